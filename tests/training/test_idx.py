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
from vit_rope.training import idx
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


def test_a_header_promising_more_than_the_limit_is_refused_before_the_data_is_read(tmp_path, monkeypatch):
    """A 2.9 MB .gz whose header promised 3 GB was inflated whole (6.6 GB at peak) before it was refused: the header
    is read first, a promise above idx.MAX_BYTES refused with nothing more inflated."""
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">III", 60_000, 28, 28)
    (tmp_path / "bomb.gz").write_bytes(gzip.compress(header + bytes(1000)))
    monkeypatch.setattr(idx, "MAX_BYTES", 47_040_000 - 1)  # 60000 x 28 x 28: refused one byte below
    asked = []
    read = gzip.GzipFile.read
    monkeypatch.setattr(gzip.GzipFile, "read", lambda self, n=-1: asked.append(n) or read(self, n))
    with pytest.raises(ValueError, match=r"bomb.gz' promises 47040000 bytes of data \(shape \(60000, 28, 28\)\), more "
                       r"than the 47039999 bytes"):  # fmt: skip
        read_idx(str(tmp_path / "bomb.gz"))
    assert asked == [4, 12]  # the magic number and the three dimensions, nothing else
    monkeypatch.undo()  # the limit itself, 2 GiB: 4 GiB promised by an uncompressed file is refused
    big = bytes([0, 0, 0x0C, 2]) + struct.pack(">II", 2**16, 2**14)  # 4 GiB of int32 promised
    (tmp_path / "big").write_bytes(big)
    with pytest.raises(ValueError, match="promises 4294967296 bytes"):
        read_idx(str(tmp_path / "big"))


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_an_idx_file_longer_than_its_header_says_is_named_so(tmp_path, suffix):
    images = np.zeros((2, 4, 4), np.uint8)
    write_idx(tmp_path / "ok", images)
    path = tmp_path / f"long{suffix}"
    payload = (tmp_path / "ok").read_bytes() + b"more"
    path.write_bytes(gzip.compress(payload) if suffix else payload)
    with pytest.raises(ValueError, match=r"is longer than its header says \(32 bytes of data, shape \(2, 4, 4\)\)"):
        read_idx(str(path))


def split_files(root: Path, images: np.ndarray, labels: np.ndarray | None = None) -> None:
    write_idx(root / "train-images-idx3-ubyte.gz", images)
    write_idx(root / "train-labels-idx1-ubyte.gz", np.zeros(len(images), np.uint8) if labels is None else labels)


@pytest.mark.parametrize("images,pixels", [
    (np.array([[[0, 100], [255, 7]]], np.int32), [[0, 100], [255, 7]]),  # integers in 0..255: as they are
    (np.array([[[0.0, 0.5], [1.0, 0.2]]], np.float32), [[0, 128], [255, 51]]),  # floats in [0, 1]: x 255
])  # fmt: skip
def test_idx_images_of_another_type_reach_the_model_in_range(tmp_path, images, pixels):
    """PIL's convert clipped an int32 or float IDX image silently (floats of 0.5 became 0, black)."""
    split_files(tmp_path, images)
    image, _ = IdxImages(str(tmp_path), True, [str(i) for i in range(10)])[0]
    assert image.mode == "L" and np.asarray(image).tolist() == pixels


@pytest.mark.parametrize("images,message", [
    (np.array([[[0, 1000]]], np.int32), "int32 pixels from 0 to 1000: integer IDX images are read as 8-bit"),
    (np.array([[[-5, 0]]], np.int32), "int32 pixels from -5 to 0"),
    (np.array([[[0.0, 2.0]]], np.float32), r"float32 pixels with values from 0 to 2: .* values in \[0, 1\]"),
    (np.array([[[np.inf, 0.0]]], np.float32), "float32 pixels with values that are not finite"),
    (np.zeros((0, 4, 4), np.uint8), r"holds no images \(its header says 0\)"),
])  # fmt: skip
def test_idx_images_out_of_range_or_none_are_refused_when_read(tmp_path, images, message):
    split_files(tmp_path, images)
    with pytest.raises(ValueError, match=f"train-images-idx3-ubyte.gz' (holds )?{message}"):
        IdxImages(str(tmp_path), True, [str(i) for i in range(10)])
