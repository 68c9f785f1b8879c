"""Would ``train.py --compile`` speed the CPU benchmark? The train step of its tiny models, eager against compiled.

    uv run python bench/cpu_compile.py                          # axial RoPE, one thread (a JOBS=2 worker's share)
    uv run python bench/cpu_compile.py --models vit_ape_tiny vit_rope_tiny --threads 2

The models are those of configs/protocol_fashion_papers.yaml (patch 2, depth 4, width 64, 2 heads; batch 128 at the
recipe's 10, 14 and 18 px), each step forward, label-smoothed loss, backward, clipping and AdamW as train.py takes
them, on random images (the time does not depend on them). An eager and a compiled copy of a model (inductor, one
graph per image size) take turns, five steps each a round; a figure is the median over rounds of eager time /
compiled time within a round (above 1: compiling is faster), with the interquartile range.
"""

import argparse
import statistics
import time

import timm
import torch

import vit_rope  # noqa: F401  (registers the models)

SIZES = (10, 14, 18)  # the papers' recipe's training sizes (train_sizes)


def model_and_optimizer(name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=10, img_size=14, patch_size=2, depth=4, embed_dim=64, num_heads=2)
    return model, torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=0.05)


def train_step(forward, model: torch.nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor):
    loss = torch.nn.functional.cross_entropy(forward(x), y, label_smoothing=0.1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()


def seconds(forward, model, optimizer, x, y, steps: int = 5) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        train_step(forward, model, optimizer, x, y)
    return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["vit_rope_tiny"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--batch", type=int, default=128)
    args = parser.parse_args()
    for flag in ("threads", "batch", "rounds"):
        if getattr(args, flag) < (2 if flag == "rounds" else 1):
            parser.error(f"--{flag} {getattr(args, flag)}: give a whole number from {2 if flag == 'rounds' else 1}")
    unknown = [name for name in args.models if not timm.is_model(name)]
    if unknown:
        parser.error(
            f"--models: {', '.join(unknown)} not in timm's registry (the benchmark's: vit_ape_tiny, vit_rope_tiny, ...)"
        )
    torch.set_num_threads(args.threads)
    batches = {s: (torch.randn(args.batch, 3, s, s), torch.randint(0, 10, (args.batch,))) for s in SIZES}
    for name in args.models:
        try:
            eager, eager_opt = model_and_optimizer(name)
        except TypeError as e:  # a timm model without the ViT's patch_size, depth, embed_dim and num_heads
            parser.error(f"--models {name}: not a ViT this trunk's kwargs build ({e})")
        model, opt = model_and_optimizer(name)
        compiled = torch.compile(model)
        start = time.perf_counter()
        for s in SIZES:  # warm-up: each size's graph compiled (twice: the optimizer's state appears on the first)
            for _ in range(2):
                train_step(compiled, model, opt, *batches[s])
                train_step(eager, eager, eager_opt, *batches[s])
        print(f"{name}: compiling its three graphs and warming up took {time.perf_counter() - start:.0f} s")
        for s in SIZES:
            ratios, eager_ms = [], []
            for _ in range(args.rounds):
                e = seconds(eager, eager, eager_opt, *batches[s])
                c = seconds(compiled, model, opt, *batches[s])
                ratios.append(e / c)
                eager_ms.append(e * 1e3)
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            print(
                f"  {s} px, batch {args.batch}, {args.threads} thread(s): eager {statistics.median(eager_ms):.0f} ms "
                f"a step; eager / compiled {statistics.median(ratios):.2f} [{q1:.2f}-{q3:.2f}]"
            )


if __name__ == "__main__":
    main()
