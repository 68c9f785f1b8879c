"""What a position encoding hands attention, and the whole math of applying it: one frozen value per grid (or batch).

* :class:`Table`: no relative encoding, plain attention (APE and no-PE models).
* :class:`RotaryTable`: a rotation of each token's channels, per head: channel pairs turned by angles (``cos``,
  ``sin``: axial, mixed, spiral, golden-gate RoPE, ...), or consecutive blocks of ``b`` channels turned by ``b×b``
  rotation matrices (``blocks``: LieRE, ComRoPE); either optionally inside an orthogonal change of basis (``basis``:
  Cayley-STRING's ``R = Pᵀ · turn · P``, ComRoPE's eigenbases), which attention folds into the q and k projections.
* :class:`AttentionBias`: an additive bias on the attention logits (LookHere), a block of queries at a time.
* :class:`ParabolicBias`: a bias on the logits that is an inner product of a few columns appended to q and k (PaPE),
  so attention stays one SDPA call with no ``N × N`` bias at all.

Attention asks a table one thing, :meth:`Table.attend`: the attention of its tokens, from the layer's input and qkv
projection to ``(B, heads, N, dim)``. A family builds its table once, in its final dtype, from its raw output (angles,
generators or bias terms) with :class:`Build`, which carries what the pipeline adds to every family: the prefix rows
(cls, registers: unturned, unbiased), p-RoPE's turning pairs, YaRN's temperature and the dtype.

A table of a native-resolution batch (:mod:`vit_rope.naflex`) also holds ``keys``, the real tokens of each sample as
SDPA's key-only mask: every ``attend`` leaves the padding out, so padding never changes a real token's output.

Leading dims broadcast against attention's ``(B, heads, N, dim)``: ``([B,] [layer,] [heads,] N, ...)``, where per-sample
tables (token dropping) and per-layer ones always carry a head dim (1 when heads share it); a table whose
``per_layer`` is set holds one entry per model layer (``.layer(i)`` picks one). Tables keep their own precision
(float32 at least): arithmetic runs in it, outside autocast, and the result is rounded once to the input's dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .kernels import outside_autocast, pape_extend, pape_qkv, turn_back, turn_qkv

__all__ = [
    "AttentionBias",
    "Build",
    "ParabolicBias",
    "RotaryTable",
    "Table",
    "outside_autocast",
    "rotate_pairs",
    "split_heads",
]


QKV_HEADS = "b n (three h d) -> three b h n d"  # a qkv projection's columns: q's heads, then k's, then v's


def split_heads(qkv: Tensor, heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """A qkv projection ``(B, N, 3 · heads · dim)`` → q, k, v ``(B, heads, N, dim)`` each (views)."""
    q, k, v = rearrange(qkv, QKV_HEADS, three=3, h=heads).unbind(0)
    return q, k, v


def fold_basis(weight: Tensor, bias: Tensor | None, fold: Tensor, heads: int) -> tuple[Tensor, Tensor | None]:
    """A qkv projection's weight and bias with q's and k's rows turned by their basis: ``P W_q``, ``P W_k`` (since
    ``<Pᵀ R P q, Pᵀ R P k> = <R P q, R P k>``), v's kept; ``fold (3, heads | 1, dim, dim)`` is a table's ``fold``
    (P, P and the identity), so that one product folds all three, the bias with them as one more column."""
    w = rearrange(weight, "(three h d) c -> three h d c", three=3, h=heads)
    if bias is not None:
        w = torch.cat((w, rearrange(bias, "(three h d) -> three h d 1", three=3, h=heads)), dim=-1)  # a column more
    folded = rearrange(torch.matmul(fold.to(w.dtype), w), "three h d c -> (three h d) c")
    return (folded, None) if bias is None else (folded[:, :-1], folded[:, -1])


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """Turn channel pairs of ``x (..., N, dim)`` by angles given as ``cos, sin (..., N, dim // 2)``, in their dtype.

    ``layout="interleaved"`` pairs channels (2i, 2i+1), ``"half"`` pairs i with i + dim/2. Real arithmetic only (no
    complex ops), so it exports to ONNX and fuses under ``torch.compile``.
    """
    x = x.to(torch.promote_types(x.dtype, cos.dtype))
    if layout == "interleaved":
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., N, dim/2) each
        return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    return torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)


@torch.library.custom_op("vit_rope::cos_sin", mutates_args=())
def _cos_sin_op(angles: Tensor) -> tuple[Tensor, Tensor]:
    return angles.cos(), angles.sin()


@_cos_sin_op.register_fake
def _(angles: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(angles), torch.empty_like(angles)


def _cos_sin_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*output)


def _cos_sin_backward(ctx, grad_cos: Tensor, grad_sin: Tensor) -> Tensor:
    cos, sin = ctx.saved_tensors
    return grad_sin * cos - grad_cos * sin


_cos_sin_op.register_autograd(_cos_sin_backward, setup_context=_cos_sin_setup)


def cos_sin(angles: Tensor) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of a table's angles. Compiled, through an op inductor cannot see into, so that it computes
    them once into a buffer: left pointwise, inductor folds them into every block's rotation kernel, which then
    recomputes them for every sample and head (docs/speed.md measures the difference). Exported (ONNX,
    torch.export) and eager, the plain ops."""
    if torch.compiler.is_compiling() and not torch.compiler.is_exporting():
        return _cos_sin_op(angles)
    return angles.cos(), angles.sin()


def _prepend(t: Tensor, n: int, dim: int, value: float = 0.0) -> Tensor:
    """``t`` with ``n`` entries of ``value`` first along dim ``dim`` (counted from the end): prefix tokens' rows."""
    if n == 0:
        return t
    shape = list(t.shape)
    shape[t.dim() + dim] = n
    return torch.cat((t.new_full(shape, value), t), dim=dim)


def _take(t: Tensor, rows: Tensor, dim: int, batched: bool) -> Tensor:
    """Rows ``(B, T)`` of token dim ``dim`` (from the end) of ``t``, the sample dim first and a head dim kept:
    ``([layer,] heads | 1, N, ...)`` → ``(B, [layer,] heads | 1, T, ...)``; a ``batched`` table (its sample dim first
    already) gives each sample its own rows."""
    rows = rows.to(t.device)
    at = t.dim() + dim
    if batched:
        index = rows.view(rows.shape[0], *[1] * (at - 1), rows.shape[1], *[1] * (-dim - 1))
        return torch.take_along_dim(t, index, dim=at)
    if t.dim() == -dim:  # no head dim: one for every head
        t, at = t.unsqueeze(0), at + 1
    picked = t.index_select(at, rows.reshape(-1)).unflatten(at, rows.shape)
    return picked.movedim(at, 0)


@dataclass(frozen=True)
class Build:
    """What the pipeline (:class:`~vit_rope.position_encoding.PositionEncoding`) asks of every family's table:
    ``prefix`` rows first (cls, registers: unturned, unbiased), the ``dtype`` it is kept in, p-RoPE's ``rotating``
    pairs (a ``(dim // 2,)`` bool mask, or None: all turn) and YaRN's ``temperature`` (per-pair factors the rotation
    scales by, or None). The table constructors apply them to the family's raw output as they build, once."""

    prefix: int = 0
    dtype: torch.dtype = torch.float32
    rotating: Tensor | None = None
    temperature: Tensor | None = None

    def precise(self, t: Tensor) -> Tensor:
        """A learned parameter in the precision its table is computed in: float32 at least (under autocast too: bf16
        angles drift, timm PR #2089), float64 for a float64 table."""
        return t.to(torch.promote_types(t.dtype, self.dtype))


@dataclass(frozen=True, kw_only=True)
class Table:
    """No relative position encoding: plain attention. The base of every table, and the one verb attention uses."""

    per_layer: bool = False  # one entry per model layer, right after the batch dim; layer(i) picks one
    # (B, 1, 1, N) bool: the tokens attention may look at (not the padding of a native-resolution batch), as SDPA's
    # key-only mask, which keeps its fused kernels
    keys: Tensor | None = None
    # attention takes the fused ops (kernels.py): asked once, as the table is built for its device and dtype
    fused: bool = False

    def layer(self, index: int) -> Table:
        """The table of model layer ``index`` (a table shared by every layer is returned as it is)."""
        return self

    def gather(self, rows: Tensor) -> Table:
        """Each sample's tokens ``rows (B, T)`` (prefix rows included): a per-sample table."""
        if self.keys is None:
            return self
        return replace(self, keys=self.keys.gather(-1, rows.to(self.keys.device)[:, None, None, :]))

    def attend(self, x: Tensor, qkv: nn.Linear, heads: int, targets: str, dropout: float) -> Tensor:
        """Attention over the layer's input ``x (B, N, C)`` → ``(B, heads, N, dim)``; ``targets``: which of q, k, v
        and the output a rotation turns (letters of "qkvo")."""
        q, k, v = split_heads(qkv(x), heads)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.keys, dropout_p=dropout)


