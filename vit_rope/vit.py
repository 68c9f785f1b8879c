"""Vision Transformer whose position encoding is chosen by argument, registered in timm.

A pre-norm ViT with patch embedding, a cls token (optional register tokens) and LayerScale: the DeiT-III trunk
(Touvron et al. 2022). ``pos_embed`` picks the only part that differs between variants:

* a position-encoding family of the registry (:mod:`vit_rope.families`), by its name or its models' name (``"rope"``
  is axial RoPE, Heo et al. ECCV 2024)
* ``"ape"``: learned absolute embedding over the patch grid (resampled bicubically at other sizes)
* ``"rope_ape"``: both, as RoPE-ViT's "+APE" models (axial RoPE with ``abs_pos_embed="ape"``)
* ``"sincos"``: fixed 2D sin-cos absolute embedding
* ``"none"``

``abs_pos_embed`` adds an absolute embedding to any of them: ``"ape"`` (learned, resampled as above) or ``"sincos"``
on top of a family is "+ APE" for every family (``pos_embed="rope_mixed", abs_pos_embed="ape"`` is RoPE-ViT's
RoPE-Mixed + APE), as production encoders pair APE with RoPE.

Any input whose sides the patch size divides runs without extra arguments: positions follow the grid and APE is
resampled with timm's ``resample_abs_pos_embed``. timm's RoPE ViTs (``vit_*_patch16_rope*_224``) and DeiT-III
(``deit3_*_patch16_224``) checkpoints load through :func:`~vit_rope.checkpoint.checkpoint_filter_fn` with equal
outputs.
"""

import math
import re
from collections.abc import Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch
from einops import rearrange
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import DropPath, LayerScale, Mlp, PatchEmbed, build_sincos2d_pos_embed, trunc_normal_
from timm.layers._fx import register_notrace_function
from timm.layers.patch_dropout import PatchDropoutWithIndices
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models._features import feature_take_indices
from timm.models._manipulate import checkpoint, named_apply
from timm.models.naflexvit import global_pool_naflex
from timm.models.vision_transformer import init_weights_vit_timm
from torch import Tensor, nn

from .attention import Attention, parse_rope_targets
from .checkpoint import check_loaded_weights, checkpoint_filter_fn, resample_grid_embed
from .checks import (
    check_global_pool,
    check_image_input,
    check_img_size,
    check_init_values,
    check_num_classes,
    check_rates,
    check_sizes,
)
from .families import FAMILIES, Family, on_register
from .naflex import absolute_positions_of_tokens, embed_patches, keep_tokens, read_batch, sample_grids
from .position_encoding import PositionEncoding
from .tables import Table

__all__ = ["ABS_POS_EMBEDS", "VisionTransformer", "absolute_embedding", "family_of", "pos_embed_names"]

# the absolute embeddings: pos_embed values of their own, and what abs_pos_embed adds to a family's tokens
ABS_POS_EMBEDS = ("none", "ape", "sincos")


def family_of(pos_embed: str) -> str | None:
    """The registered family a ``pos_embed`` value names, by its name or its models' name ("rope" → axial; "rope_ape"
    is axial RoPE and an APE); None for absolute embeddings alone. Asks the registry now, so that a family registered
    later (in a user's module) is one too."""
    if pos_embed == "rope_ape":
        return "axial"
    if pos_embed in FAMILIES:
        return pos_embed
    return next((name for name, f in FAMILIES.items() if f.model_name == pos_embed), None)


def absolute_embedding(pos_embed: str, abs_pos_embed: str = "none") -> str:
    """The absolute embedding a model of ``pos_embed`` with ``abs_pos_embed`` adds to its tokens: ``"ape"``,
    ``"sincos"`` or ``"none"``. ``pos_embed`` names one itself where it is one ("ape", "sincos", and "rope_ape"'s APE);
    ``abs_pos_embed`` adds one to any other value (a family, or "none"). Asking for a second, other one is an error."""
    if abs_pos_embed not in ABS_POS_EMBEDS:
        raise ValueError(
            f"abs_pos_embed={abs_pos_embed!r}: choose one of {ABS_POS_EMBEDS} (the absolute embedding added to the "
            "tokens besides pos_embed's relative one)"
        )
    own = "ape" if pos_embed in ("ape", "rope_ape") else "sincos" if pos_embed == "sincos" else "none"
    if "none" not in (own, abs_pos_embed) and own != abs_pos_embed:
        raise ValueError(
            f"pos_embed={pos_embed!r} has its own absolute embedding ({own}); abs_pos_embed={abs_pos_embed!r} would "
            f"add a second: give pos_embed a family (or 'none') with abs_pos_embed={abs_pos_embed!r}, or leave "
            "abs_pos_embed out"
        )
    return abs_pos_embed if own == "none" else own


