"""The mixed-aspect image folder made from Fashion-MNIST (vit_rope/training/canvases.py): every item on a canvas of
its own shape, whole and in its class folder."""

import numpy as np
import pytest
from PIL import Image

from tests.training.test_idx import write_idx
from vit_rope.training.canvases import FASHION_CLASSES, canvas, main


def test_an_item_lies_whole_on_its_canvas():
    rng = np.random.default_rng(0)
    item = Image.fromarray(np.full((28, 28), 200, dtype=np.uint8))
    shapes = set()
    for _ in range(40):
        out = canvas(item, rng)
        w, h = out.size
        assert min(w, h) >= 28 and max(w, h) <= 84
        pixels = np.asarray(out)
        side = int(round(np.sqrt((pixels > 100).sum())))  # the item, scaled by 1 or 2, is all that is not black
        assert side in (28, 56) and (pixels > 100).sum() == side * side
        shapes.add("wide" if w > h else "tall" if h > w else "square")
    assert shapes == {"wide", "tall", "square"}


def test_the_folder_holds_each_item_in_its_class(tmp_path):
    g = np.random.default_rng(1)
    for prefix, n in (("train", 12), ("t10k", 5)):
        write_idx(tmp_path / f"{prefix}-images-idx3-ubyte", g.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{prefix}-labels-idx1-ubyte", (np.arange(n) % 10).astype(np.uint8))
    main(["--idx-root", str(tmp_path), "--output", str(tmp_path / "out"), "--train", "10", "--val", "4"])
    for split, n in (("train", 10), ("val", 4)):
        files = sorted((tmp_path / "out" / split).glob("*/*.png"))
        assert len(files) == n and {f.parent.name for f in files} <= set(FASHION_CLASSES)
    with pytest.raises(SystemExit, match="--train 13: the split has 12 items"):
        main(["--idx-root", str(tmp_path), "--output", str(tmp_path / "o2"), "--train", "13"])
