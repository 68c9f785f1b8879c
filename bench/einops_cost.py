"""What einops' ``rearrange`` costs a block against the ``view``/``permute`` chains it replaced (eager, per call).

    uv run python bench/einops_cost.py            # ViT-S's shapes at batch 8

A block splits its qkv projection into heads once and merges the heads once; the figures are microseconds a call
(the median of five runs of 20,000 calls each, after warm-up) and their ratio. Compiled, both are resolved while
tracing and cost nothing.
"""

import statistics
import time

import torch
from einops import rearrange


def by_hand_split(qkv: torch.Tensor, heads: int):
    B, N, _ = qkv.shape
    return qkv.view(B, N, 3, heads, -1).permute(2, 0, 3, 1, 4).unbind(0)


def einops_split(qkv: torch.Tensor, heads: int):
    return rearrange(qkv, "b n (three h d) -> three b h n d", three=3, h=heads).unbind(0)


def by_hand_merge(x: torch.Tensor, heads: int):
    B, H, N, D = x.shape
    return x.transpose(1, 2).reshape(B, N, H * D)


def einops_merge(x: torch.Tensor, heads: int):
    return rearrange(x, "b h n d -> b n (h d)")


def microseconds(f, x: torch.Tensor, heads: int, calls: int = 20_000) -> float:
    for _ in range(1_000):
        f(x, heads)
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            f(x, heads)
        runs.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(runs)


def main() -> None:
    heads, dim, tokens, batch = 6, 64, 197, 8
    qkv, attended = torch.randn(batch, tokens, 3 * heads * dim), torch.randn(batch, heads, tokens, dim)
    for what, hand, ours, x in (("split heads", by_hand_split, einops_split, qkv),
                                ("merge heads", by_hand_merge, einops_merge, attended)):  # fmt: skip
        a, b = microseconds(hand, x, heads), microseconds(ours, x, heads)
        print(f"{what}: by hand {a:.2f} us, einops {b:.2f} us a call (einops / by hand {b / a:.2f})")


if __name__ == "__main__":
    main()
