"""An image folder of mixed aspect ratios made from real images: Fashion-MNIST items on wide, tall and square canvases.

Each item (28 × 28, read in place from its IDX files) is scaled by 1 or 2 and put at a random place on a black canvas
whose sides are 1 to 3 times 28 px, wide or tall or square alike; its class is the item's. The folder is what
``--dataset imagefolder`` reads (``root/{train,val}/<class>/<n>.png``), for training and evaluating at native aspect
ratio (``--naflex``):

    uv run python -m vit_rope.training.canvases --idx-root /usr/share/datasets/fashion-mnist --output data/canvases
"""

from __future__ import annotations

import argparse
import os

import numpy as np
from PIL import Image
from tqdm import tqdm

from .idx import IdxImages

# Fashion-MNIST's classes, as folder names (torchvision's names with "/" left out)
FASHION_CLASSES = ["tshirt-top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                   "ankle-boot"]  # fmt: skip


def canvas(item: Image.Image, rng: np.random.Generator) -> Image.Image:
    """``item`` scaled by 1 or 2, at a random place on a black canvas of 1 to 3 times its side per axis, as wide,
    tall or square alike."""
    base = item.width
    side = base * int(rng.integers(1, 3))
    item = item.resize((side, side), Image.BICUBIC)
    long = int(rng.integers(side, 3 * base + 1))
    shape = rng.integers(3)  # wide, tall, square
    w, h = (long, side) if shape == 0 else (side, long) if shape == 1 else (long, long)
    out = Image.new(item.mode, (w, h))
    out.paste(item, (int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))))
    return out


def write_canvases(idx_root: str, output: str, train: int = 6000, val: int = 1000, seed: int = 0) -> None:
    """``train`` items of the training split and ``val`` of the test split, each on its canvas, as PNG files in
    ``output/{train,val}/<class>/``; the items are the first of a fixed shuffle of each split (by ``seed``)."""
    rng = np.random.default_rng(seed)
    for split, count, is_train in (("train", train, True), ("val", val, False)):
        items = IdxImages(idx_root, is_train, FASHION_CLASSES)
        if count > len(items):
            raise ValueError(f"--{split} {count}: the split has {len(items)} items; ask at most that many")
        for name in FASHION_CLASSES:
            os.makedirs(os.path.join(output, split, name), exist_ok=True)
        for n, i in enumerate(tqdm(rng.permutation(len(items))[:count], desc=split)):
            image, label = items[int(i)]
            canvas(image, rng).save(os.path.join(output, split, FASHION_CLASSES[label], f"{n:06d}.png"))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idx-root", default="/usr/share/datasets/fashion-mnist", help="folder of the IDX files")
    p.add_argument("--output", required=True, help="the image folder to write (root/{train,val}/<class>/)")
    p.add_argument("--train", type=int, default=6000, help="training items")
    p.add_argument("--val", type=int, default=1000, help="validation items")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        write_canvases(args.idx_root, args.output, args.train, args.val, args.seed)
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


if __name__ == "__main__":
    main()
