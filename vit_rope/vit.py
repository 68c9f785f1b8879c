"""Vision Transformer whose position embedding is chosen by argument, registered in timm.

A pre-norm ViT with patch embedding, a cls token (optional register tokens) and LayerScale: the DeiT-III trunk
(Touvron et al. 2022). ``pos_embed`` picks the only part that differs between variants:

* ``"rope"``: axial RoPE (Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024)
* ``"rope_mixed"``: RoPE-Mixed, learned frequencies per layer and head (same paper)
* ``"ape"``: learned absolute embedding over the patch grid (resampled bicubically at other sizes)
* ``"rope_ape"``: both, as RoPE-ViT's "+APE" models
* ``"sincos"``: fixed 2D sin-cos absolute embedding
* ``"none"``

Any input whose sides the patch size divides runs without extra arguments: RoPE positions follow the grid and
APE is resampled with timm's ``resample_abs_pos_embed``. Checkpoints never hold RoPE tables, so they load at
any size. timm's RoPE ViTs (``vit_*_patch16_rope*_224``) and DeiT-III (``deit3_*_patch16_224``) checkpoints load
through :func:`checkpoint_filter_fn` with equal outputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import (
    DropPath,
    LayerScale,
    Mlp,
    PatchEmbed,
    build_sincos2d_pos_embed,
    resample_abs_pos_embed,
    trunc_normal_,
)
from timm.layers._fx import register_notrace_function
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint, named_apply
from timm.models.vision_transformer import init_weights_vit_timm
from torch import Tensor, nn

from .attention import Attention, hooked, parse_rope_targets
from .rope import SCALING_MODES, RotaryEmbedding, RotaryTable

__all__ = ["VisionTransformer", "checkpoint_filter_fn", "POS_EMBEDS"]

POS_EMBEDS = ("rope", "rope_mixed", "ape", "rope_ape", "sincos", "none")


class Block(nn.Module):
    """Pre-norm transformer block with LayerScale (DeiT-III)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = None,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        rope_targets: str = "qk",
    ) -> None:
        super().__init__()
        norm_layer = partial(nn.LayerNorm, eps=1e-6)
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, proj_drop, rope_targets)
        self.ls1 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        self.ls2 = LayerScale(dim, init_values) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, rope: RotaryTable | None = None) -> Tensor:
        x = self.residual(x, self.attn(self.norm1(x), rope), self.ls1, self.drop_path1)
        return self.residual(x, self.mlp(self.norm2(x)), self.ls2, self.drop_path2)

    def residual(self, x: Tensor, y: Tensor, ls: nn.Module, drop_path: nn.Module) -> Tensor:
        """``x + drop_path(ls(y))``. With LayerScale and no stochastic depth this is one pass, ``addcmul``, instead
        of a scaled copy of y and then the sum: the two passes make up about 1 % of a ViT-S forward on a CPU. Not under
        mixed precision (y in another dtype than x): autocast would run addcmul on a float32 copy of y and keep that
        for backward, twice the bytes of the bfloat16 y that the plain product keeps."""
        same_dtype = not isinstance(y, Tensor) or y.dtype == x.dtype  # (a torch.fx Proxy has none)
        if same_dtype and type(ls) is LayerScale and drop_path_off(drop_path) and not hooked(ls, drop_path):
            return torch.addcmul(x, y, ls.gamma)
        return x + drop_path(ls(y))


def drop_path_off(drop_path: nn.Module) -> bool:
    """Whether stochastic depth passes its input through unchanged (none, rate 0, or not in training mode)."""
    return type(drop_path) is nn.Identity or (
        type(drop_path) is DropPath and (drop_path.drop_prob == 0 or not drop_path.training)
    )


@register_notrace_function
def check_image_input(x: Tensor, in_chans: int, patch_size: Sequence[int], pad: bool) -> None:
    """One clear error for input an image model cannot take."""
    if x.ndim != 4:
        hint = " (a video clip? use a vit_rope3d_* model)" if x.ndim == 5 else ""
        raise ValueError(f"image models take (B, C, H, W) input, got shape {tuple(x.shape)}{hint}")
    if x.shape[1] != in_chans:
        raise ValueError(
            f"input has {x.shape[1]} channels but the model was built with in_chans={in_chans}; "
            f"pass in_chans={x.shape[1]} to timm.create_model (pretrained patch weights are adapted)"
        )
    H, W = x.shape[-2:]
    if not pad and (H % patch_size[0] or W % patch_size[1]):
        raise ValueError(
            f"input size {H}x{W} is not divisible by the patch size {patch_size[0]}x{patch_size[1]}; resize or crop "
            "to a multiple of it, or create the model with dynamic_img_pad=True to pad instead"
        )


