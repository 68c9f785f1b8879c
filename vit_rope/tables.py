"""What a position-encoding family hands to attention for one set of tokens, and the reference way to apply it.

* :class:`RotaryTable`: a rotation per channel pair (axial, mixed, spiral RoPE), optionally after an orthogonal change
  of basis per head (Cayley-STRING: ``R(p) = Pᵀ RoPE(p) P``).
* :class:`BlockTable`: a rotation per block of ``b`` channels (ComRoPE, LieRE: ``R(p) = exp(Σ p_a A_a)``).
* :class:`AttentionBias`: an additive bias on the attention logits (LookHere).

Leading dims broadcast against attention's ``(B, heads, N, dim)``: ``([B,] [layer,] [heads,] N, ...)``, where per-sample
tables (token dropping) and per-layer ones always carry a head dim (1 when heads share it); a table whose
``per_layer`` is set holds one entry per model layer (``.layer(i)`` picks one). Tables keep their own precision
(float32 at least): arithmetic runs in it, outside autocast, and the result is rounded once to the input's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

__all__ = ["AttentionBias", "BlockTable", "Encoding", "RotaryTable", "apply_rotary", "rotate_pairs"]


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """Turn channel pairs of ``x (..., N, dim)`` by angles given as ``cos, sin (..., N, dim // 2)``.

    ``layout="interleaved"`` pairs channels (2i, 2i+1), ``"half"`` pairs i with i + dim/2. Real arithmetic only (no
    complex ops, no ``tensor_split``), so it traces, exports to ONNX and fuses under ``torch.compile``. bf16/fp16
    inputs are turned in the table's precision and rounded once (their gradients too).
    """
    dtype = x.dtype
    x = x.to(torch.promote_types(x.dtype, cos.dtype))
    if layout == "interleaved":
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)  # (..., N, dim/2) each
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    else:
        half = x.shape[-1] // 2
        x0, x1 = x[..., :half], x[..., half:]
        out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.to(dtype)


def _identity_rows(t: Tensor, n: int, value: float, dim: int) -> Tensor:
    """``t`` with ``n`` rows of ``value`` prepended along token dim ``dim`` (the rows of prefix tokens)."""
    shape = list(t.shape)
    shape[dim] = n
    return torch.cat((t.new_full(shape, value), t), dim=dim)


class _Table:
    """What every table does alike: pick a layer, hand its tensors to gradient checkpointing."""

    per_layer: bool
    _tensors: tuple[str, ...]  # the fields that hold tensors
    _layer_dim: int  # where a per-layer table's tensors keep the layer, counted from the end

    def layer(self, index: int) -> _Table:
        """The table of model layer ``index`` (a table that is the same for every layer is returned as it is)."""
        if not self.per_layer:
            return self
        tensors = zip(self._tensors, self.tensors(), strict=True)
        return replace(
            self, **{k: t.select(self._layer_dim, index) for k, t in tensors if t is not None}, per_layer=False
        )

    def tensors(self) -> tuple[Tensor | None, ...]:
        """The table's tensors (gradient checkpointing passes them as arguments, so that their graph is kept)."""
        return tuple(getattr(self, k) for k in self._tensors)

    def with_tensors(self, *tensors: Tensor | None) -> _Table:
        return replace(self, **dict(zip(self._tensors, tensors, strict=True)))


@dataclass
class RotaryTable(_Table):
    """Per-pair cos/sin ``([B,] [layer,] [heads,] N, dim // 2)`` for ``layout``, and an optional orthogonal ``basis``
    ``([layer,] heads | 1, dim, dim)`` applied first and undone last: ``R = basisᵀ · RoPE · basis`` (Cayley-STRING)."""

    cos: Tensor
    sin: Tensor
    layout: str = "interleaved"
    basis: Tensor | None = None
    per_layer: bool = False
    scaled: bool = False  # |cos + i·sin| ≠ 1 (YaRN's temperature): it scales as it turns, so it cannot turn back
    _tensors = ("cos", "sin", "basis")
    _layer_dim = -4  # (layer, heads, N, P) and (layer, heads, dim, dim) alike

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[-2]

    @property
    def num_heads(self) -> int:
        """Heads the table holds one rotation each for (1: the same for all)."""
        return self.cos.shape[-3] if self.cos.ndim >= 3 else 1

    def rotate(self, x: Tensor, inverse: bool = False) -> Tensor:
        if inverse and self.scaled:
            raise ValueError(
                "inverse=True under scaling='yarn' at a scale above 1: its table scales by the attention temperature "
                "as it turns, so turning back would scale again instead of undoing; use 'pi', 'ntk' or 'normalized'"
            )
        sin = -self.sin if inverse else self.sin
        if self.basis is None:
            return rotate_pairs(x, self.cos, sin, self.layout)
        with torch.autocast(x.device.type, enabled=False):  # the basis change in the table's precision
            z = x.to(self.basis.dtype) @ self.basis.mT  # P x (x as rows)
            return (rotate_pairs(z, self.cos, sin, self.layout) @ self.basis).to(x.dtype)  # Pᵀ RoPE P x

    def with_prefix(self, n: int) -> RotaryTable:
        """``n`` identity rows first: prefix tokens (cls, registers) stay unturned (``Pᵀ P = I`` with a basis)."""
        return replace(self, cos=_identity_rows(self.cos, n, 1.0, -2), sin=_identity_rows(self.sin, n, 0.0, -2))

    def with_temperature(self, m: Tensor) -> RotaryTable:
        """Every pair scaled by ``m (dim // 2,)`` as it turns (YaRN's attention temperature, prefix rows included)."""
        m = m.to(self.cos)
        return replace(self, cos=self.cos * m, sin=self.sin * m, scaled=True)

    def to(self, dtype: torch.dtype) -> RotaryTable:
        basis = None if self.basis is None else self.basis.to(dtype)
        return replace(self, cos=self.cos.to(dtype), sin=self.sin.to(dtype), basis=basis)


@dataclass
class BlockTable(_Table):
    """Rotations of consecutive blocks of ``b`` channels, ``blocks ([B,] [layer,] heads | 1, N, dim // b, b, b)``;
    channels past the last block stay unturned."""

    blocks: Tensor
    per_layer: bool = False
    _tensors = ("blocks",)
    _layer_dim = -6

    @property
    def num_tokens(self) -> int:
        return self.blocks.shape[-4]

    @property
    def num_heads(self) -> int:
        return self.blocks.shape[-5] if self.blocks.ndim >= 5 else 1

    def rotate(self, x: Tensor, inverse: bool = False) -> Tensor:
        count, b = self.blocks.shape[-3], self.blocks.shape[-1]
        R = self.blocks.mT if inverse else self.blocks  # (..., N, blocks, b, b)
        with torch.autocast(x.device.type, enabled=False):
            turned = x[..., : count * b].to(R.dtype).unflatten(-1, (count, b))  # (..., N, blocks, b)
            batch = turned.ndim - R.ndim + 1  # leading dims of x that the table is the same for
            if batch > 0:
                # those dims as the columns of one matrix a block: one (b, b) @ (b, batch) product a block instead of
                # batch matrix-vector products (2.6x faster for ViT-S q at 224², batch 8, on 2 CPU cores)
                columns = turned.flatten(0, batch - 1).movedim(0, -1)  # (..., N, blocks, b, batch)
                turned = (R @ columns).movedim(-1, 0).unflatten(0, turned.shape[:batch])
            else:
                turned = (R @ turned.unsqueeze(-1)).squeeze(-1)
        turned = turned.flatten(-2).to(x.dtype)  # (..., N, blocks · b), broadcast against the table's leading dims
        return torch.cat((turned, x[..., count * b :].expand(*turned.shape[:-1], -1)), dim=-1)

    def with_prefix(self, n: int) -> BlockTable:
        eye = torch.eye(self.blocks.shape[-1], dtype=self.blocks.dtype, device=self.blocks.device)
        shape = list(self.blocks.shape)
        shape[-4] = n
        return replace(self, blocks=torch.cat((eye.expand(shape), self.blocks), dim=-4))

    def to(self, dtype: torch.dtype) -> BlockTable:
        return replace(self, blocks=self.blocks.to(dtype))


@dataclass
class AttentionBias(_Table):
    """An additive bias on attention logits, ``bias ([B,] heads, N, N)`` (``-inf`` where a key is hidden); a per-layer
    bias is the same bias scaled by ``layer_scale[i]`` in layer i."""

    bias: Tensor
    per_layer: bool = False
    layer_scale: Tensor | None = None
    _tensors = ("bias", "layer_scale")

    @property
    def num_tokens(self) -> int:
        return self.bias.shape[-1]

    @property
    def num_heads(self) -> int:
        return self.bias.shape[-3] if self.bias.ndim >= 3 else 1

    def layer(self, index: int) -> AttentionBias:
        if not self.per_layer:
            return self
        return replace(self, bias=self.bias * self.layer_scale[index], layer_scale=None, per_layer=False)

    def with_prefix(self, n: int) -> AttentionBias:
        """Prefix tokens see every token and are seen by every token, with no penalty."""
        return replace(self, bias=_identity_rows(_identity_rows(self.bias, n, 0.0, -1), n, 0.0, -2))

    def to(self, dtype: torch.dtype) -> AttentionBias:
        scale = None if self.layer_scale is None else self.layer_scale.to(dtype)
        return replace(self, bias=self.bias.to(dtype), layer_scale=scale)


Encoding = RotaryTable | BlockTable | AttentionBias


def apply_rotary(x: Tensor, table: RotaryTable | BlockTable, inverse: bool = False) -> Tensor:
    """Rotate ``x (..., N, dim)`` by ``table`` (``inverse=True`` turns back: Rᵀ); returns x's dtype."""
    if isinstance(table, AttentionBias):
        raise ValueError("an attention bias (LookHere) does not rotate vectors: attention adds it to its logits")
    if x.shape[-2] != table.num_tokens:
        raise ValueError(
            f"x has {x.shape[-2]} tokens but the rotary table has {table.num_tokens}; the grid (plus prefix tokens) "
            "must match the sequence length of x"
        )
    return table.rotate(x, inverse)
