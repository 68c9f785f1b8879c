"""Tile sizes of the fused rotation kernel (vit_rope.rope_triton) against a copy of the same bytes, on a GPU.

python bench/kernel_tiles.py --batch 128
"""

import argparse
import itertools

import torch
import triton.testing

from vit_rope import RotaryEmbedding, rope_triton
from vit_rope.rope import _packed_view


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=128)
    args = p.parse_args()
    table = RotaryEmbedding(64, axes=2, num_prefix_tokens=1).table((14, 14), device="cuda")
    cis = _packed_view(table.cis)
    for dtype in (torch.bfloat16, torch.float32):
        packed = torch.randn(args.batch, 197, 3 * 6 * 64, device="cuda", dtype=dtype)
        moved = 2 * packed[..., : 2 * 6 * 64].numel() * packed.element_size()  # read and write q, k
        src = torch.randn(moved // 2 // packed.element_size(), device="cuda", dtype=dtype)
        dst = torch.empty_like(src)
        copy = triton.testing.do_bench(lambda dst=dst, src=src: dst.copy_(src), return_mode="median")
        print(f"{dtype}: copy of the same bytes {1e3 * copy:.1f} us = {moved / copy / 1e6:.0f} GB/s")
        for max_pairs, pairs, warps in itertools.product((64, 128, 256, 512), (512, 1024, 2048, 4096), (2, 4, 8)):
            if pairs < max_pairs:
                continue
            rope_triton.TILE.update(max_pairs=max_pairs, pairs=pairs, num_warps=warps)
            turn = lambda x=packed: rope_triton.rotate_rows(x, cis, 0, 2, 6)  # noqa: E731
            ms = triton.testing.do_bench(turn, return_mode="median")
            print(
                f"  max_pairs {max_pairs:4d} pairs {pairs:5d} warps {warps}: {1e3 * ms:6.1f} us "
                f"{moved / ms / 1e6:5.0f} GB/s  {copy / ms:.2f} of the copy"
            )


if __name__ == "__main__":
    main()
