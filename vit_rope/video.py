"""Video ViT: tubelet patch embedding and 3D RoPE over (t, h, w), on the image models' trunk.

Clips are ``(B, C, T, H, W)``; a Conv3d cuts them into tubelets (default 2×16×16, as ViViT / VideoMAE /
V-JEPA), whose integer (time, row, column) indices feed a 3-axis rotary embedding. By default the head dim is
split into equal even sections (64 → 20/20/20, 4 unrotated, as V-JEPA 2); ``rope_axis_dims`` chooses others,
e.g. ``(16, 24, 24)``. Any T the tubelet depth divides and any H×W the patch divides runs.

Image checkpoints start a video model (the usual way to fine-tune one): the patch embedding is inflated over
time (each frame's kernel = the image kernel / tubelet depth, so a still clip embeds like its image) and the
trunk is shared; an image APE is repeated over time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.layers._fx import register_notrace_function
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from torch import Tensor, nn

from .vit import (
    SIZES,
    VisionTransformer,
    checkpoint_embed_grid,
    checkpoint_filter_fn,
    checkpoint_prefix_slots,
    resample_grid_embed,
    unwrap_state_dict,
)

__all__ = ["TubeletEmbed", "VideoVisionTransformer", "inflate_image_checkpoint"]


class TubeletEmbed(nn.Module):
    """Non-overlapping ``tubelet × patch × patch`` Conv3d; output channels-last ``(B, T', H', W', C)``."""

    def __init__(self, img_size=224, num_frames=16, tubelet_size=2, patch_size=16, in_chans=3, embed_dim=768):
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.tubelet_size = tubelet_size
        self.img_size = to_2tuple(img_size)
        self.num_frames = num_frames
        self.dynamic_img_pad = False
        self.grid_size = (
            num_frames // tubelet_size,
            self.img_size[0] // self.patch_size[0],
            self.img_size[1] // self.patch_size[1],
        )
        kernel = (tubelet_size, *self.patch_size)
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=kernel, stride=kernel)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x).permute(0, 2, 3, 4, 1)


@register_notrace_function
def check_video_input(x: Tensor, in_chans: int, tubelet: int, patch_size: Sequence[int]) -> None:
    """One clear error for input a video model cannot take."""
    if x.ndim != 5:
        hint = (
            " (an image batch? use a vit_rope_* image model, or add a time axis: x.unsqueeze(2))" if x.ndim == 4 else ""
        )
        raise ValueError(f"video models take (B, C, T, H, W) clips, got shape {tuple(x.shape)}{hint}")
    if x.shape[1] != in_chans:
        raise ValueError(
            f"clip has {x.shape[1]} channels (dim 1 of (B, C, T, H, W)) but the model was built with "
            f"in_chans={in_chans}; pass in_chans={x.shape[1]} or move channels to dim 1"
        )
    T, H, W = x.shape[2:]
    if T % tubelet:
        raise ValueError(f"clip length {T} is not divisible by the tubelet depth {tubelet}; sample a multiple of it")
    if H % patch_size[0] or W % patch_size[1]:
        raise ValueError(
            f"frame size {H}x{W} is not divisible by the patch size {patch_size[0]}x{patch_size[1]}; resize or crop "
            "to a multiple of it"
        )


class VideoVisionTransformer(VisionTransformer):
    """The image trunk over tubelet tokens, with 3D RoPE (or a 3D APE baseline)."""

    def __init__(self, num_frames: int = 16, tubelet_size: int = 2, **kwargs) -> None:
        self._num_frames, self._tubelet_size = num_frames, tubelet_size
        if kwargs.get("pos_embed") == "sincos":
            raise ValueError("pos_embed='sincos' is 2D only; video models take 'rope', 'rope_mixed', 'ape' or 'none'")
        if kwargs.pop("dynamic_img_pad", False):
            raise ValueError("video models do not pad; crop clips to multiples of the tubelet and patch size")
        super().__init__(**kwargs)

    def _make_patch_embed(self, img_size, patch_size, in_chans, embed_dim, dynamic_img_pad) -> nn.Module:
        return TubeletEmbed(img_size, self._num_frames, self._tubelet_size, patch_size, in_chans, embed_dim)

    def _check_input(self, x: Tensor) -> None:
        check_video_input(x, self.in_chans, self.patch_embed.tubelet_size, self.patch_embed.patch_size)

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        raise NotImplementedError("video models take any clip size the tubelet divides; create a new model instead")


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


def inflate_image_checkpoint(state_dict: dict[str, Tensor], model: VideoVisionTransformer) -> dict[str, Tensor]:
    """Adapt an image or video checkpoint to a video model (``pretrained_filter_fn`` of the video models)."""
    state_dict = dict(unwrap_state_dict(state_dict))
    w = state_dict.get("patch_embed.proj.weight")
    video = w is not None and w.ndim == 5  # a video checkpoint: its APE is over (time, rows, cols)
    if w is not None and w.ndim == 4:  # image kernel → each of the tubelet's frames gets kernel / depth
        t = model.patch_embed.tubelet_size
        if w.shape[-2:] != model.patch_embed.patch_size:
            from timm.layers import resample_patch_embed

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
    freqs = state_dict.get("rope.freqs")
    own = model.rope.freqs if model.rope is not None else None
    if freqs is not None and own is not None and freqs.shape != own.shape:
        raise ValueError(
            f"the checkpoint's learned RoPE frequencies rope.freqs {tuple(freqs.shape)} do not map onto the video "
            f"model's {tuple(own.shape)} (three axes): a video RoPE-Mixed model loads only a video RoPE-Mixed "
            "checkpoint of its depth and heads"
        )
    return checkpoint_filter_fn(state_dict, model)


def _cfg(**kwargs):
    return dict(
        url="",
        num_classes=400,
        input_size=(3, 224, 224),  # per frame; clips default to num_frames=16
        pool_size=None,
        crop_pct=1.0,
        interpolation="bicubic",
        fixed_input_size=False,
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="patch_embed.proj",
        classifier="head",
        **kwargs,
    )


default_cfgs = generate_default_cfgs({"vit_rope3d_tiny": _cfg(), "vit_rope3d_small": _cfg(), "vit_rope3d_base": _cfg()})


def _create(variant: str, pretrained: bool, size: str, **kwargs) -> VideoVisionTransformer:
    args = dict(patch_size=16, tubelet_size=2, num_frames=16, num_classes=400, pos_embed="rope", **SIZES[size])
    return build_model_with_cfg(
        VideoVisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=inflate_image_checkpoint,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(args, **kwargs),
    )


@register_model
def vit_rope3d_tiny(pretrained: bool = False, **kwargs) -> VideoVisionTransformer:
    """Video ViT-Ti, 2×16×16 tubelets, 3D RoPE over (t, h, w)."""
    return _create("vit_rope3d_tiny", pretrained, "tiny", **kwargs)


@register_model
def vit_rope3d_small(pretrained: bool = False, **kwargs) -> VideoVisionTransformer:
    """Video ViT-S, 2×16×16 tubelets, 3D RoPE over (t, h, w)."""
    return _create("vit_rope3d_small", pretrained, "small", **kwargs)


@register_model
def vit_rope3d_base(pretrained: bool = False, **kwargs) -> VideoVisionTransformer:
    """Video ViT-B, 2×16×16 tubelets, 3D RoPE over (t, h, w)."""
    return _create("vit_rope3d_base", pretrained, "base", **kwargs)
