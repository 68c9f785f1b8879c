"""The fused attention inputs: q, k and v of a layer split from its qkv projection and encoded in one kernel.

Three Triton kernels, each registered with :func:`torch.library.triton_op`, so that eager mode and ``torch.compile``
run the same kernel (inductor sees into it). Each reads q, k and v through any strides (the qkv projection's output
as ``(3, B, heads, N, dim)``), loads any float dtype, computes in float32 and writes the input's dtype:

* ``vit_rope::turn_pairs``: channel pairs turned by ``cos, sin (B, heads, N, dim // 2)`` through any strides, so one
  kernel serves every pair table: shared (strides 0), per head (RoPE-Mixed), per sample (NaFlex, token dropping), a
  layer's of a per-layer table, both layouts, YaRN's scaled entries, the inverse turn (VO-RoPE's output); a basis
  (STRING, ComRoPE) is folded into the projection before it;
* ``vit_rope::turn_blocks``: blocks of channels turned by ``(B, heads, N, count, b, b)`` matrices (LieRE; ComRoPE's
  exponentials), or by their transposes;
* ``vit_rope::pape_qkv``: PaPE's columns appended to q and k, v padded to their width (:func:`pape_extend`).

The turns write in the input's layout, so attention's output merges its heads with no copy, as without a rotation;
their backward turns the gradient back with the same kernel, in the qkv projection's layout, and gives a learned
table its gradient. PaPE's backward is its PyTorch path's at the same inputs.

Which path a tensor takes (``FUSED``, from the environment variable ``VIT_ROPE_FUSED`` at import):

* ``auto`` (default): the kernels for CUDA tensors, the PyTorch path (:mod:`vit_rope.tables`) elsewhere;
* ``triton``: the kernels for every tensor; CPU tensors run it under Triton's interpreter, so set
  ``TRITON_INTERPRET=1`` too (the tests and ``bench/kernel_ops.py`` do), in eager mode (a compiled graph of CPU
  tensors takes the op, which computes with PyTorch ops there);
* ``torch``: the PyTorch path everywhere.

The turns follow the design of the rotary kernels of Liger, flash-attn and TransformerEngine (a program per block of
tokens and head, pairs in registers), which take neither per-head tables nor gradients for the table; no code is taken
from them.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import torch
from einops import rearrange
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a torch without Triton (macOS, some CPU builds): the PyTorch path alone
    triton = None

__all__ = [
    "FUSED",
    "fused",
    "outside_autocast",
    "pape_columns",
    "pape_extend",
    "pape_qkv",
    "turn_back",
    "turn_blocks",
    "turn_pairs",
    "turn_qkv",
]

# the device types that have autocast, asked once at import: torch.compile traces a set lookup, but before torch 2.12
# it cannot trace torch.amp.is_autocast_available, and the graph break it leaves recompiles on every call
_AUTOCAST_DEVICES = frozenset(
    d for d in ("cpu", "cuda", "xpu", "mps", "hpu", "mtia", "xla", "maia") if torch.amp.is_autocast_available(d)
)


def outside_autocast(device_type: str):
    """A context where ops keep their inputs' precision, under autocast too (a device without autocast, such as meta,
    needs none)."""
    return torch.autocast(device_type, enabled=False) if device_type in _AUTOCAST_DEVICES else nullcontext()


FUSED = os.environ.get("VIT_ROPE_FUSED", "auto")
if FUSED not in ("auto", "triton", "torch"):
    raise ValueError(f"VIT_ROPE_FUSED={FUSED!r}: choose 'auto' (the kernel on CUDA), 'triton' or 'torch'")


def fused(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether attention takes tensors of ``device`` and ``dtype`` through the fused ops (module docstring); float64
    never does (the kernels compute in float32). A table asks once, as it is built (``Table.fused``)."""
    if triton is None or FUSED == "torch" or dtype == torch.float64:
        return False
    return FUSED == "triton" or device.type == "cuda"


def _launches_kernel(x: Tensor) -> bool:
    """Whether the op launches its kernel on ``x``: on CUDA always (traced into a compiled graph too); on CPU under
    the interpreter, in eager mode only (a traced tensor is a subclass; the interpreter's kernel cannot be traced, so
    a compiled graph of CPU tensors takes the op's PyTorch path)."""
    if triton is None or FUSED == "torch":
        return False
    return x.device.type == "cuda" or (FUSED == "triton" and type(x) is Tensor)


