"""IDX files (vit_rope/training/idx.py): MNIST-style files read where they lie, gzipped or not, damaged ones refused;
Fashion-MNIST through them."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import train
from vit_rope.training import data as D
from vit_rope.training.idx import IdxImages, read_idx


def write_idx(path: Path, array: np.ndarray) -> None:
    """An IDX file of ``array`` (gzipped where the name ends in .gz), written from the format's description."""
    code = {np.dtype("uint8"): 0x08, np.dtype("int32"): 0x0C, np.dtype("float32"): 0x0D}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(payload) if path.suffix == ".gz" else payload)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_files_round_trip(tmp_path, suffix):
    g = np.random.default_rng(0)
    for array in (g.integers(0, 256, (5, 7, 3), dtype=np.uint8), g.integers(-(2**20), 2**20, (4, 2), dtype=np.int32),
                  g.standard_normal(6).astype(np.float32)):  # fmt: skip
        path = tmp_path / f"a-{array.dtype}{suffix}"
        write_idx(path, array)
        back = read_idx(str(path))
        assert back.dtype == array.dtype and np.array_equal(back, array)


def test_idx_reader_refuses_damaged_files(tmp_path):
    images = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
    write_idx(tmp_path / "ok", images)
    data = (tmp_path / "ok").read_bytes()
    (tmp_path / "short").write_bytes(data[:-5])
    with pytest.raises(ValueError, match=r"short' is truncated or damaged: its header promises 32 bytes .* holds 27"):
        read_idx(str(tmp_path / "short"))
    (tmp_path / "magic").write_bytes(b"\x00\x01" + data[2:])
    with pytest.raises(ValueError, match="magic' is not an IDX file: it starts with 00010803"):
        read_idx(str(tmp_path / "magic"))
    (tmp_path / "header").write_bytes(data[:9])
    with pytest.raises(ValueError, match="ends inside its header"):
        read_idx(str(tmp_path / "header"))
    (tmp_path / "cut.gz").write_bytes(gzip.compress(data)[:-12])
    with pytest.raises(ValueError, match="cut.gz' is a damaged gzip file"):
        read_idx(str(tmp_path / "cut.gz"))


def fashion_args(root: Path) -> list[str]:
    return ["--dataset", "fashion_mnist", "--data-dir", str(root), "--img-size", "28"]


def test_fashion_mnist_reads_its_idx_files_where_they_lie(tmp_path, monkeypatch):
    """The four files in --data-dir (gzipped or not) are read in place: torchvision (which would download) is never
    asked; --train-subset and --val-subset keep fixed parts."""
    import torchvision.datasets as tvd

    g = np.random.default_rng(1)
    splits = {split: (g.integers(0, 256, (n, 28, 28), dtype=np.uint8), g.integers(0, 10, n, dtype=np.uint8))
              for split, n in (("train", 12), ("t10k", 6))}  # fmt: skip
    for split, (images, labels) in splits.items():
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte{'' if split == 'train' else '.gz'}", labels)
    monkeypatch.setattr(tvd.FashionMNIST, "__init__", lambda *a, **k: pytest.fail("torchvision was asked"))
    cfg, _ = train.parse_config(fashion_args(tmp_path))
    dc = dict(mean=(0.0,) * 3, std=(1.0,) * 3)
    train_ds, eval_set, num_classes, _ = D.build_data(cfg, dc)
    assert num_classes == 10 and len(train_ds) == 12
    val = eval_set(28, "resize")
    for i in range(6):
        x, y = val[i]
        assert y == splits["t10k"][1][i] and x.shape == (3, 28, 28)
        torch.testing.assert_close(x[1] * 255, torch.from_numpy(splits["t10k"][0][i]).float(), atol=1e-3, rtol=0)
    assert eval_set(56, "resize")[0][0].shape == (3, 56, 56)
    subset, _ = train.parse_config([*fashion_args(tmp_path), "--train-subset", "5", "--val-subset", "4"])
    train_ds, eval_set, _, _ = D.build_data(subset, dc)
    assert len(train_ds) == 5 and len(eval_set(28, "resize")) == 4
    labels = [[eval_set(size, "resize")[i][1] for i in range(4)] for size in (20, 28)]
    assert labels[0] == labels[1]  # the same images at every size
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", splits["t10k"][1][:5])
    with pytest.raises(ValueError, match=r"holds images \(6, 28, 28\) .* labels \(5,\)"):
        D.build_data(cfg, dc)


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not (FASHION / "t10k-images-idx3-ubyte.gz").exists(), reason="dataset-fashion-mnist not installed")
def test_the_installed_fashion_mnist_reads_in_place():
    test = IdxImages(str(FASHION), False, ["class"] * 10)
    assert len(test) == 10_000 and test.images.shape == (10_000, 28, 28)
    assert sorted(set(test.labels.tolist())) == list(range(10))
