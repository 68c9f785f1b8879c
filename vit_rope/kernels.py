"""The fused rotation: q, k and v of a layer split from its qkv projection and turned by their table in one kernel.

A Triton kernel registered as ``vit_rope::turn_pairs`` with :func:`torch.library.triton_op`, so that eager mode and
``torch.compile`` run the same kernel (inductor sees into it). It reads its input through any strides (the qkv
projection's output as ``(3, B, heads, N, dim)``, or attention's output), loads any float dtype, turns channel pairs in
float32 and writes the input's dtype in the input's layout: q, k and v as attention takes them without a rotation.
Its table is ``cos, sin (B, heads, N, dim // 2)`` through any strides, so one kernel serves every pair table: shared
(strides 0), per head (RoPE-Mixed), per sample (NaFlex, token dropping), a layer's of a per-layer table, both
layouts, YaRN's scaled entries and the inverse turn (VO-RoPE's output). Backward turns the gradient back with the
same kernel, writing it in the input's own layout (the qkv projection's, so no copy follows), and gives a learned
table its gradient.

Which path a tensor takes (``FUSED``, from the environment variable ``VIT_ROPE_FUSED`` at import):

* ``auto`` (default): the kernel for CUDA tensors, the PyTorch path (:mod:`vit_rope.tables`) elsewhere;
* ``triton``: the kernel for every tensor; CPU tensors run it under Triton's interpreter, so set
  ``TRITON_INTERPRET=1`` too (the tests and ``bench/kernel_ops.py`` do), in eager mode (a compiled graph of CPU
  tensors takes the op, which computes with PyTorch ops there);
* ``torch``: the PyTorch path everywhere.

The design follows the rotary kernels of Liger, flash-attn and TransformerEngine (a program per block of tokens and
head, pairs in registers), which take neither per-head tables nor gradients for the table; no code is taken from them.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # a torch without Triton (macOS, some CPU builds): the PyTorch path alone
    triton = None

__all__ = ["FUSED", "fused", "turn_back", "turn_blocks", "turn_pairs", "turn_qkv"]

FUSED = os.environ.get("VIT_ROPE_FUSED", "auto")
if FUSED not in ("auto", "triton", "torch"):
    raise ValueError(f"VIT_ROPE_FUSED={FUSED!r}: choose 'auto' (the kernel on CUDA), 'triton' or 'torch'")


def fused(x: Tensor) -> bool:
    """Whether attention turns ``x``'s heads through the fused op (module docstring); float64 never does (the kernel
    computes in float32)."""
    if triton is None or FUSED == "torch" or x.dtype == torch.float64:
        return False
    return FUSED == "triton" or x.device.type == "cuda"


def _launches_kernel(x: Tensor) -> bool:
    """Whether the op launches its kernel on ``x``: on CUDA always (traced into a compiled graph too); on CPU under
    the interpreter, in eager mode only (a traced tensor is a subclass; the interpreter's kernel cannot be traced, so
    a compiled graph of CPU tensors takes the op's PyTorch path)."""
    if triton is None or FUSED == "torch":
        return False
    return x.device.type == "cuda" or (FUSED == "triton" and type(x) is Tensor)


if triton is not None:

    @triton.jit
    def _turn_pairs_kernel(
        x_ptr, cos_ptr, sin_ptr, out_ptr,
        B, N, P, turned,
        xs_s, xs_b, xs_h, xs_n, xs_d,
        ts_b, ts_h, ts_n, ts_p,
        os_s, os_b, os_h, os_n, os_d,
        INTERLEAVED: tl.constexpr, INVERSE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
    ):  # fmt: skip
        # one program: BLOCK_N tokens of one head of one sample of one of q, k, v (s)
        pid_n, h, sb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        s, b = sb // B, sb % B
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None]  # (BLOCK_N, 1)
        p = tl.arange(0, BLOCK_P)[None, :]  # (1, BLOCK_P): pair index
        mask = (n < N) & (p < P)
        first = 2 * p if INTERLEAVED else p  # the pair's two channels
        second = first + 1 if INTERLEAVED else p + P
        x = x_ptr + s * xs_s + b * xs_b + h * xs_h + n * xs_n
        x0 = tl.load(x + first * xs_d, mask=mask, other=0.0).to(tl.float32)
        x1 = tl.load(x + second * xs_d, mask=mask, other=0.0).to(tl.float32)
        t = b * ts_b + h * ts_h + n * ts_n + p * ts_p
        c = tl.load(cos_ptr + t, mask=mask, other=1.0).to(tl.float32)
        sn = tl.load(sin_ptr + t, mask=mask, other=0.0).to(tl.float32)
        if INVERSE:
            sn = -sn
        on = ((turned >> s) & 1) == 1  # this one of q, k, v turns; the others are copied
        c = tl.where(on, c, 1.0)
        sn = tl.where(on, sn, 0.0)
        out = out_ptr + s * os_s + b * os_b + h * os_h + n * os_n
        tl.store(out + first * os_d, x0 * c - x1 * sn, mask=mask)
        tl.store(out + second * os_d, x0 * sn + x1 * c, mask=mask)


