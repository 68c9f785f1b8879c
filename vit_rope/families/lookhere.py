"""LookHere (Fuller et al., "LookHere: Vision Transformers with Directed Attention Generalize and Extrapolate",
NeurIPS 2024, arXiv 2405.13985): no rotation and no absolute embedding, a fixed bias on the attention logits.

Each head looks one way: a directed head sees only the keys inside its field of view (a wedge around its direction,
boundaries included; a token always sees itself), the rest masked (-inf); every head adds a distance penalty
``-slope · ‖p_i - p_j‖`` (patch units). ``slope = s_layer · s_head``: ``s_layer`` runs linearly from 1.5 at the first
block to 0.5 at the last; directed heads have ``s_head = 1``, the undirected ones ``1/2, 1/8, 1/32, ...``. Two thirds
of the heads are directed (8 of 12, as the paper), cycling through eight directions in an order that spreads any
first few evenly. Prefix tokens see everything and are seen by every token, with no penalty. ``fov`` picks the
variant: 180 (half-planes), 90 (default: the fields of view of the released LH-90, quadrants and cardinal wedges,
in our head order) or 45.

The bias of a grid is built once (and cached with the other tables) as ``(heads, N, N)``; each layer scales it by its
own ``s_layer``. Coordinate modes apply (``"pi"`` shortens distances, as the paper's lower slopes at high resolution).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..tables import AttentionBias
from . import register_family
from .base import Extrapolation, Family

__all__ = ["LookHere", "field_of_view"]

# rays at multiples of 45°, counter-clockwise from "right", in (x right, y up), as integers: boundary tests are exact
RAYS = ((1, 0), (1, 1), (0, 1), (-1, 1), (-1, 0), (-1, -1), (0, -1), (1, -1))
# each field of view as the wedge (start ray, end ray) it spans counter-clockwise, in the order heads take them
WEDGES = {
    180: ((6, 2), (2, 6), (0, 4), (4, 0), (7, 3), (3, 7), (1, 5), (5, 1)),  # → ← ↑ ↓ ↗ ↙ ↖ ↘ half-planes
    90: ((7, 1), (3, 5), (1, 3), (5, 7), (0, 2), (4, 6), (2, 4), (6, 0)),  # → ← ↑ ↓ wedges, ↗ ↙ ↖ ↘ quadrants
    45: ((0, 1), (4, 5), (2, 3), (6, 7), (1, 2), (5, 6), (3, 4), (7, 0)),
}


def field_of_view(offsets: Tensor, wedge: tuple[int, int]) -> Tensor:
    """Which offsets ``(..., 2)`` (key minus query, in (x right, y up)) lie inside the wedge, boundaries included."""
    (ax, ay), (bx, by) = RAYS[wedge[0]], RAYS[wedge[1]]
    dx, dy = offsets[..., 0], offsets[..., 1]
    after_start = ax * dy - ay * dx >= 0  # counter-clockwise of the start ray
    before_end = dx * by - dy * bx >= 0  # clockwise of the end ray
    return after_start & before_end  # (a 180° wedge: both say the same half-plane)


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
        if not global_slope > 0:
            raise ValueError(f"global_slope={global_slope} must be positive")
        self.fov, self.global_slope = fov, float(global_slope)
        undirected = max(1, self.num_heads // 3)
        self.directed = self.num_heads - undirected
        self.head_slopes = [1.0] * self.directed + [2.0 ** -(2 * i + 1) for i in range(undirected)]
        self.per_layer = self.depth is not None
        layers = self.depth or 1
        self.layer_slopes = [1.5 - i / max(layers - 1, 1) for i in range(layers)] if self.per_layer else [1.0]

    def encode(self, coords: Tensor, extrapolation: Extrapolation) -> AttentionBias:
        xy = torch.stack((coords[..., 1], -coords[..., 0]), dim=-1)  # (row, col) → (x right, y up)
        offsets = xy.unsqueeze(-3) - xy.unsqueeze(-2)  # key minus query: (..., N_query, N_key, 2)
        distance = offsets.norm(dim=-1)
        heads = []
        for h, slope in enumerate(self.head_slopes):
            visible = field_of_view(offsets, WEDGES[self.fov][h % 8]) if h < self.directed else None
            bias = -self.global_slope * slope * distance
            heads.append(bias if visible is None else bias.masked_fill(~visible, float("-inf")))
        bias = torch.stack(heads, dim=-3)  # ([B,] heads, N, N)
        scale = coords.new_tensor(self.layer_slopes) if self.per_layer else None
        return AttentionBias(bias, per_layer=self.per_layer, layer_scale=scale)

    def prune_layers(self, depth: int) -> None:
        self.layer_slopes, self.depth = self.layer_slopes[:depth], depth

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, fov={self.fov}, directed heads={self.directed}"
