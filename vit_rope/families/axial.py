"""Axial RoPE (Su et al. 2021; Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024).

The channels are cut into one even section per axis and each section turns with its own axis only, pair j of a
section of d channels by ``pos · theta ** (-2j / d)``. Sections run from the *last* grid axis to the first: in 2D the
first half of the channels turns with x (the column), the second half with y (the row); in 3D ``(t, h, w)`` the
order is ``[w | h | t]``. Channels no section takes stay unrotated. Scaling modes: all five, ``none``, ``pi`` and
``normalized`` on the coordinates, and on its fixed ladder NTK-aware scaling (bloc97, 2023) and YaRN (Peng et al.
2023), each section at its own axis's scale.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import PairFamily, Scaling
from .registry import register_family

__all__ = ["Axial", "frequency_ladder", "yarn_frequencies", "yarn_temperature"]


def yarn_frequencies(f: Tensor, s: float, length: float, beta_fast: float, beta_slow: float) -> Tensor:
    """YaRN's "NTK-by-parts" (Peng et al. 2023): ``r = length / wavelength`` counts the turns a frequency makes over
    the original length; frequencies with fewer than ``beta_slow`` turns are interpolated (``f / s``), those with more
    than ``beta_fast`` kept, and a linear ramp blends between them."""
    turns = length * f / (2 * math.pi)
    ramp = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)  # 0: interpolated, 1: kept
    return f / s * (1 - ramp) + f * ramp


def frequency_ladder(
    d: int, theta: float, mode: str = "none", s: float = 1.0, length: float = 0.0, yarn_beta=(32.0, 1.0)
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
class Axial(PairFamily):
    """Axial RoPE: fixed frequencies, one section of channels per axis (``axis_dims`` in grid axis order)."""

    name = "axial"
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")
    model_name = "rope"

    def __init__(self, dim: int, axes: int, *, yarn_beta: tuple[float, float] = (32.0, 1.0), **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        self.yarn_beta = tuple(yarn_beta)

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """The ``(axes, dim // 2)`` float64 frequency matrix, zero where a pair ignores an axis."""
        ext = scaling or Scaling("none", (1.0,) * self.axes)
        F = torch.zeros(self.axes, self.dim // 2, dtype=torch.float64)
        for axis, pairs in self.sections():
            length = ext.ref_grid[axis] if ext.ref_grid else 0.0
            F[axis, pairs] = frequency_ladder(
                self.axis_dims[axis], self.theta, ext.mode, ext.scales[axis], length, self.yarn_beta
            )
        return F

    def temperature(self, scaling: Scaling) -> Tensor | None:
        if scaling.mode != "yarn" or max(scaling.scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        for axis, pairs in self.sections():
            m[pairs] = yarn_temperature(scaling.scales[axis])
        return m