def check_global_pool(global_pool: str, class_token: bool) -> None:
    """One clear error for a pooling the model cannot do."""
    if global_pool not in ("", "token", "avg", "max"):
        raise ValueError(f"global_pool={global_pool!r}: choose '', 'token', 'avg' or 'max'")
    if global_pool == "token" and not class_token:
        raise ValueError("global_pool='token' needs class_token=True; use global_pool='avg' without one")


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


def resample_grid_embed(pos_embed: Tensor, grid: Sequence[int], ref_grid: Sequence[int]) -> Tensor:
    """An absolute embedding over ``ref_grid`` resampled to ``grid``: bicubic in 2D (align_corners=False, no
    antialias, RoPE-ViT's protocol, via timm's ``resample_abs_pos_embed``), trilinear in 3D."""
    if tuple(grid) == tuple(ref_grid):
        return pos_embed
    if len(grid) == 2:
        return resample_abs_pos_embed(pos_embed, list(grid), list(ref_grid), num_prefix_tokens=0, antialias=False)
    C = pos_embed.shape[-1]
    pe = pos_embed.reshape(1, *ref_grid, C).movedim(-1, 1).float()
    pe = F.interpolate(pe, size=tuple(grid), mode="trilinear", align_corners=False)
    return pe.movedim(1, -1).reshape(1, -1, C).to(pos_embed.dtype)


@register_notrace_function
def embed_positions(
    x: Tensor,
    pos_embed: Tensor | None,
    sincos: bool,
    rope: RotaryEmbedding | None,
    ref_grid: tuple[int, ...],
    rope_vo: bool = False,
) -> tuple[Tensor, RotaryTable | None, tuple[int, ...]]:
    """Patch tokens ``(B, *grid, C)`` → flat tokens with any absolute embedding added, the rotary table of the grid
    (cached; prefix rows identity), and the grid. A leaf for torch.fx: everything here depends on the grid size."""
    grid = tuple(x.shape[1:-1])
    x = x.flatten(1, -2)
    if pos_embed is not None:
        x = x + resample_grid_embed(pos_embed, grid, ref_grid)
    elif sincos:
        x = x + build_sincos2d_pos_embed(list(grid), x.shape[-1], device=x.device).unsqueeze(0).to(x.dtype)
    if rope_vo and rope is not None and rope.has_temperature(grid):
        raise ValueError(
            f"rope_scaling='yarn' at grid {grid} scales q and k by its attention temperature, which would scale v and "
            "the output too with rope_targets turning v or o; use rope_scaling 'pi', 'ntk' or 'normalized' there"
        )
    table = rope.table(grid, device=x.device, dtype=x.dtype) if rope is not None else None
    return x, table, grid


@register_notrace_function
def tokens_to_grid(x: Tensor, grid: tuple[int, ...]) -> Tensor:
    """Spatial tokens ``(B, N, C)`` → ``(B, C, *grid)``."""
    return x.reshape(x.shape[0], *grid, -1).movedim(-1, 1).contiguous()


def _block_with_table(block: nn.Module, x: Tensor, cos: Tensor, sin: Tensor, cis: Tensor, layout: str) -> Tensor:
    """A block run on a rotary table passed as its tensors (for gradient checkpointing)."""
    return block(x, RotaryTable(cos, sin, layout, cis))


