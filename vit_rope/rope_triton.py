"""The rotation of q and k on a GPU in Triton kernels: one read and one write of every element they touch.

Eager PyTorch turns bfloat16/float16 q and k in several passes (to float32, a complex multiply, back again), and
without complex numbers a rotation takes five (two multiplies, a stack, an add, a flatten). This kernel loads each
row's channel pairs once, turns them in float32 (float64 for float64 tables) with the cos/sin of its token and head,
rounds once and stores them once: in place in a fused qkv projection, or out of place over the whole row (turned slots
rotated, the others copied). A second kernel gathers per-head tensors (the gradients of q, k and v) back into a fused
projection's rows, turning them back on the way.

Used by :func:`vit_rope.rope.rotate_packed` and :func:`vit_rope.rope.rotate_split` (in place; in training their
backward pass turns the gradients back with these kernels too) for tensors on a GPU when Triton is installed (it comes
with PyTorch's CUDA wheels on Linux), never while tracing or compiling: ``torch.compile`` fuses the real-arithmetic
path itself.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - a CPU-only PyTorch without Triton
    triton = None

__all__ = ["available", "heads_to_rows", "rotate_rows", "rows_apart"]

# a program's tile: up to max_pairs channel pairs of a row, as many rows as make `pairs` pairs in all. Of 48 tiles
# timed on an H100 for ViT-S q and k at batch 128 (bench/kernel_tiles.py), the fastest in bfloat16 (0.95 of a copy of
# the same bytes) and within 3 % of the fastest in float32
TILE = {"max_pairs": 128, "pairs": 512, "num_warps": 2}
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests): CPU tensors allowed


def available(x: Tensor) -> bool:
    """Whether the kernel can turn ``x``: Triton is installed, x is on a GPU it drives (an NVIDIA GPU of compute
    capability 8.0 or later, Ampere on, or an AMD GPU; on any device when Triton runs interpreted, which is how the
    tests check the kernel on a CPU), and ``VIT_ROPE_TRITON=0`` is not set (the switch back to the eager PyTorch
    rotation, for comparison or a GPU that Triton mishandles)."""
    # the device first: this runs once a layer, and a CPU tensor needs no further look
    if triton is None or not (INTERPRETED or x.device.type == "cuda"):
        return False
    if os.environ.get("VIT_ROPE_TRITON", "1") == "0":
        return False
    return INTERPRETED or _supported(x.device.index)


@functools.cache
def _supported(index: int | None) -> bool:
    if torch.version.hip:
        return True
    return torch.cuda.get_device_capability(index) >= (8, 0)


def _on(device: torch.device):
    """Triton launches on the current CUDA device, not the tensor's: make the tensor's current while launching."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def rows_apart(x: Tensor) -> bool:
    """Whether no two elements of ``x`` share memory (a sufficient test: dims ordered by stride, each stride past the
    extent of the dims before it), which a kernel that writes ``x`` from many programs at once needs."""
    extent = 1
    for stride, size in sorted((st, n) for st, n in zip(x.stride(), x.shape, strict=True) if n > 1):
        if stride < extent:
            return False
        extent += (size - 1) * stride
    return True


