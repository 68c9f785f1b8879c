"""Native-resolution input: timm's NaFlex batches, images of different sizes and aspect ratios in one batch.

A batch is a dict (as ``timm.data.NaFlexCollator`` writes it, ``timm.data.create_naflex_loader`` loads it):

* ``patches (B, N, P·P·C)``: each patch's pixels flat in (row, column, channel) order (timm's ``patchify_image``
  default; a video tubelet's in (frame, row, column, channel) order);
* ``patch_coord (B, N, axes)``: each patch's integer index on its image's grid, (y, x) (video: (t, y, x));
* ``patch_valid (B, N)`` bool: which patches are real; the rest is padding (optional: all real).

Each sample's grid is its largest index plus one along each axis. Positions come from the coordinates, never from a
token's place in the row, so any order of the tokens gives the same result; padding is left out of attention and
pooling. The functions here turn the dict into tokens; the models (:mod:`vit_rope.vit`) take it as they take images.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import build_sincos2d_pos_embed
from timm.layers._fx import register_notrace_function
from torch import Tensor, nn

from .checkpoint import resample_grid_embed
from .checks import check_batch

__all__ = ["absolute_positions_of_tokens", "embed_patches", "keep_tokens", "read_batch", "sample_grids"]


# the most patches one sample's grid may span (its largest index plus one, multiplied over the axes): a 16k x 16k
# image of 16-px patches. Past it a coordinate is a broken batch, and an absolute embedding resampled to that grid
# would ask for more memory than any machine has.
MAX_GRID_PATCHES = 1 << 20


def read_batch(
    batch: dict, patch_size: tuple[int, ...], in_chans: int, axes: int, weight: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """``patches``, ``patch_coord`` and ``patch_valid`` of a NaFlex dict, checked; one clear error for a bad one.
    ``weight``: the patch embedding's, whose device (and dtype, outside autocast) the patches must have."""
    if not isinstance(batch, dict) or "patches" not in batch or "patch_coord" not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise ValueError(
            f"a native-resolution batch is a dict with 'patches', 'patch_coord' (and 'patch_valid'); got {keys}"
        )
    patches, coord = batch["patches"], batch["patch_coord"]
    valid = batch.get("patch_valid")
    values = math.prod(patch_size) * in_chans
    if not isinstance(patches, Tensor) or patches.ndim != 3 or not patches.is_floating_point():
        got = tuple(patches.shape) if isinstance(patches, Tensor) else type(patches).__name__
        raise ValueError(f"patches is {got}; expected a float tensor (B, N, {values}): each patch's pixels, flat")
    if weight is not None:
        check_batch(patches, weight)
    B, N, width = patches.shape
    if width != values:
        sizes = "×".join(str(p) for p in patch_size)
        raise ValueError(
            f"patches have {width} values each, but this model's patches are {sizes} pixels × {in_chans} channels = "
            f"{values}; patchify with the model's get_patch_size()"
        )
    if not isinstance(coord, Tensor) or tuple(coord.shape) != (B, N, axes) or coord.is_floating_point():
        got = (tuple(coord.shape), coord.dtype) if isinstance(coord, Tensor) else type(coord).__name__
        raise ValueError(f"patch_coord is {got}; expected integer ({B}, {N}, {axes}): each patch's grid index per axis")
    if valid is None:
        valid = torch.ones(B, N, dtype=torch.bool, device=patches.device)
    if not isinstance(valid, Tensor) or tuple(valid.shape) != (B, N) or valid.dtype != torch.bool:
        got = (tuple(valid.shape), valid.dtype) if isinstance(valid, Tensor) else type(valid).__name__
        raise ValueError(f"patch_valid is {got}; expected bool ({B}, {N}): True for each real patch, False for padding")
    for name, t in (("patch_coord", coord), ("patch_valid", valid)):
        if t.device != patches.device:
            raise ValueError(f"{name} is on {t.device} but patches are on {patches.device}; move the whole batch to "
                             "one device")  # fmt: skip
    if N == 0:
        raise ValueError("the batch has no patches (N = 0): every sample needs at least one real patch")
    if not torch.compiler.is_compiling():  # the values are data torch.compile cannot branch on: eager checks them
        check_indices(coord, valid)
    return patches, coord, valid