class VisionTransformer(nn.Module):
    """ViT with a choice of position embedding; timm's model API (forward_features/head/intermediates, ...)."""

    dynamic_img_size: bool = True

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = 16,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dim: int = 384,
        depth: int = 12,
        num_heads: int = 6,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        init_values: float | None = 1e-5,
        class_token: bool = True,
        reg_tokens: int = 0,
        pos_embed: str = "rope",
        rope_targets: str = "qk",
        rope_theta: float | None = None,
        rope_layout: str = "interleaved",
        rope_axis_dims: Sequence[int] | None = None,
        rope_fraction: float = 1.0,
        rope_coords: str = "index",
        rope_scaling: str = "none",
        rope_scale: float | Sequence[float] | None = None,
        rope_shift: float | None = None,
        rope_jitter: float | None = None,
        rope_rescale: float | None = None,
        rope_mixed_per_layer: bool = True,
        dynamic_img_pad: bool = False,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        weight_init: str = "",
    ) -> None:
        super().__init__()
        if pos_embed not in POS_EMBEDS:
            raise ValueError(f"pos_embed={pos_embed!r}: choose one of {POS_EMBEDS}")
        check_global_pool(global_pool, class_token)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; choose a divisor")
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = int(class_token) + reg_tokens
        self.num_reg_tokens = reg_tokens
        self.has_class_token = class_token
        self.pos_embed_type = pos_embed
        self.grad_checkpointing = False
        self.in_chans = in_chans

        self.patch_embed = self._make_patch_embed(img_size, patch_size, in_chans, embed_dim, dynamic_img_pad)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim)) if reg_tokens else None
        grid = self.patch_embed.grid_size
        # APE covers the patch grid only (no embedding for prefix tokens), as DeiT-III, so it resamples cleanly
        self.pos_embed = nn.Parameter(torch.randn(1, math.prod(grid), embed_dim) * 0.02) if "ape" in pos_embed else None
        self.pos_drop = nn.Dropout(pos_drop_rate)

        head_dim = embed_dim // num_heads
        self.rope: RotaryEmbedding | None = None
        self.rope_per_layer = pos_embed == "rope_mixed" and rope_mixed_per_layer
        self.rope_vo = False
        if pos_embed.startswith("rope"):
            try:
                self.rope = RotaryEmbedding(
                    head_dim,
                    axes=len(grid),
                    theta=rope_theta,
                    layout=rope_layout,
                    axis_dims=rope_axis_dims,
                    rotate_fraction=rope_fraction,
                    freqs="mixed" if pos_embed == "rope_mixed" else "axial",
                    num_heads=num_heads,
                    depth=depth if self.rope_per_layer else None,
                    num_prefix_tokens=self.num_prefix_tokens,
                    coords=rope_coords,
                    scaling=rope_scaling,
                    scale=rope_scale,
                    ref_grid=grid,
                    shift=rope_shift,
                    jitter=rope_jitter,
                    rescale=rope_rescale,
                )
            except ValueError as e:
                # the layer names its arguments without the model's "rope_" prefix; say so, and where the head dim
                # is what does not fit, where that comes from
                about_dim = re.search(r"\b(dim|axis_dims)=", str(e)) is not None
                hint = f"; head_dim={head_dim} is embed_dim {embed_dim} / {num_heads} heads" if about_dim else ""
                raise ValueError(f"RoPE over {len(grid)} axes: {e} (the model's rope_<name> sets <name>){hint}") from e
            # VO-RoPE needs pure rotations (checked against the scaling at each grid in embed_positions)
            self.rope_vo = any(c in parse_rope_targets(rope_targets) for c in "vo")
        elif rope_targets not in ("qk", "none"):
            raise ValueError(f"rope_targets={rope_targets!r} needs a RoPE pos_embed, not {pos_embed!r}")

        dpr = torch.linspace(0, drop_path_rate, depth).tolist()
        self.blocks = nn.ModuleList(
            Block(
                embed_dim,
                num_heads,
                mlp_ratio,
                qkv_bias,
                init_values,
                proj_drop_rate,
                attn_drop_rate,
                dpr[i],
                rope_targets if self.rope is not None else "none",
            )
            for i in range(depth)
        )
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=self._reduction()) for i in range(depth)
        ]
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes) if num_classes > 0 else nn.Identity()
        self.init_weights(weight_init)

    # ------------------------------------------------------------------------------------------- building
    def _make_patch_embed(self, img_size, patch_size, in_chans, embed_dim, dynamic_img_pad) -> nn.Module:
        return PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            strict_img_size=False,
            output_fmt="NHWC",
            dynamic_img_pad=dynamic_img_pad,
        )

    def _reduction(self) -> int:
        return max(self.patch_embed.patch_size)

    def init_weights(self, mode: str = "") -> None:
        if self.pos_embed is not None:
            trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        if self.reg_token is not None:
            nn.init.normal_(self.reg_token, std=1e-6)
        named_apply(init_weights_vit_timm, self)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"cls_token", "reg_token", "pos_embed", "rope.freqs"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        return dict(
            stem=r"^cls_token|^reg_token|^pos_embed|^patch_embed|^rope",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            check_global_pool(global_pool, self.cls_token is not None)
            self.global_pool = global_pool
        self.head = nn.Linear(self.embed_dim, num_classes) if num_classes > 0 else nn.Identity()

    def rope_scaling_modes(self) -> tuple[str, ...]:
        """The RoPE extrapolation modes this model takes (none without RoPE): learned mixed frequencies have no
        ladder for NTK or YaRN to rescale, and YaRN's temperature would scale v and o under VO-RoPE."""
        if self.rope is None:
            return ()
        skip = ("ntk", "yarn") if self.rope.freqs is not None else ()
        skip += ("yarn",) if self.rope_vo else ()
        return tuple(m for m in SCALING_MODES if m not in skip)

    def set_rope_scaling(self, mode: str) -> None:
        """Evaluate from now on under RoPE scaling ``mode`` (one of :meth:`rope_scaling_modes`)."""
        if mode not in self.rope_scaling_modes():
            raise ValueError(f"rope scaling {mode!r}: this model takes {self.rope_scaling_modes()}")
        self.rope.set_scaling(mode)

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the nominal input size (and patch size): APE and the RoPE reference grid follow."""
        prev_grid = self.patch_embed.grid_size
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        grid = self.patch_embed.grid_size
        if self.pos_embed is not None and tuple(grid) != tuple(prev_grid):
            # the same resampling as a forward pass at that size, so that outputs there do not change
            self.pos_embed = nn.Parameter(resample_grid_embed(self.pos_embed.detach(), grid, prev_grid))
        if self.rope is not None:
            self.rope.ref_grid = tuple(grid)
            self.rope.clear_cache()
        for info in self.feature_info:
            info["reduction"] = self._reduction()

    # -------------------------------------------------------------------------------------------- forward
    def _check_input(self, x: Tensor) -> None:
        check_image_input(x, self.in_chans, self.patch_embed.patch_size, self.patch_embed.dynamic_img_pad)

    def embed(self, x: Tensor) -> tuple[Tensor, RotaryTable | None, tuple[int, ...]]:
        """Patchify, add absolute embeddings, prepend prefix tokens; also return the rotary table and the grid."""
        self._check_input(x)
        x = self.patch_embed(x)
        x, rope, grid = embed_positions(
            x,
            self.pos_embed,
            self.pos_embed_type == "sincos",
            self.rope,
            tuple(self.patch_embed.grid_size),
            self.rope_vo,
        )
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        if prefix:
            x = torch.cat([*prefix, x], dim=1)
        return self.pos_drop(x), rope, grid

    def _run_block(self, i: int, x: Tensor, rope: RotaryTable | None) -> Tensor:
        table = rope.layer(i) if self.rope_per_layer else rope
        if self.grad_checkpointing and not torch.jit.is_scripting():
            if not isinstance(table, RotaryTable) or not table.cos.requires_grad:  # None, or traced by torch.fx
                return checkpoint(self.blocks[i], x, table)
            # a learned table goes in as tensors: a reentrant checkpoint detaches tensor arguments and hands their
            # gradients back once a block, where it would otherwise run backward through the table's graph each time
            return checkpoint(_block_with_table, self.blocks[i], x, table.cos, table.sin, table.cis, table.layout)
        return self.blocks[i](x, table)

    def forward_features(self, x: Tensor) -> Tensor:
        x, rope, _ = self.embed(x)
        for i in range(len(self.blocks)):
            x = self._run_block(i, x, rope)
        return self.norm(x)

    def pool(self, x: Tensor, pool_type: str | None = None) -> Tensor:
        pool_type = self.global_pool if pool_type is None else pool_type
        if pool_type == "token":
            return x[:, 0]
        if pool_type == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        if pool_type == "max":
            return x[:, self.num_prefix_tokens :].amax(dim=1)
        return x

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------------------------------- intermediates
    def forward_intermediates(
        self,
        x: Tensor,
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """Features after the chosen blocks, as ``(B, C, *grid)`` (``NCHW``) or ``(B, N, C)`` (``NLC``)."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: choose 'NCHW' or 'NLC'")
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, rope, grid = self.embed(x)
        last = max_index if stop_early else len(self.blocks) - 1
        intermediates = []
        for i in range(last + 1):
            x = self._run_block(i, x, rope)
            if i in take_indices:
                intermediates.append(self.norm(x) if norm else x)
        prefix = [y[:, : self.num_prefix_tokens] for y in intermediates]
        spatial = [y[:, self.num_prefix_tokens :] for y in intermediates]
        if output_fmt == "NCHW":
            spatial = [tokens_to_grid(y, grid) for y in spatial]
        if return_prefix_tokens:
            spatial = list(zip(spatial, prefix, strict=True))
        if intermediates_only:
            return spatial
        return self.norm(x), spatial

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if self.rope is not None and self.rope_per_layer:
            self.rope.freqs = nn.Parameter(self.rope.freqs[: max_index + 1].detach().clone())
            self.rope.depth = max_index + 1
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


