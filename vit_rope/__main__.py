"""`python -m vit_rope`: a short tour of the position encodings — what a table holds, that attention stays relative
under every commuting family, and how the scaling modes change the angles."""

import torch

from vit_rope import FAMILIES, RotaryEmbedding


def main() -> None:
    torch.manual_seed(0)
    rope = RotaryEmbedding(dim=64, axes=2, theta=100.0, num_prefix_tokens=1)
    print(rope)
    table = rope.table((14, 14), dtype=torch.float64)
    angles = torch.atan2(table.sin, table.cos)
    print(
        "token (row 1, col 2): first x pairs", angles[1 + 16, :3].tolist(), "first y pairs", angles[17, 16:19].tolist()
    )

    print("\n<R(a) q, R(b) k> for the same offset b - a at three places, random learned parameters:")
    q, k = torch.randn(2, 1, 2, 1, 64, dtype=torch.float64)
    for name in sorted(n for n, f in FAMILIES.items() if f.rotary and f.min_axes <= 2):
        layer = RotaryEmbedding(64, axes=2, family=name, num_heads=2).double()
        with torch.no_grad():
            for p in layer.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
        scores = []
        for a in ((0.0, 0.0), (7.0, 2.0), (40.0, 40.0)):
            pos = torch.tensor([a, (a[0] + 3, a[1] + 5)], dtype=torch.float64)
            rq = layer(q.expand(-1, -1, 2, -1), positions=pos)[..., 0, :]
            rk = layer(k.expand(-1, -1, 2, -1), positions=pos)[..., 1, :]
            scores.append(f"{(rq * rk).sum(-1)[0, 0].item():+.9f}")
        print(
            f"  {name:11s} {'  '.join(scores)}{'   (not commuting: only approximately relative)' * (name == 'liere')}"
        )

    print("\nangle between neighbouring columns, lowest x frequency, 28x28 grid of a model trained at 14x14:")
    for mode in ("none", "pi", "ntk", "yarn", "normalized"):
        layer = RotaryEmbedding(64, axes=2, scaling=mode, ref_grid=(14, 14))
        t28 = layer.table((28, 28), dtype=torch.float64)
        step = torch.atan2(t28.sin[1, 15], t28.cos[1, 15]) - torch.atan2(t28.sin[0, 15], t28.cos[0, 15])
        print(f"  {mode:10s} {step.item():.6f} rad")


if __name__ == "__main__":
    main()
