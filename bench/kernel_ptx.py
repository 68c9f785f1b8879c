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
``ptxas`` ships with it. It uses Triton's compiler internals, which change between versions: it runs under Triton
3.9 (torch 2.15) and 3.6 (torch 2.11, the GPU machines').
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
WIDTH = {f"{t}{bits}": bits // 8 for t in "bfsu" for bits in (8, 16, 32, 64)}


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
    # ld.global[.qualifiers such as nc or L1::evict_last][.v2 | .v4].<type><bits>
    for op, vec, kind in re.findall(r"\b(ld|st)\.global(?:\.[\w:]+?)*?(?:\.v(\d))?\.([bfsu]\d+)\b", ptx):
        counts[f"{op} {int(vec or 1) * WIDTH[kind]:2d} B"] += 1
    return counts


def train_step_launches(family: str, size: int = 224) -> tuple[list, int, str | None]:
    """The kernel launches of one train step of a one-block ViT-S of ``family`` under bf16 autocast, caught, not run:
    ``(kernel, args, kwargs)`` each, how many of them the forward made, and why the backward stopped (None: it did
    not). Needs ``kernels.FUSED == "triton"`` (the path a CUDA tensor takes)."""
    if kernels.FUSED != "triton":
        raise SystemExit("set VIT_ROPE_FUSED=triton: the kernels are launched for CPU tensors only then")
    launches: list = []
    real = {name: getattr(kernels, name) for name in KERNELS}
    for name, kernel in real.items():
        setattr(kernels, name, Caught(kernel, launches))
    try:
        model = timm.create_model("vit_rope_small", pos_embed=family, img_size=size, depth=1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.randn(2, 3, size, size)).float().sum()
        forward, stopped = len(launches), None
        try:
            loss.backward()
        except RuntimeError as e:  # the caught launches wrote nothing: a backward that checks values may refuse
            stopped = str(e)
    finally:
        for name, kernel in real.items():
            setattr(kernels, name, kernel)
    return launches, forward, stopped


def bytes_an_access(counts: Counter) -> float:
    """The mean bytes a global load or store moves."""
    return sum(int(k.split()[1]) * v for k, v in counts.items()) / max(1, sum(counts.values()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    image = [f for f in sorted(FAMILIES) if f != "videorope"]  # (VideoRoPE is a video family)
    p.add_argument("--families", nargs="+", default=image, choices=image)
    p.add_argument("--size", type=int, default=224)
    args = p.parse_args()
    for family in args.families:
        launches, forward, stopped = train_step_launches(family, args.size)
        if stopped:
            print(f"{family:11s} the forward's launches only (its backward refused unwritten values: {stopped[:60]})")
        if not launches:
            print(f"{family:11s} no kernel (attention takes a bias)")
        for index, (kernel, a, kw) in enumerate(launches):
            counts = memory_instructions(compile_for_h100(kernel, a, kw))
            shown = ", ".join(f"{v} x {k}" for k, v in sorted(counts.items()))
            when = "forward" if index < forward else "backward"
            print(
                f"{family:11s} {when:8s} {kernel.fn.__name__:20s} {bytes_an_access(counts):5.1f} B an access  ({shown})"
            )


if __name__ == "__main__":
    main()