# --------------------------------------------------------------------------------------------------- weights
def unwrap_state_dict(state_dict: dict) -> dict:
    """The weights inside a training checkpoint (EMA weights first), or the dict itself."""
    for key in ("model_ema", "state_dict_ema", "model", "state_dict"):
        if key in state_dict and isinstance(state_dict[key], dict):
            return state_dict[key]
    return state_dict


def checkpoint_filter_fn(state_dict: dict[str, Tensor], model: VisionTransformer) -> dict[str, Tensor]:
    """Adapt a checkpoint to ``model``: ours at any size/class count, timm's DeiT-III and RoPE ViTs (Eva).

    * timm Eva names ``gamma_1/2`` → ``ls1/2.gamma``; Eva's mixed frequencies ``(2=(x, y), depth, heads, P)`` →
      ours ``(depth, heads, axes=(row, col), P)``;
    * APE resampled bicubically to the model's grid (rows of prefix tokens, as classic and register ViTs keep, dropped);
    * patch embedding resampled to another patch size, and adapted to another ``in_chans`` (timm's rule);
    * a classifier of another size, or none, is left to the model's own initialisation. Any other key the model
      has and the checkpoint lacks, or the other way round, is an error naming it: timm loads non-strictly when
      the head changes, and another model's weights (APE into RoPE, another depth) must not load half-way.
    """
    from timm.layers import resample_patch_embed
    from timm.models import adapt_input_conv

    state_dict = unwrap_state_dict(state_dict)
    own = model.state_dict()
    out: dict[str, Tensor] = {}
    unexpected = []
    for k, v in state_dict.items():
        k = k.replace("gamma_1", "ls1.gamma").replace("gamma_2", "ls2.gamma")
        if k == "rope.freqs" and k in own and v.shape != own[k].shape and v.ndim == 4 and v.shape[0] == 2:
            v = torch.stack((v[1], v[0]), dim=2)  # (x, y) → grid order (row, col)
        elif k == "pos_embed" and k in own and v.shape != own[k].shape:
            grid = list(model.patch_embed.grid_size)
            v, src = checkpoint_embed_grid(v, checkpoint_prefix_slots(state_dict), grid)
            v = resample_grid_embed(v, grid, src)
        elif k == "patch_embed.proj.weight" and k in own and v.shape != own[k].shape:
            if v.ndim == 4 and v.shape[-2:] != own[k].shape[-2:]:
                v = resample_patch_embed(v, list(own[k].shape[-2:]))
            if v.shape[1] != own[k].shape[1]:
                if v.shape[1] != 3:
                    raise ValueError(
                        f"the checkpoint's patch embedding takes in_chans={v.shape[1]}, the model "
                        f"in_chans={own[k].shape[1]}; only 3-channel weights are adapted (timm's rule): create the "
                        f"model with in_chans={v.shape[1]}"
                    )
                kernel = v.shape[2:]  # timm's adaptation from RGB: summed for one channel, tiled and rescaled for more
                v = adapt_input_conv(own[k].shape[1], v.flatten(2, -2)).unflatten(2, kernel[:-1])
        if k not in own:
            if not k.startswith("head."):  # a model without a classifier drops the checkpoint's
                unexpected.append(k)
            continue
        if v.shape != own[k].shape:
            if k.startswith("head."):
                continue  # another class count: keep the model's fresh classifier
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