def check_indices(coord: Tensor, valid: Tensor) -> None:
    """Every sample has a real patch, and its real patches' indices lie on a grid of at most
    :data:`MAX_GRID_PATCHES` patches, counted from 0."""
    if not bool(valid.any(dim=1).all()):
        raise ValueError("a sample of the batch has no real patch (patch_valid all False): every sample needs one")
    if bool((coord[valid] < 0).any()):
        raise ValueError("patch_coord has a negative index among the real patches: indices count from 0 on each grid")
    spans = sample_grids(coord, valid).double().prod(dim=-1)  # (B,) patches of each sample's grid
    if bool((spans > MAX_GRID_PATCHES).any()):
        i = int(spans.argmax())
        raise ValueError(
            f"sample {i}'s patch_coord reaches index {coord[i][valid[i]].amax(dim=0).tolist()}, a grid of "
            f"{spans[i]:.3g} patches (at most {MAX_GRID_PATCHES}): indices are each patch's row and column on its "
            "own image's grid, counted from 0 (timm's NaFlex collator writes them so)"
        )


def sample_grids(coord: Tensor, valid: Tensor) -> Tensor:
    """Each sample's grid ``(B, axes)``: its real patches' largest index plus one along each axis."""
    return coord.masked_fill(~valid.unsqueeze(-1), -1).amax(dim=1) + 1


def embed_patches(patches: Tensor, proj: nn.Conv2d | nn.Conv3d) -> Tensor:
    """Flat patches ``(B, N, P·P·C)`` → tokens ``(B, N, D)`` through a patch embedding's convolution, as a linear map
    (its weight's channels moved last to match the patches' pixel order): the same as the convolution of the image."""
    weight = rearrange(proj.weight, "d c ... -> d (... c)")  # (D, C, *P) → (D, P·P·C)
    return F.linear(patches.to(weight.dtype), weight, proj.bias)


@register_notrace_function  # a leaf for torch.fx: it loops over the batch's grids
def absolute_positions_of_tokens(
    x: Tensor, coord: Tensor, grids: Tensor, pos_embed: Tensor | None, sincos: bool, ref_grid: tuple[int, ...]
) -> Tensor:
    """Tokens ``(B, N, C)`` with the absolute embedding of each one's grid index: APE resampled to each sample's grid
    (as an image of that grid gets it), or 2D sin-cos of that grid."""
    if pos_embed is None and not sincos:
        return x
    added = torch.zeros_like(x)
    for grid in grids.unique(dim=0):  # one resampling per distinct grid in the batch
        size = tuple(int(n) for n in grid)
        if pos_embed is not None:
            table = resample_grid_embed(pos_embed, size, ref_grid)[0]  # (prod(size), C)
        else:
            table = build_sincos2d_pos_embed(list(size), x.shape[-1], device=x.device).to(x.dtype)
        samples = (grids == grid).all(dim=1)
        index = coord[samples].clamp(min=0)  # padding may carry any index: clamped, and zeroed by the caller
        index = torch.minimum(index, grid - 1)
        flat = torch.zeros(index.shape[:-1], dtype=torch.long, device=x.device)
        for axis, n in enumerate(size):  # row-major index on the grid
            flat = flat * n + index[..., axis]
        added[samples] = table.to(x.dtype)[flat]
    return x + added


def keep_tokens(valid: Tensor, rate: float, prefix: int = 0) -> Tensor:
    """Token dropping in a native-resolution batch: the rows ``(B, prefix + K)`` each sample keeps, its ``prefix``
    tokens first, then ``K = N · (1 - rate)`` (at least 1) of its ``N`` patch tokens, drawn at random among the real
    ones first, so that a sample keeps padding only when it has no more real tokens to keep."""
    B, N = valid.shape
    keep = max(1, int(N * (1 - rate)))
    scores = torch.rand(B, N, device=valid.device) + (~valid).to(torch.float32)  # padding sorts after real tokens
    kept = scores.argsort(dim=1)[:, :keep] + prefix
    return torch.cat((torch.arange(prefix, device=valid.device).expand(B, prefix), kept), dim=1)
