"""The pair rotation alone, on a ViT-S block's qkv projection: the kernel against a copy of the same bytes.

    uv run python bench/rotation.py --device cuda                                        # batch 128, 224², bf16
    VIT_ROPE_FUSED=triton TRITON_INTERPRET=1 uv run python bench/rotation.py --batch 2   # the CPU dry run

A rotation of q and k (v copied) reads the projection once and writes it once, as a copy in the same layout does
(``torch.empty_like(x).copy_(x)``): the copy is the floor, and the kernel's time over the copy's is what the
rotation costs beyond moving the bytes. Timed, each in the op the models call (``kernels.turn_pairs``): both layouts,
a per-head table (RoPE-Mixed's), the turn back (VO-RoPE's output, and the backward of every turn), a forward and
backward against a copy's; and the same arithmetic in PyTorch ops (``VIT_ROPE_FUSED=torch``'s path) for scale.
"""

from __future__ import annotations

import argparse
import time

import torch
from einops import rearrange

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
    x = rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=H)  # a view, as attention takes it
    angles = torch.rand(N, D // 2, device=device, generator=g) * 100
    shape = (B, H, N, D // 2)
    cos, sin = angles.cos().expand(shape), angles.sin().expand(shape)  # one table for every sample and head
    heads = torch.rand(H, N, D // 2, device=device, generator=g) * 100
    cos_h, sin_h = heads.cos().expand(shape), heads.sin().expand(shape)  # a table a head (RoPE-Mixed)
    moved = 2 * x.numel() * x.element_size()  # read once, written once

    print(
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'}, torch {torch.__version__}, "
        f"{args.dtype}, q k v of (B {B}, heads {H}, N {N}, dim {D}) in the qkv projection's layout "
        f"({moved / 2**20:.0f} MiB moved), kernels.FUSED={kernels.FUSED}, {repeats} calls each"
    )
    calls = {
        "copy (the floor)": lambda: torch.empty_like(x).copy_(x),
        "kernel, interleaved pairs": lambda: kernels.turn_pairs(x, cos, sin, 0b011, True, False),
        "kernel, half layout": lambda: kernels.turn_pairs(x, cos, sin, 0b011, False, False),
        "kernel, a table a head": lambda: kernels.turn_pairs(x, cos_h, sin_h, 0b011, True, False),
        "kernel, the turn back": lambda: kernels.turn_pairs(x, cos, sin, 0b011, True, True),
        "PyTorch ops, interleaved": lambda: kernels._turn_pairs_torch(x, cos, sin, 0b011, True, False),
    }
    leaf = qkv.detach().requires_grad_()
    grad = torch.randn_like(x)

    def copy_both_ways():
        y = rearrange(leaf, "b n (three h d) -> three b h n d", three=3, h=H).clone()
        y.backward(grad)

    def turn_both_ways():
        y = kernels.turn_pairs(rearrange(leaf, "b n (three h d) -> three b h n d", three=3, h=H), cos, sin, 3, True,
                               False)  # fmt: skip
        y.backward(grad)

    calls["copy, forward and backward"] = copy_both_ways
    calls["kernel, forward and backward"] = turn_both_ways

    floor = {}
    for name, fn in calls.items():
        ms = timed(fn, device, repeats)
        if name.startswith("copy"):
            floor["both" if "backward" in name else "one"] = ms
        base = floor["both" if "backward" in name else "one"]
        rate = moved * (2 if "backward" in name else 1) / ms / 1e6
        print(f"{name:32s} {ms * 1e3:9.1f} us  {rate:7.0f} GB/s  copy/this {base / ms:5.2f}")


if __name__ == "__main__":
    main()
