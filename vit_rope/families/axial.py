"""Axial RoPE (Su et al. 2021; Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024).

The channels are cut into one even section per axis and each section turns with its own axis only, pair j of a
section of d channels by ``pos · theta ** (-2j / d)``. Sections run from the *last* grid axis to the first: in 2D the
first half of the channels turns with x (the column), the second half with y (the row); in 3D ``(t, h, w)`` the
order is ``[w | h | t]``. Channels no section takes stay unrotated. A fixed ladder, so NTK-aware scaling (bloc97,
2023) and YaRN (Peng et al. 2023) apply, per axis.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..tables import RotaryTable
from . import register_family
from .base import Extrapolation, Family, check_axis_dims, check_layout

__all__ = ["Axial", "frequency_ladder", "yarn_frequencies"]


def yarn_frequencies(f: Tensor, s: float, length: float, beta_fast: float, beta_slow: float) -> Tensor:
    """YaRN's "NTK-by-parts" (Peng et al. 2023): ``r = length / wavelength`` counts the turns a frequency makes over
    the original length; frequencies with fewer than ``beta_slow`` turns are interpolated (``f / s``), those with more
    than ``beta_fast`` kept, and a linear ramp blends between them."""
    turns = length * f / (2 * math.pi)
    keep = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
    return f / s * (1 - keep) + f * keep


def frequency_ladder(
    d: int,
    theta: float,
    mode: str = "none",
    s: float = 1.0,
    length: float = 0.0,
    yarn_beta: tuple[float, float] = (32.0, 1.0),
) -> Tensor:
    """The ``d // 2`` frequencies ``theta ** (-2j / d)`` of a section of d channels (float64), under NTK-aware
    scaling (``theta · s ** (d / (d - 2))``) or YaRN's ramp (against ``length``, the reference grid's extent)."""
    if mode == "ntk" and s > 1 and d > 2:
        theta = theta * s ** (d / (d - 2))
    f = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return yarn_frequencies(f, s, length, *yarn_beta) if mode == "yarn" and s > 1 else f


def yarn_temperature(s: float) -> float:
    """YaRN's attention temperature ``0.1 ln s + 1`` (applied to q and k alike, so logits scale by its square)."""
    return 0.1 * math.log(max(s, 1.0)) + 1.0


@register_family
class Axial(Family):
    """Axial RoPE: fixed frequencies, one section of channels per axis (``axis_dims`` in grid axis order)."""

    name = "axial"
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")
    model_name = "rope"

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        theta: float = 100.0,
        layout: str = "interleaved",
        axis_dims: Sequence[int] | None = None,
        rotate_fraction: float | None = None,
        yarn_beta: tuple[float, float] = (32.0, 1.0),
        **common,
    ) -> None:
        super().__init__(dim, axes, **common)
        if not theta > 0:
            raise ValueError(f"theta={theta} must be positive (100 is RoPE-ViT's choice, 10000 the language models')")
        self.theta, self.layout, self.yarn_beta = float(theta), check_layout(layout), tuple(yarn_beta)
        self.axis_dims = check_axis_dims(dim, axes, axis_dims, rotate_fraction)

    def frequency_matrix(self, extrapolation: Extrapolation | None = None) -> Tensor:
        """The ``(axes, dim // 2)`` float64 frequency matrix, zero where a pair ignores an axis."""
        ext = extrapolation or Extrapolation(scales=(1.0,) * self.axes)
        F = torch.zeros(self.axes, self.dim // 2, dtype=torch.float64)
        start = 0
        for axis in reversed(range(self.axes)):  # sections from the last grid axis (x) to the first
            d = self.axis_dims[axis]
            length = ext.ref_grid[axis] if ext.ref_grid else 0.0
            F[axis, start : start + d // 2] = frequency_ladder(
                d, self.theta, ext.mode, ext.scales[axis], length, self.yarn_beta
            )
            start += d // 2
        return F

    def forward(self, coords: Tensor, extrapolation: Extrapolation) -> RotaryTable:
        angles = coords @ self.frequency_matrix(extrapolation).to(coords)  # (..., N, P): one non-zero product a pair
        if coords.ndim == 3:  # per-sample positions (B, N, axes): a head dim to broadcast over
            angles = angles.unsqueeze(1)
        return RotaryTable(angles.cos(), angles.sin(), self.layout)

    def temperature(self, extrapolation: Extrapolation) -> Tensor | None:
        if extrapolation.mode != "yarn" or max(extrapolation.scales) <= 1:
            return None
        m, start = torch.ones(self.dim // 2, dtype=torch.float64), 0
        for axis in reversed(range(self.axes)):
            m[start : start + self.axis_dims[axis] // 2] = yarn_temperature(extrapolation.scales[axis])
            start += self.axis_dims[axis] // 2
        return m

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, axis_dims={self.axis_dims}, theta={self.theta}, layout={self.layout}"
