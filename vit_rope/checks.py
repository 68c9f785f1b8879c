"""Checks at the models' boundary: input they cannot take and arguments out of range, each one clear error that
says what is wrong and how to fix it (rather than a failure deep inside a convolution or attention)."""

import math
import operator
from typing import Any

import timm.models
import torch
from timm.layers._fx import register_notrace_function
from torch import Tensor

__all__ = ["check_batch", "check_global_pool", "check_timm", "check_image_input", "check_img_size", "check_init_values",
           "check_num_classes", "check_rates", "check_sizes", "check_tensor"]  # fmt: skip


def check_timm() -> None:
    """One clear error at import where the installed timm is older than 1.0.31, the first whose ``create_model``
    records a model's arguments for ``save_for_hf``'s config.json: with an older one a saved model folder would be
    rebuilt with the default arguments (another ``rope_theta``, say: a different model, silently), and below 1.0.21
    the trunk does not build at all."""
    if not hasattr(timm.models, "get_model_args"):  # new in 1.0.31, with the recording
        raise ImportError(
            f"vit-rope needs timm>=1.0.31, whose create_model records each model's arguments for a saved folder's "
            f"config.json (timm.models.get_model_args); this Python has timm {timm.__version__}, without it: "
            "pip install -U 'timm>=1.0.31'"
        )


@register_notrace_function  # torch.fx: a leaf
def check_image_input(x: Tensor, in_chans: int, patch_size: Any, pad: bool, weight: Tensor) -> None:
    """One clear error for input an image model cannot take."""
    check_tensor(x)
    if x.ndim != 4:
        hint = " (a video clip? use a vit_rope3d_* model)" if x.ndim == 5 else ""
        raise ValueError(f"image models take (B, C, H, W) input, got shape {tuple(x.shape)}{hint}")
    check_batch(x, weight)
    if x.shape[1] != in_chans:
        raise ValueError(
            f"input has {x.shape[1]} channels but the model was built with in_chans={in_chans}; "
            f"pass in_chans={x.shape[1]} to timm.create_model (pretrained patch weights are adapted)"
        )
    H, W = x.shape[-2:]
    if min(H, W) < 1:
        raise ValueError(f"input of shape {tuple(x.shape)} has no pixels (H, W = {H}, {W}); pass images of at "
                         "least one patch")  # fmt: skip
    if not pad and (H % patch_size[0] or W % patch_size[1]):
        raise ValueError(
            f"input size {H}x{W} is not divisible by the patch size {patch_size[0]}x{patch_size[1]}; resize or crop "
            "to a multiple of it, or create the model with dynamic_img_pad=True to pad instead"
        )


def check_tensor(x: object) -> None:
    """A model's input is a torch tensor (or a NaFlex dict, read elsewhere): a NumPy array, a list or None is one
    error here, rather than an attribute error inside (or a NumPy array's device, 'cpu', misread as torch's)."""
    if not isinstance(x, Tensor):
        hint = ", e.g. torch.from_numpy(x)" if type(x).__module__ == "numpy" else ""
        raise ValueError(f"input is a {type(x).__module__}.{type(x).__qualname__}; pass a torch tensor{hint} (or a "
                         "NaFlex dict)")  # fmt: skip


def check_batch(x: Tensor, weight: Tensor) -> None:
    """An empty batch, input on another device than the weights, or of another floating dtype outside autocast, is
    an error here rather than deep inside a convolution."""
    dtype = weight.dtype
    if x.device != weight.device and weight.device.type != "meta":  # (meta: weights offloaded until their hook runs)
        raise ValueError(
            f"input is on {x.device} but the model's weights are on {weight.device}; move one to the other "
            f"(x.to({str(weight.device)!r}) or model.to({str(x.device)!r}))"
        )
    if x.shape[0] == 0:
        raise ValueError("the batch is empty (batch size 0); pass at least one sample")
    if not x.is_floating_point():
        raise ValueError(f"input has dtype {x.dtype}; convert it to a float tensor, e.g. x.float() / 255")
    if x.dtype != dtype and not torch.is_autocast_enabled(x.device.type):
        raise ValueError(
            f"input has dtype {x.dtype} but the model's weights are {dtype}; convert one to the other "
            f"(x.to({dtype}) or model.to({x.dtype})), or run under torch.autocast"
        )


def check_global_pool(global_pool: str, class_token: bool) -> None:
    """One clear error for a pooling the model cannot do."""
    if global_pool not in ("", "token", "avg", "max"):
        raise ValueError(f"global_pool={global_pool!r}: choose '', 'token', 'avg' or 'max'")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without one")


def check_sizes(
    embed_dim: int, depth: int, num_heads: int, mlp_ratio: float, reg_tokens: int, patch_size=16, in_chans: int = 3
) -> None:
    """Model sizes out of range: one clear error naming the argument."""
    patch = tuple(patch_size) if isinstance(patch_size, tuple | list) else (patch_size,)
    for name, value, low in (("embed_dim", embed_dim, 1), ("depth", depth, 1), ("num_heads", num_heads, 1),
                             ("reg_tokens", reg_tokens, 0), ("in_chans", in_chans, 1),
                             *(("patch_size", p, 1) for p in patch)):  # fmt: skip
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            shown = patch_size if name == "patch_size" else value
            raise ValueError(f"{name}={shown!r} must be an integer of at least {low}")
    if not mlp_ratio > 0:
        raise ValueError(f"mlp_ratio={mlp_ratio} must be positive")
    if embed_dim % num_heads:
        raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; choose a divisor")


def check_img_size(img_size: Any) -> tuple[int, int]:
    """An image size, one whole number of pixels or two (height, width), each at least 1, as (height, width)."""
    sizes = tuple(img_size) if isinstance(img_size, tuple | list) else (img_size,) * 2
    try:  # whole numbers: ints, NumPy's, a torch.Size's (operator.index takes them, not 32.0 nor True)
        if len(sizes) != 2 or any(isinstance(n, bool) or operator.index(n) < 1 for n in sizes):
            raise TypeError
    except TypeError:
        raise ValueError(
            f"img_size={img_size!r}: give a whole number of pixels, or two (height, width), at least 1"
        ) from None
    return operator.index(sizes[0]), operator.index(sizes[1])


def check_init_values(init_values: float | None) -> None:
    """LayerScale's initial value: a finite number, or None/0 for no LayerScale (a NaN makes every output NaN)."""
    if init_values is not None and not (isinstance(init_values, int | float) and math.isfinite(init_values)):
        raise ValueError(f"init_values={init_values!r} must be a finite number (0 or None: no LayerScale)")


def check_num_classes(num_classes: int) -> None:
    """A classifier's class count: 0 (no head: features) or more."""
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 0:
        raise ValueError(f"num_classes={num_classes!r} must be a whole number, 0 (features, no head) or more")


def check_rates(**rates: float) -> None:
    """Dropout-like rates must lie in [0, 1): one clear error naming the argument."""
    for name, value in rates.items():
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name}={value} must be in [0, 1)")
