"""Video ViT: tubelet patch embedding and 3D RoPE over (t, h, w), on the image models' trunk.

Clips are ``(B, C, T, H, W)``; a Conv3d cuts them into tubelets (default 2×16×16, as ViViT / VideoMAE /
V-JEPA), whose integer (time, row, column) indices feed a 3-axis rotary embedding. By default the head dim is
split into equal even sections (64 → 20/20/20, 4 unrotated, as V-JEPA 2); ``rope_axis_dims`` chooses others,
e.g. ``(16, 24, 24)``. Any T the tubelet depth divides and any H×W the patch divides runs.

Image checkpoints start a video model (the usual way to fine-tune one): the patch embedding is inflated over
time (each frame's kernel = the image kernel / tubelet depth, so a still clip embeds like its image) and the
trunk is shared; an image APE is repeated over time. ``abs_pos_embed="ape"`` adds a learned APE over (t, h, w),
resampled trilinearly, to any family ("+ APE").
"""

from dataclasses import replace
from typing import Any

import torch
from einops import rearrange
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import to_2tuple
from timm.layers._fx import register_notrace_function, register_notrace_module
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg
from torch import Tensor, nn

from .checkpoint import inflate_image_checkpoint
from .checks import check_batch, check_tensor
from .vit import SIZES, VisionTransformer

__all__ = ["TubeletEmbed", "VideoVisionTransformer"]


@register_notrace_function  # torch.fx: a leaf
def check_video_input(x: Tensor, in_chans: int, tubelet: int, patch_size: Any, weight: Tensor) -> None:
    """One clear error for input a video model cannot take."""
    check_tensor(x)
    if x.ndim != 5:
        hint = (
            " (an image batch? use a vit_rope_* image model, or add a time axis: x.unsqueeze(2))" if x.ndim == 4 else ""
        )
        raise ValueError(f"video models take (B, C, T, H, W) clips, got shape {tuple(x.shape)}{hint}")
    check_batch(x, weight)
    if x.shape[1] != in_chans:
        raise ValueError(
            f"clip has {x.shape[1]} channels (dim 1 of (B, C, T, H, W)) but the model was built with "
            f"in_chans={in_chans}; pass in_chans={x.shape[1]} or move channels to dim 1"
        )
    T, H, W = x.shape[2:]
    if min(T, H, W) < 1:
        raise ValueError(f"clip of shape {tuple(x.shape)} has an empty axis (T, H, W = {T}, {H}, {W}); each axis "
                         "needs at least one tubelet")  # fmt: skip
    if T % tubelet:
        raise ValueError(f"clip length {T} is not divisible by the tubelet depth {tubelet}; sample a multiple of it")
    if H % patch_size[0] or W % patch_size[1]:
        raise ValueError(
            f"frame size {H}x{W} is not divisible by the patch size {patch_size[0]}x{patch_size[1]}; resize or crop "
            "to a multiple of it"
        )


@register_notrace_module  # a leaf for torch.fx: einops reads the clip's shape, which fx's proxies do not have
class TubeletEmbed(nn.Module):
    """Non-overlapping ``tubelet × patch × patch`` Conv3d; output channels-last ``(B, T', H', W', C)``. It checks its
    clips itself (torch.fx wraps a check as a leaf only where a module's forward calls it)."""

    def __init__(
        self,
        img_size=224,
        num_frames=16,
        tubelet_size=2,
        patch_size=16,
        in_chans=3,
        embed_dim=768,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.patch_size = to_2tuple(patch_size)
        self.tubelet_size = tubelet_size
        self.img_size = to_2tuple(img_size)
        self.num_frames = num_frames
        self.dynamic_img_pad = False
        self.set_input_size(img_size)
        kernel = (tubelet_size, *self.patch_size)
        self.proj = nn.Conv3d(in_chans, embed_dim, kernel_size=kernel, stride=kernel, device=device, dtype=dtype)

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """The nominal frame size (clips of other sizes run as they come); the patch size is the kernel's."""
        if patch_size is not None and tuple(to_2tuple(patch_size)) != tuple(self.patch_size):
            raise ValueError(f"video models keep their patch size {self.patch_size}; create a new model for another")
        self.img_size = to_2tuple(img_size) if img_size is not None else self.img_size
        T, (H, W), (ph, pw) = self.num_frames // self.tubelet_size, self.img_size, self.patch_size
        self.grid_size = (T, H // ph, W // pw)

    def forward(self, x: Tensor) -> Tensor:
        check_video_input(x, self.proj.in_channels, self.tubelet_size, self.patch_size, self.proj.weight)
        return rearrange(self.proj(x), "b c t h w -> b t h w c")


class VideoVisionTransformer(VisionTransformer):
    """The image trunk over tubelet tokens, with 3D RoPE (or a 3D APE baseline)."""

    def __init__(self, num_frames: int = 16, tubelet_size: int = 2, **kwargs) -> None:
        for name, value in (("num_frames", num_frames), ("tubelet_size", tubelet_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an integer of at least 1")
        self._num_frames, self._tubelet_size = num_frames, tubelet_size
        if kwargs.get("pos_embed") == "sincos":
            raise ValueError(
                "pos_embed='sincos' is 2D only; video models take a position-encoding family, 'ape' or 'none'"
            )
        if kwargs.get("abs_pos_embed") == "sincos":
            raise ValueError("abs_pos_embed='sincos' is 2D only; video models add abs_pos_embed='ape' or 'none'")
        if kwargs.pop("dynamic_img_pad", False):
            raise ValueError("video models do not pad; crop clips to multiples of the tubelet and patch size")
        super().__init__(**kwargs)

    def _make_patch_embed(self, img_size, patch_size, in_chans, embed_dim, dynamic_img_pad, dd) -> nn.Module:
        return TubeletEmbed(img_size, self._num_frames, self._tubelet_size, patch_size, in_chans, embed_dim, **dd)

    def _check_input(self, x: Tensor) -> None:
        """The tubelet embedding checks the clip."""


def _cfg(**kwargs):
    return dict(
        url="",
        num_classes=400,
        input_size=(3, 16, 224, 224),  # a clip: (C, T, H, W), as the models take it
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
    # timm's builder reads in_chans off a 3-entry (C, H, W) input size: it gets the frame's, the model keeps the clip's
    cfg = resolve_pretrained_cfg(
        variant, kwargs.pop("pretrained_cfg", None), kwargs.pop("pretrained_cfg_overlay", None)
    )
    channels, frames, *frame = cfg.input_size
    args = dict(patch_size=16, tubelet_size=2, num_frames=frames, num_classes=400, pos_embed="rope", **SIZES[size])
    model = build_model_with_cfg(
        VideoVisionTransformer,
        variant,
        pretrained,
        pretrained_cfg=replace(cfg, input_size=(channels, *frame)),
        pretrained_filter_fn=inflate_image_checkpoint,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(args, **kwargs),
    )
    model.pretrained_cfg = model.default_cfg = cfg.to_dict()
    return model


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