@dataclass(frozen=True, kw_only=True)
class RotaryTable(Table):
    """A rotation of every token's channels, per head: pairs by ``cos``/``sin ([B,] [layer,] heads | 1, N, dim // 2)``
    in ``layout``, or blocks by ``blocks ([B,] [layer,] heads | 1, N, dim // b, b, b)`` (channels past the last block
    stay unturned); inside ``basis ([layer,] heads | 1, dim, dim)`` when given: ``R = basisᵀ · turn · basis``, with
    ``fold ([layer,] 3, heads | 1, dim, dim)`` beside it, the basis of q, k and v (P, P, the identity) that attention
    folds into its qkv projection (built with the table, once a forward rather than once a block).

    ``scaled``: ``|cos + i·sin| ≠ 1`` (YaRN's temperature), so it scales as it turns and cannot turn back.
    """

    cos: Tensor | None = None
    sin: Tensor | None = None
    blocks: Tensor | None = None
    basis: Tensor | None = None
    fold: Tensor | None = None
    layout: str = "interleaved"
    scaled: bool = False

    @classmethod
    def from_angles(
        cls,
        angles: Tensor,
        build: Build,
        *,
        layout: str = "interleaved",
        basis: Tensor | None = None,
        per_layer: bool = False,
    ) -> RotaryTable:
        """Pairs turned by ``angles ([B,] [layer,] heads | 1, N, dim // 2)``: p-RoPE's still pairs at angle 0, the
        prefix rows at angle 0, cos and sin times the temperature, in ``build.dtype``."""
        if build.rotating is not None:
            angles = angles * build.rotating.to(angles)  # p-RoPE: the pairs that do not turn, angle 0
        angles = _prepend(angles, build.prefix, -2)  # prefix tokens: unturned
        cos, sin = cos_sin(angles)
        if build.temperature is not None:  # after the prefix rows: it scales every q·k logit, the cls token's too
            m = build.temperature.to(cos)
            cos, sin = cos * m, sin * m
        dtype = build.dtype
        fold = None
        if basis is not None:
            basis = basis.to(dtype)
            eye = torch.eye(basis.shape[-1], dtype=dtype, device=basis.device).expand_as(basis)
            fold = torch.stack((basis, basis, eye), dim=-4)  # ([layer,] 3, heads | 1, dim, dim)
        return cls(
            cos=cos.to(dtype),
            sin=sin.to(dtype),
            basis=basis,
            fold=fold,
            layout=layout,
            per_layer=per_layer,
            scaled=build.temperature is not None,
        )

    @classmethod
    def from_generators(cls, generators: Tensor, build: Build, *, per_layer: bool = False) -> RotaryTable:
        """Blocks ``exp(generators)`` for skew-symmetric ``generators ([B,] [layer,] heads | 1, N, blocks, b, b)``,
        the prefix rows the identity (a zero generator); the exponentials in float64 (float32 ones drift off the
        rotations at large positions), kept in ``build.dtype``."""
        if build.rotating is not None or build.temperature is not None:
            raise ValueError("p-RoPE and YaRN's temperature act on channel pairs; a block rotation has none")
        exact = torch.float32 if generators.device.type == "mps" else torch.float64  # MPS has no float64
        blocks = torch.linalg.matrix_exp(_prepend(generators, build.prefix, -4).to(exact))
        return cls(blocks=blocks.to(build.dtype), per_layer=per_layer)

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[-2] if self.blocks is None else self.blocks.shape[-4]

    @property
    def num_heads(self) -> int:
        """Heads the table holds one rotation each for (1: the same for all)."""
        t, head_dim = (self.cos, -3) if self.blocks is None else (self.blocks, -5)
        return t.shape[head_dim] if t.dim() >= -head_dim else 1

    def layer(self, index: int) -> RotaryTable:
        if not self.per_layer:
            return self
        cos, sin, blocks, basis = self.cos, self.sin, self.blocks, self.basis
        return replace(
            self,
            cos=None if cos is None else cos.select(-4, index),
            sin=None if sin is None else sin.select(-4, index),
            blocks=None if blocks is None else blocks.select(-6, index),
            basis=None if basis is None else basis.select(-4, index),
            fold=None if self.fold is None else self.fold.select(-5, index),
            per_layer=False,
        )

    def gather(self, rows: Tensor) -> RotaryTable:
        table = super().gather(rows)
        if self.blocks is not None:  # a per-sample table always has a head dim: (B, [layer,] heads | 1, N, ...)
            batched = self.blocks.dim() == 6 + self.per_layer
            return replace(table, blocks=_take(self.blocks, rows, -4, batched))
        batched = self.cos.dim() == 4 + self.per_layer
        return replace(table, cos=_take(self.cos, rows, -2, batched), sin=_take(self.sin, rows, -2, batched))

    def attend(self, x: Tensor, qkv: nn.Linear, heads: int, targets: str, dropout: float) -> Tensor:
        """q, k, v turned as ``targets`` says ("o": the output turned back by each query's rotation, VO-RoPE); a basis
        folds into the q and k projections where only q and k turn, exactly."""
        if self.scaled and ("v" in targets or "o" in targets):
            raise ValueError(
                "rope_scaling='yarn' above the training size scales q and k by its attention temperature, which would "
                "scale v and the output too with rope_targets turning v or o; use 'pi', 'ntk' or 'normalized' there"
            )
        folded = self.basis is not None and targets == "qk"
        projected = F.linear(x, *fold_basis(qkv.weight, qkv.bias, self.fold, heads)) if folded else qkv(x)
        if self.fused and (self.basis is None or folded):
            # one kernel splits q, k, v off the projection and turns them (kernels.py), in the projection's layout
            turn = dict(cos=self.cos, sin=self.sin, layout=self.layout, blocks=self.blocks)
            q, k, v = turn_qkv(projected, heads, targets.replace("o", ""), **turn)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keys, dropout_p=dropout)
            return turn_back(out, **turn) if "o" in targets else out
        q, k, v = split_heads(projected, heads)
        q = self.rotate(q, in_basis=not folded) if "q" in targets else q
        k = self.rotate(k, in_basis=not folded) if "k" in targets else k
        v = self.rotate(v) if "v" in targets else v
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keys, dropout_p=dropout)
        return self.rotate(out, inverse=True) if "o" in targets else out

    def rotate(self, x: Tensor, inverse: bool = False, in_basis: bool = True) -> Tensor:
        """``x (..., N, dim)`` turned by each token's rotation (``inverse``: turned back, ``Rᵀ``; ``in_basis=False``:
        the turn alone, its basis folded elsewhere); x's dtype."""
        if inverse and self.scaled:
            raise ValueError(
                "inverse=True under scaling='yarn' at a scale above 1: its table scales by the attention temperature "
                "as it turns, so turning back would scale again instead of undoing; use 'pi', 'ntk' or 'normalized'"
            )
        basis = self.basis if in_basis else None
        if self.blocks is None and basis is None:  # pairs alone: elementwise ops, which autocast leaves alone
            cos, sin = self.cos, -self.sin if inverse else self.sin
            eager = self.layout == "interleaved" and not torch.compiler.is_compiling()
            # a complex view needs channel pairs side by side at even offsets (as q and k of a qkv projection are)
            if eager and x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and math.gcd(*x.stride()[:-1]) % 2 == 0:
                # eager: pairs (2i, 2i+1) as complex numbers times cos + i·sin, one pass over x (rotate_pairs takes
                # five; docs/speed.md); compile, export and ONNX take the real arithmetic
                z = torch.view_as_complex(x.to(torch.promote_types(x.dtype, cos.dtype)).unflatten(-1, (-1, 2)))
                return torch.view_as_real(z * torch.complex(cos, sin)).flatten(-2).to(x.dtype)
            return rotate_pairs(x, cos, sin, self.layout).to(x.dtype)
        with outside_autocast(x.device.type):  # matrix products in the table's precision, under autocast too
            dtype = (self.cos if self.blocks is None else self.blocks).dtype
            turned = x.to(dtype) if basis is None else x.to(basis.dtype) @ basis.mT  # P x, x as rows
            if self.blocks is None:
                sin = -self.sin if inverse else self.sin
                turned = rotate_pairs(turned, self.cos, sin, self.layout)
            else:
                turned = self._turn_blocks(turned, inverse)
            return (turned if basis is None else turned @ basis).to(x.dtype)  # Pᵀ · turn · P x

    def _turn_blocks(self, x: Tensor, inverse: bool) -> Tensor:
        R = self.blocks.mT if inverse else self.blocks  # (..., N, blocks, b, b)
        count, b = R.shape[-3], R.shape[-1]
        turned = x[..., : count * b].to(R.dtype).unflatten(-1, (count, b))  # (..., N, blocks, b)
        batch = turned.dim() - R.dim() + 1  # leading dims of x that the table is the same for
        if batch > 0:
            # those dims as the columns of one matrix a block: one (b, b) @ (b, batch) product a block instead of
            # batch matrix-vector products (docs/speed.md)
            lead = turned.shape[:batch]
            columns = turned.flatten(0, batch - 1).movedim(0, -1)  # (..., N, blocks, b, batch)
            turned = (R @ columns).movedim(-1, 0).unflatten(0, lead)
        else:
            turned = (R @ turned.unsqueeze(-1)).squeeze(-1)
        turned = turned.flatten(-2)  # (..., N, blocks · b), broadcast against the table's leading dims
        rest = x[..., count * b :].to(turned.dtype)
        return torch.cat((turned, rest.expand(turned.shape[:-1] + rest.shape[-1:])), dim=-1)