if triton is not None:

    @triton.jit
    def _turn_blocks_kernel(
        x_ptr, r_ptr, out_ptr,
        B, N, NB, BS, D, turned,
        xs_s, xs_b, xs_h, xs_n, xs_d,
        rs_b, rs_h, rs_n, rs_j, rs_i, rs_k,
        os_s, os_b, os_h, os_n, os_d,
        BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_R: tl.constexpr,
    ):  # fmt: skip
        # one program: BLOCK_N tokens of one head of one sample of one of q, k, v (s); channel j·b + i is entry i of
        # block j; y_ji = Σ_k R_jik x_jk (the strides of R swapped for Rᵀ); channels past the last block are copied
        pid_n, h, sb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        s, b = sb // B, sb % B
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)[:, None, None]  # (BLOCK_N, 1, 1)
        j = tl.arange(0, BLOCK_J)[None, :, None]  # (1, BLOCK_J, 1): block
        i = tl.arange(0, BLOCK_B)[None, None, :]  # (1, 1, BLOCK_B): entry within the block
        mask = (n < N) & (j < NB) & (i < BS)
        x = x_ptr + s * xs_s + b * xs_b + h * xs_h
        out = out_ptr + s * os_s + b * os_b + h * os_h
        xb = tl.load(x + n * xs_n + (j * BS + i) * xs_d, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_N, J, B)
        r = r_ptr + b * rs_b + h * rs_h + n[:, :, :, None] * rs_n + j[:, :, :, None] * rs_j
        r = r + i[:, :, :, None] * rs_i + tl.arange(0, BLOCK_B)[None, None, None, :] * rs_k
        kmask = mask[:, :, :, None] & (tl.arange(0, BLOCK_B)[None, None, None, :] < BS)
        R = tl.load(r, mask=kmask, other=0.0).to(tl.float32)  # (BLOCK_N, J, B, B): R[n, j, i, k]
        y = tl.sum(R * xb[:, :, None, :], axis=3)
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
    rs = list(blocks.stride())
    if transpose:
        rs[-1], rs[-2] = rs[-2], rs[-1]

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_N"]), H, S * B)

    kernel = torch.library.wrap_triton(_turn_blocks_kernel) if x.device.type == "cuda" else _turn_blocks_kernel
    kernel[grid](
        x, blocks, out, B, N, count, size, D, turned, *x.stride(), *rs, *out.stride(),
        BLOCK_N=block_n, BLOCK_J=block_j, BLOCK_B=block_b, BLOCK_R=max(1, triton.next_power_of_2(D - count * size)),
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
    B, N, _ = qkv.shape
    x = qkv.view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, heads, N, dim): a view of qkv's layout
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
