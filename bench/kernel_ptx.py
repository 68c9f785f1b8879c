"""The memory instructions our Triton kernels compile to for an H100 (sm_90), from a CPU: how many bytes a load moves.

    VIT_ROPE_FUSED=triton uv run python bench/kernel_ptx.py                      # every family, a ViT-S train step
    VIT_ROPE_FUSED=triton uv run python bench/kernel_ptx.py --families axial pape

A memory-bound kernel is as fast as the bytes each of its load and store instructions moves: a warp of 16-byte
accesses to adjacent addresses runs near the card's bandwidth, one of 2-byte accesses to every other address does
not. On an H100 (2026-11-27, docs/speed.md) the pair kernel that read channels 2p and 2p + 1 with 2-byte loads took
528 us a call, 8 % of a copy's speed, and 69 us once it read whole rows with 16-byte loads. That width is decided at
compile time, so a CPU can show it: a train step of each family is run once on the CPU with every kernel launch caught
(not run) and its arguments kept; each launch is then compiled for sm_90 the way Triton's JIT compiles it on the
GPU (the same specialisation of pointers' alignment and integers' divisibility by 16), and its PTX's global loads
and stores are counted by width. Needs ``VIT_ROPE_FUSED=triton`` (the path a CUDA tensor takes); Triton's own
``ptxas`` ships with it. Triton's compiler internals change between versions: written against Triton 3.9.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from vit_rope import kernels
from vit_rope.families import FAMILIES

KERNELS = ("_turn_pairs_kernel", "_turn_blocks_kernel", "_pape_kernel")
WIDTH = {"b8": 1, "b16": 2, "b32": 4, "b64": 8, "u8": 1, "u16": 2, "u32": 4, "u64": 8, "f32": 4, "f16": 2}


class Caught:
    """Stands for a kernel: ``kernel[grid](*args, **kwargs)`` keeps the launch's arguments and runs nothing."""

    def __init__(self, kernel, launches: list) -> None:
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches.append((self.kernel, args, kwargs))

        return launch


def compile_for_h100(kernel, args: tuple, kwargs: dict) -> str:
    """The PTX Triton's JIT would build for these arguments on an sm_90 card."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)
    return compiled.asm["ptx"]


def memory_instructions(ptx: str) -> Counter:
    """Global loads and stores by kind and bytes an access: ``ld.global.v4.b32`` is a 16-byte load."""
    counts = Counter()
    for op, vec, kind in re.findall(r"\b(ld|st)\.global(?:\.[a-z]+)*?(?:\.v(\d))?\.([bfu]\d+)\b", ptx):
        counts[f"{op} {int(vec or 1) * WIDTH[kind]:2d} B"] += 1
    return counts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--families", nargs="+", default=[f for f in sorted(FAMILIES) if f != "videorope"])
    p.add_argument("--size", type=int, default=224)
    # (each launch of a train step's forward and backward is compiled: the backward's turn back is the same kernel)
    args = p.parse_args()
    if kernels.FUSED != "triton":
        raise SystemExit("set VIT_ROPE_FUSED=triton: the kernels are launched for CPU tensors only then")

    launches: list = []
    for name in KERNELS:
        setattr(kernels, name, Caught(getattr(kernels, name), launches))
    for family in args.families:
        model = timm.create_model("vit_rope_small", pos_embed=family, img_size=args.size, depth=1)
        x = torch.randn(2, 3, args.size, args.size)
        launches.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16):  # a train step: the backward's launches too
            loss = model(x).float().sum()
        forward = len(launches)
        try:
            loss.backward()
        except RuntimeError as e:  # the caught launches wrote nothing: a backward that checks values may refuse
            print(f"{family:11s} the forward's launches only (its backward refused unwritten values: {str(e)[:60]})")
        if not launches:
            print(f"{family:11s} no kernel (attention takes a bias)")
        for index, (kernel, a, kw) in enumerate(launches):
            counts = memory_instructions(compile_for_h100(kernel, a, kw))
            moved = sum(int(k.split()[1]) * v for k, v in counts.items()) / max(1, sum(counts.values()))
            shown = ", ".join(f"{v} x {k}" for k, v in sorted(counts.items()))
            when = "forward" if index < forward else "backward"
            print(f"{family:11s} {when:8s} {kernel.fn.__name__:20s} {moved:5.1f} B an access  ({shown})")


if __name__ == "__main__":
    main()
