"""The pair rotation alone, on a ViT-S block's qkv projection: the kernel against a copy of the same bytes.

    uv run python bench/rotation.py --device cuda                                        # batch 128, 224², bf16
    VIT_ROPE_FUSED=triton TRITON_INTERPRET=1 uv run python bench/rotation.py --batch 2   # the CPU dry run

A rotation of q and k (v copied) reads the projection once and writes it once, as a copy in the same layout does
(``torch.empty_like(x).copy_(x)``): the copy is the floor, and the kernel's time over the copy's is what the
rotation costs beyond moving the bytes. Timed, each in the op the models call (``kernels.turn_pairs``): both layouts,
a per-head table (RoPE-Mixed's), the turn back (VO-RoPE's output, and the backward of every turn), a forward and
backward against a copy's; and the same arithmetic in PyTorch ops (``VIT_ROPE_FUSED=torch``'s path) for scale.
Each figure is the mean of eager calls, launch costs on the CPU included: a row of several kernels (the forward and
backward) can be bound by them rather than by the GPU.
"""

from __future__ import annotations

import argparse
import time

import torch
from einops import rearrange
from torch import Tensor

from vit_rope import kernels


def timed(fn, device: torch.device, repeats: int) -> float:
    """Milliseconds a call, the mean of ``repeats`` calls after three to warm up (Triton compiles on the first)."""
    for _ in range(3):
        fn()
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / repeats
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) * 1e3 / repeats


def calls(qkv: Tensor, heads: int) -> dict:
    """What is timed, on a qkv projection ``(B, N, 3 · heads · dim)``: each a call of no arguments."""
    B, N, D = qkv.shape[0], qkv.shape[1], qkv.shape[2] // (3 * heads)
    x = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=heads)  # a view, as attention takes it
    g = torch.Generator(device=qkv.device).manual_seed(1)
    shape = (B, heads, N, D // 2)
    angles = torch.rand(N, D // 2, device=qkv.device, generator=g) * 100
    cos, sin = angles.cos().expand(shape), angles.sin().expand(shape)  # one table for every sample and head
    per_head = torch.rand(heads, N, D // 2, device=qkv.device, generator=g) * 100
    cos_h, sin_h = per_head.cos().expand(shape), per_head.sin().expand(shape)  # a table a head (RoPE-Mixed)
    leaf, grad = qkv.detach().requires_grad_(), torch.randn_like(x)

    # the gradient returned, not accumulated into leaf.grad (which would add a pass a call)
    def copy_both_ways():
        y = rearrange(leaf, "b n (three h d) -> three b h n d", three=3, h=heads).clone()
        torch.autograd.grad(y, leaf, grad)

    def turn_both_ways():
        y = rearrange(leaf, "b n (three h d) -> three b h n d", three=3, h=heads)
        torch.autograd.grad(kernels.turn_pairs(y, cos, sin, 0b011, True, False), leaf, grad)

    return {
        "copy (the floor)": lambda: torch.empty_like(x).copy_(x),
        "kernel, interleaved pairs": lambda: kernels.turn_pairs(x, cos, sin, 0b011, True, False),
        "kernel, half layout": lambda: kernels.turn_pairs(x, cos, sin, 0b011, False, False),
        "kernel, a table a head": lambda: kernels.turn_pairs(x, cos_h, sin_h, 0b011, True, False),
        "kernel, the turn back": lambda: kernels.turn_pairs(x, cos, sin, 0b011, True, True),
        "PyTorch ops, interleaved": lambda: kernels._turn_pairs_torch(x, cos, sin, 0b011, True, False),
        "copy, forward and backward": copy_both_ways,
        "kernel, forward and backward": turn_both_ways,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--tokens", type=int, default=197, help="tokens a sample (ViT-S/16 at 224²: 196 and the cls)")
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    B, N, H, D = args.batch, args.tokens, args.heads, args.head_dim
    repeats = args.repeats if device.type == "cuda" else max(1, args.repeats // 25)
    g = torch.Generator(device=device).manual_seed(0)
    qkv = torch.randn(B, N, 3 * H * D, device=device, dtype=dtype, generator=g)  # the projection's output
    moved = 2 * qkv.numel() * qkv.element_size()  # read once, written once
    print(
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}, "
        f"{args.dtype}, q k v of (B {B}, heads {H}, N {N}, dim {D}) in the qkv projection's layout "
        f"({moved / 2**20:.0f} MiB moved), kernels.FUSED={kernels.FUSED}, {repeats} calls each"
    )
    floor = {}
    for name, fn in calls(qkv, H).items():
        ms = timed(fn, device, repeats)
        both = "backward" in name
        if name.startswith("copy"):
            floor[both] = ms
        rate = moved * (2 if both else 1) / ms / 1e6
        print(f"{name:32s} {ms * 1e3:9.1f} us  {rate:7.0f} GB/s  copy/this {floor[both] / ms:5.2f}")


if __name__ == "__main__":
    main()
