"""Rotary position embeddings (RoPE) over any number of axes.

One rotation serves 1D sequences, 2D images and 3D video. Every channel pair ``p`` of a head turns by an angle
``coords · F[:, p]``, where ``coords`` are a token's coordinates (one per grid axis) and ``F`` is an
``(axes, dim // 2)`` frequency matrix:

* **axial** (Su et al. 2021; Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024): the
  channels are cut into one even section per axis and each section only sees its own axis, with the ladder
  ``f_j = theta ** (-2j / d_a)`` for a section of ``d_a`` channels (``j < d_a / 2``). Sections are laid out from
  the *last* grid axis to the first: in 2D the first half of the channels turns with x (the column), the
  second half with y (the row); in 3D ``(t, h, w)`` the order is ``[w | h | t]``. ``axis_dims`` is given in grid
  axis order, like ``grid`` and ``positions``. Channels no section takes stay unrotated (the last pairs: at the
  end for the interleaved layout, at the end of each half for ``layout="half"``).
* **mixed** (RoPE-Mixed, Heo et al. ECCV 2024): ``F`` is a learnable dense matrix per head (and per layer when
  ``depth`` is given), so a pair can turn with any direction in the plane.

Coordinates are integer patch indices by default, or patch centres normalised to [-1, 1] per axis (DINOv3,
Siméoni et al. 2025, which multiplies them by 2π). Extrapolation to grids larger than ``ref_grid`` can use
position interpolation (Chen et al. 2023), NTK-aware scaling (bloc97, 2023) or YaRN (Peng et al. 2023), with
per-axis scale factors as in FiT (Lu et al. 2024, arXiv 2402.12376).

Tables are computed in float64 and stored in float32 (float64 for float64 inputs), also under autocast, cached
per grid/device/dtype. Inside attention, ``rotate_split`` turns q and k in place in the fused qkv projection and
hands out q, k, v as views of it; its backward pass gathers their gradients into the projection's in one pass,
turning q's and k's back on the way. On a GPU Triton kernels do both (``vit_rope.rope_triton``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from . import rope_triton

__all__ = ["RotaryEmbedding", "RotaryTable", "apply_rotary", "rotate_packed", "rotate_split"]

Layout = Literal["interleaved", "half"]
Coords = Literal["index", "normalized"]
Scaling = Literal["none", "pi", "ntk", "yarn", "normalized"]
SCALING_MODES: tuple[str, ...] = ("none", "pi", "ntk", "yarn", "normalized")
_CACHE_SIZE = 16


def _tracing() -> bool:
    """True while torch.compile, torch.export, ONNX export or TorchScript/FX tracing sees the code."""
    return (
        torch.compiler.is_compiling()
        or torch.compiler.is_exporting()
        or torch.jit.is_tracing()
        or torch.jit.is_scripting()
    )


@dataclass
class RotaryTable:
    """Per-pair cos/sin of shape ``(..., N, dim // 2)``, for ``layout``; leading dims are (layer,) head."""

    cos: Tensor
    sin: Tensor
    layout: Layout = "interleaved"
    _cis: Tensor | None = None

    @property
    def cis(self) -> Tensor:
        """``cos + i·sin`` for the eager fast path (built with the table; lazily for hand-made tables)."""
        if self._cis is None:
            self._cis = torch.complex(self.cos, self.sin)
        return self._cis

    @property
    def packed_cis(self) -> Tensor:
        """:attr:`cis` as ``(N, 1, heads | 1, dim // 2)``, the broadcast shape against a fused projection
        ``(B, N, slots, heads, dim // 2)``; kept with a fixed table, which every layer of a model shares. Not kept for
        a learned table: a view first taken under ``no_grad`` (a reentrant checkpoint's first pass) would carry no
        gradient to the frequencies."""
        cis = self.cis
        if cis.requires_grad:
            return _packed_view(cis)
        if "_packed_cis" not in self.__dict__:
            self.__dict__["_packed_cis"] = _packed_view(cis)
        return self.__dict__["_packed_cis"]

    def packed(self, turn: tuple[bool, ...]) -> RotaryTable:
        """This table laid out for a fused projection ``(B, N, slots, heads, dim)``, e.g. the (q, k, v) output of a
        qkv Linear: shape ``(N, slots, heads | 1, dim // 2)``, identity where ``turn`` is False, so every slot passes
        in one go. Cached per table (rebuilt while tracing or for learned tables, which change every step)."""
        cache = self.__dict__.setdefault("_packed", {})
        if turn not in cache or _tracing() or self.cos.requires_grad:
            mask = torch.tensor(turn, device=self.cos.device).view(-1, 1, 1)

            def expand(t: Tensor, identity: float) -> Tensor:
                t = _packed_view(t).squeeze(1)  # (N, heads | 1, dim // 2)
                return torch.where(mask, t.unsqueeze(1), torch.full_like(t, identity).unsqueeze(1))

            cis = None if self._cis is None else expand(self._cis, 1.0)
            table = RotaryTable(expand(self.cos, 1.0), expand(self.sin, 0.0), self.layout, cis)
            if _tracing() or self.cos.requires_grad:
                return table
            cache[turn] = table
        return cache[turn]

    def layer(self, index: int) -> RotaryTable:
        """The table of one layer of a per-layer (mixed-frequency) table."""
        cis = None if self._cis is None else self._cis.select(-4, index)
        return RotaryTable(self.cos.select(-4, index), self.sin.select(-4, index), self.layout, cis)

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[-2]


def _fx_leaf(fn):
    """Register ``fn`` as a leaf for timm's torch.fx tracing (it reads shapes), if timm is there."""
    try:
        from timm.layers._fx import register_notrace_function
    except ImportError:  # pragma: no cover
        return fn
    return register_notrace_function(fn)


@_fx_leaf
def apply_rotary(x: Tensor, table: RotaryTable, inverse: bool = False) -> Tensor:
    """Rotate ``x (..., N, dim)`` by ``table`` (``inverse=True`` turns back: Rᵀ).

    The table broadcasts against x's leading dims, so q and k stacked as ``(2, B, heads, N, dim)`` turn in one
    pass. The result has x's dtype; the arithmetic runs in the table's precision (float32 at least).
    """
    if x.shape[-1] != 2 * table.cos.shape[-1]:
        raise ValueError(
            f"the last dim of x is {x.shape[-1]} but the rotary table was built for dim={2 * table.cos.shape[-1]}; "
            "build the RotaryEmbedding with dim equal to the head dim of x"
        )
    if x.shape[-2] != table.num_tokens:
        raise ValueError(
            f"x has {x.shape[-2]} tokens but the rotary table has {table.num_tokens}; the grid (plus prefix tokens) "
            "must match the sequence length of x"
        )
    # _tracing() first: the offset check in _complex_viewable is not traceable (torch.compile, fullgraph)
    if table.layout == "interleaved" and not _tracing() and x.dtype == table.cos.dtype and _complex_viewable(x):
        # Eager fast path: one complex multiply reads x once and writes the result once.
        cis = table.cis.conj() if inverse else table.cis
        z = torch.view_as_complex(x.unflatten(-1, (-1, 2)))
        out = torch.view_as_real(z * cis).flatten(-2)
        if out.requires_grad:  # autograd's view_as_real backward cannot view a gradient at an odd offset as complex
            out.register_hook(_at_even_offset)
        return out
    return _rotate_real(x, table.cos, -table.sin if inverse else table.sin, table.layout)


def _at_even_offset(grad: Tensor) -> Tensor:
    """``grad``, copied where it starts at an odd element (a slice of a concatenation's gradient, say); None (no
    gradient) passes."""
    return grad.clone() if grad is not None and grad.storage_offset() % 2 else grad


def _packed_view(t: Tensor) -> Tensor:
    """A table tensor ``([heads,] N, dim // 2)`` as ``(N, 1, heads | 1, dim // 2)``: the broadcast shape against a
    fused projection ``(B, N, slots, heads, dim // 2)``."""
    if t.ndim == 2:
        return t[:, None, None]
    if t.ndim == 3:
        return t.transpose(0, 1)[:, None]
    raise ValueError(
        f"a rotary table of shape {tuple(t.shape)} cannot turn a fused projection; it needs ([heads,] N, dim // 2): "
        "one table per model layer (RotaryTable.layer) and no batch of positions"
    )


@_fx_leaf
def rotate_packed(packed: Tensor, table: RotaryTable, num_heads: int, turn: tuple[bool, ...]) -> Tensor:
    """Rotate the slots of a fused projection ``packed (B, N, slots · num_heads · dim)`` where ``turn`` is True,
    e.g. q and k of a qkv Linear's output with ``turn=(True, True, False)``; returns ``(B, N, slots · heads · dim)``.

    Eagerly, for the interleaved layout, the turned slots are multiplied in place, in the layout the Linear wrote
    them: for float32/float64 the pass reads and writes q and k once and allocates nothing (bfloat16/float16 go
    through a float32 copy of the slots and are rounded once; on a GPU one Triton kernel reads and writes each dtype
    once), and attention then reads q, k, v exactly where an absolute-embedding ViT would. ``packed`` must be a fresh
    result that nothing else holds (autograd's version counter checks that for backward). Otherwise (tracing,
    compile, export, other dtypes, the half layout, slots that are not one run) it returns a rotated copy through the
    real-arithmetic path. Gradients reach ``packed`` and learned frequencies (or positions); the latter are computed
    from the rotated output and the table, with no copy of the input kept.
    """
    turn = tuple(turn)  # a list would do for everything but the table's cache of packed layouts, which keys on it
    _check_packed(packed, table, num_heads, turn)
    if not any(turn):
        return packed
    span = _turned_run(turn)
    if span is not None and _turns_in_place(packed, table):
        cis = table.packed_cis
        if torch.is_grad_enabled() and (packed.requires_grad or cis.requires_grad):
            return _RotateInPlace.apply(packed, cis, *span, num_heads, False)
        _turn_slots(packed, cis, *span, num_heads)
        return packed
    return _rotated_copy(packed, table, num_heads, turn)


@_fx_leaf
def rotate_split(packed: Tensor, table: RotaryTable, num_heads: int, turn: tuple[bool, ...]) -> tuple[Tensor, ...]:
    """:func:`rotate_packed`, then the slots apart: one ``(B, heads, N, dim)`` view a slot, as attention takes q, k
    and v. In training, its backward pass writes each slot's gradient into the projection's, turned back on the way:
    one pass a slot, where the gather that autograd does for an absolute-embedding ViT takes two (a stack of the
    three gradients, then a copy that undoes the head transpose), so the rotation's backward costs no pass of its
    own. A projection that is a view of another tensor (a reshape, a slice of a wider Linear) takes the path of
    :func:`rotate_packed` and autograd's split: autograd lets a Function that writes into a view return only one
    output."""
    turn = tuple(turn)
    _check_packed(packed, table, num_heads, turn)
    span = _turned_run(turn)
    if span is not None and _turns_in_place(packed, table):
        cis = table.packed_cis
        if not (torch.is_grad_enabled() and (packed.requires_grad or cis.requires_grad)):
            _turn_slots(packed, cis, *span, num_heads)
        elif packed._base is None:
            return _RotateInPlace.apply(packed, cis, *span, num_heads, True)[1:]
        else:
            packed = _RotateInPlace.apply(packed, cis, *span, num_heads, False)
    elif any(turn):
        packed = _rotated_copy(packed, table, num_heads, turn)
    return _split(packed, len(turn), num_heads)


def _rotated_copy(packed: Tensor, table: RotaryTable, num_heads: int, turn: tuple[bool, ...]) -> Tensor:
    """The flagged slots of a checked projection turned into a new tensor by the real-arithmetic path (any layout,
    traceable, exportable, fused by torch.compile)."""
    t = table.packed(turn)
    x = packed.unflatten(-1, (len(turn), num_heads, -1))
    return _rotate_real(x, t.cos, t.sin, t.layout).flatten(2)


def _split(packed: Tensor, slots: int, num_heads: int) -> tuple[Tensor, ...]:
    """``(B, N, slots · heads · dim)`` → one ``(B, heads, N, dim)`` view a slot."""
    return packed.unflatten(-1, (slots, num_heads, -1)).permute(2, 0, 3, 1, 4).unbind(0)


def _turned_run(turn: tuple[bool, ...]) -> tuple[int, int] | None:
    """``(first, last)`` of the turned slots when they are one run (what the in-place paths turn), else None."""
    if not any(turn):
        return None
    first = turn.index(True)
    last = len(turn) - turn[::-1].index(True)
    return (first, last) if all(turn[first:last]) else None


def _turns_in_place(packed: Tensor, table: RotaryTable) -> bool:
    """Whether the in-place paths (complex multiply, or the kernel) take this projection and table: the interleaved
    layout, a dtype the table's precision serves (its own, or bf16/fp16 against a float32 table), channel pairs that
    the kernel or a complex view can reach, and no tracing or compiling."""
    if table.layout != "interleaved" or _tracing():
        return False
    same = packed.dtype == table.cos.dtype or (packed.dtype in _HALF and table.cos.dtype == torch.float32)
    return same and (_complex_viewable(packed) or _kernel_turns_in_place(packed))


def _kernel_turns_in_place(x: Tensor) -> bool:
    """Whether the Triton kernel can turn ``x`` in place: on its device, channels contiguous, and no two rows sharing
    memory (an expanded tensor would be turned once a row that shares it)."""
    return x.stride(-1) == 1 and rope_triton.available(x) and rope_triton.rows_apart(x)


def _check_packed(packed: Tensor, table: RotaryTable, num_heads: int, turn: tuple[bool, ...]) -> None:
    """One clear error for a fused projection and table that do not fit together."""
    if packed.ndim != 3:
        raise ValueError(
            f"packed has shape {tuple(packed.shape)}; expected a fused projection (B, N, slots * heads * dim)"
        )
    _, tokens, width = packed.shape
    slots, dim = len(turn), 2 * table.cos.shape[-1]
    if table.cos.ndim == 3 and table.cos.shape[0] not in (1, num_heads):
        raise ValueError(
            f"the rotary table has {table.cos.shape[0]} heads but the projection {num_heads}; build the mixed "
            "frequencies with num_heads equal to the attention's"
        )
    if width != slots * num_heads * dim:
        raise ValueError(
            f"a fused projection of width {width} is not {slots} slots x {num_heads} heads x {dim} dims; build the "
            "rotary table for the head dim and pass one turn flag per slot"
        )
    if tokens != table.num_tokens:
        raise ValueError(
            f"the projection has {tokens} tokens but the rotary table has {table.num_tokens}; the grid (plus prefix "
            "tokens) must match the sequence length"
        )


class _RotateInPlace(torch.autograd.Function):
    """``z ← z · cis`` on the channel pairs of slots ``[first, last)`` of a fused projection, in place; with
    ``split``, also one ``(B, heads, N, dim)`` view of it a slot (q, k, v as attention takes them).

    The projection is returned and marked dirty, so it carries this node's history wherever it is used; the views are
    outputs of their own. Backward writes the projection's gradient in one pass: where only the views were used (the
    models), one write a slot, turned back on the way; otherwise the whole row turned back.
    """

    @staticmethod
    def forward(ctx, packed: Tensor, cis: Tensor, first: int, last: int, num_heads: int, split: bool):
        _turn_slots(packed, cis, first, last, num_heads)
        ctx.mark_dirty(packed)
        ctx.set_materialize_grads(False)  # unused outputs (the projection itself, as a rule) give no gradient pass
        ctx.span, ctx.num_heads, ctx.shape, ctx.dtype = (first, last), num_heads, packed.shape, packed.dtype
        # learned frequencies need the input for their gradient: keep the output (which attention keeps anyway),
        # from which it follows, rather than a copy of the input
        ctx.save_for_backward(cis, packed if ctx.needs_input_grad[1] else None)
        if not split:
            return packed
        return packed, *_split(packed, packed.shape[-1] // (num_heads * 2 * cis.shape[-1]), num_heads)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor | None, *slot_grads: Tensor | None):
        if grad is None and all(g is None for g in slot_grads):  # undefined gradients (a Function that gave None)
            return None, None, None, None, None, None
        cis, out = ctx.saved_tensors
        (first, last), heads = ctx.span, ctx.num_heads
        slots = ctx.shape[-1] // (heads * 2 * cis.shape[-1])
        if grad is not None and any(g is not None for g in slot_grads):  # both the projection and its views used
            grad = grad.clone(memory_format=torch.contiguous_format)
            for whole, g in zip(grad.unflatten(-1, (slots, heads, -1)).unbind(2), slot_grads, strict=True):
                if g is not None:
                    whole.add_(g.transpose(1, 2))
        grad_in = grad_cis = None
        if ctx.needs_input_grad[0] and grad is not None:
            grad_in = _turn_back_rows(grad, cis, first, last, heads)
        elif ctx.needs_input_grad[0]:
            grad_in = torch.empty(ctx.shape, dtype=ctx.dtype, device=cis.device)
            _slots_to_rows(slot_grads, cis, grad_in, first, last, heads)
        if out is not None and ctx.needs_input_grad[1]:
            if grad is not None:
                per_slot = list(grad.unflatten(-1, (slots, heads, -1)).unbind(2))  # (B, N, heads, dim) each
            else:
                per_slot = [None if g is None else g.transpose(1, 2) for g in slot_grads]
            grad_cis = _table_gradient(per_slot, out, cis, first, last, heads)
        return grad_in, grad_cis, None, None, None, None


_HALF = (torch.bfloat16, torch.float16)
_REAL = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def _real_pairs(packed: Tensor, num_heads: int, pairs: int) -> Tensor:
    """``(B, N, slots · heads · dim)`` as channel pairs ``(B, N, slots, heads, dim // 2, 2)`` (a view)."""
    return packed.view(*packed.shape[:2], -1, num_heads, pairs, 2)


def _turn_slots(packed: Tensor, cis: Tensor, first: int, last: int, num_heads: int, out: Tensor | None = None) -> None:
    """``out[slots] ← packed[slots] · cis`` over channel pairs as complex numbers (``out`` defaults to ``packed``:
    in place). The product is taken in the table's precision; bfloat16/float16 go through a float32 copy of the slots
    (complex numbers exist in neither) and are rounded once on the way back. In place on a GPU: the Triton kernel."""
    if out is None and _kernel_turns_in_place(packed):
        rope_triton.rotate_rows(packed, cis, first, last, num_heads)  # one read and one write, any dtype
        return
    real = _REAL[cis.dtype]
    if packed.dtype == real and out is None:  # the models' case on a CPU: as few view ops as the multiply needs
        torch.narrow(_complex_slots(packed, num_heads, cis), 2, first, last - first).mul_(cis)
        return
    src = _real_pairs(packed, num_heads, cis.shape[-1])[:, :, first:last]
    dst = src if out is None else _real_pairs(out, num_heads, cis.shape[-1])[:, :, first:last]
    if src.dtype == real:
        torch.mul(torch.view_as_complex(src), cis, out=torch.view_as_complex(dst))
    else:
        dst.copy_(torch.view_as_real(torch.view_as_complex(src.to(real)).mul_(cis)))


def _complex_slots(packed: Tensor, num_heads: int, cis: Tensor) -> Tensor:
    """A fused projection ``(B, N, slots · heads · dim)`` in the table's real precision, channels complex-viewable,
    as complex pairs ``(B, N, slots, heads, dim // 2)`` (a view)."""
    return packed.view(cis.dtype).view(*packed.shape[:2], -1, num_heads, cis.shape[-1])


def _turn_back_rows(grad: Tensor, cis: Tensor, first: int, last: int, num_heads: int) -> Tensor:
    """A new ``(B, N, width)`` tensor: slots ``[first, last)`` of ``grad`` turned back by ``cis``, the others copied."""
    if grad.stride(-1) == 1 and rope_triton.available(grad):  # one kernel writes the whole row
        return rope_triton.rotate_rows(grad, cis, first, last, num_heads, inverse=True, out=torch.empty_like(grad))
    if not grad.is_contiguous() or grad.storage_offset() % 2:  # contiguous is not enough: it may start at an odd
        grad = grad.clone(memory_format=torch.contiguous_format)  # element, which no complex view takes
    grad_in = torch.empty_like(grad)
    _turn_slots(grad, cis.conj(), first, last, num_heads, out=grad_in)
    g, g_in = (_real_pairs(t, num_heads, cis.shape[-1]) for t in (grad, grad_in))
    g_in[:, :, :first] = g[:, :, :first]
    g_in[:, :, last:] = g[:, :, last:]
    return grad_in


def _slots_to_rows(grads, cis: Tensor, out: Tensor, first: int, last: int, num_heads: int) -> None:
    """Write every slot of a fused projection ``out (B, N, slots · heads · dim)`` from its ``(B, heads, N, dim)``
    gradient (any strides; None for zeros), turned back by ``cis`` in slots ``[first, last)``, else copied: one read
    and one write a slot."""
    kernel = rope_triton.available(out)  # the kernel takes any strides
    dsts = back = None
    for slot, src in enumerate(grads):
        turn = first <= slot < last
        if src is not None and kernel:
            rope_triton.heads_to_rows(src, cis, out, slot, turn, inverse=True)
            continue
        if dsts is None:  # every slot of out as (B, heads, N, dim), the layout of its gradient
            dsts = _split(out, len(grads), num_heads)
        dst = dsts[slot]
        if src is None:
            dst.zero_()
        elif not turn:
            dst.copy_(src)
        else:
            if back is None:  # once a call, resolved: a product with a lazily conjugated table copies it each time
                back = cis.squeeze(1).transpose(0, 1).conj().resolve_conj()  # (heads | 1, N, dim // 2)
            if src.dtype == dst.dtype == _REAL[cis.dtype] and _complex_viewable(src):
                torch.mul(src.view(cis.dtype), back, out=dst.view(cis.dtype))
            else:
                dst.copy_(torch.view_as_real(_complex_pairs(src, _REAL[cis.dtype]) * back).flatten(-2))


def _table_gradient(
    per_slot: list[Tensor | None], out: Tensor, cis: Tensor, first: int, last: int, num_heads: int
) -> Tensor | None:
    """The gradient of a learned table ``cis (N, 1, heads | 1, dim // 2)`` from the turned projection ``out`` and the
    gradients of its slots (``(B, N, heads, dim)`` each, None where unused; slots ``[first, last)`` turned).

    For ``out = z · cis`` it is ``Σ g · conj(z)`` over the batch and the turned slots. ``conj(z) = conj(out) · cis /
    |cis|²``, and that factor, the same for every batch element and slot, comes out of the sum: ``cis / |cis|² · Σ
    conj(out) · g``, one product and sum a slot, with no pass to recover z (for half-precision outputs, z up to their
    rounding). ``|cis|`` is 1 for a pure rotation and YaRN's temperature for its tables."""
    real = _REAL[cis.dtype]
    slots = out.unflatten(-1, (-1, num_heads, 2 * cis.shape[-1]))  # (B, N, slots, heads, dim)
    total = None
    for slot in range(first, last):
        if per_slot[slot] is not None:
            term = torch.linalg.vecdot(
                _complex_pairs(slots[:, :, slot], real), _complex_pairs(per_slot[slot], real), dim=0
            )
            total = term if total is None else total + term  # (N, heads, dim // 2)
    if total is None:
        return None
    total = total.unsqueeze(1)
    return (total.sum(2, keepdim=True) if cis.shape[2] == 1 else total) * (
        cis / (cis.real.square() + cis.imag.square())
    )


def _complex_pairs(t: Tensor, real: torch.dtype) -> Tensor:
    """The channel pairs of ``t (..., dim)`` as complex numbers of precision ``real``: a view where t allows one."""
    if t.dtype != real or not _complex_viewable(t):  # a fresh copy: a contiguous t may still start at an odd offset
        t = t.to(real, copy=True, memory_format=torch.contiguous_format)
    return torch.view_as_complex(t.unflatten(-1, (-1, 2)))


def _complex_viewable(x: Tensor) -> bool:
    """Whether channel pairs of x can be viewed as complex numbers without a copy, by ``view_as_complex`` or by
    ``Tensor.view(complex dtype)``; the latter asks even strides of every dim, size-1 ones included."""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(st % 2 == 0 for st in x.stride()[:-1])


def _rotate_real(x: Tensor, cos: Tensor, sin: Tensor, layout: Layout) -> Tensor:
    """Real-arithmetic rotation: export/ONNX safe (no complex ops, no tensor_split), fused by torch.compile."""
    half = x.shape[-1] // 2
    if layout == "interleaved":
        pairs = x.unflatten(-1, (half, 2))
        x0, x1 = pairs[..., 0], pairs[..., 1]
        out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)
    else:
        x0, x1 = x[..., :half], x[..., half:]
        out = torch.cat((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.to(x.dtype)


def _as_tuple(value: float | Sequence[float], n: int, name: str) -> tuple[float, ...]:
    if isinstance(value, int | float):
        return (float(value),) * n
    value = tuple(float(v) for v in value)
    if len(value) != n:
        raise ValueError(f"{name} has {len(value)} entries but the layer has {n} axes; give one per axis or a scalar")
    return value


def _default_axis_dims(dim: int, axes: int, rotate_fraction: float) -> tuple[int, ...]:
    rotary = int(dim * rotate_fraction)
    per_axis = 2 * ((rotary // axes) // 2)  # even, equal sections; the remainder stays unrotated (V-JEPA 2)
    return (per_axis,) * axes


def mixed_frequency_init(
    axis_dims: Sequence[int], num_heads: int, theta: float, depth: int | None = None, generator=None
) -> Tensor:
    """RoPE-Mixed initial frequencies, shape ``([depth,] heads, axes, dim // 2)``.

    Heo et al. (ECCV 2024): per head, a random rotation ``a ~ U[0, 2π)``; the first half of the pairs get the
    direction ``(cos a, sin a)``, the second half ``(cos(a + π/2), sin(a + π/2))``, both with magnitudes
    ``1 / theta ** (4j / dim)``. For ``n`` axes the ``n`` groups of pairs take the columns of a random
    orthonormal basis (a random rotation by ``a`` in 2D, exactly the paper's init).
    """
    axes = len(axis_dims)
    lead = (num_heads,) if depth is None else (depth, num_heads)
    group = axis_dims[0] // 2  # pairs per group (all sections are equal for mixed frequencies)
    mag = theta ** (-torch.arange(group, dtype=torch.float64) * 2 / axis_dims[0])
    if axes == 1:
        basis = torch.ones(*lead, 1, 1, dtype=torch.float64)
    elif axes == 2:
        a = torch.rand(*lead, generator=generator, dtype=torch.float64) * 2 * math.pi
        # basis[axis, group]: group directions (cos a, sin a) and (cos(a + π/2), sin(a + π/2)) in (x, y); the
        # axes run in grid order, so row 0 takes the y components (sin) and row 1 the x components (cos)
        y = torch.stack((a.sin(), (a + math.pi / 2).sin()), -1)
        x = torch.stack((a.cos(), (a + math.pi / 2).cos()), -1)
        basis = torch.stack((y, x), -2)
    else:
        gauss = torch.randn(*lead, axes, axes, generator=generator, dtype=torch.float64)
        basis, _ = torch.linalg.qr(gauss)
    # (..., axes, groups, 1) * (group,) -> (..., axes, groups * group)
    freqs = (basis.unsqueeze(-1) * mag).flatten(-2)
    return freqs.float()


class RotaryEmbedding(nn.Module):
    """n-dimensional rotary position embedding.

    Args:
        dim: channels per head that the layer sees (the head dim).
        axes: number of coordinate axes: 1 (sequence), 2 (image rows, cols), 3 (video t, h, w), ...
        theta: frequency base. Default 100 for axial (best for ViTs in Heo et al.), 10 for mixed (their init);
            10000 is the language-model value.
        layout: ``"interleaved"`` pairs channels (2i, 2i+1); ``"half"`` pairs i with i + dim/2 (rotate_half),
            the same rotation up to the channel permutation 2i ↔ i, 2i+1 ↔ i + dim/2.
        axis_dims: channels per axis, in grid axis order (e.g. ``(16, 24, 24)`` for (t, h, w)); each even.
            Default: equal even sections, the remainder unrotated (64 over 3 axes → 20/20/20 + 4).
        rotate_fraction: fraction of ``dim`` to rotate when ``axis_dims`` is not given (the rest stays unrotated).
        freqs: ``"axial"`` (fixed) or ``"mixed"`` (learned, needs ``num_heads``; per layer with ``depth``).
        num_prefix_tokens: leading tokens (cls, registers) left unrotated; x then has ``prefix + prod(grid)``
            tokens, and the rotation still runs in a single pass.
        coords: ``"index"`` (integer patch indices) or ``"normalized"`` (patch centres in [-1, 1] per axis,
            times 2π as in DINOv3, so coordinates do not depend on the resolution).
        scaling: extrapolation mode for grids larger than ``ref_grid``: ``"none"``, ``"pi"`` (coordinates / s),
            ``"ntk"`` (``theta · s ** (d / (d - 2))`` per section of d channels), ``"yarn"``, or ``"normalized"``
            (patch centres of any grid, larger or smaller, mapped onto the extent of ``ref_grid``; a no-op for
            ``coords="normalized"``, which is resolution-independent already).
        scale: scale factor s (scalar or per axis). ``None`` derives it per axis from the grid:
            ``s = max(n / ref_n, 1)``.
        ref_grid: the training grid (for derived scales and YaRN's original length).
        yarn_beta: YaRN's (β_fast, β_slow) ramp bounds, in turns over the original length.
        shift, jitter, rescale: training-only coordinate augmentation (DINOv3): a shift drawn from U[-shift, shift]
            per axis, a per-axis factor log-uniform in [1/jitter, jitter], one shared factor log-uniform in
            [1/rescale, rescale]. Drawn once per table (so once per forward pass in the models).
    """

    def __init__(
        self,
        dim: int,
        axes: int = 2,
        theta: float | None = None,
        layout: Layout = "interleaved",
        axis_dims: Sequence[int] | None = None,
        rotate_fraction: float = 1.0,
        freqs: Literal["axial", "mixed"] = "axial",
        num_heads: int | None = None,
        depth: int | None = None,
        num_prefix_tokens: int = 0,
        coords: Coords = "index",
        scaling: Scaling = "none",
        scale: float | Sequence[float] | None = None,
        ref_grid: Sequence[int] | None = None,
        yarn_beta: tuple[float, float] = (32.0, 1.0),
        shift: float | None = None,
        jitter: float | None = None,
        rescale: float | None = None,
    ) -> None:
        super().__init__()
        if axes < 1:
            raise ValueError(f"axes={axes}: a rotary embedding needs at least one axis")
        if layout not in ("interleaved", "half"):
            raise ValueError(f"layout={layout!r}: choose 'interleaved' (pairs 2i, 2i+1) or 'half' (i, i + dim/2)")
        if freqs not in ("axial", "mixed"):
            raise ValueError(f"freqs={freqs!r}: choose 'axial' or 'mixed'")
        if coords not in ("index", "normalized"):
            raise ValueError(f"coords={coords!r}: choose 'index' or 'normalized'")
        if dim % 2:
            raise ValueError(f"dim={dim} is odd; rotary embeddings turn channel pairs, so dim must be even")
        if not 0.0 < rotate_fraction <= 1.0:
            raise ValueError(f"rotate_fraction={rotate_fraction} must be in (0, 1]")
        if axis_dims is None:
            axis_dims = _default_axis_dims(dim, axes, rotate_fraction)
            if axis_dims[0] == 0:
                raise ValueError(
                    f"dim={dim} (rotate_fraction={rotate_fraction}) cannot be split into even sections for {axes} "
                    f"axes; use a head dim of at least {2 * axes} or pass axis_dims with one even size per axis"
                )
        else:
            if rotate_fraction != 1.0:
                raise ValueError("give either axis_dims or rotate_fraction, not both")
            axis_dims = tuple(int(d) for d in axis_dims)
            if len(axis_dims) != axes:
                raise ValueError(f"axis_dims={axis_dims} has {len(axis_dims)} entries for {axes} axes; give one each")
            if any(d <= 0 or d % 2 for d in axis_dims) or sum(axis_dims) > dim:
                raise ValueError(
                    f"axis_dims={axis_dims} cannot split dim={dim}: each section must be even and positive, and "
                    f"together at most dim (e.g. axis_dims={_default_axis_dims(dim, axes, 1.0)})"
                )
        if freqs == "mixed":
            if num_heads is None:
                raise ValueError("freqs='mixed' learns frequencies per head: pass num_heads")
            if len(set(axis_dims)) != 1:
                raise ValueError(f"freqs='mixed' needs equal axis_dims, got {axis_dims}")
        self.dim = dim
        self.axes = axes
        self.axis_dims = tuple(axis_dims)
        self.theta = float(theta if theta is not None else (10.0 if freqs == "mixed" else 100.0))
        self.layout: Layout = layout
        self.freqs_mode = freqs
        self.num_heads = num_heads
        self.depth = depth
        self.num_prefix_tokens = num_prefix_tokens
        self.coords = coords
        self.yarn_beta = yarn_beta
        self.ref_grid = None if ref_grid is None else tuple(int(n) for n in ref_grid)
        self.set_scaling(scaling, scale)
        self.shift, self.jitter, self.rescale = shift, jitter, rescale
        for name, v, low in (("shift", shift, 0.0), ("jitter", jitter, 1.0), ("rescale", rescale, 1.0)):
            if v is not None and v < low:
                raise ValueError(f"{name}={v} must be at least {low} (None turns it off)")
        if freqs == "mixed":
            self.freqs = nn.Parameter(mixed_frequency_init(self.axis_dims, num_heads, self.theta, depth))
        else:
            self.freqs = None
        self._cache: OrderedDict[tuple, RotaryTable] = OrderedDict()

    # ----------------------------------------------------------------------------------------------- config
    @property
    def rotary_dim(self) -> int:
        """Channels that turn; the rest (``dim - rotary_dim``, at the end) pass through unchanged."""
        return sum(self.axis_dims)

    @property
    def augment(self) -> bool:
        return self.training and any(v is not None for v in (self.shift, self.jitter, self.rescale))

    def set_scaling(self, scaling: Scaling = "none", scale: float | Sequence[float] | None = None) -> None:
        """Choose the extrapolation mode (e.g. per evaluation resolution); clears the table cache."""
        if scaling not in SCALING_MODES:
            raise ValueError(f"scaling={scaling!r}: choose one of {SCALING_MODES}")
        if scaling != "none" and scale is None and getattr(self, "ref_grid", None) is None:
            raise ValueError(f"scaling={scaling!r} needs a scale factor or ref_grid (the training grid) to derive one")
        if scaling == "yarn" and getattr(self, "ref_grid", None) is None:
            raise ValueError("scaling='yarn' needs ref_grid (the training grid): its ramp is measured against it")
        if scaling in ("ntk", "yarn") and getattr(self, "freqs_mode", "axial") == "mixed":
            raise ValueError(
                f"scaling={scaling!r} rescales a fixed frequency ladder; learned mixed frequencies have none: "
                "use 'pi' or 'normalized'"
            )
        if scaling == "normalized" and getattr(self, "ref_grid", None) is None:
            raise ValueError("scaling='normalized' needs ref_grid (the training grid) to map coordinates onto")
        self.scaling = scaling
        self.scale = None if scale is None else _as_tuple(scale, self.axes, "scale")
        if self.scale is not None and min(self.scale) <= 0:
            raise ValueError(f"scale={scale} must be positive")
        self.clear_cache()

    def clear_cache(self) -> None:
        self._cache = OrderedDict()

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, axes={self.axes}, axis_dims={self.axis_dims}, theta={self.theta}, "
            f"layout={self.layout}, freqs={self.freqs_mode}, coords={self.coords}, scaling={self.scaling}"
        )

    # ------------------------------------------------------------------------------------------- coordinates
    def _scales(self, grid: Sequence[int] | None) -> tuple[float, ...]:
        if self.coords == "normalized":
            return (1.0,) * self.axes  # normalised coordinates do not grow with the grid: nothing to rescale
        if self.scale is not None:
            return self.scale
        if self.ref_grid is None or grid is None:
            return (1.0,) * self.axes
        return tuple(max(n / r, 1.0) for n, r in zip(grid, self.ref_grid, strict=True))

    def grid_coords(self, grid: Sequence[int], device=None) -> Tensor:
        """Row-major coordinates ``(prod(grid), axes)`` in float64, before scaling and augmentation."""
        axes = []
        for n in grid:
            i = torch.arange(n, device=device, dtype=torch.float64)
            axes.append((i + 0.5) / n * 2 - 1 if self.coords == "normalized" else i)
        mesh = torch.meshgrid(*axes, indexing="ij")
        return torch.stack(mesh, dim=-1).reshape(-1, len(grid))

    def _augment(self, coords: Tensor) -> Tensor:
        dev, a = coords.device, self.axes
        if self.shift:
            coords = coords + (torch.rand(a, device=dev, dtype=coords.dtype) * 2 - 1) * self.shift
        if self.jitter:
            log_j = math.log(self.jitter)
            coords = coords * ((torch.rand(a, device=dev, dtype=coords.dtype) * 2 - 1) * log_j).exp()
        if self.rescale:
            log_r = math.log(self.rescale)
            coords = coords * ((torch.rand(1, device=dev, dtype=coords.dtype) * 2 - 1) * log_r).exp()
        return coords

    # ------------------------------------------------------------------------------------------- frequencies
    def frequency_matrix(self, scales: Sequence[float] | None = None) -> Tensor:
        """The axial ``(axes, dim // 2)`` float64 frequency matrix (zero where a pair ignores an axis).

        Sections run from the last grid axis to the first; NTK and YaRN adjust each section's ladder by its
        axis's scale factor.
        """
        scales = scales or (1.0,) * self.axes
        F = torch.zeros(self.axes, self.dim // 2, dtype=torch.float64)
        start = 0
        for axis in reversed(range(self.axes)):
            d = self.axis_dims[axis]
            s = scales[axis]
            theta = self.theta
            if self.scaling == "ntk" and s > 1 and d > 2:
                theta = theta * s ** (d / (d - 2))
            f = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
            if self.scaling == "yarn" and s > 1:
                f = _yarn_frequencies(f, s, self.ref_grid[axis], *self.yarn_beta)
            F[axis, start : start + d // 2] = f
            start += d // 2
        return F

    def has_temperature(self, grid: Sequence[int] | None = None) -> bool:
        """Whether tables for ``grid`` carry YaRN's attention temperature (``|cos + i·sin| ≠ 1``): they then scale
        what they turn, which suits q and k (the temperature of their logits) but not v or an output turned back."""
        return self._magnitude(self._scales(grid)) is not None

    def _magnitude(self, scales: Sequence[float]) -> Tensor | None:
        """YaRN's attention temperature ``0.1 ln s + 1`` per rotated pair (None when it is 1 everywhere)."""
        if self.scaling != "yarn" or max(scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        start = 0
        for axis in reversed(range(self.axes)):
            d = self.axis_dims[axis] // 2
            m[start : start + d] = 0.1 * math.log(max(scales[axis], 1.0)) + 1.0
            start += d
        return m

    # ------------------------------------------------------------------------------------------------ tables
    def table(
        self,
        grid: Sequence[int] | None = None,
        positions: Tensor | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> RotaryTable:
        """cos/sin for a grid (row-major tokens) or for explicit ``positions`` ``([B,] N, axes)``.

        Shape ``([B,] [depth,] [heads,] prefix + N, dim // 2)``; ``dtype`` float64 keeps float64 precision,
        anything else gives float32.
        """
        dtype = torch.float64 if dtype == torch.float64 else torch.float32
        if (grid is None) == (positions is None):
            raise ValueError("pass exactly one of grid=(sizes per axis) or positions=(N, axes) coordinates")
        if grid is not None:
            grid = tuple(int(n) for n in grid)
            if len(grid) != self.axes:
                raise ValueError(
                    f"grid={grid} has {len(grid)} sizes but the layer has axes={self.axes}; give one size per axis"
                )
            if min(grid) < 1:
                raise ValueError(f"grid={grid}: every axis needs at least one position")
        else:
            if positions.ndim not in (2, 3) or positions.shape[-1] != self.axes:
                raise ValueError(
                    f"positions has shape {tuple(positions.shape)}; expected (N, {self.axes}) or (B, N, {self.axes}): "
                    "one coordinate per axis, in grid axis order"
                )
        device = (
            torch.device(device)
            if device is not None
            else (positions.device if positions is not None else torch.device("cpu"))
        )
        cacheable = grid is not None and self.freqs is None and not self.augment and not _tracing()
        if cacheable:  # inference tensors cannot be saved for backward later: inference mode keeps tables apart
            key = (grid, device, dtype, torch.is_inference_mode_enabled())
        if cacheable and key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        table = self._build(grid, positions, device, dtype)
        if cacheable:
            self._cache[key] = table
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return table

    def _build(self, grid, positions, device, dtype) -> RotaryTable:
        # MPS has no float64; everything else computes the fixed tables in float64.
        calc = torch.float32 if device.type == "mps" else torch.float64
        scales = self._scales(grid)
        with torch.autocast(device.type, enabled=False):
            if grid is not None:
                coords = self.grid_coords(grid, device=device).to(calc)
            else:
                coords = positions.to(device=device, dtype=calc)
            if self.scaling == "pi":
                coords = coords / torch.tensor(scales, device=device, dtype=calc)
            elif self.scaling == "normalized" and grid is not None and self.coords == "index":
                # patch centres (i + 0.5) / n of this grid placed at the same fraction of the reference grid
                ratio = torch.tensor(
                    [r / n for r, n in zip(self.ref_grid, grid, strict=True)], device=device, dtype=calc
                )
                coords = (coords + 0.5) * ratio - 0.5
            if self.augment:
                coords = self._augment(coords)  # in coordinate units: patches, or [-1, 1] when normalised
            if grid is not None and self.coords == "normalized":
                coords = coords * (2 * math.pi)
            if self.freqs is None:
                F = self.frequency_matrix(scales).to(device=device, dtype=calc)
                angles = coords @ F  # (..., N, P); exact: each pair sums one non-zero product
            else:
                # (..., N, axes) x ([depth,] heads, axes, P) -> (..., [depth,] heads, N, P), in float32 (as the
                # paper) or the parameters' precision if higher
                mixed_dtype = torch.promote_types(self.freqs.dtype, torch.float32)
                # unrotated channels (rotary_dim < dim) are pairs with zero frequency
                F = nn.functional.pad(self.freqs.to(mixed_dtype), (0, self.dim // 2 - self.freqs.shape[-1]))
                c = coords.to(mixed_dtype)
                if c.ndim == 3:  # batched positions: (B, 1.., N, axes)
                    c = c.view(c.shape[0], *([1] * (F.ndim - 2)), *c.shape[1:])
                angles = c @ F
            cos, sin = angles.cos(), angles.sin()
            if self.num_prefix_tokens:
                pad = (0, 0, self.num_prefix_tokens, 0)
                cos = nn.functional.pad(cos, pad, value=1.0)
                sin = nn.functional.pad(sin, pad, value=0.0)
            mag = self._magnitude(scales)
            if mag is not None:  # after the prefix rows: the temperature scales every q·k logit, the cls token's too
                mag = mag.to(device=device, dtype=cos.dtype)
                cos, sin = cos * mag, sin * mag
            if positions is not None and positions.ndim == 3 and self.freqs is None:
                # batched positions (B, N, axes) -> (B, 1, N, P): broadcasts against x (..., B, heads, N, dim)
                cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
            cos, sin = cos.to(dtype), sin.to(dtype)
            # the fast path's complex table is built here, once per table, never inside a (checkpointed) block
            cis = torch.complex(cos, sin) if self.layout == "interleaved" and not _tracing() else None
        return RotaryTable(cos, sin, self.layout, cis)

    # --------------------------------------------------------------------------------------------- forward
    def forward(
        self,
        x: Tensor,
        grid: Sequence[int] | None = None,
        positions: Tensor | None = None,
        *,
        inverse: bool = False,
        layer: int | None = None,
    ) -> Tensor:
        """Rotate ``x (..., N, dim)`` by the positions of its tokens (``inverse=True``: rotate back).

        Mixed frequencies need x as ``(..., heads, N, dim)``; with per-layer frequencies pass ``layer``.
        """
        if x.shape[-1] != self.dim:
            raise ValueError(
                f"x has last dim {x.shape[-1]} but the layer was built with dim={self.dim}; the last dim of x must be "
                "the head dim the layer rotates"
            )
        if grid is not None and len(grid) == self.axes:
            expected = self.num_prefix_tokens + math.prod(grid)
            if x.shape[-2] != expected:
                prefix = f" + {self.num_prefix_tokens} prefix" if self.num_prefix_tokens else ""
                raise ValueError(
                    f"x has {x.shape[-2]} tokens but grid={tuple(grid)} has {math.prod(grid)}{prefix}; tokens must be "
                    "the flattened (row-major) grid"
                )
        if inverse and self.has_temperature(grid):
            raise ValueError(
                "inverse=True under scaling='yarn' at a scale above 1: its table scales by the attention temperature "
                "as it turns, so turning back would scale again instead of undoing; use 'pi', 'ntk' or 'normalized'"
            )
        table = self.table(grid, positions, device=x.device, dtype=x.dtype)
        if self.depth is not None:
            if layer is None:
                raise ValueError("this layer learns frequencies per model layer (depth is set): pass layer=index")
            table = table.layer(layer)
        if self.freqs is not None and x.ndim >= 3 and x.shape[-3] != self.num_heads:
            raise ValueError(
                f"mixed frequencies are per head: x must be (..., heads={self.num_heads}, N, dim), got {tuple(x.shape)}"
            )
        return apply_rotary(x, table, inverse=inverse)


def _yarn_frequencies(f: Tensor, s: float, length: int, beta_fast: float, beta_slow: float) -> Tensor:
    """YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of LLMs"), "NTK-by-parts".

    ``r = length / wavelength`` counts the turns a frequency makes over the original length. Frequencies with
    fewer than ``beta_slow`` turns are interpolated (``f / s``), those with more than ``beta_fast`` are kept, and
    a linear ramp blends between them.
    """
    turns = length * f / (2 * math.pi)
    keep = ((turns - beta_slow) / (beta_fast - beta_slow)).clamp(0.0, 1.0)
    return f / s * (1 - keep) + f * keep
