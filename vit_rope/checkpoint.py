"""Loading weights into the models: timm's checkpoints and ours, at any size, patch size or channel count.

Checkpoints never hold RoPE tables, so they load at any resolution. An absolute embedding is resampled where its grid
follows from its length; the patch kernel is resampled to another patch size and adapted from RGB to another
``in_chans`` by timm's rule; image checkpoints inflate into video models.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from einops import rearrange
from timm.layers import resample_abs_pos_embed, resample_patch_embed
from timm.models import adapt_input_conv
from torch import Tensor, nn

__all__ = ["RECORD", "check_loaded_weights", "checkpoint_filter_fn", "dtype_kind", "inflate_image_checkpoint",
           "recorded_kind", "resample_grid_embed", "unwrap_state_dict"]  # fmt: skip

RECORD = "vit_rope.record"  # the metadata key of a model.safetensors this package wrote: what model the weights are


def dtype_kind(dtype: torch.dtype) -> str:
    """A dtype's kind: float, complex, bool or integer (loading casts within a kind, never across one)."""
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    return "float" if dtype.is_floating_point else "integer"


def check_loaded_weights(module: nn.Module, state_dict: dict, prefix: str, *_) -> None:
    """``load_state_dict``'s check of the weights it is given (a pre-hook of our models): a tensor of another kind
    than the model's (integer or bool where the model has floats: torch would cast it silently) or a float tensor
    holding NaN or inf (a damaged file, or a run that diverged) is one error naming it. Float weights of another
    precision (bf16, fp16 into fp32) load as before."""
    own, floats = module.state_dict(), {}
    for key, value in state_dict.items():
        mine = own.get(key[len(prefix) :]) if key.startswith(prefix) else None
        if mine is None or not isinstance(value, Tensor) or value.device.type == "meta":
            continue
        if dtype_kind(value.dtype) != dtype_kind(mine.dtype):
            raise ValueError(
                f"weight {key} is {value.dtype} but the model's is {mine.dtype}: {dtype_kind(value.dtype)} values "
                "are not weights of this model (torch would cast them silently); load the file the model was saved to"
            )
        if value.is_floating_point():
            floats.setdefault(value.device, {})[key] = value
    for tensors in floats.values():  # one wait a device, not one a tensor
        finite = torch.stack([torch.isfinite(v).all() for v in tensors.values()])
        if not bool(finite.all()):
            key = list(tensors)[int((~finite).nonzero()[0])]
            raise ValueError(
                f"weight {key} holds NaN or inf: the checkpoint is damaged, or saved from a run that diverged; load "
                "weights saved before it diverged"
            )


def recorded_kind(path: str) -> dict | None:
    """The record a model.safetensors this package wrote keeps in its metadata (its ``model`` and ``kind``), read from
    the file's header alone; None where there is none (timm's files, another tool's) or it cannot be read (the
    loader then says why)."""
    try:
        from safetensors import safe_open

        with safe_open(path, "pt") as f:
            record = json.loads((f.metadata() or {}).get(RECORD) or "null")
    except Exception:  # (an unreadable file: the weights' loader names it)
        return None
    fields_ok = isinstance(record, dict) and all(isinstance(record.get(k), str) for k in ("model", "kind"))
    return record if fields_ok else None