@dataclass(frozen=True, kw_only=True)
class AttentionBias(Table):
    """A bias on the attention logits of distance penalties and fields of view (LookHere): query i, key j and head h
    get ``-slopes[h] · ‖xy_j - xy_i‖``, and ``-inf`` where a directed head's wedge (between its two rays, both
    included) does not hold the offset; prefix tokens (the first ``num_prefix``) see and are seen by every token,
    unpenalised. ``xy ([B,] N, 2)`` in (x right, y up); ``rays (heads, 2, 2)``: each head's start and end ray,
    ``directed (heads,)``: which heads have a field of view; ``layer_scale (layers,)``: a per-layer factor.

    Attention takes the bias a block of queries at a time (:meth:`block`; as many queries as keep a block's logits
    within ``block_bytes``, 4 MiB), so no ``N × N`` tensor need be held for a whole layer; ``dense``, the unscaled
    ``([B,] heads, N, N)`` bias built once per grid, serves grids whose bias fits in one block.
    """

    xy: Tensor
    slopes: Tensor
    rays: Tensor
    directed: Tensor
    num_prefix: int = 0
    dense: Tensor | None = None
    layer_scale: Tensor | None = None
    block_bytes: int = 1 << 22

    @classmethod
    def build(
        cls, xy: Tensor, slopes: Tensor, rays: Tensor, directed: Tensor, build: Build, *, layer_scale=None
    ) -> AttentionBias:
        """The bias of tokens at ``xy ([B,] N, 2)`` with ``build.prefix`` prefix tokens first (their places are
        placeholders: they have no position), in ``build.dtype``; dense where it fits one block."""
        xy = _prepend(xy, build.prefix, -2)
        table = cls(xy=xy, slopes=slopes, rays=rays, directed=directed, num_prefix=build.prefix,
                    layer_scale=layer_scale, per_layer=layer_scale is not None)  # fmt: skip
        fits = len(slopes) * xy.shape[-2] ** 2 * 4 <= table.block_bytes  # a grid whose bias fits one block keeps it
        dense = table.block(0, xy.shape[-2]) if fits else None
        dt = build.dtype
        scale = None if layer_scale is None else layer_scale.to(dt)
        dense = None if dense is None else dense.to(dt)
        return replace(table, xy=xy.to(dt), slopes=slopes.to(dt), layer_scale=scale, dense=dense)

    @property
    def num_tokens(self) -> int:
        return self.xy.shape[-2]

    def layer(self, index: int) -> AttentionBias:
        """Layer ``index``'s bias: the layer's factor folded into the slopes (and the dense bias)."""
        if not self.per_layer:
            return self
        s = self.layer_scale[index]
        dense = None if self.dense is None else self.dense * s
        return replace(self, slopes=self.slopes * s, dense=dense, layer_scale=None, per_layer=False)

    def gather(self, rows: Tensor) -> AttentionBias:
        rows = rows.to(self.xy.device)
        xy = self.xy[rows] if self.xy.dim() == 2 else self.xy.gather(1, rows[..., None].expand(-1, -1, 2))
        dense = self.dense
        if dense is not None:  # each sample's rows and columns: (B, heads, T, T)
            dense = dense if dense.dim() == 4 else dense.expand(len(rows), *dense.shape)
            dense = torch.stack([d[:, i][:, :, i] for d, i in zip(dense, rows, strict=True)])
        return replace(super().gather(rows), xy=xy, dense=dense)  # dense: (B, heads, T, T)

    def block(self, start: int, stop: int) -> Tensor:
        """The bias of queries ``start:stop`` against every key: ``([B,] heads, stop - start, N)``."""
        if self.dense is not None:
            return self.dense[..., start:stop, :]
        query = self.xy[..., start:stop, :]
        offset = self.xy.unsqueeze(-3) - query.unsqueeze(-2)  # key minus query: ([B,] r, N, 2)
        distance = torch.linalg.vector_norm(offset, dim=-1).unsqueeze(-3)  # ([B,] 1, r, N)
        bias = -self.slopes[:, None, None] * distance  # ([B,] heads, r, N)
        dx, dy = offset[..., 0].unsqueeze(-3), offset[..., 1].unsqueeze(-3)  # ([B,] 1, r, N)
        rays = self.rays.to(offset.dtype)[..., None, None]  # (heads, 2 rays, 2 coordinates, 1, 1)
        ax, ay, bx, by = rays[:, 0, 0], rays[:, 0, 1], rays[:, 1, 0], rays[:, 1, 1]
        inside = (ax * dy - ay * dx >= 0) & (dx * by - dy * bx >= 0)  # counter-clockwise of one, clockwise of other
        bias = bias.masked_fill(~(inside | ~self.directed[:, None, None]), float("-inf"))
        p = self.num_prefix
        if p > 0:  # prefix tokens: seen by every query, and seeing every key, unpenalised
            prefix_key = torch.arange(bias.shape[-1], device=bias.device) < p
            prefix_query = torch.arange(start, stop, device=bias.device)[:, None] < p
            bias = bias.masked_fill(prefix_key | prefix_query, 0.0)
        return bias

    def attend(self, x: Tensor, qkv: nn.Linear, heads: int, targets: str, dropout: float) -> Tensor:
        """Attention a block of queries at a time: each block's bias is built (or sliced from a small grid's dense
        bias) as the block is attended, so no ``N × N`` bias is held for a whole layer (docs/speed.md)."""
        q, k, v = split_heads(qkv(x), heads)
        B, _, N, _ = q.shape
        rows = max(1, self.block_bytes // (4 * heads * N))
        out = []
        for start in range(0, N, rows):
            stop = min(start + rows, N)
            # expanded to every batch dim (a view): CPU attention then takes its fused kernel (docs/speed.md)
            bias = self.block(start, stop).to(q.dtype).expand(B, heads, stop - start, N)
            if self.keys is not None:  # padding: unseen; a padding query sees every real key, unbiased (never none)
                bias = bias.masked_fill(~self.keys[..., start:stop].mT, 0.0)  # (B, 1, rows, 1): padding queries
                bias = bias.masked_fill(~self.keys, float("-inf"))
            out.append(F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=bias, dropout_p=dropout))
        return out[0] if len(out) == 1 else torch.cat(out, dim=2)


