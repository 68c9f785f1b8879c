"""PaPE (Øhrstrøm et al., "Parabolic Position Encoding: Vision-Centric, Principled, Extrapolatable, General", arXiv
2602.01418, 2026; code: github.com/DTU-PAS/parabolic-position-encoding): no rotation, a learned bias on the attention
logits that is a sum of parabolas over the offset between query and key.

Each head has M parabolas (50, the released configuration). Parabola m measures the offset ``δ = p_j - p_i`` along a
learned direction ``w_m`` (a linear map of positions, no bias) and adds ``-a_im (w_m · δ)² + b_im (w_m · δ)``: the
curvature ``a_im ≥ 0`` (a softplus) makes attention decay with distance, the slope ``b_im`` tilts it towards a side
(the paper's directionality); both are read from the query token (its context awareness). The bias depends on offsets
alone (translation invariance); each layer learns its own parabolas. A pair's bias is
``(Σ_m -a_im (w_m · δ)² + b_im (w_m · δ)) / √d`` on logits ``q·k / √d`` (d the head dim): the released code appends
the bias's columns to q and k and lets attention's scale divide them too.

Why PaPE rather than FIRE (Li et al., "Functional Interpolation for Relative Positions Improves Long Context
Transformers", ICLR 2024, arXiv 2310.04418), the other bias that extrapolates: FIRE's bias is a small MLP of a
log-transformed offset normalised by the query's position, a value per pair that no inner product gives, so it must
be evaluated for every (query, key, head) — ``heads × N × N`` MLP outputs a layer, built a block of queries at a time
as LookHere's here, and attention with a dense mask loses the fused kernels. PaPE's parabolas, summed, are the
quadratic ``-δᵀ A_i δ + β_i · δ`` (``A_i = Σ_m a_im w_m w_mᵀ``, ``β_i = Σ_m b_im w_m``), which expands into products
of a query column and a key column: ``axes² + axes + 1`` columns (7 for images) appended to q and k carry it exactly
(:class:`~vit_rope.tables.ParabolicBias`), whatever M, in one ``scaled_dot_product_attention`` call with no ``N × N``
tensor. FIRE was also made for causal language models (its offsets are normalised by the query's position in the
sequence, which a 2D grid has no counterpart of), while PaPE was made and measured on ViTs (its authors report up to
+10.5 points of ImageNet-1K accuracy over the next-best encoding when extrapolating beyond the training resolution).

Where this differs from the released code:

* the curvatures and slopes are linear maps of the head's query ``q_i`` (per head, ``dim → M``), not of the layer's
  input: attention here sees q, k and v only. ``q_i`` is itself a linear map of the layer's input, so this is the
  released map restricted to go through the head's query projection;
* prefix tokens (cls, registers) get no bias, as with LookHere here; the released code places cls at (0, 0), beside
  the grid's corner, where its bias grows with the distance from there.

Precision: the expanded terms grow as ``‖p‖²`` while the bias is their difference, so positions are centred (the bias
is unchanged) and the columns are computed in float32 at least. Under autocast attention takes bfloat16 q, k and v
(the flash kernels), each column as a bfloat16 value and its bfloat16 remainder (three times the columns, 88 channels
for a 64-wide head): rounded to bfloat16 once, as the released code does, the columns move the logits by up to 0.5
at 14×14 and 19 at 64×64 with the init's parabolas; split, by about 1e-3 and 3e-2 (float32: 6e-5 and 2e-3;
tests/test_tables.py holds the bounds). Scaling modes: ``none``, ``pi``, ``normalized``, the coordinate
modes (``"pi"``, ``"normalized"``, ``coords="normalized"`` shorten offsets); it has no frequencies for NTK or YaRN.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..tables import Build, ParabolicBias
from .base import Family, Scaling
from .registry import register_family

__all__ = ["PaPE"]


@register_family
class PaPE(Family):
    """PaPE: learned parabolas over query-key offsets on the attention logits, curvature and slope from the query."""

    name = "pape"
    rotary = False
    commutes = True  # a bias on offsets p_j - p_i alone: attention is exactly relative
    model_name = "pape"
    needs_heads = True

    def __init__(self, dim: int, axes: int, *, parabolas: int = 50, per_layer: bool = True, **common) -> None:
        super().__init__(dim, axes, **common)
        if isinstance(parabolas, bool) or not isinstance(parabolas, int) or parabolas < 1:
            raise ValueError(f"parabolas={parabolas!r} must be a positive integer (the paper's is 50 a head)")
        self.parabolas = parabolas
        lead = self.learned_shape(per_layer)  # ([layer,] heads)
        # initialised as the released code's linear layers: uniform within ±1/√(inputs)
        self.directions = nn.Parameter(uniform(*lead, parabolas, axes, bound=axes**-0.5))
        self.curvature = nn.Parameter(uniform(*lead, dim, parabolas, bound=dim**-0.5))
        self.slope = nn.Parameter(uniform(*lead, dim, parabolas, bound=dim**-0.5))

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> ParabolicBias:
        centred = coords - coords.mean(dim=-2, keepdim=True)
        learned = (build.precise(p) for p in (self.directions, self.curvature, self.slope))
        return ParabolicBias.build(centred, *learned, build, per_layer=self.per_layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, parabolas={self.parabolas}"


def uniform(*shape: int, bound: float) -> Tensor:
    return torch.empty(*shape).uniform_(-bound, bound)