if triton is not None:

    @triton.jit
    def _ids():
        # the grid's three program ids as int64: offsets such as b · (batch stride) pass 2**31 in a tensor of 2**31
        # elements or more (4 GiB of bf16: a large video batch), where int32 arithmetic would wrap to another address
        return tl.program_id(0).to(tl.int64), tl.program_id(1).to(tl.int64), tl.program_id(2).to(tl.int64)

    @triton.jit
    def _turn_pairs_kernel(
        x_ptr, cos_ptr, sin_ptr, out_ptr,
        B, N, P, turned,
        xs_s, xs_b, xs_h, xs_n, xs_d,
        ts_b, ts_h, ts_n, ts_p,
        os_s, os_b, os_h, os_n, os_d,
        INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # one program: BLOCK_N tokens of one head of one sample of one of q, k, v (s); offsets in int64 (_ids).
        # Every load and store sweeps whole runs of adjacent channels, so the GPU moves them 16 bytes at a time:
        # interleaved pairs are read as whole rows and split in registers (reading channels 2p and 2p + 1 apart,
        # two bytes a load, ran at 7 % of an H100's memory bandwidth: docs/speed.md)
        pid_n, h, sb = _ids()
        s, b = sb // B, sb % B
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]  # (BLOCK_N, 1)
        p = tl.arange(0, BLOCK_P)[None, :]  # (1, BLOCK_P): pair index
        mask = (n < N) & (p < P)
        x = x_ptr + s * xs_s + b * xs_b + h * xs_h + n * xs_n
        out = out_ptr + s * os_s + b * os_b + h * os_h + n * os_n
        if INTERLEAVED:  # channel 2p + i is entry i of pair p: a row of 2 · BLOCK_P channels, then (pairs, 2)
            d = tl.arange(0, 2 * BLOCK_P)[None, :]  # (1, 2 · BLOCK_P)
            row_mask = (n < N) & (d < 2 * P)
            row = tl.load(x + d * xs_d, mask=row_mask, other=0.0).to(tl.float32)
            x0, x1 = tl.split(tl.reshape(row, (BLOCK_N, BLOCK_P, 2)))
        else:  # channels p and P + p: two runs of adjacent channels
            x0 = tl.load(x + p * xs_d, mask=mask, other=0.0).to(tl.float32)
            x1 = tl.load(x + (p + P) * xs_d, mask=mask, other=0.0).to(tl.float32)
        t = b * ts_b + h * ts_h + n * ts_n + p * ts_p
        c = tl.load(cos_ptr + t, mask=mask, other=1.0).to(tl.float32)
        sn = tl.load(sin_ptr + t, mask=mask, other=0.0).to(tl.float32)
        if INVERSE:
            sn = -sn
        on = ((turned >> s) & 1) == 1  # this one of q, k, v turns; the others are copied
        c = tl.where(on, c, 1.0)
        sn = tl.where(on, sn, 0.0)
        y0 = x0 * c - x1 * sn
        y1 = x0 * sn + x1 * c
        if INTERLEAVED:
            row = tl.reshape(tl.join(y0, y1), (BLOCK_N, 2 * BLOCK_P))
            tl.store(out + d * os_d, row, mask=row_mask)
        else:
            tl.store(out + p * os_d, y0, mask=mask)
            tl.store(out + (p + P) * os_d, y1, mask=mask)