@dataclass(frozen=True, kw_only=True)
class ParabolicBias(Table):
    """A sum of parabolas over each pair's offset, on the logits (PaPE), applied as extra columns of q and k.

    Query i, key j and head h (a per-head tensor's rows are ``h``) get ``Σ_m [-a_im (w_m · δ)² + b_im (w_m · δ)] / √d``
    with ``δ = p_j - p_i``: parabola m looks along ``w_m`` (``directions ([layer,] heads, M, axes)``), its curvature
    ``a_i = softplus(q_i · curvature)`` and slope ``b_i = q_i · slope`` (``([layer,] heads, dim, M)`` each) come from
    the query; ``d`` is the head dim, so the bias is divided as q·k is. With ``A_i = Σ_m a_im w_m w_mᵀ`` and
    ``β_i = Σ_m b_im w_m`` the sum is ``-δᵀ A_i δ + β_i · δ``, which expands into ``axes² + axes + 1`` products of a
    query column and a key column (:meth:`extend`): the keys' ``vec(p_j p_jᵀ)``, ``p_j`` and 1 against the queries'
    ``-vec(A_i)``, ``2 A_i p_i + β_i`` and ``-p_iᵀ A_i p_i - β_i · p_i``. Nothing of size ``N × N`` is held.

    ``coords ([B,] N, axes)``: token positions (the family centres them: the bias depends on offsets alone, and centred
    coordinates keep the expanded terms, which grow as ``‖p‖²``, small); prefix tokens (the first ``num_prefix``) get
    zero columns, so they see and are seen by every token with no bias.
    """

    coords: Tensor
    directions: Tensor
    curvature: Tensor
    slope: Tensor
    num_prefix: int = 0
    # what the columns take of the parabolas, built with the table (once a forward, not once a block):
    # gain = slope W ([layer,] heads, dim, axes), outer = vec(w_m w_mᵀ) ([layer,] heads, M, axes²)
    gain: Tensor | None = None
    outer: Tensor | None = None

    @classmethod
    def build(
        cls, coords: Tensor, directions: Tensor, curvature: Tensor, slope: Tensor, build: Build, *, per_layer: bool
    ) -> ParabolicBias:
        """The parabolas of tokens at ``coords ([B,] N, axes)`` with ``build.prefix`` prefix tokens first (their
        coordinates are placeholders: their columns are zero), in ``build.dtype``."""
        W, curvature, slope = (t.to(build.dtype) for t in (directions, curvature, slope))
        coords = _prepend(coords, build.prefix, -2).to(build.dtype)
        outer = (W.unsqueeze(-1) * W.unsqueeze(-2)).flatten(-2)
        return cls(coords=coords, directions=W, curvature=curvature, slope=slope, num_prefix=build.prefix,
                   per_layer=per_layer, gain=slope @ W, outer=outer)  # fmt: skip

    @property
    def num_tokens(self) -> int:
        return self.coords.shape[-2]

    def layer(self, index: int) -> ParabolicBias:
        if not self.per_layer:
            return self
        W, curvature, slope = self.directions[index], self.curvature[index], self.slope[index]
        gain, outer = self.gain[index], self.outer[index]
        return replace(self, directions=W, curvature=curvature, slope=slope, gain=gain, outer=outer, per_layer=False)

    def gather(self, rows: Tensor) -> ParabolicBias:
        rows, c = rows.to(self.coords.device), self.coords
        coords = c[rows] if c.dim() == 2 else c.gather(1, rows[..., None].expand(-1, -1, c.shape[-1]))
        return replace(super().gather(rows), coords=coords)

    def attend(self, x: Tensor, qkv: nn.Linear, heads: int, targets: str, dropout: float) -> Tensor:
        """One SDPA call over q and k with the bias's columns appended, its ``scale`` the head dim's 1/√d, in q's
        dtype (bfloat16 under autocast: the flash kernels take it). v is padded with zero columns to q's width, since
        fused attention takes one head dim for q, k and v (docs/speed.md)."""
        projected = qkv(x)
        if self.fused:  # one kernel: q, k, v split off the projection, the columns appended (kernels.py)
            x5 = rearrange(projected, QKV_HEADS, three=3, h=heads)  # a view of the projection
            coords = self.coords.expand(x5.shape[1], *self.coords.shape[-2:])
            q, k, v = pape_qkv(x5, coords, self.curvature, self.gain, self.outer, self.num_prefix).unbind(0)
            dim, dtype = x5.shape[-1], projected.dtype
        else:
            q, k, v = split_heads(projected, heads)
            dim, dtype = q.shape[-1], v.dtype
            q, k = pape_extend(q, k, self.coords, self.curvature, self.gain, self.outer, self.num_prefix)
            v = F.pad(v.to(q.dtype), [0, q.shape[-1] - dim])
        with outside_autocast(q.device.type):  # q, k, v already in the dtype extend chose
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.keys, dropout_p=dropout, scale=dim**-0.5)
        return out[..., :dim].to(dtype)

    def extend(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """``q, k (B, heads, N, d)`` with the bias's columns appended: ``q' · k' = q · k + √d · bias``
        (:func:`~vit_rope.kernels.pape_extend`: its precision, its 16-bit split)."""
        return pape_extend(q, k, self.coords, self.curvature, self.gain, self.outer, self.num_prefix)
