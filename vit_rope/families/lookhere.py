"""LookHere (Fuller et al., "LookHere: Vision Transformers with Directed Attention Generalize and Extrapolate",
NeurIPS 2024, arXiv 2405.13985): no rotation and no absolute embedding, a fixed bias on the attention logits.

Each head looks one way: a directed head sees only the keys inside its field of view (a wedge around its direction,
boundaries included; a token always sees itself), the rest masked (-inf); every head adds a distance penalty
``-slope · ‖p_i - p_j‖`` (patch units). ``slope = global_slope · s_layer · s_head``: ``s_layer`` runs linearly from
1.5 at the first block to 0.5 at the last; ``s_head`` as the released code (GreenCUBIC/lookhere, ``get_slopes`` and
``get_none_slopes``): directed heads in groups of four at ``2^-1``, ``2^-2``, ..., undirected heads ``4^-1``, ``4^-2``,
``4^-3``, ``4^-4``. Two thirds of the heads are directed (8 of 12, 4 of 6, as the paper), cycling through eight
directions in an order that spreads any first few evenly (the four cardinal ones, then the diagonals). Prefix tokens see
everything and are seen by every token, with no penalty. ``fov`` picks the variant: 180 (half-planes), 90 (default: the
fields of view of the released LH-90, quadrants and cardinal wedges, in our head order) or 45.

The bias is built a block of queries at a time as attention takes it (:class:`~vit_rope.tables.AttentionBias`), or,
for a grid whose ``(heads, N, N)`` bias is small, once per grid (cached with the other tables); each layer scales it
by its own ``s_layer``. Scaling modes: ``none``, ``pi``, ``normalized``, the coordinate modes (``"pi"`` shortens
distances, as the paper's lower slopes at high resolution); it has no frequencies for NTK or YaRN to rescale.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..tables import AttentionBias, Build
from .base import Family, Scaling
from .registry import register_family

__all__ = ["LookHere", "head_slopes"]

# rays at multiples of 45°, counter-clockwise from "right", in (x right, y up), as integers: boundary tests are exact
RAYS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))
# each field of view as the wedge (start ray, end ray) it spans counter-clockwise, in the order heads take them
WEDGES = {
    180: ((6, 2), (2, 6), (0, 4), (4, 0), (7, 3), (3, 7), (1, 5), (5, 1)),  # → ← ↑ ↓ ↗ ↙ ↖ ↘ half-planes
    90: ((7, 1), (3, 5), (1, 3), (5, 7), (0, 2), (4, 6), (2, 4), (6, 0)),  # → ← ↑ ↓ wedges, ↗ ↙ ↖ ↘ quadrants
    45: ((0, 1), (4, 5), (2, 3), (6, 7), (1, 2), (5, 6), (3, 4), (7, 0)),
}


def head_slopes(directed: int, undirected: int) -> list[float]:
    """Each head's slope, as the released code assigns them: directed heads in groups of four at 2^-1, 2^-2, ...
    (``get_slopes``), undirected ones 4^-1 ... 4^-4, each repeated when there are more than four
    (``get_none_slopes``)."""
    repeat = max(1, undirected // 4)
    undirected_slopes = [4.0 ** -(1 + i // repeat) for i in range(undirected)]
    return [2.0 ** -(1 + i // 4) for i in range(directed)] + undirected_slopes


@register_family
class LookHere(Family):
    """LookHere: directional fields of view and distance penalties on the attention logits, per head and layer."""

    name = "lookhere"
    rotary = False
    model_name = "lookhere"
    needs_heads = True
    min_axes = max_axes = 2  # fields of view are directions of the image plane

    def __init__(self, dim: int, axes: int, *, fov: int = 90, global_slope: float = 1.0, **common) -> None:
        super().__init__(dim, axes, **common)
        if fov not in WEDGES:
            raise ValueError(f"fov={fov}: choose 180, 90 or 45 (LH-180, LH-90, LH-45)")
        if (
            isinstance(global_slope, bool)
            or not isinstance(global_slope, int | float)
            or not 0 < global_slope < math.inf
        ):
            raise ValueError(f"global_slope={global_slope!r} must be a positive finite number")
        self.fov, self.global_slope = fov, float(global_slope)
        undirected = max(1, self.num_heads // 3)
        self.directed = self.num_heads - undirected
        self.head_slopes = head_slopes(self.directed, undirected)
        self.per_layer = self.depth is not None
        layers = self.depth or 1
        self.layer_slopes = [1.5 - i / max(layers - 1, 1) for i in range(layers)] if self.per_layer else [1.0]

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> AttentionBias:
        xy = torch.stack((coords[..., 1], -coords[..., 0]), dim=-1)  # (row, col) → (x right, y up)
        wedges = [WEDGES[self.fov][h % 8] for h in range(self.num_heads)]
        rays = torch.tensor([[RAYS[a], RAYS[b]] for a, b in wedges], device=coords.device)  # (heads, 2, 2)
        directed = torch.arange(self.num_heads, device=coords.device) < self.directed
        slopes = coords.new_tensor(self.head_slopes) * self.global_slope
        scale = coords.new_tensor(self.layer_slopes) if self.per_layer else None
        return AttentionBias.build(xy, slopes, rays, directed, build, layer_scale=scale)

    def prune_layers(self, depth: int) -> None:
        self.layer_slopes, self.depth = self.layer_slopes[:depth], depth

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fov={self.fov}, directed heads={self.directed}"
