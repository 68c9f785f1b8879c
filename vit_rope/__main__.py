"""`python -m vit_rope`: a short tour of the rotary layer — what it computes, that attention stays relative, how
the extrapolation modes change the angles, and what one layer's q/k rotation costs next to a plain copy."""

import time

import torch

from vit_rope import RotaryEmbedding, rotate_packed


def _median_us(fn, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6


def main() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(dim=64, axes=2, theta=100.0, num_prefix_tokens=1)
    print(rope)
    table = rope.table((14, 14), dtype=torch.float64)
    angles = torch.atan2(table.sin, table.cos)
    print(
        "token (row 1, col 2): first x pairs", angles[1 + 16, :3].tolist(), "first y pairs", angles[17, 16:19].tolist()
    )

    q, k = torch.randn(2, 64, dtype=torch.float64)
    for a, b in [((0, 0), (3, 5)), ((7, 2), (10, 7)), ((40, 40), (43, 45))]:
        pos = torch.tensor([a, b], dtype=torch.float64)
        rq = RotaryEmbedding(64, axes=2)(q.expand(2, -1), positions=pos)[0]
        rk = RotaryEmbedding(64, axes=2)(k.expand(2, -1), positions=pos)[1]
        print(f"<R{a} q, R{b} k> = {float(rq @ rk):+.12f}   (same offset, same score)")

    print("\nangle between neighbouring columns, lowest x frequency, 28x28 grid of a model trained at 14x14:")
    for mode in ("none", "pi", "ntk", "yarn"):
        layer = RotaryEmbedding(64, axes=2, scaling=mode, ref_grid=(14, 14))
        t28 = layer.table((28, 28), dtype=torch.float64)
        step = torch.atan2(t28.sin[1, 15], t28.cos[1, 15]) - torch.atan2(t28.sin[0, 15], t28.cos[0, 15])
        print(f"  {mode:5s} {step.item():.6f} rad")

    qkv = torch.randn(8, 197, 3 * 6 * 64)  # one ViT-S layer's qkv projection, batch 8
    t = rope.table((14, 14))
    rot = _median_us(lambda: rotate_packed(qkv, t, num_heads=6, turn=(True, True, False)))
    copy = _median_us(lambda: qkv[..., : 2 * 6 * 64].clone())
    print(f"\nrotate q and k (8x6x197x64 each) in place: {rot:.0f} us; a plain copy of them: {copy:.0f} us")


if __name__ == "__main__":
    main()
