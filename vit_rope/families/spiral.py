"""Spiral RoPE (Liu et al., "Spiral RoPE: Rotate Your Rotary Positional Embeddings in the 2D Plane", arXiv
2602.03227): multi-direction RoPE without parameters.

The channels of the image plane are cut into K equal groups; group k turns with the projection ``<p, u_k>`` of the
position on the direction ``u_k = (cos kπ/K, sin kπ/K)`` in (x, y), spread evenly over the half-turn. The frequencies
are axial RoPE's ladder for one axis (``theta ** (-4j / d)``, j < d/4 for d plane channels), cut into chunks of two and
dealt round-robin to the K/2 perpendicular direction pairs (k, k + K/2), which share them (the paper's Eq. 13). K = 2 is
axial RoPE exactly. The paper multiplies its base-10000 ladder by 1.5; here the ladder is axial RoPE's (theta 100) so
that the comparison with axial isolates the directions.

Leading axes (time in video) keep axial sections of their own; the last two axes (rows, cols) are the plane. A fixed
ladder, so NTK and YaRN apply, with one scale for the plane (the larger of its two).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..tables import RotaryTable
from . import register_family
from .axial import frequency_ladder, yarn_temperature
from .base import Extrapolation, Family, check_axis_dims, check_layout

__all__ = ["Spiral", "direction_frequencies"]


def direction_frequencies(plane_dims: int, directions: int, ladder: Tensor) -> Tensor:
    """The ``(directions, plane_dims // (2 · directions))`` frequencies of each direction: ``ladder`` (the
    ``plane_dims // 4`` axial frequencies) in chunks of two, chunk c going to the direction pair ``c mod (K / 2)``."""
    chunks = ladder.view(-1, 2)  # (plane_dims // 8, 2)
    pairs = directions // 2
    per_pair = chunks.view(-1, pairs, 2).transpose(0, 1).flatten(1)  # pair k: chunks k, k + K/2, ... ascending
    return torch.cat((per_pair, per_pair))  # direction k and k + K/2 share them


@register_family
class Spiral(Family):
    """Spiral RoPE: K directions spread over the half-turn (``directions``; default the most, up to 8, that fit)."""

    name = "spiral"
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")
    model_name = "spiral"

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        theta: float = 100.0,
        layout: str = "interleaved",
        directions: int | None = None,
        axis_dims: Sequence[int] | None = None,
        rotate_fraction: float | None = None,
        yarn_beta: tuple[float, float] = (32.0, 1.0),
        **common,
    ) -> None:
        super().__init__(dim, axes, **common)
        if axes < 2:
            raise ValueError("spiral RoPE turns with directions of the image plane: it needs axes >= 2")
        if not theta > 0:
            raise ValueError(f"theta={theta} must be positive")
        self.theta, self.layout, self.yarn_beta = float(theta), check_layout(layout), tuple(yarn_beta)
        self.axis_dims = check_axis_dims(dim, axes, axis_dims, rotate_fraction)
        self.plane_dims = self.axis_dims[-1] + self.axis_dims[-2]
        fits = [k for k in range(2, self.plane_dims // 4 + 1, 2) if (self.plane_dims // 4) % k == 0]
        if directions is None:
            directions = max([k for k in fits if k <= 8], default=0)
        if directions not in fits:
            raise ValueError(
                f"directions={directions} does not fit {self.plane_dims} channels of the image plane: K must be even "
                f"and divide {self.plane_dims // 4} (channels / 4); choose one of {fits} or other axis_dims"
            )
        self.directions = directions

    def frequency_matrix(self, extrapolation: Extrapolation | None = None) -> Tensor:
        """The ``(axes, dim // 2)`` float64 frequency matrix: the plane's direction groups first, then one axial
        section per leading axis (from the last to the first, as axial RoPE lays them out)."""
        ext = extrapolation or Extrapolation(scales=(1.0,) * self.axes)
        F = torch.zeros(self.axes, self.dim // 2, dtype=torch.float64)
        s = max(ext.scales[-2:])
        length = max(ext.ref_grid[-2:]) if ext.ref_grid else 0.0
        ladder = frequency_ladder(self.plane_dims // 2, self.theta, ext.mode, s, length, self.yarn_beta)
        freqs = direction_frequencies(self.plane_dims, self.directions, ladder)  # (K, pairs per direction)
        angle = torch.arange(self.directions, dtype=torch.float64) * math.pi / self.directions
        row, col = self.axes - 2, self.axes - 1
        F[col, : self.plane_dims // 2] = (angle.cos()[:, None] * freqs).flatten()  # x component of u_k
        F[row, : self.plane_dims // 2] = (angle.sin()[:, None] * freqs).flatten()  # y component
        start = self.plane_dims // 2
        for axis in reversed(range(self.axes - 2)):
            d = self.axis_dims[axis]
            length = ext.ref_grid[axis] if ext.ref_grid else 0.0
            F[axis, start : start + d // 2] = frequency_ladder(
                d, self.theta, ext.mode, ext.scales[axis], length, self.yarn_beta
            )
            start += d // 2
        return F

    def forward(self, coords: Tensor, extrapolation: Extrapolation) -> RotaryTable:
        angles = coords @ self.frequency_matrix(extrapolation).to(coords)  # (..., N, P)
        if coords.ndim == 3:  # per-sample positions (B, N, axes): a head dim to broadcast over
            angles = angles.unsqueeze(1)
        return RotaryTable(angles.cos(), angles.sin(), self.layout)

    def temperature(self, extrapolation: Extrapolation) -> Tensor | None:
        if extrapolation.mode != "yarn" or max(extrapolation.scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        m[: self.plane_dims // 2] = yarn_temperature(max(extrapolation.scales[-2:]))
        start = self.plane_dims // 2
        for axis in reversed(range(self.axes - 2)):
            m[start : start + self.axis_dims[axis] // 2] = yarn_temperature(extrapolation.scales[axis])
            start += self.axis_dims[axis] // 2
        return m

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, directions={self.directions}, plane_dims={self.plane_dims}, theta={self.theta}"