def _cfg(hub: str | None = None, **kwargs) -> dict[str, Any]:
    return dict(
        url="",
        hf_hub_id=hub,
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=None,
        crop_pct=0.9,
        interpolation="bicubic",
        fixed_input_size=False,
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
        first_conv="patch_embed.proj",
        classifier="head",
        license="apache-2.0",
        **kwargs,
    )


# Weights published for timm's own models of the same architecture load into ours (checkpoint_filter_fn).
default_cfgs = generate_default_cfgs(
    {
        "vit_rope_tiny": _cfg(),
        "vit_rope_small.naver_in1k": _cfg("timm/vit_small_patch16_rope_224.naver_in1k"),
        "vit_rope_base.naver_in1k": _cfg("timm/vit_base_patch16_rope_224.naver_in1k"),
        "vit_rope_large.naver_in1k": _cfg("timm/vit_large_patch16_rope_224.naver_in1k"),
        "vit_rope_mixed_tiny": _cfg(),
        "vit_rope_mixed_small.naver_in1k": _cfg("timm/vit_small_patch16_rope_mixed_224.naver_in1k"),
        "vit_rope_mixed_base.naver_in1k": _cfg("timm/vit_base_patch16_rope_mixed_224.naver_in1k"),
        "vit_rope_mixed_large.naver_in1k": _cfg("timm/vit_large_patch16_rope_mixed_224.naver_in1k"),
        "vit_ape_tiny": _cfg(),
        "vit_ape_small.fb_in1k": _cfg("timm/deit3_small_patch16_224.fb_in1k"),
        "vit_ape_base.fb_in1k": _cfg("timm/deit3_base_patch16_224.fb_in1k"),
        "vit_ape_large.fb_in1k": _cfg("timm/deit3_large_patch16_224.fb_in1k"),
    }
)