if triton is not None:

    @triton.jit
    def _turn_blocks_kernel(
        x_ptr, r_ptr, out_ptr,
        B, N, NB, D, turned,
        xs_s, xs_b, xs_h, xs_n, xs_d,
        rs_b, rs_h, rs_n, rs_j, rs_i: tl.constexpr, rs_k,
        os_s, os_b, os_h, os_n, os_d,
        BS: tl.constexpr, TRANSPOSE: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        # one program: BLOCK_N tokens of one head of one sample of one of q, k, v (s); channel j·b + i is entry i of
        # block j; y_ji = Σ_k R_jik x_jk, or by Rᵀ: y_jk = Σ_i R_jik x_ji; channels past the last block are copied.
        # R is read in its own layout either way and the block size is a compile-time constant, so the entries of a
        # block's row are read 16 bytes at a time (runtime sizes and swapped strides gave 2-4 bytes: docs/speed.md)
        pid_n, h, sb = _ids()
        s, b = sb // B, sb % B
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None, None]  # (BLOCK_N, 1, 1)
        j = tl.arange(0, BLOCK_J)[None, :, None]  # (1, BLOCK_J, 1): block
        i = tl.arange(0, BLOCK_B)[None, None, :]  # (1, 1, BLOCK_B): entry within the block
        mask = (n < N) & (j < NB) & (i < BS)
        x = x_ptr + s * xs_s + b * xs_b + h * xs_h
        out = out_ptr + s * os_s + b * os_b + h * os_h
        xb = tl.load(x + n * xs_n + (j * BS + i) * xs_d, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N, J, B)
        k = tl.arange(0, BLOCK_B)[None, None, None, :]  # (1, 1, 1, BLOCK_B)
        r = r_ptr + b * rs_b + h * rs_h + n[:, :, :, None] * rs_n + j[:, :, :, None] * rs_j
        r = r + i[:, :, :, None] * rs_i + k * rs_k
        R = tl.load(r, mask=mask[:, :, :, None] & (k < BS), other=0.0).to(tl.float32)  # (BLOCK_N, J, B, B): R_jik
        # by Rᵀ: y_jk = Σ_i R_jik x_ji, laid out as x is (the last axis: the entry within the block)
        y = tl.sum(R * xb[:, :, :, None], axis=2) if TRANSPOSE else tl.sum(R * xb[:, :, None, :], axis=3)
        on = ((turned >> s) & 1) == 1  # this one of q, k, v turns; the others are copied
        y = tl.where(on, y, xb)
        tl.store(out + n * os_n + (j * BS + i) * os_d, y, mask=mask)
        rest = NB * BS + tl.arange(0, BLOCK_R)[None, :]  # (1, BLOCK_R): unturned channels past the last block
        n2 = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]
        rmask = (n2 < N) & (rest < D)
        tl.store(out + n2 * os_n + rest * os_d, tl.load(x + n2 * xs_n + rest * xs_d, mask=rmask), mask=rmask)


