"""ComRoPE (Yu et al., "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by Trainable Commuting
Angle Matrices", CVPR 2025, arXiv 2506.03737).

``R(p) = exp(Σ_a p_a A_a)`` with block-diagonal skew-symmetric ``A_a`` that commute pairwise, so attention stays
exactly relative. Each b×b block j of a head carries one learned skew matrix ``B_j = P_j - P_jᵀ``, and the position
turns it by one scalar ``t_j(p)``: ``R_j(p) = exp(t_j(p) B_j)``.

* **AP** (axis-partitioned): block j belongs to axis ``j mod axes`` (grid axis order: rows first), ``t_j = p_axis``;
  where the blocks do not divide among the axes (8 blocks over (t, h, w)) the first axes get one more (the authors'
  code asks them to divide evenly).
* **LD** (linearly dependent): every axis shares the block, ``t_j = Σ_a θ_{a,j} p_a`` with learned θ per axis, head
  and block (the paper's appendix E.2.4; its code shares θ across heads).

Block size 8 (the paper's experiments), per layer and head. P ~ N(0, init_std²) as the authors' code; their
coordinates are patch centres in (0, 1) at every resolution, ours patch indices, so the init's scale is divided by the
reference grid's side. Learned: NTK and YaRN do not apply.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..tables import RotaryTable
from . import register_family
from .base import Extrapolation, Family, at_least_float32, head_angles

__all__ = ["ComRoPEAP", "ComRoPELD"]


class _ComRoPE(Family):
    """What AP and LD share: one learned skew block per (layer, head, block), turned per token by ``turns``."""

    needs_heads = True
    onnx = False  # matrix_exp

    def __init__(
        self, dim: int, axes: int, *, block_size: int = 8, init_std: float = 1.0, per_layer: bool = True, **common
    ) -> None:
        super().__init__(dim, axes, **common)
        if block_size < 2 or dim % block_size:
            raise ValueError(f"block_size={block_size} must be at least 2 and divide dim={dim} (the paper uses 8)")
        if not init_std > 0:
            raise ValueError(f"init_std={init_std} must be positive")
        self.block_size, self.num_blocks = block_size, dim // block_size
        self.lead = self.learned_shape(per_layer)
        std = init_std / max(self.ref_grid) if self.ref_grid else init_std
        self.generators = nn.Parameter(torch.randn(*self.lead, self.num_blocks, block_size, block_size) * std)

    def turns(self, coords: Tensor) -> Tensor:
        """The scalar ``t_j`` of every token and block: ``([B,] [layer,] heads | 1.., N, blocks)``."""
        raise NotImplementedError

    def encode(self, coords: Tensor, extrapolation: Extrapolation) -> RotaryTable:
        P = at_least_float32(self.generators)
        t = self.turns(coords.to(P.dtype))  # ([B,] [layer,] heads | 1, N, blocks)
        blocks = torch.linalg.matrix_exp(t[..., None, None] * (P - P.mT).unsqueeze(-4))  # (..., N, blocks, b, b)
        return RotaryTable(blocks=blocks, per_layer=self.per_layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}"


@register_family
class ComRoPEAP(_ComRoPE):
    """ComRoPE-AP: each block turns with one axis (block j with axis j mod axes)."""

    name = "comrope_ap"

    def __init__(self, dim: int, axes: int, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        owner = torch.arange(self.num_blocks) % axes
        onehot = (owner == torch.arange(axes)[:, None]).float()  # (axes, blocks)
        self.register_buffer("axis_of_block", onehot.expand(*[1] * len(self.lead), -1, -1), persistent=False)

    def turns(self, coords: Tensor) -> Tensor:
        return head_angles(coords, self.axis_of_block.to(coords))


@register_family
class ComRoPELD(_ComRoPE):
    """ComRoPE-LD: every block turns with a learned mix of the axes (θ per layer, head, axis and block)."""

    name = "comrope_ld"
    model_name = "comrope"

    def __init__(self, dim: int, axes: int, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        self.mix = nn.Parameter(torch.randn(*self.lead, axes, self.num_blocks))  # θ ~ N(0, 1), as the authors' code

    def turns(self, coords: Tensor) -> Tensor:
        return head_angles(coords, self.mix.to(coords))
