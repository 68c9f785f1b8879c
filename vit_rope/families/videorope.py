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
attention between patch tokens is exactly relative. Extrapolation: the coordinate modes; the one interleaved ladder
has no per-axis ladder for NTK or YaRN to rescale.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..tables import Build, RotaryTable
from . import register_family
from .axial import frequency_ladder
from .base import PairFamily, Scaling

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

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        temporal_spacing: float = 2.0,
        diagonal: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(dim, axes, **kwargs)
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

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """The ``(3, dim // 2)`` float64 frequency matrix over (t, h, w): one ladder over the rotated pairs, the
        spatial pairs first (even: h, odd: w), time's last (the lowest); unrotated pairs (if any) zero."""
        spatial, time = (self.axis_dims[1] + self.axis_dims[2]) // 2, self.axis_dims[0] // 2  # pairs of h and w; of t
        ladder = frequency_ladder(2 * (spatial + time), self.theta)
        F = torch.zeros(3, self.dim // 2, dtype=torch.float64)
        F[1, 0:spatial:2] = ladder[0:spatial:2]
        F[2, 1:spatial:2] = ladder[1:spatial:2]
        F[0, spatial : spatial + time] = ladder[spatial:]
        return F

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        return super().encode(diagonal_coordinates(coords, self.temporal_spacing, self.diagonal), scaling, build)

    def frequency_groups(self) -> list[Tensor]:
        """p-RoPE cuts each axis's pairs on their own (t, h and w each keep the fraction p of their frequencies): the
        pairs interleave, so the groups follow the frequency matrix, not contiguous sections."""
        F = self.frequency_matrix()
        return [torch.nonzero(F[axis]).flatten() for axis in range(self.axes)]

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, temporal_spacing={self.temporal_spacing}, diagonal={self.diagonal}"
