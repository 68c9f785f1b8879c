"""Would ``train.py --compile`` speed the CPU benchmark? The train step of its tiny models, eager against compiled.

    uv run python bench/cpu_compile.py                          # axial RoPE, one thread (a JOBS=2 worker's share)
    uv run python bench/cpu_compile.py --models vit_ape_tiny vit_rope_tiny --threads 2

The models are those of configs/protocol_fashion_papers.yaml (patch 2, depth 4, width 64, 2 heads; batch 128 at the
recipe's 10, 14 and 18 px), on random images (the time does not depend on them). At each size an eager and a
compiled copy (inductor) take throughput.py's train step (forward, loss, backward, AdamW) in turns, and a figure is
its ratio: the median over rounds of eager time / compiled time (above 1: compiling is faster), [interquartile
range], and the ratio of the fastest steps.
"""

import argparse
import statistics
import time

import timm
import torch
from throughput import Setup, keep_freed_memory, speed_ratio, timed_rounds

import vit_rope  # noqa: F401  (registers the models)

SIZES = (10, 14, 18)  # the papers' recipe's training sizes (train_sizes)
TRUNK = dict(num_classes=10, img_size=14, patch_size=2, depth=4, embed_dim=64, num_heads=2)  # the benchmark's


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit_rope_tiny"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30, help="interleaved rounds of one step each, after warm-up")
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    for flag, lowest in {"threads": 1, "batch": 1, "rounds": 2}.items():
        if getattr(args, flag) < lowest:
            parser.error(f"--{flag} {getattr(args, flag)}: give a whole number from {lowest}")
    for name in args.models:
        if not timm.is_model(name):
            parser.error(f"--models {name}: not in timm's registry (the benchmark's: vit_ape_tiny, vit_rope_tiny, ...)")
        try:
            timm.create_model(name, **TRUNK)
        except TypeError as e:  # a timm model without the ViT's patch_size, depth, embed_dim and num_heads
            parser.error(f"--models {name}: not a ViT this trunk's kwargs build ({e})")
    return args


def eager_against_compiled(name: str, batch: int, rounds: int) -> None:
    """One line a size: the eager step's median time and eager / compiled, after the compiled copy's first step (its
    graph compiled) is timed."""
    eager, compiled = Setup("cpu", "float32", compile=False), Setup("cpu", "float32", compile=True)
    for size in SIZES:
        x = torch.randn(batch, 3, size, size)
        torch.manual_seed(0)
        steps = {"eager": eager.train_fn(eager.model(name, **TRUNK), x)}
        torch.manual_seed(0)
        steps["compiled"] = compiled.train_fn(compiled.model(name, **TRUNK), x)
        start = time.perf_counter()
        steps["compiled"]()
        first = time.perf_counter() - start
        times = timed_rounds(steps, rounds)
        print(
            f"{name} {size} px, batch {batch}: compiled's first step {first:.0f} s; eager "
            f"{1e3 * statistics.median(times['eager']):.0f} ms a step; eager / compiled "
            f"{speed_ratio(times, 'compiled', 'eager', f'{name} {size} px')}"
        )


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    print(f"{keep_freed_memory()}; {args.threads} thread(s), {args.rounds} rounds")
    for name in args.models:
        eager_against_compiled(name, args.batch, args.rounds)


if __name__ == "__main__":
    main()
