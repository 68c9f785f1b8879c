"""Spiral RoPE (Liu et al., "Spiral RoPE: Rotate Your Rotary Positional Embeddings in the 2D Plane", arXiv
2602.03227): multi-direction RoPE without parameters.

The channels of the image plane are cut into K equal groups; group k turns with the projection ``<p, u_k>`` of the
position on the direction ``u_k = (cos kπ/K, sin kπ/K)`` in (x, y), spread evenly over the half-turn. The frequencies
are axial RoPE's ladder for one axis (``theta ** (-4j / d)``, j < d/4 for d plane channels), cut into chunks of two and
dealt round-robin to the K/2 perpendicular direction pairs (k, k + K/2), which share them (the paper's Eq. 13). K = 2 is
axial RoPE exactly. The paper multiplies its base-10000 ladder by 1.5; here the ladder is axial RoPE's (theta 100) so
that the comparison with axial isolates the directions.

Leading axes (time in video) keep axial sections of their own (by default a quarter of the channels each); the last
two axes (rows, cols) are the plane. Scaling modes: all five; on its fixed ladder NTK and YaRN take one scale for the
plane (the larger of its two: directions mix them) and each leading axis's own. By default as many directions as fit,
from 4 up to 8.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .axial import frequency_ladder, yarn_temperature
from .base import PairFamily, Scaling, axis_sections
from .registry import register_family

__all__ = ["Spiral", "direction_frequencies"]


def direction_frequencies(plane_dims: int, directions: int, ladder: Tensor) -> Tensor:
    """The ``(directions, plane_dims // (2 · directions))`` frequencies of each direction: ``ladder`` (the
    ``plane_dims // 4`` axial frequencies) in chunks of two, chunk c going to the direction pair ``c mod (K / 2)``."""
    chunks = ladder.view(-1, 2)  # (plane_dims // 8, 2)
    pairs = directions // 2
    per_pair = chunks.view(-1, pairs, 2).transpose(0, 1).flatten(1)  # pair k: chunks k, k + K/2, ... ascending
    return torch.cat((per_pair, per_pair))  # direction k and k + K/2 share them


@register_family
class Spiral(PairFamily):
    """Spiral RoPE: K directions spread over the half-turn (``directions``; default the most, 4 to 8, that fit)."""

    name = "spiral"
    min_axes = 2  # directions of the image plane
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")
    model_name = "spiral"

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        directions: int | None = None,
        yarn_beta: tuple[float, float] = (32.0, 1.0),
        **kwargs,
    ) -> None:
        super().__init__(dim, axes, **kwargs)
        if self.grid_indexing != "xy":
            raise ValueError("spiral RoPE lays out the plane's directions first: grid_indexing='ij' means nothing here")
        self.yarn_beta = tuple(yarn_beta)
        self.plane_dims = self.axis_dims[-1] + self.axis_dims[-2]  # the (rows, cols) plane's channels
        quarter = self.plane_dims // 4  # the ladder's length: chunks of two frequencies go round the directions
        fits = [k for k in range(2, quarter + 1, 2) if quarter % k == 0] if self.plane_dims % 8 == 0 else []
        if directions is None:  # the most from 4 to 8 that fit, else the most that fit
            directions = max([k for k in fits if 4 <= k <= 8] or fits, default=None)
        if directions not in fits:
            choices = f"one of {fits}" if fits else "axis_dims that give the plane a multiple of 8 channels"
            raise ValueError(
                f"directions={directions} does not fit {self.plane_dims} channels of the image plane: K must be even "
                f"and divide {self.plane_dims / 4:g} (the plane's channels / 4, which must be even); choose {choices} "
                "(K = 2 is axial RoPE)"
            )
        self.directions = directions

    @classmethod
    def default_axis_dims(cls, dim: int, axes: int) -> tuple[int, ...]:
        """The plane (the last two axes) gets the most channels that are a multiple of 8 (so that directions fit)
        after a quarter for each leading (time) axis, which then share the rest (64 → 16/24/24 in 3D, as M-RoPE;
        48 → 16/16/16); channels left over stay unrotated. An equal split would leave the plane room for two
        directions alone, axial RoPE."""
        time = 2 * ((dim // 4) // 2) if axes > 2 else 0
        plane = 8 * ((dim - (axes - 2) * time) // 8)
        if plane < 8:
            raise ValueError(
                f"dim={dim} leaves the image plane fewer than 8 channels: spiral RoPE needs a head dim of 16+"
            )
        leading = 2 * (((dim - plane) // (axes - 2)) // 2) if axes > 2 else 0
        return (leading,) * (axes - 2) + (plane // 2,) * 2

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """The ``(axes, dim // 2)`` float64 frequency matrix: the plane's direction groups first, then one axial
        section per leading axis (from the last to the first, as axial RoPE lays them out)."""
        ext = scaling or Scaling("none", (1.0,) * self.axes)
        F = torch.zeros(self.axes, self.dim // 2, dtype=torch.float64)
        plane = slice(0, self.plane_dims // 2)
        length = max(ext.ref_grid[-2:]) if ext.ref_grid else 0.0
        ladder = frequency_ladder(
            self.plane_dims // 2, self.theta, ext.mode, self.plane_scale(ext), length, self.yarn_beta
        )
        freqs = direction_frequencies(self.plane_dims, self.directions, ladder)  # (K, pairs per direction)
        angle = torch.arange(self.directions, dtype=torch.float64) * math.pi / self.directions
        F[-1, plane] = (angle.cos()[:, None] * freqs).flatten()  # u_k's x component turns with the column
        F[-2, plane] = (angle.sin()[:, None] * freqs).flatten()  # its y component with the row
        for axis, pairs in axis_sections(self.axis_dims[:-2], start=plane.stop):
            length = ext.ref_grid[axis] if ext.ref_grid else 0.0
            F[axis, pairs] = frequency_ladder(
                self.axis_dims[axis], self.theta, ext.mode, ext.scales[axis], length, self.yarn_beta
            )
        return F

    def frequency_groups(self) -> list[Tensor]:
        """p-RoPE cuts the plane's ladder as one (its pairs mix both axes) and each leading axis's section alone."""
        plane = torch.arange(self.plane_dims // 2)
        return [plane] + [
            torch.arange(p.start, p.stop) for _, p in axis_sections(self.axis_dims[:-2], start=len(plane))
        ]

    def plane_scale(self, scaling: Scaling) -> float:
        """One scale factor for the plane (directions mix its axes): the larger of its two."""
        return max(scaling.scales[-2:])

    def temperature(self, scaling: Scaling) -> Tensor | None:
        if scaling.mode != "yarn" or max(scaling.scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        m[: self.plane_dims // 2] = yarn_temperature(self.plane_scale(scaling))
        for axis, pairs in axis_sections(self.axis_dims[:-2], start=self.plane_dims // 2):
            m[pairs] = yarn_temperature(scaling.scales[axis])
        return m

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, directions={self.directions}"
