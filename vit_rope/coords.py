"""Token coordinates: the first stage of every position encoding, shared by all families.

A grid of ``(n_0, n_1, ...)`` patches gives row-major coordinates ``(N, axes)`` in grid axis order (2D: (row, col)),
as integer patch indices or as patch centres normalised to [-1, 1] per axis (DINOv3, Siméoni et al. 2025). The
coordinate-level scaling (extrapolation) modes live here and so apply to every family; the frequency-level ones
(NTK, YaRN) belong to the families with a fixed frequency ladder:

* ``"pi"``: position interpolation (Chen et al. 2023): coordinates / s, per axis ``s = max(n / n_ref, 1)`` (FiT,
  Lu et al. 2024, arXiv 2402.12376) or a given scale;
* ``"normalized"``: the patch centres of any grid, larger or smaller, placed at the same fraction of the reference
  grid's extent (a no-op for normalised coordinates, which are resolution-independent already).

DINOv3's training-only augmentation (shift, per-axis jitter, one shared rescale) also acts on coordinates.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial

import torch
from torch import Tensor

__all__ = ["COORDINATE_MODES", "augment", "grid_coordinates", "scale_factors", "scaled_coordinates"]

COORDINATE_MODES = ("none", "pi", "normalized")  # scaling modes that act on coordinates: every family has them


def grid_coordinates(grid: Sequence[int], normalized: bool = False, device=None, dtype=torch.float64) -> Tensor:
    """Row-major coordinates ``(prod(grid), axes)``: patch indices, or patch centres in [-1, 1] per axis."""
    axes = []
    for n in grid:
        i = torch.arange(n, device=device, dtype=dtype)
        axes.append((i + 0.5) / n * 2 - 1 if normalized else i)
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(grid))


def scale_factors(
    grid: Sequence[int] | None, ref_grid: Sequence[int] | None, scale: Sequence[float] | None, axes: int
) -> tuple[float, ...]:
    """Per-axis scale factors s: the given ``scale``, else ``max(n / n_ref, 1)`` (1 without a grid or reference)."""
    if scale is not None:
        return tuple(scale)
    if grid is None or ref_grid is None:
        return (1.0,) * axes
    return tuple(max(n / r, 1.0) for n, r in zip(grid, ref_grid, strict=True))


def scaled_coordinates(coords: Tensor, mode: str, scales, grid, ref_grid: Sequence[int] | None) -> Tensor:
    """Index coordinates ``([B,] N, axes)`` under a coordinate-level scaling mode (other modes pass them through).
    ``scales`` and ``grid``: one value per axis, or per sample ``(B, 1, axes)`` (native-resolution batches)."""
    as_tensor = partial(torch.as_tensor, dtype=coords.dtype, device=coords.device)
    if mode == "pi":
        return coords / as_tensor(scales)
    if mode == "normalized" and grid is not None:
        # patch centres (i + 0.5) / n of this grid placed at the same fraction of the reference grid
        return (coords + 0.5) * (as_tensor(ref_grid) / as_tensor(grid)) - 0.5
    return coords


def augment(coords: Tensor, shift: float | None, jitter: float | None, rescale: float | None) -> Tensor:
    """DINOv3's coordinate augmentation, drawn once per call: a shift from U[-shift, shift] per axis, a per-axis factor
    log-uniform in [1/jitter, jitter], one shared factor log-uniform in [1/rescale, rescale]."""
    axes = coords.shape[-1]

    def uniform(n: int) -> Tensor:  # U[-1, 1)
        return torch.rand(n, device=coords.device, dtype=coords.dtype) * 2 - 1

    if shift:
        coords = coords + uniform(axes) * shift
    if jitter:
        coords = coords * (uniform(axes) * math.log(jitter)).exp()
    if rescale:
        coords = coords * (uniform(1) * math.log(rescale)).exp()
    return coords