def pos_embed_names() -> tuple[str, ...]:
    """Every ``pos_embed`` value the models take now."""
    models = tuple(f.model_name for f in FAMILIES.values() if f.model_name)
    return (*ABS_POS_EMBEDS, "rope_ape", *FAMILIES, *models)


def zero_padding(x: Tensor, table: Table) -> Tensor:
    """Tokens ``(B, N, C)`` with the rows of a NaFlex batch's padding (``table.keys`` False) zero; as they are else."""
    return x if table.keys is None else x.masked_fill(~table.keys[:, 0, 0, :, None], 0.0)


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
        norm_eps: float = 1e-6,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dd = dict(device=device, dtype=dtype)
        norm_layer = partial(nn.LayerNorm, eps=norm_eps, **dd)
        self.norm1 = norm_layer(dim)
        self.attn = Attention(dim, num_heads, qkv_bias, attn_drop, proj_drop, rope_targets, **dd)
        self.ls1 = LayerScale(dim, init_values, **dd) if init_values else nn.Identity()
        self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop, **dd)
        self.ls2 = LayerScale(dim, init_values, **dd) if init_values else nn.Identity()
        self.drop_path2 = DropPath(drop_path) if drop_path > 0 else nn.Identity()

    def forward(self, x: Tensor, table: Table) -> Tensor:
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), table)))
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


@register_notrace_function  # a leaf for torch.fx: the embedding follows the grid's size
def absolute_positions(x: Tensor, pos_embed: Tensor | None, sincos: bool, ref_grid: tuple[int, ...]) -> Tensor:
    """Patch tokens ``(B, *grid, C)`` → flat tokens ``(B, N, C)`` with any absolute embedding added (APE resampled to
    the grid, or 2D sin-cos)."""
    grid = tuple(x.shape[1:-1])
    x = x.flatten(1, -2)
    if pos_embed is not None:
        x = x + resample_grid_embed(pos_embed, grid, ref_grid)
    elif sincos:
        x = x + build_sincos2d_pos_embed(list(grid), x.shape[-1], device=x.device).unsqueeze(0).to(x.dtype)
    return x


