"""Kernel-launching ops a transformer block, each position encoding against APE's: the GPU's cost, counted on a CPU.

    VIT_ROPE_FUSED=triton TRITON_INTERPRET=1 uv run python bench/kernel_ops.py   # the path a CUDA tensor takes
    VIT_ROPE_FUSED=torch uv run python bench/kernel_ops.py                        # the PyTorch path

On a GPU an eager ViT-S block is bound by kernel launches and passes over memory, not by arithmetic, so the ops it
dispatches are a proxy of its time. A ``TorchDispatchMode`` counts every aten (and custom) op a block dispatches in
a ViT-S inference forward under bfloat16 autocast, leaving out views and allocations, which launch no kernel; the
table each forward builds once is counted apart. ``VIT_ROPE_FUSED=triton`` with Triton's interpreter runs the fused
kernel (vit_rope/kernels.py) on CPU tensors, one op where a CUDA tensor launches one kernel.
"""

from __future__ import annotations

import argparse
from collections import Counter

import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import vit_rope  # noqa: F401  (registers the models)
from vit_rope import kernels
from vit_rope.families import FAMILIES

# allocations, and reshapes of contiguous tensors (_unsafe_view), which launch no kernel
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "lift_fresh", "detach",
             "_unsafe_view", "promote_types"}  # fmt: skip


class OpCounter(TorchDispatchMode):
    """Counts the ops dispatched while ``active``, views and allocations left out."""

    def __init__(self) -> None:
        super().__init__()
        self.active, self.ops = False, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.active and not func.is_view and func.overloadpacket.__name__ not in NO_KERNEL:
            self.ops[f"{func.namespace}.{func.overloadpacket.__name__}"] += 1
        return func(*args, **(kwargs or {}))


def count(pos_embed: str, size: int, batch: int, **kwargs) -> tuple[float, float, Counter]:
    """(ops a block, ops outside the blocks, the blocks' ops by name) of one inference forward."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_small", pos_embed=pos_embed, img_size=size, **kwargs).eval()
    counter = OpCounter()
    for block in model.blocks:
        block.register_forward_pre_hook(lambda *_: setattr(counter, "active", True))
        block.register_forward_hook(lambda *_: setattr(counter, "active", False))
    x = torch.randn(batch, 3, size, size)

    def forward():  # each forward in an autocast region of its own, as a training loop runs it: autocast casts a
        with torch.autocast("cpu", dtype=torch.bfloat16):  # weight once per region, so one region would hide the casts
            model(x)

    with torch.no_grad():
        forward()  # warm (lazy state)
        with counter:
            forward()
        blocks = counter.ops.copy()
        outside = OpCounter()
        outside.active = True
        with outside:
            forward()
    depth = len(model.blocks)
    total_blocks = sum(blocks.values())
    return total_blocks / depth, sum(outside.ops.values()) - total_blocks, blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=64, help="image side (the count does not depend on it)")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--verbose", action="store_true", help="each kind's ops by name")
    args = p.parse_args()
    image = [n for n, f in FAMILIES.items() if f.min_axes <= 2 <= (f.max_axes or 2)]
    kinds = {"ape": {}, **{n: {} for n in image}, "rope (vo)": dict(pos_embed="rope", rope_targets="vo")}
    print(f"path: VIT_ROPE_FUSED={kernels.FUSED}; ViT-S at {args.size}², bf16 autocast, inference forward")
    print(f"{'kind':<18} {'ops a block':>11} {'beyond APE':>10} {'outside blocks':>14}")
    base = None
    for kind, kw in kinds.items():
        kw = dict(kw)
        pos_embed = kw.pop("pos_embed", kind)
        per_block, outside, ops = count(pos_embed, args.size, args.batch, **kw)
        base = per_block if base is None else base
        print(f"{kind:<18} {per_block:>11.1f} {per_block - base:>+10.1f} {outside:>14}")
        if args.verbose:
            depth = 12
            print("    " + ", ".join(f"{n} {c / depth:g}" for n, c in sorted(ops.items(), key=lambda t: -t[1])))


if __name__ == "__main__":
    main()