def _turn_pairs_torch(x: Tensor, cos: Tensor, sin: Tensor, turned: int, interleaved: bool, inverse: bool) -> Tensor:
    """The kernel's arithmetic in PyTorch ops (float32 at least), for a device without the kernel."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    c, sn = cos.to(dtype), sin.to(dtype) * (-1 if inverse else 1)
    out = []
    for s, xs in enumerate(x.unbind(0)):
        xs = xs.to(dtype)
        if not (turned >> s) & 1:
            out.append(xs)
            continue
        if interleaved:
            x0, x1 = xs[..., 0::2], xs[..., 1::2]
            out.append(torch.stack((x0 * c - x1 * sn, x0 * sn + x1 * c), dim=-1).flatten(-2))
        else:
            half = xs.shape[-1] // 2
            x0, x1 = xs[..., :half], xs[..., half:]
            out.append(torch.cat((x0 * c - x1 * sn, x0 * sn + x1 * c), dim=-1))
    return torch.stack(out).to(x.dtype)


@torch.library.triton_op("vit_rope::turn_pairs", mutates_args=())
def turn_pairs(x: Tensor, cos: Tensor, sin: Tensor, turned: int, interleaved: bool, inverse: bool) -> Tensor:
    """``x (S, B, heads, N, dim)`` with the ``S`` slices whose bit is set in ``turned`` turned by ``cos, sin (B, heads,
    N, dim // 2)`` (``inverse``: turned back), the others copied; in x's layout where x is dense (the qkv
    projection's: attention's output then needs no copy to merge its heads, as without a rotation), else
    contiguous."""
    out = torch.empty_like(x)
    if not _launches_kernel(x):
        return out.copy_(_turn_pairs_torch(x, cos, sin, turned, interleaved, inverse))
    S, B, H, N, D = x.shape
    P = D // 2
    block_p = triton.next_power_of_2(P)
    block_n = max(1, min(64, 4096 // block_p))

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_N"]), H, S * B)

    # on CPU the interpreter's kernel, called as it is (torch < 2.12 cannot wrap it; it runs eagerly only)
    kernel = torch.library.wrap_triton(_turn_pairs_kernel) if x.device.type == "cuda" else _turn_pairs_kernel
    kernel[grid](
        x, cos, sin, out, B, N, P, turned, *x.stride(), *cos.stride(), *out.stride(),
        INTERLEAVED=interleaved, INVERSE=inverse, BLOCK_N=block_n, BLOCK_P=block_p,
    )  # fmt: skip
    return out


def _setup(ctx, inputs, output) -> None:
    x, cos, sin, turned, interleaved, inverse = inputs
    ctx.args = (turned, interleaved, inverse)
    learned = cos.requires_grad or sin.requires_grad
    ctx.save_for_backward(cos, sin, x if learned else None)


def _backward(ctx, grad: Tensor):
    cos, sin, x = ctx.saved_tensors
    turned, interleaved, inverse = ctx.args
    # the transpose of a turn is the turn back, written in x's layout: the qkv projection's gradient as it is
    grad_x = turn_pairs(grad, cos, sin, turned, interleaved, not inverse)
    grad_cos = grad_sin = None
    if x is not None:
        grad_cos, grad_sin = _table_grads(x, grad, turned, interleaved, inverse)
    return grad_x, grad_cos, grad_sin, None, None, None


def _table_grads(x: Tensor, grad: Tensor, turned: int, interleaved: bool, inverse: bool) -> tuple[Tensor, Tensor]:
    """∂/∂cos and ∂/∂sin ``(B, heads, N, dim // 2)``, summed over the turned slices: with ``y0 = x0 c - x1 s``,
    ``y1 = x0 s + x1 c``, ``∂c = g0 x0 + g1 x1`` and ``∂s = g1 x0 - g0 x1`` (negated for the inverse turn)."""
    on = [s for s in range(x.shape[0]) if (turned >> s) & 1]
    x, g = x[on].float(), grad[on].float()
    if interleaved:
        x0, x1, g0, g1 = x[..., 0::2], x[..., 1::2], g[..., 0::2], g[..., 1::2]
    else:
        half = x.shape[-1] // 2
        x0, x1, g0, g1 = x[..., :half], x[..., half:], g[..., :half], g[..., half:]
    grad_cos = (g0 * x0 + g1 * x1).sum(0)
    grad_sin = (g1 * x0 - g0 * x1).sum(0)
    return grad_cos, -grad_sin if inverse else grad_sin


turn_pairs.register_autograd(_backward, setup_context=_setup)


def _turn_blocks_torch(x: Tensor, blocks: Tensor, turned: int, transpose: bool) -> Tensor:
    """The block kernel's arithmetic in PyTorch ops (float32 at least), for a device without the kernel."""
    dtype = torch.promote_types(x.dtype, torch.float32)
    R = (blocks.mT if transpose else blocks).to(dtype)  # (B, heads, N, blocks, b, b)
    count, size = R.shape[-3], R.shape[-1]
    out = []
    for s, xs in enumerate(x.unbind(0)):
        xs = xs.to(dtype)
        if (turned >> s) & 1:
            turned_part = (R @ xs[..., : count * size].unflatten(-1, (count, size)).unsqueeze(-1)).flatten(-3)
            xs = torch.cat((turned_part, xs[..., count * size :]), dim=-1)
        out.append(xs)
    return torch.stack(out).to(x.dtype)


@torch.library.triton_op("vit_rope::turn_blocks", mutates_args=())
def turn_blocks(x: Tensor, blocks: Tensor, turned: int, transpose: bool) -> Tensor:
    """``x (S, B, heads, N, dim)`` with the ``S`` slices whose bit is set in ``turned`` turned block by block by
    ``blocks (B, heads, N, count, b, b)`` (``transpose``: by their transposes, the turn back), channels past the last
    block and the other slices copied; in x's layout where x is dense, else contiguous."""
    out = torch.empty_like(x)
    if not _launches_kernel(x):
        return out.copy_(_turn_blocks_torch(x, blocks, turned, transpose))
    S, B, H, N, D = x.shape
    count, size = blocks.shape[-3], blocks.shape[-1]
    block_j, block_b = triton.next_power_of_2(count), triton.next_power_of_2(size)
    block_n = max(1, min(32, 4096 // (block_j * block_b * block_b)))

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_N"]), H, S * B)

    kernel = torch.library.wrap_triton(_turn_blocks_kernel) if x.device.type == "cuda" else _turn_blocks_kernel
    kernel[grid](
        x, blocks, out, B, N, count, D, turned, *x.stride(), *blocks.stride(), *out.stride(),
        BS=size, TRANSPOSE=transpose, BLOCK_N=block_n, BLOCK_J=block_j, BLOCK_B=block_b,
        BLOCK_R=max(1, triton.next_power_of_2(D - count * size)),
    )  # fmt: skip
    return out


def _setup_blocks(ctx, inputs, output) -> None:
    x, blocks, turned, transpose = inputs
    ctx.args = (turned, transpose)
    ctx.save_for_backward(blocks, x if blocks.requires_grad else None)


def _backward_blocks(ctx, grad: Tensor):
    blocks, x = ctx.saved_tensors
    turned, transpose = ctx.args
    grad_x = turn_blocks(grad, blocks, turned, not transpose)  # Rᵀ g: the turn back, in x's layout
    grad_blocks = None
    if x is not None:  # ∂R_jik = Σ g_ji x_jk over the turned slices (its transpose for a turn by Rᵀ)
        count, size = blocks.shape[-3], blocks.shape[-1]
        on = [s for s in range(x.shape[0]) if (turned >> s) & 1]
        xs = x[on, ..., : count * size].float().unflatten(-1, (count, size))
        gs = grad[on, ..., : count * size].float().unflatten(-1, (count, size))
        grad_blocks = (gs.unsqueeze(-1) * xs.unsqueeze(-2)).sum(0)
        grad_blocks = grad_blocks.mT if transpose else grad_blocks
    return grad_x, grad_blocks, None, None


turn_blocks.register_autograd(_backward_blocks, setup_context=_setup_blocks)


def turn_qkv(qkv: Tensor, heads: int, targets: str, *, cos=None, sin=None, layout="interleaved", blocks=None):
    """A qkv projection ``(B, N, 3 · heads · dim)`` → q, k, v ``(B, heads, N, dim)`` each, those named in ``targets``
    (letters of "qkv") turned by a table's pairs ``cos, sin ([B,] [heads | 1,] N, dim // 2)`` or its ``blocks ([B,]
    [heads | 1,] N, count, b, b)``; in the projection's layout, as attention gets them without a rotation (a new
    tensor, so the projection's gradient is written in one pass)."""
    x = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=heads)  # a view of the projection
    turned = sum(1 << i for i, c in enumerate("qkv") if c in targets)
    return _turn(x, turned, False, cos, sin, layout, blocks).unbind(0)


def turn_back(x: Tensor, *, cos=None, sin=None, layout="interleaved", blocks=None) -> Tensor:
    """Attention's output ``(B, heads, N, dim)`` turned back by each token's rotation (VO-RoPE's output)."""
    return _turn(x.unsqueeze(0), 1, True, cos, sin, layout, blocks)[0]


def _turn(x: Tensor, turned: int, inverse: bool, cos, sin, layout: str, blocks) -> Tensor:
    B, H, N, D = x.shape[1:]
    if blocks is None:
        shape = (B, H, N, D // 2)
        return turn_pairs(x, cos.expand(shape), sin.expand(shape), turned, layout == "interleaved", inverse)
    return turn_blocks(x, blocks.expand(B, H, N, *blocks.shape[-3:]), turned, inverse)


# --------------------------------------------------------------------------------------------------------- PaPE
def pape_columns(
    q: Tensor, coords: Tensor, curvature: Tensor, gain: Tensor, outer: Tensor, num_prefix: int
) -> tuple[Tensor, Tensor]:
    """PaPE's columns (:class:`~vit_rope.tables.ParabolicBias`): the queries' ``(B, heads, N, E)`` and the keys' ``([B,]
    1, N, E)``, ``E = axes² + axes + 1``, in the coordinates' dtype, from ``q (B, heads, N, d)``, ``coords ([B,] N,
    axes)``, the curvatures' map ``(heads, d, M)``, the slopes' ``gain = slope W (heads, d, axes)`` and ``outer =
    vec(w_m w_mᵀ) (heads, M, axes²)``; prefix tokens (the first ``num_prefix``) get zero columns."""
    dtype, axes = coords.dtype, coords.shape[-1]
    p = coords.unsqueeze(-3)  # ([B,] 1, N, axes)
    x = q.to(dtype)
    a = torch.nn.functional.softplus(x @ curvature)  # (B, heads, N, M): curvatures, positive (decay with distance)
    A = (a @ outer).unflatten(-1, (axes, axes))  # (B, heads, N, axes, axes): A_i = Σ_m a_im w_m w_mᵀ
    beta = x @ gain  # (B, heads, N, axes): β_i = Σ_m b_im w_m with b_i = slopeᵀ q_i
    Ap = (A * p.unsqueeze(-2)).sum(dim=-1)  # (B, heads, N, axes): A_i p_i
    linear = 2 * Ap + beta  # 2 A_i p_i + β_i
    constant = -((Ap + beta) * p).sum(dim=-1, keepdim=True)  # -p_iᵀ A_i p_i - β_i · p_i
    patch = (torch.arange(p.shape[-2], device=p.device) >= num_prefix).to(dtype).unsqueeze(-1)
    query = torch.cat((-A.flatten(-2), linear, constant), dim=-1) * patch  # SDPA's 1/√d divides them as q·k
    squares = (p.unsqueeze(-1) * p.unsqueeze(-2)).flatten(-2)  # vec(p_j p_jᵀ)
    key = torch.cat((squares, p, torch.ones_like(p[..., :1])), dim=-1) * patch
    return query, key


def pape_width(dim: int, axes: int, dtype: torch.dtype) -> int:
    """Channels of PaPE's extended q, k and v: the head dim, the columns (three times over for a 16-bit dtype: value,
    value, remainder against value, remainder, value), zeros up to a multiple of 8 (fused attention needs it)."""
    columns = axes * axes + axes + 1
    used = dim + (3 * columns if dtype in (torch.bfloat16, torch.float16) else columns)
    return used + (-used % 8)


def pape_extend(
    q: Tensor, k: Tensor, coords: Tensor, curvature: Tensor, gain: Tensor, outer: Tensor, num_prefix: int
) -> tuple[Tensor, Tensor]:
    """``q, k (B, heads, N, d)`` with PaPE's columns appended (:func:`pape_columns`) and zeros up to
    :func:`pape_width`, so that ``q' · k' = q · k + √d · bias``. The columns are computed in the coordinates'
    precision (float32 at least: the bias is a difference of terms that grow as ``‖p‖²``). A 16-bit q (autocast)
    keeps its dtype, so attention takes its flash kernels, and each column goes in as a 16-bit value and its 16-bit
    remainder, ``c = c_hi + c_lo``: the query's ``(hi, hi, lo)`` against the key's ``(hi, lo, hi)``, whose products
    attention sums in float32, leave out only ``lo · lo``, about 2⁻¹⁶ of each term rather than the 2⁻⁸ that one 16-bit
    rounding of the columns costs (the released code's way; tests/test_tables.py measures both). Otherwise q, k and
    the columns are float32 at least."""
    with outside_autocast(q.device.type):  # the expansion cancels large terms: the coordinates' precision
        query, key = pape_columns(q, coords, curvature, gain, outer, num_prefix)
    key = key.expand(*k.shape[:-1], key.shape[-1])
    half = q.dtype in (torch.bfloat16, torch.float16)
    dtype = q.dtype if half else torch.promote_types(q.dtype, torch.float32)
    if half:
        query_hi, key_hi = query.to(dtype), key.to(dtype)
        query_lo, key_lo = (query - query_hi.to(query.dtype)).to(dtype), (key - key_hi.to(key.dtype)).to(dtype)
        query = torch.cat((query_hi, query_hi, query_lo), dim=-1)
        key = torch.cat((key_hi, key_lo, key_hi), dim=-1)
    pad = [0, -(q.shape[-1] + query.shape[-1]) % 8]  # up to a multiple of 8 channels: pape_width
    q = torch.nn.functional.pad(torch.cat((q.to(dtype), query.to(dtype)), dim=-1), pad)
    return q, torch.nn.functional.pad(torch.cat((k.to(dtype), key.to(dtype)), dim=-1), pad)


def _pape_torch(x: Tensor, coords: Tensor, curvature: Tensor, gain: Tensor, outer: Tensor, num_prefix: int) -> Tensor:
    """The PaPE kernel's result in PyTorch ops (its backward too): ``(3, B, heads, N, width)``."""
    q, k, v = x.unbind(0)
    q, k = pape_extend(q, k, coords, curvature, gain, outer, num_prefix)
    return torch.stack((q, k, torch.nn.functional.pad(v.to(q.dtype), [0, q.shape[-1] - v.shape[-1]])))


if triton is not None:

    @triton.jit
    def _pape_token_columns(p, A, beta, j, AX: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
        # the columns of each token (pape_columns' math): query [-A, 2 A p + β, -(p·A p + β·p)], key [p pᵀ, p, 1]
        query = tl.where(j < AX * AX, -A, 0.0)
        key = tl.zeros((BLOCK_N, BLOCK_J), dtype=tl.float32)
        constant = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for r in tl.static_range(AX):
            p_r = tl.sum(tl.where(j == r, p, 0.0), axis=1)
            beta_r = tl.sum(tl.where(j == r, beta, 0.0), axis=1)
            Ap_r = tl.zeros((BLOCK_N,), dtype=tl.float32)
            for c in tl.static_range(AX):
                p_c = tl.sum(tl.where(j == c, p, 0.0), axis=1)
                Ap_r += tl.sum(tl.where(j == r * AX + c, A, 0.0), axis=1) * p_c
                key += tl.where(j == r * AX + c, (p_r * p_c)[:, None], 0.0)
            query += tl.where(j == AX * AX + r, (2.0 * Ap_r + beta_r)[:, None], 0.0)
            key += tl.where(j == AX * AX + r, p_r[:, None], 0.0)
            constant += (Ap_r + beta_r) * p_r
        query += tl.where(j == AX * AX + AX, -constant[:, None], 0.0)
        key += tl.where(j == AX * AX + AX, 1.0, 0.0)
        return query, key

    @triton.jit
    def _store_pape_columns(q_out, k_out, query, key, E, mask, HALF: tl.constexpr):
        # the columns after q's and k's channels: as they are, or (bf16/fp16) split hi + lo so that their products
        # keep float32's precision: q [hi, hi, lo] against k [hi, lo, hi] (pape_extend's layout)
        if HALF:
            dtype = q_out.dtype.element_ty
            query_hi, key_hi = query.to(dtype), key.to(dtype)
            query_lo = (query - query_hi.to(tl.float32)).to(dtype)
            key_lo = (key - key_hi.to(tl.float32)).to(dtype)
            tl.store(q_out, query_hi, mask=mask)
            tl.store(q_out + E, query_hi, mask=mask)
            tl.store(q_out + 2 * E, query_lo, mask=mask)
            tl.store(k_out, key_hi, mask=mask)
            tl.store(k_out + E, key_lo, mask=mask)
            tl.store(k_out + 2 * E, key_hi, mask=mask)
        else:
            tl.store(q_out, query, mask=mask)
            tl.store(k_out, key, mask=mask)

    @triton.jit
    def _pape_kernel(
        x_ptr, c_ptr, curv_ptr, gain_ptr, outer_ptr, out_ptr,
        B, N, D, M, E, USED, W, PREFIX,
        xs_s, xs_b, xs_h, xs_n, xs_d,
        cs_b, cs_n, cs_a,
        vs_h, vs_d, vs_m,
        gs_h, gs_d, gs_a,
        us_h, us_m, us_j,
        os_s, os_b, os_h, os_n,
        AX: tl.constexpr, HALF: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_W: tl.constexpr,
    ):  # fmt: skip
        # one program: BLOCK_N tokens of one head of one sample; q, k, v in, q', k', v' out (pape_columns' math)
        pid_n, h, b = _ids()
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]  # (BLOCK_N, 1)
        d = tl.arange(0, BLOCK_D)[None, :]
        dd = tl.arange(0, BLOCK_D)[:, None]
        m = tl.arange(0, BLOCK_M)
        j = tl.arange(0, BLOCK_J)[None, :]  # a column's index
        nmask = n < N
        dmask = nmask & (d < D)
        x = x_ptr + b * xs_b + h * xs_h + n * xs_n + d * xs_d
        q = tl.load(x, mask=dmask, other=0.0).to(tl.float32)
        k = tl.load(x + xs_s, mask=dmask, other=0.0).to(tl.float32)
        v = tl.load(x + xs_s + xs_s, mask=dmask, other=0.0).to(tl.float32)
        curv = tl.load(curv_ptr + h * vs_h + dd * vs_d + m[None, :] * vs_m, mask=(dd < D) & (m[None, :] < M), other=0.0)
        a = tl.dot(q, curv.to(tl.float32), input_precision="ieee")  # (BLOCK_N, BLOCK_M)
        a = tl.where(a > 20.0, a, tl.log(1.0 + tl.exp(tl.minimum(a, 20.0))))  # softplus (torch's threshold 20)
        a = tl.where(m[None, :] < M, a, 0.0)
        outer = tl.load(outer_ptr + h * us_h + m[:, None] * us_m + j * us_j, mask=(m[:, None] < M) & (j < AX * AX),
                        other=0.0)  # fmt: skip
        A = tl.dot(a, outer.to(tl.float32), input_precision="ieee")  # (BLOCK_N, BLOCK_J): A[:, r·axes + c]
        gain = tl.load(gain_ptr + h * gs_h + dd * gs_d + j * gs_a, mask=(dd < D) & (j < AX), other=0.0)
        beta = tl.dot(q, gain.to(tl.float32), input_precision="ieee")  # (BLOCK_N, BLOCK_J): β[:, c]
        p = tl.load(c_ptr + b * cs_b + n * cs_n + j * cs_a, mask=nmask & (j < AX), other=0.0).to(tl.float32)
        query, key = _pape_token_columns(p, A, beta, j, AX, BLOCK_N, BLOCK_J)
        query = tl.where(n >= PREFIX, query, 0.0)
        key = tl.where(n >= PREFIX, key, 0.0)
        # out is ours, contiguous, its width a multiple of 8 (pape_width): every row of q', k' and v' starts at a
        # multiple of 8 elements, which Triton cannot prove from strides that are not multiples of 16, so the stores
        # are told (else 2 bytes a store)
        row = b * os_b + h * os_h + n * os_n
        q_out = out_ptr + tl.multiple_of(row, [8, 8])
        k_out = out_ptr + tl.multiple_of(row + os_s, [8, 8])
        v_out = out_ptr + tl.multiple_of(row + 2 * os_s, [8, 8])
        tl.store(q_out + d, q, mask=dmask)
        tl.store(k_out + d, k, mask=dmask)
        tl.store(v_out + d, v, mask=dmask)
        _store_pape_columns(q_out + D + j, k_out + D + j, query, key, E, nmask & (j < E), HALF)
        w = tl.arange(0, BLOCK_W)[None, :]
        zeros = tl.zeros((BLOCK_N, BLOCK_W), dtype=tl.float32)
        tl.store(q_out + w, zeros, mask=nmask & (w >= USED) & (w < W))
        tl.store(k_out + w, zeros, mask=nmask & (w >= USED) & (w < W))
        tl.store(v_out + w, zeros, mask=nmask & (w >= D) & (w < W))


@torch.library.triton_op("vit_rope::pape_qkv", mutates_args=())
def pape_qkv(x: Tensor, coords: Tensor, curvature: Tensor, gain: Tensor, outer: Tensor, num_prefix: int) -> Tensor:
    """``x (3, B, heads, N, d)``, q, k and v, → ``(3, B, heads, N, width)``: q and k extended by
    :func:`pape_extend`, v padded with zeros to their width, in x's dtype (float32 at least); ``coords (B, N,
    axes)``."""
    S, B, H, N, D = x.shape
    axes = coords.shape[-1]
    width = pape_width(D, axes, x.dtype)
    if not _launches_kernel(x):
        return _pape_torch(x, coords, curvature, gain, outer, num_prefix)
    out = torch.empty((S, B, H, N, width), dtype=x.dtype, device=x.device)
    E = axes * axes + axes + 1
    half = x.dtype in (torch.bfloat16, torch.float16)
    M = curvature.shape[-1]

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_N"]), H, B)

    pow2 = triton.next_power_of_2
    kernel = torch.library.wrap_triton(_pape_kernel) if x.device.type == "cuda" else _pape_kernel
    kernel[grid](
        x, coords, curvature, gain, outer, out, B, N, D, M, E, D + (3 * E if half else E), width, num_prefix,
        *x.stride(), *coords.stride(), *curvature.stride(), *gain.stride(), *outer.stride(), *out.stride()[:-1],
        AX=axes, HALF=half, BLOCK_N=16, BLOCK_D=max(16, pow2(D)), BLOCK_M=max(16, pow2(M)),
        BLOCK_J=max(16, pow2(E)), BLOCK_W=pow2(width),
    )  # fmt: skip
    return out


def _pape_setup(ctx, inputs, output) -> None:
    x, coords, curvature, gain, outer, num_prefix = inputs
    ctx.num_prefix = num_prefix
    ctx.save_for_backward(x, coords, curvature, gain, outer)


def _pape_backward(ctx, grad: Tensor):
    """The gradient of the PyTorch path at the same inputs (the kernel computes what it computes)."""
    x, coords, curvature, gain, outer = ctx.saved_tensors
    leaves = [t.detach().requires_grad_() for t in (x, curvature, gain, outer)]
    with torch.enable_grad():
        out = _pape_torch(leaves[0], coords, *leaves[1:], ctx.num_prefix)
    grads = torch.autograd.grad(out, leaves, grad)
    return grads[0], None, grads[1], grads[2], grads[3], None


pape_qkv.register_autograd(_pape_backward, setup_context=_pape_setup)