class VisionTransformer(nn.Module):
    """ViT with a choice of position encoding; timm's model API (forward_features/head/intermediates, ...)."""

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
        norm_eps: float = 1e-6,
        class_token: bool = True,
        reg_tokens: int = 0,
        pos_embed: str = "rope",
        abs_pos_embed: str = "none",
        rope_targets: str = "qk",
        rope_theta: float | None = None,
        rope_layout: str | None = None,
        rope_axis_dims: Sequence[int] | None = None,
        rope_rotate_fraction: float | None = None,
        rope_coords: str = "index",
        rope_scaling: str = "none",
        rope_scale: float | Sequence[float] | None = None,
        rope_shift: float | None = None,
        rope_jitter: float | None = None,
        rope_rescale: float | None = None,
        rope_options: dict[str, Any] | None = None,
        patch_drop_rate: float = 0.0,
        dynamic_img_pad: bool = False,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        weight_init: str = "",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if pos_embed not in pos_embed_names():
            raise ValueError(f"pos_embed={pos_embed!r}: choose one of {pos_embed_names()}")
        self.abs_pos_embed = absolute_embedding(pos_embed, abs_pos_embed)  # what embed() adds: ape, sincos or none
        check_global_pool(global_pool, class_token)
        check_sizes(embed_dim, depth, num_heads, mlp_ratio, reg_tokens, patch_size, in_chans)
        check_num_classes(num_classes)
        img_size = check_img_size(img_size)
        check_init_values(init_values)
        check_rates(
            drop_rate=drop_rate,
            pos_drop_rate=pos_drop_rate,
            proj_drop_rate=proj_drop_rate,
            attn_drop_rate=attn_drop_rate,
            drop_path_rate=drop_path_rate,
            patch_drop_rate=patch_drop_rate,
        )
        dd = dict(device=device, dtype=dtype)
        self.num_classes, self.global_pool, self.in_chans = num_classes, global_pool, in_chans
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dim
        self.num_prefix_tokens = int(class_token) + reg_tokens
        self.num_reg_tokens, self.has_class_token = reg_tokens, class_token
        self.pos_embed_type = pos_embed
        self.grad_checkpointing = False

        self.patch_embed = self._make_patch_embed(img_size, patch_size, in_chans, embed_dim, dynamic_img_pad, dd)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim, **dd)) if class_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, reg_tokens, embed_dim, **dd)) if reg_tokens else None
        grid = self.patch_embed.grid_size
        # APE covers the patch grid only (no embedding for prefix tokens), as DeiT-III, so it resamples cleanly
        ape = self.abs_pos_embed == "ape"
        self.pos_embed = nn.Parameter(torch.randn(1, math.prod(grid), embed_dim, **dd) * 0.02) if ape else None
        self.patch_drop = PatchDropoutWithIndices(patch_drop_rate, self.num_prefix_tokens)
        self.pos_drop = nn.Dropout(pos_drop_rate)

        targets = parse_rope_targets(rope_targets)
        family = family_of(pos_embed)
        rope_args = dict(theta=rope_theta, layout=rope_layout, axis_dims=rope_axis_dims)
        rope_args |= dict(
            rotate_fraction=rope_rotate_fraction,
            coords=rope_coords,
            scaling=rope_scaling,
            scale=rope_scale,
            shift=rope_shift,
        )
        rope_args |= dict(jitter=rope_jitter, rescale=rope_rescale, **(rope_options or {}))
        self.position_encoding: PositionEncoding | None = None
        if family is not None:
            with torch.device(device) if device is not None else nullcontext():  # a family makes its own parameters
                self.position_encoding = self._make_position_encoding(family, num_heads, depth, grid, **rope_args)
            if dtype is not None:
                self.position_encoding.to(dtype)
        elif targets not in ("qk", ""):
            raise ValueError(f"rope_targets={rope_targets!r} needs a RoPE pos_embed, not {pos_embed!r}")
        if family is not None and not FAMILIES[family].rotary and targets != "qk":
            raise ValueError(f"rope_targets={rope_targets!r}: {pos_embed!r} is an attention bias and turns nothing")
        self.rope_vo = family is not None and any(c in targets for c in "vo")  # VO-RoPE needs pure rotations
        self.plain = Table()  # what attention gets without a relative encoding

        dpr = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]  # stochastic depth, rising linearly
        block_targets = rope_targets if family is not None else "none"
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
                block_targets,
                norm_eps,
                **dd,
            )
            for i in range(depth)
        )
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=embed_dim, reduction=self._reduction()) for i in range(depth)
        ]
        self.norm = nn.LayerNorm(embed_dim, eps=norm_eps, **dd)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.init_weights(weight_init)
        self.register_load_state_dict_pre_hook(check_loaded_weights)  # integer, bool or NaN weights: one error

    # ------------------------------------------------------------------------------------------- building
    def _make_patch_embed(self, img_size, patch_size, in_chans, embed_dim, dynamic_img_pad, dd) -> nn.Module:
        return PatchEmbed(
            img_size=img_size,
            patch_size=patch_size,
            in_chans=in_chans,
            embed_dim=embed_dim,
            strict_img_size=False,
            output_fmt="NHWC",
            dynamic_img_pad=dynamic_img_pad,
            **dd,
        )

    def _make_position_encoding(self, family: str, num_heads: int, depth: int, grid, **kwargs) -> PositionEncoding:
        head_dim = self.embed_dim // num_heads
        try:
            return PositionEncoding(
                head_dim,
                len(grid),
                family,
                num_heads=num_heads,
                depth=depth,
                num_prefix_tokens=self.num_prefix_tokens,
                ref_grid=grid,
                **kwargs,
            )
        except ValueError as e:
            # the layer names its arguments without the model's "rope_" prefix: say so, and where the head dim is what
            # does not fit, where that comes from
            about_dim = re.search(r"\b(dim|axis_dims|block_size|directions)=", str(e)) is not None
            hint = f"; head_dim={head_dim} is embed_dim {self.embed_dim} / {num_heads} heads" if about_dim else ""
            raise ValueError(
                f"{family} position encoding over {len(grid)} axes: {e} (the model's rope_<name> or rope_options sets "
                f"<name>){hint}"
            ) from e

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

    def no_weight_decay(self) -> set[str]:
        """Tokens, the absolute embedding and every learned position parameter (as the papers train them)."""
        learned = {n for n, _ in self.named_parameters() if n.startswith("position_encoding.")}
        return {"cls_token", "reg_token", "pos_embed"} | learned

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's parameter groups (layer-wise LR decay): the stem, each block (the final norm with the last); the
        head, and a learned position encoding (one tensor for every layer), outside them, as timm's RoPE ViT."""
        return dict(
            stem=r"^cls_token|^reg_token|^pos_embed|^patch_embed",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        check_num_classes(num_classes)
        self.num_classes = num_classes
        if global_pool is not None:
            check_global_pool(global_pool, self.cls_token is not None)
            self.global_pool = global_pool
        like = self.patch_embed.proj.weight  # a new head where the model's weights are, in their dtype
        dd = dict(device=like.device, dtype=like.dtype)
        self.head = nn.Linear(self.embed_dim, num_classes, **dd) if num_classes > 0 else nn.Identity()
        self.head.train(self.training)

    def set_input_size(self, img_size=None, patch_size=None) -> None:
        """Change the nominal input size (and patch size): APE and the position encoding's reference grid follow."""
        prev_grid = self.patch_embed.grid_size
        for name, value in (("img_size", img_size), ("patch_size", patch_size)):
            sizes = value if isinstance(value, tuple | list) else (value,)
            if value is not None and any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
                raise ValueError(f"{name}={value!r}: sizes are whole numbers of pixels, at least 1")
        self.patch_embed.set_input_size(img_size=img_size, patch_size=patch_size)
        grid = self.patch_embed.grid_size
        if self.pos_embed is not None and tuple(grid) != tuple(prev_grid):
            # the same resampling as a forward pass at that size, so that outputs there do not change
            resampled = resample_grid_embed(self.pos_embed.detach(), grid, prev_grid)
            self.pos_embed = nn.Parameter(resampled, requires_grad=self.pos_embed.requires_grad)
        if self.position_encoding is not None:
            self.position_encoding.set_ref_grid(grid)
        for info in self.feature_info:
            info["reduction"] = self._reduction()

    def weights_kind(self) -> str:
        """What these weights are, as a saved record names it: the position encoding, and an absolute embedding its
        pos_embed does not name (weights of one encoding have the names and shapes of another's: RoPE's and
        LookHere's, say; RoPE + APE's are RoPE's and a pos_embed)."""
        added = self.abs_pos_embed
        extra = f", abs_pos_embed={added}" if added != absolute_embedding(self.pos_embed_type) else ""
        return f"vit_rope ViT, pos_embed={self.pos_embed_type}{extra}"

    # ------------------------------------------------------------------------------------------- scaling
    def rope_scaling_modes(self) -> tuple[str, ...]:
        """The scaling modes this model's position encoding takes (none without one); VO-RoPE skips YaRN,
        whose temperature is for q·k."""
        if self.position_encoding is None:
            return ()
        return tuple(m for m in self.position_encoding.scaling_modes if not (self.rope_vo and m == "yarn"))

    def set_rope_scaling(self, mode: str) -> None:
        """Evaluate at other resolutions under scaling mode ``mode`` (one of :meth:`rope_scaling_modes`)."""
        if mode not in self.rope_scaling_modes():
            raise ValueError(
                f"rope_scaling={mode!r}: this model ({self.pos_embed_type}) takes "
                f"{self.rope_scaling_modes() or 'none: it has no relative position encoding'}"
            )
        self.position_encoding.set_scaling(mode)

    # -------------------------------------------------------------------------------------------- forward
    def _check_input(self, x: Tensor) -> None:
        pe = self.patch_embed
        check_image_input(x, self.in_chans, pe.patch_size, pe.dynamic_img_pad, pe.proj.weight)

    def get_patch_size(self) -> tuple[int, ...]:
        """The patch size, ``(P, P)``: what timm's NaFlex loader patchifies with (video: a tubelet's frames come
        first in a NaFlex batch's patches, ``(t, P, P)`` is the embedding's kernel)."""
        return tuple(self.patch_embed.patch_size)

    def embed(self, x: Tensor | dict[str, Tensor]) -> tuple[Tensor, Table, torch.Size | None]:
        """Patchify, add absolute embeddings, prepend prefix tokens, drop tokens (training, ``patch_drop_rate``);
        also return the position-encoding table of the tokens kept, and the grid (None for a NaFlex batch, whose
        table knows each sample's real tokens: ``table.keys``)."""
        if isinstance(x, dict):
            return self.embed_patches(x)
        self._check_input(x)
        x = self.patch_embed(x)  # (B, *grid, C)
        grid = x.shape[1:-1]
        x = absolute_positions(x, self.pos_embed, self.abs_pos_embed == "sincos", self.patch_embed.grid_size)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        x = torch.cat([*prefix, x], dim=1) if prefix else x  # (B, prefix + N, C)
        x, kept = self.patch_drop(x)  # kept: (B, K) patch indices, None when nothing is dropped
        table = self.plain
        if self.position_encoding is not None:  # its table, prefix rows first, a row per token kept
            table = self.position_encoding(grid, tokens=kept, device=x.device, dtype=x.dtype)
        return self.pos_drop(x), table, grid

    def embed_patches(self, batch: dict[str, Tensor]) -> tuple[Tensor, Table, None]:
        """:meth:`embed` of a NaFlex batch (:mod:`vit_rope.naflex`): each token placed by its ``patch_coord`` on its own
        sample's grid, padding zeroed and left out of attention (the table's ``keys``)."""
        proj = self.patch_embed.proj
        axes = len(self.patch_embed.grid_size)
        patches, coord, valid = read_batch(batch, tuple(proj.weight.shape[2:]), proj.in_channels, axes, proj.weight)
        x = embed_patches(patches, proj)  # (B, N, C)
        norm = getattr(self.patch_embed, "norm", None)
        x = x if norm is None else norm(x)
        grids = sample_grids(coord, valid)  # (B, axes)
        sincos = self.abs_pos_embed == "sincos"
        x = absolute_positions_of_tokens(x, coord, grids, self.pos_embed, sincos, self.patch_embed.grid_size)
        x = x.masked_fill(~valid.unsqueeze(-1), 0.0)  # padding carries nothing, whatever its pixels
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.reg_token) if t is not None]
        x = torch.cat([*prefix, x], dim=1) if prefix else x  # (B, prefix + N, C)
        if self.position_encoding is not None:  # prefix rows first, keys: the real tokens
            positions = coord.to(torch.float64)
            table = self.position_encoding(None, positions, grids=grids, valid=valid, device=x.device, dtype=x.dtype)
        else:
            keys = torch.cat((valid.new_ones(x.shape[0], self.num_prefix_tokens), valid), dim=1)  # (B, prefix + N)
            table = Table(keys=keys[:, None, None, :])
        if self.training and self.patch_drop.prob > 0:  # NaFlex's token dropping: real tokens are kept first
            rows = keep_tokens(valid, self.patch_drop.prob, self.num_prefix_tokens)  # (B, prefix + K)
            x, table = x.gather(1, rows.unsqueeze(-1).expand(-1, -1, x.shape[-1])), table.gather(rows)
        return self.pos_drop(x), table, None

    def run_block(self, i: int, x: Tensor, table: Table) -> Tensor:
        """Block ``i`` with its layer's table; under gradient checkpointing its activations are recomputed in
        backward (non-reentrant: a learned table's graph is kept, its gradient flows once)."""
        if self.grad_checkpointing:
            return checkpoint(self.blocks[i], x, table.layer(i), use_reentrant=False)
        return self.blocks[i](x, table.layer(i))

    def forward_features(self, x: Tensor | dict[str, Tensor]) -> Tensor | dict[str, Tensor]:
        """Tokens ``(B, prefix + N, C)`` after the final norm; for a NaFlex batch (a dict) a dict as timm's NaFlexVit
        returns: ``patches``, those tokens with padding rows zero, and ``patch_valid (B, N)``, which rows are real
        (after token dropping in training)."""
        naflex = isinstance(x, dict)
        x, table, _ = self.embed(x)  # (B, N, C), the table of its tokens
        for i in range(len(self.blocks)):
            x = self.run_block(i, x, table)  # Block → Attention → table.attend → SDPA
        x = self.norm(x)
        if not naflex:
            return x
        return {"patches": zero_padding(x, table), "patch_valid": table.keys[:, 0, 0, self.num_prefix_tokens :]}

    def pool(self, x: Tensor, pool_type: str | None = None, patch_valid: Tensor | None = None) -> Tensor:
        """Pooled features ``(B, C)``; ``patch_valid (B, N)``: average or maximum over the real patch tokens alone."""
        pool_type = self.global_pool if pool_type is None else pool_type
        if pool_type not in ("", "token", "avg", "max"):  # (before: the tokens came back unpooled)
            check_global_pool(pool_type, self.cls_token is not None)
        if pool_type == "token":
            return x[:, 0]
        if pool_type in ("avg", "max") and patch_valid is not None:  # timm's NaFlex pooling: real tokens alone
            return global_pool_naflex(x, patch_valid, pool_type, self.num_prefix_tokens)
        if pool_type == "avg":
            return x[:, self.num_prefix_tokens :].mean(dim=1)
        if pool_type == "max":
            return x[:, self.num_prefix_tokens :].amax(dim=1)
        return x

    def forward_head(self, x: Tensor | dict[str, Tensor], pre_logits: bool = False) -> Tensor:
        """Logits (or pooled features) of :meth:`forward_features`' output, a NaFlex dict's too."""
        valid = None
        if isinstance(x, dict):
            x, valid = x["patches"], x["patch_valid"]
        x = self.head_drop(self.pool(x, patch_valid=valid))
        return x if pre_logits else self.head(x)

    def forward(self, x: Tensor | dict[str, Tensor]) -> Tensor:
        """Logits of images ``(B, C, *size)`` or of a NaFlex batch (a dict: :mod:`vit_rope.naflex`)."""
        return self.forward_head(self.forward_features(x))

    # ---------------------------------------------------------------------------------------- intermediates
    def forward_intermediates(
        self,
        x: Tensor | dict[str, Tensor],
        indices: int | list[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ) -> list[Tensor] | tuple[Tensor, list[Tensor]]:
        """Features after the chosen blocks, as ``(B, C, *grid)`` (``NCHW``) or ``(B, N, C)`` (``NLC``). A NaFlex batch
        (a dict) has no one grid: ``NLC`` alone, the tokens in the batch's order with padding rows zero."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt={output_fmt!r}: choose 'NCHW' or 'NLC'")
        if isinstance(x, dict) and output_fmt != "NLC":
            raise ValueError(
                "a NaFlex batch (dict) has a grid per sample: ask output_fmt='NLC', its rows in patch_coord"
            )
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        x, table, grid = self.embed(x)
        last = max_index if stop_early else len(self.blocks) - 1
        intermediates = []
        for i in range(last + 1):
            x = self.run_block(i, x, table)
            if i in take_indices:
                y = self.norm(x) if norm else x
                intermediates.append(zero_padding(y, table))
        prefix = [y[:, : self.num_prefix_tokens] for y in intermediates]
        spatial = [y[:, self.num_prefix_tokens :] for y in intermediates]
        if output_fmt == "NCHW":  # (B, N, C) → (B, C, *grid)
            spatial = [rearrange(y.reshape(y.shape[0], *grid, -1), "b ... c -> b c ...").contiguous() for y in spatial]
        if return_prefix_tokens:
            spatial = list(zip(spatial, prefix, strict=True))
        if intermediates_only:
            return spatial
        return zero_padding(self.norm(x), table), spatial

    def prune_intermediate_layers(
        self, indices: int | list[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        take_indices, max_index = feature_take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max_index + 1]
        if self.position_encoding is not None:
            self.position_encoding.family.prune_layers(max_index + 1)
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.reset_classifier(0, "")
        return take_indices


# --------------------------------------------------------------------------------------------- registry
def _cfg(hub: str | None = None, **kwargs) -> dict[str, Any]:
    defaults = dict(
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
    )
    return {**defaults, **kwargs}


SIZES = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
}
# DINOv3's ViTs (Siméoni et al. 2025) in our trunk: patch centres normalised, rotate-half pairs with y's section first
# (timm's "ij"), base 100, four registers, no qkv bias (but in the _qkvb weights), LayerNorm eps 1e-5
DINOV3 = dict(reg_tokens=4, qkv_bias=False, norm_eps=1e-5, rope_coords="normalized", rope_layout="half",
              rope_theta=100.0, rope_options=dict(grid_indexing="ij"))  # fmt: skip
# weights published for timm's own models of the same architecture, which load into ours (checkpoint_filter_fn):
# kind → (tag, timm's model and tag of the weights, the model arguments they ask), the first of a kind its default
PUBLISHED = {
    "rope": [
        ("naver_in1k", "vit_{size}_patch16_rope_224.naver_in1k", {}),
        ("dinov3_lvd1689m", "vit_{size}_patch16_dinov3.lvd1689m", DINOV3),
        ("dinov3_qkvb_lvd1689m", "vit_{size}_patch16_dinov3_qkvb.lvd1689m", {**DINOV3, "qkv_bias": True}),
        ("naver_ape_in1k", "vit_{size}_patch16_rope_ape_224.naver_in1k", {"abs_pos_embed": "ape"}),
    ],
    "rope_mixed": [
        ("naver_in1k", "vit_{size}_patch16_rope_mixed_224.naver_in1k", {}),
        ("naver_ape_in1k", "vit_{size}_patch16_rope_mixed_ape_224.naver_in1k", {"abs_pos_embed": "ape"}),
    ],
    "ape": [("fb_in1k", "deit3_{size}_patch16_224.fb_in1k", {})],
}
TAG_ARGS = {tag: args for weights in PUBLISHED.values() for tag, _, args in weights}
default_cfgs: dict[str, Any] = {}  # timm's register_model reads each model's pretrained configs here


def _create(variant: str, pretrained: bool, size: str, kind: str, **kwargs) -> VisionTransformer:
    """A model of ``kind``: the arguments its pretrained tag asks (``vit_rope_small.dinov3_lvd1689m``), then the
    caller's (another pos_embed too)."""
    tag = kwargs.get("pretrained_cfg") if isinstance(kwargs.get("pretrained_cfg"), str) else None
    args = dict(patch_size=16, pos_embed=kind, **SIZES[size], **TAG_ARGS.get(tag, {}))
    model = build_model_with_cfg(
        VisionTransformer,
        variant,
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **dict(args, **kwargs),
    )
    # timm's create_model records the caller's kwargs for its config.json (save_for_hf), which names the model without
    # its tag: the tag's arguments are part of what the model is (the caller's, added by timm, override them)
    model._model_args = {**TAG_ARGS.get(tag, {}), **getattr(model, "_model_args", {})}
    return model


def _entrypoint(variant: str, size: str, pos_embed: str, what: str):
    """timm's entrypoint function of one model: a function per name, as its registry wants."""

    def create(pretrained: bool = False, **kwargs) -> VisionTransformer:
        return _create(variant, pretrained, size, pos_embed, **kwargs)

    create.__name__ = create.__qualname__ = variant
    create.__doc__ = f"ViT-{size} /16 on the DeiT-III trunk, {what}."
    return create


def _weights_cfg(tag: str, weights: str) -> dict[str, Any]:
    """The pretrained config of published weights: timm's hub copy; DINOv3's are backbones (no classifier)."""
    if tag.startswith("dinov3"):
        return _cfg(f"timm/{weights}", num_classes=0, crop_pct=1.0, license="dinov3-license")
    return _cfg(f"timm/{weights}")


def register_models(pos_embed: str, what: str) -> list[str]:
    """Register ``vit_<pos_embed>_<size>`` in timm for every size (large only where weights are published), with the
    pretrained configs of published weights where there are some. Returns the names."""
    names = []
    for size in SIZES:
        weights = [] if size == "tiny" else PUBLISHED.get(pos_embed, [])
        if size == "large" and not weights:
            continue
        variant = f"vit_{pos_embed}_{size}"
        cfgs = {f"{variant}.{tag}": _weights_cfg(tag, name.format(size=size)) for tag, name, _ in weights}
        default_cfgs.update(generate_default_cfgs(cfgs or {variant: _cfg()}))
        register_model(_entrypoint(variant, size, pos_embed, what))
        names.append(variant)
    return names


def register_family_models(family: type[Family]) -> None:
    """timm's ``vit_<model_name>_*`` of a family with a ``model_name`` that takes an image's two axes (called for every
    family, now and whenever one is registered later); a family of three axes or more has only the video models."""
    if family.model_name and family.min_axes <= 2:
        register_models(family.model_name, (family.__doc__ or family.name).splitlines()[0].rstrip("."))


register_models("ape", "learned absolute embedding")
on_register(register_family_models)
