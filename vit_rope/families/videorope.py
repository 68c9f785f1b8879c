"""VideoRoPE (Wei et al., "VideoRoPE: What Makes for Good Video Rotary Position Embedding?", ICML 2025, arXiv
2502.05173; the authors' code: github.com/Wiselnn570/VideoRoPE, ``videorope-transformer/modeling_videorope.py``).

Three changes to M-RoPE's split of the channels into t / h / w sections, all kept here:

* **low-frequency temporal allocation**: one frequency ladder ``theta ** (-2j / d)`` runs over all d rotated channels
  (not one ladder per axis, as axial RoPE); time takes its lowest frequencies, the last pairs, and the rows and
  columns share the higher ones, interleaved pair by pair: even pairs turn with the row h, odd pairs with the column w
  (the authors' code: of Qwen2-VL's 64 frequencies the first 48 alternate h, w and the last 16 go to t). The default
  split is M-RoPE's proportions, a quarter of the pairs for time (64 → 16/24/24 channels for (t, h, w)); ``axis_dims``
  chooses another with equal h and w.
* **diagonal layout**: each frame's spatial indices are centred on the frame and advance with the (scaled) time index,
  ``(t, h, w) → (δt, δt + h - c_h, δt + w - c_w)``, so that every frame's centre lies on the diagonal t = h = w, where
  the encoding is 1D RoPE at position δt, and a token and its mirror image across the frame centre turn symmetrically
  about it at every time step.
* **adjustable temporal spacing**: the time index is scaled by δ (``temporal_spacing``; the authors' code uses 2).

Adapted to a video ViT, where no text surrounds the clip: in the paper's LLM the text before a video sits on the
diagonal just before the first frame's centre; here the prefix tokens (cls, registers) stay unturned, position 0 on
every axis, so they sit on the diagonal at the centre of the first frame. The centre is the midpoint of the tokens'
spatial extent, exactly (n - 1) / 2 on a grid of n patches (the authors' integer positions use ``(n - 1) // 2``,
which is off by half a patch for even n and breaks the mirror symmetry). Spatial indices advance with time as in the
paper (``diagonal=False`` keeps each frame's indices centred and still, M-RoPE's layout with VideoRoPE's frequencies).
The ladder's base is axial RoPE's (theta 100, not the LLM's 1e6), so that a comparison with axial isolates the layout.

All three are linear in the coordinates (plus a translation shared by every token), so the rotations commute and
attention between patch tokens is exactly relative.

Scaling modes: all five. The coordinate modes (``pi``, ``normalized``) act on (t, h, w) before the layout. NTK-aware
scaling and YaRN rescale the one ladder as the authors' extrapolation code does (NTK: the whole ladder's base
``theta · s ** (d / (d - 2))``, d its rotated channels, not one per axis; YaRN: the ramp over that ladder), each pair
at the scale of the coordinate it turns with: the growth of that coordinate's extent from the reference grid to the
grid the per-axis factors s make of it, each extent counted as axial RoPE counts n positions. Time's is δ·T, so its
pairs take ``s_t``; h and w advance with time on the diagonal, their extents ``δ·T + H`` and ``δ·T + W``, so larger
frames rescale them by less than ``s_h``, ``s_w`` (the diagonal's share stays), and a longer clip rescales them too:
tokens further apart in time meet at h and w offsets training never saw. One factor s on every axis rescales every
pair by s, and ``diagonal=False`` gives h and w exactly ``s_h``, ``s_w``: axial RoPE's rule. The authors'
VideoRoPE++ code, for an LLM whose frames keep their size, rescales time's pairs and keeps the spatial ones. YaRN's
ramp counts turns over the reference grid's extents, and its temperature ``0.1 ln s + 1`` is each pair's own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..tables import Build, RotaryTable
from .axial import frequency_ladder, yarn_temperature
from .base import PairFamily, Scaling
from .registry import register_family

__all__ = ["VideoRoPE", "diagonal_coordinates"]


def diagonal_coordinates(coords: Tensor, temporal_spacing: float, diagonal: bool = True) -> Tensor:
    """``([B,] N, 3)`` coordinates (t, h, w) in VideoRoPE's layout: ``(δt, δt + h - c_h, δt + w - c_w)``, the centre c
    the midpoint of the tokens' (each sample's) spatial extent; ``diagonal=False`` leaves out the ``δt`` of h and w."""
    t = coords[..., :1] * temporal_spacing
    space = coords[..., 1:]
    centre = (space.amax(dim=-2, keepdim=True) + space.amin(dim=-2, keepdim=True)) / 2
    space = space - centre
    return torch.cat((t, space + t if diagonal else space), dim=-1)


@register_family
class VideoRoPE(PairFamily):
    """VideoRoPE: time on the lowest frequencies, h and w interleaved on the higher ones, frames on the diagonal."""

    name = "videorope"
    min_axes = max_axes = 3  # (t, h, w) in grid axis order
    model_name = None  # video only: no vit_<name>_* image models; the video models take pos_embed="videorope"
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        temporal_spacing: float = 2.0,
        diagonal: bool = True,
        yarn_beta: tuple[float, float] = (32.0, 1.0),
        **kwargs,
    ) -> None:
        super().__init__(dim, axes, **kwargs)
        self.yarn_beta = tuple(yarn_beta)
        if self.grid_indexing != "xy":
            raise ValueError("VideoRoPE lays out h and w interleaved, then t: grid_indexing='ij' means nothing here")
        if self.axis_dims[1] != self.axis_dims[2]:
            raise ValueError(
                f"axis_dims={self.axis_dims}: VideoRoPE interleaves h and w pair by pair, so they need equal channels "
                f"(e.g. axis_dims={self.default_axis_dims(dim)})"
            )
        if isinstance(temporal_spacing, bool) or not isinstance(temporal_spacing, int | float):
            raise ValueError(f"temporal_spacing={temporal_spacing!r} must be a number (the paper's δ; its code uses 2)")
        if not (temporal_spacing > 0 and math.isfinite(temporal_spacing)):
            raise ValueError(
                f"temporal_spacing={temporal_spacing} must be positive and finite (the paper's δ; its code uses 2)"
            )
        self.temporal_spacing, self.diagonal = float(temporal_spacing), bool(diagonal)

    @classmethod
    def default_axis_dims(cls, dim: int, axes: int = 3) -> tuple[int, int, int]:
        """(t, h, w) channels: h and w an equal even share of three quarters of the pairs, time the rest (at least a
        quarter): 128 → 32/48/48 (Qwen2-VL's 16/24/24 pairs), 64 → 16/24/24, 32 → 8/12/12, 24 → 8/8/8."""
        pairs = dim // 2
        spatial = 2 * ((3 * pairs) // 8)  # pairs of h and w together, even: they alternate
        if spatial < 2 or pairs - spatial < 1:
            raise ValueError(f"dim={dim} is too small for VideoRoPE: it needs a head dim of 8 or more")
        return (2 * (pairs - spatial), spatial, spatial)

    def extents(self, grid: tuple[float, ...]) -> tuple[float, float, float]:
        """How far the coordinates of time's, the rows' and the columns' pairs reach over a (T, H, W) grid, counted as
        axial RoPE counts n positions: ``δ·T``; ``δ·T + H`` and ``δ·T + W`` on the diagonal, where h and w advance with
        time (H and W without it)."""
        T, H, W = grid
        time = self.temporal_spacing * T
        return (time, time + H, time + W) if self.diagonal else (time, H, W)

    def pair_scales(self, scaling: Scaling) -> tuple[float, ...]:
        """The scale factor of the pairs of t, h and w: the growth of their coordinate's extent from the reference grid
        to the grid the per-axis factors make of it (the factors themselves without a reference grid)."""
        if scaling.ref_grid is None:
            return scaling.scales
        grown = [n * s for n, s in zip(scaling.ref_grid, scaling.scales, strict=True)]
        return tuple(a / b for a, b in zip(self.extents(grown), self.extents(scaling.ref_grid), strict=True))

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """The ``(3, dim // 2)`` float64 frequency matrix over (t, h, w): one ladder over the rotated pairs, the
        spatial pairs first (even: h, odd: w), time's last (the lowest); unrotated pairs (if any) zero. Under NTK or
        YaRN each axis's pairs take the ladder rescaled at their own scale (:meth:`pair_scales`)."""
        ext = scaling or Scaling("none", (1.0,) * self.axes)
        spatial, time = (self.axis_dims[1] + self.axis_dims[2]) // 2, self.axis_dims[0] // 2  # pairs of h and w; of t
        scales = self.pair_scales(ext)
        lengths = self.extents(ext.ref_grid) if ext.ref_grid else (0.0,) * 3
        t, h, w = (
            frequency_ladder(2 * (spatial + time), self.theta, ext.mode, s, length, self.yarn_beta)
            for s, length in zip(scales, lengths, strict=True)
        )
        F = torch.zeros(3, self.dim // 2, dtype=torch.float64)
        F[1, 0:spatial:2] = h[0:spatial:2]
        F[2, 1:spatial:2] = w[1:spatial:2]
        F[0, spatial : spatial + time] = t[spatial:]
        return F

    def temperature(self, scaling: Scaling) -> Tensor | None:
        """YaRN's attention temperature of each pair, at its axis's scale (:meth:`pair_scales`)."""
        scales = self.pair_scales(scaling)
        if scaling.mode != "yarn" or max(scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        for axis, pairs in enumerate(self.frequency_groups()):
            m[pairs] = yarn_temperature(scales[axis])
        return m

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        return super().encode(diagonal_coordinates(coords, self.temporal_spacing, self.diagonal), scaling, build)

    def frequency_groups(self) -> list[Tensor]:
        """p-RoPE cuts each axis's pairs on their own (t, h and w each keep the fraction p of their frequencies): the
        pairs interleave, so the groups follow the frequency matrix, not contiguous sections."""
        F = self.frequency_matrix()
        return [torch.nonzero(F[axis]).flatten() for axis in range(self.axes)]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, temporal_spacing={self.temporal_spacing}, diagonal={self.diagonal}"