def rotate_rows(
    src: Tensor,
    cis: Tensor,
    first: int,
    last: int,
    num_heads: int,
    inverse: bool = False,
    out: Tensor | None = None,
) -> Tensor:
    """Turn the channel pairs of slots ``[first, last)`` of a fused projection ``src (B, N, slots · heads · dim)``
    by ``cis`` (complex, broadcastable as ``(N, 1, heads | 1, dim // 2)``; ``inverse`` turns by its conjugate).

    ``out=None`` turns ``src`` in place, touching only those slots. With ``out`` (same shape), every slot is written:
    the turned ones rotated, the others copied. Rows may have any batch and token strides; their channels must be
    contiguous. Returns the tensor written.
    """
    if triton is None:  # pragma: no cover
        raise RuntimeError("the fused rotation needs Triton; install PyTorch's CUDA build, which brings it")
    batch, tokens, width = src.shape
    half = cis.shape[-1]
    slot_pairs = num_heads * half  # channel pairs per slot
    if src.stride(-1) != 1 or (out is not None and (out.stride(-1) != 1 or out.shape != src.shape)):
        raise ValueError("rotate_rows needs (B, N, width) rows with contiguous channels, and an output of that shape")
    if not rows_apart(src if out is None else out):
        raise ValueError(
            "rotate_rows writes a tensor whose rows may share memory (an expanded one?); pass a contiguous one"
        )
    slots = width // (2 * slot_pairs)
    if cis.shape[0] != tokens or cis.shape[2] not in (1, num_heads) or width != 2 * slot_pairs * slots or last > slots:
        raise ValueError(f"a table of shape {tuple(cis.shape)} does not fit a projection of shape {tuple(src.shape)}")
    table = torch.view_as_real(cis)  # (N, 1, heads | 1, half, 2): cos and sin side by side
    in_place = out is None
    dst = src if in_place else out
    # in place only the turned slots are visited; out of place every pair of the row is written
    begin, end = (first * slot_pairs, last * slot_pairs) if in_place else (0, width // 2)
    rows, pairs = batch * tokens, end - begin
    block_pairs = _block(pairs, TILE["max_pairs"])
    block_rows = max(1, TILE["pairs"] // block_pairs)
    grid = (triton.cdiv(rows, block_rows), triton.cdiv(pairs, block_pairs))
    with _on(src.device):
        _rotate_kernel[grid](
            src,
            dst,
            table,
            rows,
            tokens,
            begin,
            end,
            first * slot_pairs,
            last * slot_pairs,
            half,
            num_heads,
            *_table_strides(table),
            *src.stride()[:2],
            *dst.stride()[:2],
            INVERSE=inverse,
            BLOCK_ROWS=block_rows,
            BLOCK_PAIRS=block_pairs,
            num_warps=TILE["num_warps"],
        )
    return dst


def _table_strides(table: Tensor) -> tuple[int, int, int]:
    """Strides of a real-viewed table ``(N, 1, heads | 1, dim // 2, 2)`` by token, head (0 where one table serves
    every head) and pair."""
    return table.stride(0), table.stride(2) if table.shape[2] > 1 else 0, table.stride(3)


def _block(n: int, most: int) -> int:
    """A power-of-two block for ``n`` columns: the largest one up to ``most`` that divides n (no masked lanes), or,
    where that would be tiny, the smallest one that covers n (up to ``most``)."""
    divides = min(n & -n, most)
    return divides if divides >= 32 else min(triton.next_power_of_2(n), most)


def heads_to_rows(src: Tensor, cis: Tensor, out: Tensor, slot: int, turn: bool, inverse: bool = False) -> None:
    """Write one slot of a fused projection ``out (B, N, slots · heads · dim)`` from ``src (B, heads, N, dim)`` (any
    strides, channels contiguous), turned by ``cis`` (as in :func:`rotate_rows`) where ``turn``, else copied: the
    backward pass of :func:`vit_rope.rope.rotate_split`, which gathers the gradients of q, k and v into the
    projection's."""
    batch, heads, tokens, dim = src.shape
    if src.stride(-1) != 1:
        src = src.contiguous()
    table = torch.view_as_real(cis)
    block_dim = triton.next_power_of_2(dim)
    block_rows = max(1, 1024 // block_dim)
    grid = (triton.cdiv(batch * tokens, block_rows), heads)
    with _on(src.device):
        _heads_to_rows_kernel[grid](
            src,
            out,
            table,
            batch * tokens,
            tokens,
            dim,
            *src.stride()[:3],
            out.shape[-1],
            slot * heads * dim,
            *_table_strides(table),
            TURN=turn,
            INVERSE=inverse,
            BLOCK_ROWS=block_rows,
            BLOCK_DIM=block_dim,
            num_warps=TILE["num_warps"],
        )


if triton is not None:

    @triton.jit
    def _turn(x0, x1, cis, mask, INVERSE: tl.constexpr):
        """Channel pairs (x0, x1) turned by the cos/sin pairs at ``cis`` (where ``mask``), in the table's precision."""
        cos = tl.load(cis, mask=mask, other=1.0)
        sin = tl.load(cis + 1, mask=mask, other=0.0)
        if INVERSE:
            sin = -sin
        x0 = x0.to(cos.dtype)
        x1 = x1.to(cos.dtype)
        return x0 * cos - x1 * sin, x0 * sin + x1 * cos

    @triton.jit
    def _heads_to_rows_kernel(
        src,
        dst,
        table,
        rows,
        tokens,
        dim,
        stride_batch,
        stride_head,
        stride_token,
        width,
        column,
        table_token,
        table_head,
        table_pair,
        TURN: tl.constexpr,
        INVERSE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_DIM: tl.constexpr,
    ):
        # BLOCK_ROWS tokens of the batch x one head's channels: a (B, heads, N, dim) row in, a (B, N, width) row out
        head = tl.program_id(1).to(tl.int64)
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        channel = tl.arange(0, BLOCK_DIM)
        token = row % tokens
        mask = (row < rows)[:, None] & (channel < dim)[None, :]
        start = (row // tokens).to(tl.int64) * stride_batch + head * stride_head + token.to(tl.int64) * stride_token
        x = tl.load(src + start[:, None] + channel[None, :], mask=mask, other=0.0)
        if TURN:
            x0, x1 = tl.split(tl.reshape(x, (BLOCK_ROWS, BLOCK_DIM // 2, 2)))
            pair = tl.arange(0, BLOCK_DIM // 2)
            where = token[:, None] * table_token + head * table_head + pair[None, :] * table_pair
            turned = (row < rows)[:, None] & (pair < dim // 2)[None, :]
            y0, y1 = _turn(x0, x1, table + where, turned, INVERSE)
            x = tl.reshape(tl.join(y0, y1), (BLOCK_ROWS, BLOCK_DIM))
        out = dst + row[:, None].to(tl.int64) * width + column + head * dim + channel[None, :]
        tl.store(out, x.to(dst.dtype.element_ty), mask=mask)

    @triton.jit
    def _rotate_kernel(
        src,
        dst,
        table,
        rows,
        tokens,
        begin,
        end,
        turn_begin,
        turn_end,
        half,
        heads,
        stride_token,
        stride_head,
        stride_pair,
        src_batch,
        src_token,
        dst_batch,
        dst_token,
        INVERSE: tl.constexpr,
        BLOCK_ROWS: tl.constexpr,
        BLOCK_PAIRS: tl.constexpr,
    ):
        # a tile of BLOCK_ROWS rows (tokens of the batch) x BLOCK_PAIRS channel pairs, loaded as contiguous elements
        row = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        pair = begin + tl.program_id(1) * BLOCK_PAIRS + tl.arange(0, BLOCK_PAIRS)
        element = 2 * begin + tl.program_id(1) * 2 * BLOCK_PAIRS + tl.arange(0, 2 * BLOCK_PAIRS)
        row_ok = row < rows
        batch, token = (row // tokens).to(tl.int64), (row % tokens).to(tl.int64)
        mask = row_ok[:, None] & (element[None, :] < 2 * end)
        x = tl.load(src + (batch * src_batch + token * src_token)[:, None] + element[None, :], mask=mask, other=0.0)
        x0, x1 = tl.split(tl.reshape(x, (BLOCK_ROWS, BLOCK_PAIRS, 2)))

        # cos/sin of each (token, head, pair); pairs outside the turned slots get the identity
        head = (pair // half) % heads
        where = token[:, None] * stride_token + (head * stride_head + (pair % half) * stride_pair)[None, :]
        turned = row_ok[:, None] & ((pair >= turn_begin) & (pair < turn_end))[None, :]
        y0, y1 = _turn(x0, x1, table + where, turned, INVERSE)
        # pairs outside the turned slots are copied as they are (x·1 − y·0 would turn inf beside them into NaN)
        y = tl.join(tl.where(turned, y0, x0), tl.where(turned, y1, x1))
        y = tl.reshape(y, (BLOCK_ROWS, 2 * BLOCK_PAIRS))
        out = dst + (batch * dst_batch + token * dst_token)[:, None] + element[None, :]
        tl.store(out, y.to(dst.dtype.element_ty), mask=mask)
