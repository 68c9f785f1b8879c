"""What native resolution costs: NaFlex batches (a dict of patches, coordinates and a validity mask) against images.

    uv run python bench/naflex.py                               # CPU: ViT-S, batch 8, 196 tokens an image
    uv run python bench/naflex.py --kinds rope ape lookhere pape --repeats 21
    uv run python bench/naflex.py --device cuda --dtype bfloat16 --batch 128 --compile   # a GPU

Two figures, each a throughput ratio of two inputs timed interleaved in one run (bench/throughput.py's method):

* **mask**: the same images as a NaFlex batch with every patch real (so the masked path runs, with nothing to mask)
  against the image tensor (no mask, the convolution's patch embedding): forward and train step. Its cost is the key
  mask in every attention, the per-sample tables, and the patch embedding as a linear map.
* **mixed**: images of mixed aspect ratios (1:3 to 3:1) through timm's NaFlex loader at a budget of 196 tokens (each
  image resized, aspect kept, to fill it; the rest padding) against the same images resized to one square grid of
  196 tokens: images/s of a train step. Also the share of padding tokens over the loader's batches, which bounds what
  packing several images into one row (NaViT) could save over padding.
"""

from __future__ import annotations

import argparse
import os
import platform

import timm
import torch
import torch.nn.functional as F
from PIL import Image
from throughput import Setup, keep_freed_memory, speed_ratio, timed_rounds
from timm.data import create_naflex_loader
from timm.data.naflex_transforms import patchify_image

import vit_rope  # noqa: F401  (registers the models)


def as_naflex(images: torch.Tensor, patch: int) -> dict[str, torch.Tensor]:
    """Images ``(B, C, H, W)`` as a NaFlex batch with every patch real."""
    items = [patchify_image(image, (patch, patch)) for image in images]
    return {
        "patches": torch.stack([p for p, _, _ in items]),
        "patch_coord": torch.stack([c for _, c, _ in items]),
        "patch_valid": torch.stack([v for _, _, v in items]),
    }


def to(batch, device):
    if isinstance(batch, dict):
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch.to(device)


def mask_cost(setup: Setup, kinds: list[str], batch: int, repeats: int) -> None:
    images = torch.randn(batch, 3, 224, 224)
    inputs = {"image": to(images, setup.device), "naflex": to(as_naflex(images, 16), setup.device)}
    print(f"\nmask: a NaFlex batch, every patch real, against the image tensor (ViT-S, 224², batch {batch})")
    for kind in kinds:
        model = setup.model("vit_rope_small", pos_embed=kind)
        for what, make in (("forward", setup.forward_fn), ("train step", setup.train_fn)):
            rounds = repeats if what == "forward" else max(repeats // 2, 3)
            times = timed_rounds({k: make(model, x) for k, x in inputs.items()}, rounds)
            print(
                f"  {kind:10s} {what:10s} naflex/image {speed_ratio(times, 'naflex', 'image', f'mask {kind} {what}')}"
            )


class MixedAspect(torch.utils.data.Dataset):
    """Random pictures of aspect ratios from 1:3 to 3:1, about 300 px on the long side; timm's loader sets
    ``transform``."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        ratios = torch.exp(torch.empty(n).uniform_(-1.1, 1.1, generator=g))  # width / height
        self.sizes = [(int(300 / max(r, 1)), int(300 * min(r, 1))) for r in ratios.tolist()]  # (h, w)
        self.transform = None

    def __len__(self) -> int:
        return len(self.sizes)

    def __getitem__(self, i: int):
        h, w = self.sizes[i]
        g = torch.Generator().manual_seed(i)
        image = Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy())
        return (image if self.transform is None else self.transform(image)), 0


def mixed_against_square(setup: Setup, batch: int, repeats: int) -> None:
    data = MixedAspect(max(4 * batch, 64))
    common = dict(patch_size=(16, 16), batch_size=batch, num_workers=0, use_prefetcher=False,
                  device=torch.device("cpu"), pin_memory=False, persistent_workers=False)  # fmt: skip
    loader = create_naflex_loader(data, max_seq_len=196, is_training=False, **common)
    padding = [float((~b["patch_valid"]).float().mean()) for b, _ in loader]
    naflex = next(iter(loader))[0]
    square = torch.stack(
        [F.interpolate(torch.rand(1, 3, h, w), size=(224, 224), mode="bicubic")[0] for h, w in data.sizes[:batch]]
    )
    print(f"\nmixed: aspect ratios 1:3 to 3:1 at 196 tokens an image, NaFlex against one square grid (batch {batch})")
    print(f"  padding: {100 * sum(padding) / len(padding):.1f} % of the tokens over {len(padding)} batches "
          "(what packing could save at most)")  # fmt: skip
    model = setup.model("vit_rope_small")
    inputs = {"naflex": to(naflex, setup.device), "square": to(square, setup.device)}
    times = timed_rounds({k: setup.train_fn(model, x) for k, x in inputs.items()}, max(repeats // 2, 3))
    print(f"  train step images/s naflex/square {speed_ratio(times, 'naflex', 'square', 'mixed train step')}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds (train steps: half as many)")
    p.add_argument("--kinds", nargs="+", default=["rope", "ape"], help="pos_embed values of the mask section")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--compile", action="store_true")
    p.add_argument("--depth", type=int, help="blocks of every model (default: each model's own; a quick dry run)")
    p.add_argument("--sections", nargs="+", default=["mask", "mixed"], choices=["mask", "mixed"])
    args = p.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    malloc = keep_freed_memory()
    setup = Setup(args.device, args.dtype, args.compile, args.depth)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = setup.device
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    print(f"{where}, {args.threads} CPU threads, torch {torch.__version__}, timm {timm.__version__}, {args.dtype}"
          f"{', compiled' if args.compile else ''}{f', depth {args.depth}' if args.depth else ''}, {malloc}, "
          f"{args.repeats} interleaved rounds; ratios are "
          "throughput, medians of the rounds' paired ratios [interquartile range]")  # fmt: skip
    if "mask" in args.sections:
        mask_cost(setup, args.kinds, args.batch, args.repeats)
    if "mixed" in args.sections:
        mixed_against_square(setup, args.batch, args.repeats)


if __name__ == "__main__":
    main()