def unwrap_state_dict(state_dict: dict) -> dict:
    """The weights inside a training checkpoint (EMA weights first), or the dict itself."""
    for key in ("model_ema", "state_dict_ema", "model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            return state_dict[key]
    return state_dict


def resample_grid_embed(pos_embed: Tensor, grid: Sequence[int], ref_grid: Sequence[int]) -> Tensor:
    """An absolute embedding over ``ref_grid`` resampled to ``grid``: bicubic in 2D (align_corners=False, no
    antialias, RoPE-ViT's protocol, via timm's ``resample_abs_pos_embed``), trilinear in 3D."""
    if tuple(grid) == tuple(ref_grid):
        return pos_embed
    if len(grid) == 2:
        return resample_abs_pos_embed(pos_embed, list(grid), list(ref_grid), num_prefix_tokens=0, antialias=False)
    C = pos_embed.shape[-1]
    pe = rearrange(pos_embed.reshape(1, *ref_grid, C), "1 ... c -> 1 c ...").float()
    pe = F.interpolate(pe, size=tuple(grid), mode="trilinear", align_corners=False)
    return rearrange(pe, "1 c ... -> 1 (...) c").to(pos_embed.dtype)


def checkpoint_prefix_slots(state_dict: dict[str, Tensor]) -> tuple[int, ...]:
    """How many prefix-token rows a checkpoint's APE may start with, from the tokens it holds: none (DeiT-III and
    ours), or one a cls, distillation and register token (classic timm ViTs, DeiT distilled, register ViTs)."""
    cls = int("cls_token" in state_dict) + int("dist_token" in state_dict)
    reg = state_dict["reg_token"].shape[1] if "reg_token" in state_dict else 0
    return tuple(sorted({0, cls, reg, cls + reg}))


def checkpoint_embed_grid(
    pos_embed: Tensor, prefixes: Sequence[int], grid: Sequence[int], what: str = "checkpoint pos_embed"
) -> tuple[Tensor, list[int]]:
    """A checkpoint's image APE ``(1, n, C)`` without its prefix-token rows (one of ``prefixes``), and its grid: the
    model's ``grid`` where the rows left are that many, else the square they make. Any other n is a grid that cannot
    be told from n alone, and gets one clear error rather than a guess."""
    n = pos_embed.shape[1]
    for fits in (lambda m: m == math.prod(grid), lambda m: math.isqrt(m) ** 2 == m):
        for prefix in prefixes:
            if n > prefix and fits(n - prefix):
                side = math.isqrt(n - prefix)
                src = list(grid) if n - prefix == math.prod(grid) else [side, side]
                return pos_embed[:, prefix:], src
    raise ValueError(
        f"{what} has {n} positions: after {' or '.join(map(str, prefixes))} prefix rows, neither the model's grid "
        f"{tuple(grid)} nor a square, so its grid cannot be inferred; create the model at the checkpoint's img_size "
        "(it takes other sizes as they come, the APE resampled on the fly) or call set_input_size after loading"
    )


def _adapt_patch_kernel(v: Tensor, own: Tensor) -> Tensor:
    """A checkpoint's patch kernel resampled to the model's patch size and adapted to its in_chans (from RGB only)."""
    if v.ndim == 4 and v.shape[-2:] != own.shape[-2:]:
        v = resample_patch_embed(v, list(own.shape[-2:]))
    if v.shape[1] != own.shape[1]:
        if v.shape[1] != 3:
            raise ValueError(
                f"the checkpoint's patch embedding takes in_chans={v.shape[1]}, the model in_chans={own.shape[1]}; "
                f"only 3-channel weights are adapted (timm's rule): create the model with in_chans={v.shape[1]}"
            )
        kernel = v.shape[2:]  # timm's adaptation from RGB: summed for one channel, tiled and rescaled for more
        v = adapt_input_conv(own.shape[1], v.flatten(2, -2)).unflatten(2, kernel[:-1])
    return v


def rename_timm_keys(state_dict: dict[str, Tensor]) -> dict[str, Tensor]:
    """timm Eva's names → ours: ``gamma_1/2`` → ``ls1/2.gamma``; ``attn.q_bias`` and ``attn.v_bias`` (k has none) →
    one ``attn.qkv.bias``; its mixed frequencies ``rope.freqs (2=(x, y), depth, heads, P)`` →
    ``position_encoding.family.frequencies (depth, heads, axes=(row, col), P)``."""
    out = {}
    for k, v in state_dict.items():
        k = k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
        if k == "rope.freqs" and v.ndim == 4 and v.shape[0] == 2:
            k, v = "position_encoding.family.frequencies", torch.stack((v[1], v[0]), dim=2)
        if k.endswith("attn.q_bias"):
            k, v = k.replace("q_bias", "qkv.bias"), torch.cat((v, torch.zeros_like(v), state_dict[k[:-6] + "v_bias"]))
        if k.endswith("attn.v_bias"):
            continue
        out[k] = v
    return out


def check_recorded_kind(model: nn.Module) -> None:
    """The weights timm is loading into ``model`` (its ``pretrained_cfg``'s file: a ``local-dir:`` folder's
    model.safetensors, or a file) are of the kind their record names, where they have one: weights of RoPE and of
    LookHere share names and shapes, and only the record tells them apart."""
    file = (getattr(model, "pretrained_cfg", None) or {}).get("file")
    file = os.path.join(file, "model.safetensors") if isinstance(file, str) and os.path.isdir(file) else file
    record = recorded_kind(file) if isinstance(file, str) and file.endswith(".safetensors") else None
    kind = model.weights_kind() if callable(getattr(model, "weights_kind", None)) else None
    if record is not None and kind is not None and record["kind"] != kind:
        raise ValueError(
            f"{file} holds the weights of {record['model']} ({record['kind']}), not of this model ({kind}): their "
            "names and shapes agree, but they mean other things; create the model its config.json names, unchanged"
        )


def _resized(key: str, value: Tensor, own: Tensor, model: nn.Module, state_dict: dict[str, Tensor]) -> Tensor:
    """A checkpoint's APE resampled to the model's grid, its patch kernel to the model's patch size and channels;
    any other tensor as it is."""
    if key == "pos_embed" and value.shape != own.shape:
        grid = list(model.patch_embed.grid_size)
        value, src = checkpoint_embed_grid(value, checkpoint_prefix_slots(state_dict), grid)
        return resample_grid_embed(value, grid, src)
    if key == "patch_embed.proj.weight" and value.shape != own.shape:
        return _adapt_patch_kernel(value, own)
    return value


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Adapt a checkpoint to an image ``model``: ours at any size/class count, timm's DeiT-III and RoPE ViTs (Eva).

    * timm Eva's names (:func:`rename_timm_keys`);
    * APE resampled bicubically to the model's grid (rows of prefix tokens, as classic and register ViTs keep, dropped);
    * patch embedding resampled to another patch size, and adapted to another ``in_chans`` (timm's rule);
    * a classifier of another size, or none, is left to the model's own initialisation. Any other key the model has
      and the checkpoint lacks, or the other way round, is an error naming it: timm loads non-strictly when the head
      changes, and another model's weights (APE into RoPE, another depth) must not load half-way.
    """
    check_recorded_kind(model)
    state_dict = rename_timm_keys(unwrap_state_dict(state_dict))
    own = model.state_dict()
    out: dict[str, Tensor] = {}
    unexpected = []
    for k, v in state_dict.items():
        if k not in own:
            if not k.startswith("head."):  # a model without a classifier drops the checkpoint's
                unexpected.append(k)
            continue
        v = _resized(k, v, own[k], model, state_dict)
        if v.shape != own[k].shape:
            if k.startswith("head."):  # another class count: keep the model's fresh classifier, and say so
                if k == "head.weight":
                    warnings.warn(
                        f"the checkpoint's classifier has {v.shape[0]} classes and the model {own[k].shape[0]}: the "
                        "model's head is newly initialised (train it before using its outputs)",
                        stacklevel=2,
                    )
                continue
            raise ValueError(
                f"checkpoint tensor {k} has shape {tuple(v.shape)} but the model expects {tuple(own[k].shape)}; "
                "create the model with the checkpoint's embed_dim/depth/num_heads"
            )
        out[k] = v
    missing = [k for k in own if k not in out and not k.startswith("head.")]
    if missing or unexpected:
        lacks = [f"it lacks the model's {_some(missing)}"] if missing else []
        has = [f"it has {_some(unexpected)}, which the model lacks"] if unexpected else []
        raise ValueError(
            f"the checkpoint does not fit the model: {'; '.join(lacks + has)} (only the classifier head may differ); "
            "create the model the checkpoint was saved from (its pos_embed, depth, reg_tokens, ...) or load this "
            "model's own checkpoint"
        )
    return {**{k: v for k, v in own.items() if k.startswith("head.")}, **out}  # a missing head keeps its init


def _some(keys: list[str], most: int = 8) -> str:
    """Up to ``most`` key names of a list, and how many more."""
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return f"{keys[:most]}{more}"


def video_embed_grid(n: int, grid: tuple[int, int, int]) -> tuple[int, int, int]:
    """The (time, rows, cols) grid of a video checkpoint's APE of n rows, for a model of ``grid``: the model's frame
    grid with another number of time steps, or its time steps over another square frame grid, whichever alone fits
    n. Where neither or both fit, n cannot tell the grid, and that is one clear error rather than a guess."""
    T, H, W = grid
    fits = []
    if n % (H * W) == 0:
        fits.append((n // (H * W), H, W))
    side = math.isqrt(n // T)
    if n % T == 0 and side * side == n // T:
        fits.append((T, side, side))
    if len(set(fits)) == 1:
        return fits[0]
    raise ValueError(
        f"the video checkpoint's pos_embed has {n} positions, which fit {' and '.join(map(str, fits)) or 'neither'} "
        f"of the (time, rows, cols) grids tried against the model's {grid}; create the model with the checkpoint's "
        "num_frames and img_size: it takes clips of other sizes as they come, the APE resampled on the fly"
    )


def inflate_image_checkpoint(state_dict: dict[str, Tensor], model: nn.Module) -> dict[str, Tensor]:
    """Adapt an image or video checkpoint to a video model (``pretrained_filter_fn`` of the video models): the image
    kernel inflated over time (each frame's kernel = kernel / tubelet depth, so a still clip embeds like its image),
    an image APE repeated over time, a video APE resampled trilinearly."""
    state_dict = rename_timm_keys(unwrap_state_dict(state_dict))
    w = state_dict.get("patch_embed.proj.weight")
    video = w is not None and w.ndim == 5  # a video checkpoint: its APE is over (time, rows, cols)
    if w is not None and w.ndim == 4:
        t = model.patch_embed.tubelet_size
        if w.shape[-2:] != model.patch_embed.patch_size:
            w = resample_patch_embed(w, list(model.patch_embed.patch_size))
        state_dict["patch_embed.proj.weight"] = w.unsqueeze(2).repeat(1, 1, t, 1, 1) / t
    pe = state_dict.get("pos_embed")
    if pe is not None and model.pos_embed is not None:  # (an APE the model lacks is left for the filter to refuse)
        T, H, W = model.patch_embed.grid_size
        n = pe.shape[1]
        if n == T * H * W:
            state_dict["pos_embed"] = pe
        elif video:  # another clip length or frame size: trilinear, as a forward pass at that size resamples it
            state_dict["pos_embed"] = resample_grid_embed(pe, (T, H, W), video_embed_grid(n, (T, H, W)))
        else:  # an image APE: spatial grid, prefix slots dropped, resampled, repeated over time
            pe, src = checkpoint_embed_grid(pe, checkpoint_prefix_slots(state_dict), (H, W), "the image pos_embed")
            pe = resample_grid_embed(pe, (H, W), src)
            state_dict["pos_embed"] = pe.reshape(1, 1, H * W, -1).expand(1, T, H * W, -1).reshape(1, T * H * W, -1)
    own = model.state_dict()
    learned = [k for k in state_dict if k.startswith("position_encoding.") and k in own]
    for k in [k for k in learned if state_dict[k].shape != own[k].shape]:
        raise ValueError(
            f"the checkpoint's learned position parameter {k} {tuple(state_dict[k].shape)} does not map onto the "
            f"video model's {tuple(own[k].shape)} (three axes): a video model with a learned position encoding loads "
            "only a video checkpoint of its family, depth and heads"
        )
    return checkpoint_filter_fn(state_dict, model)