SIZES = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}


def _create(variant: str, pretrained: bool, size: str, kind: str, **kwargs) -> VisionTransformer:
    args = dict(patch_size=16, pos_embed=kind, **SIZES[size])
    return build_model_with_cfg(
        VisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(args, **kwargs),
    )


@register_model
def vit_rope_tiny(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-Ti/16 with axial RoPE (theta 100)."""
    return _create("vit_rope_tiny", pretrained, "tiny", "rope", **kwargs)


@register_model
def vit_rope_small(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 with axial RoPE (theta 100); weights of timm's vit_small_patch16_rope_224 (RoPE-ViT, Naver)."""
    return _create("vit_rope_small", pretrained, "small", "rope", **kwargs)


@register_model
def vit_rope_base(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-B/16 with axial RoPE (theta 100); weights of timm's vit_base_patch16_rope_224."""
    return _create("vit_rope_base", pretrained, "base", "rope", **kwargs)


@register_model
def vit_rope_large(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-L/16 with axial RoPE (theta 100); weights of timm's vit_large_patch16_rope_224."""
    return _create("vit_rope_large", pretrained, "large", "rope", **kwargs)


@register_model
def vit_rope_mixed_tiny(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-Ti/16 with RoPE-Mixed (learned frequencies per layer and head)."""
    return _create("vit_rope_mixed_tiny", pretrained, "tiny", "rope_mixed", **kwargs)


@register_model
def vit_rope_mixed_small(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 with RoPE-Mixed; weights of timm's vit_small_patch16_rope_mixed_224."""
    return _create("vit_rope_mixed_small", pretrained, "small", "rope_mixed", **kwargs)


@register_model
def vit_rope_mixed_base(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-B/16 with RoPE-Mixed; weights of timm's vit_base_patch16_rope_mixed_224."""
    return _create("vit_rope_mixed_base", pretrained, "base", "rope_mixed", **kwargs)


@register_model
def vit_rope_mixed_large(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-L/16 with RoPE-Mixed; weights of timm's vit_large_patch16_rope_mixed_224."""
    return _create("vit_rope_mixed_large", pretrained, "large", "rope_mixed", **kwargs)


@register_model
def vit_ape_tiny(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-Ti/16 with a learned absolute embedding: the APE baseline on the same trunk."""
    return _create("vit_ape_tiny", pretrained, "tiny", "ape", **kwargs)


@register_model
def vit_ape_small(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-S/16 with learned APE; weights of timm's deit3_small_patch16_224 (DeiT-III)."""
    return _create("vit_ape_small", pretrained, "small", "ape", **kwargs)


@register_model
def vit_ape_base(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-B/16 with learned APE; weights of timm's deit3_base_patch16_224."""
    return _create("vit_ape_base", pretrained, "base", "ape", **kwargs)


@register_model
def vit_ape_large(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """ViT-L/16 with learned APE; weights of timm's deit3_large_patch16_224."""
    return _create("vit_ape_large", pretrained, "large", "ape", **kwargs)
