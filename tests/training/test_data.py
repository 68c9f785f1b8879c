"""The data a run reads (vit_rope/training/data.py, idx.py): image and clip folders, IDX files. A folder received from
someone else is data: a class, clip or file that cannot be read as one (no frames, a FIFO or device named like an
image, a decompression bomb) is one line before the run starts, and one that breaks while the run goes on is one line
too, saying that --resume continues."""

import gzip
import os
import pathlib
import struct
import zlib
from dataclasses import replace

import pytest
import torch

import train
from tests.test_train import make_folder, make_imagefolder
from tests.training.test_folder import EPOCH, no_hang, one_line  # noqa: F401 (no_hang: a fixture)
from vit_rope.training.idx import IdxImages


def run_on(root: pathlib.Path, tmp_path: pathlib.Path, *args: str, dataset: str = "imagefolder") -> list[str]:
    return [*EPOCH, "--dataset", dataset, "--data-dir", str(root), "--batch-size", "2", "--num-frames", "2", *args,
            "--output", str(tmp_path / "out")]  # fmt: skip


def test_an_image_folder_of_one_class_is_refused(tmp_path):
    make_imagefolder(tmp_path / "one", classes=1, per_class=2)
    with pytest.raises(SystemExit) as stop:
        train.main(run_on(tmp_path / "one", tmp_path))
    assert "1 class folder(s)" in one_line(stop) and "at least two" in str(stop.value)


def write_idx(path: pathlib.Path, code: int, values: list, fmt: str) -> None:
    header = bytes([0, 0, code, 1]) + struct.pack(">I", len(values))
    path.write_bytes(gzip.compress(header + struct.pack(f">{len(values)}{fmt}", *values)))


@pytest.mark.parametrize("labels,message", [((0x08, [0, 12], "B"), "labels outside the 10 classes 0..9"),
                                            ((0x0D, [1.0, 2.0], "f"), "float32 labels, not integers")])  # fmt: skip
def test_idx_labels_outside_the_classes_or_not_integers_are_refused(labels, message, tmp_path):
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">III", 2, 2, 2)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + bytes(8)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", *labels)
    with pytest.raises(ValueError, match=message):
        IdxImages(str(tmp_path), True, [str(i) for i in range(10)])


def test_a_clip_without_frames_is_refused_before_the_run(tmp_path):
    """Issue 35, 8: a clip folder with no frames was found in the middle of an epoch, as a traceback."""
    root = tmp_path / "clips"
    make_folder(root, dict(train="ab", val="ab"), clips=True)
    (root / "train" / "b" / "clip1").mkdir()  # sorted after clip0: reached only when the epoch gets there
    with pytest.raises(SystemExit, match=r"clip1' has no frames") as stop:
        train.main(run_on(root, tmp_path, "--models", "vit_rope3d_tiny", dataset="clipfolder"))
    one_line(stop)
    assert not (tmp_path / "out").exists()


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header promises ``width`` x ``height`` pixels (and holds none)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
    return b"\x89PNG\r\n\x1a\n" + head + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


@pytest.mark.parametrize("kind,message", [
    ("fifo", "not a regular file"),
    ("bomb", "decompression bomb"),
])  # fmt: skip
@pytest.mark.usefixtures("no_hang")
def test_a_file_named_like_an_image_that_is_none_is_one_line_before_the_run(kind, message, tmp_path):
    """A FIFO named zz.png blocked the run for ever; an image whose header promises 10^10 pixels gave a traceback:
    one line naming the file, before anything is written."""
    make_imagefolder(tmp_path / "data", classes=2, per_class=2)
    path = tmp_path / "data" / "train" / "class0" / "zz.png"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(png_header(100_000, 100_000))
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(run_on(tmp_path / "data", tmp_path))
    assert "zz.png" in one_line(stop)
    assert not (tmp_path / "out").exists()


def test_an_image_broken_while_the_run_goes_on_is_one_line(tmp_path, monkeypatch):
    """An image replaced after the run's checks (here: between the checks and training) stops the run with one line
    naming it and saying how to continue, not a traceback from inside the DataLoader."""
    make_imagefolder(tmp_path / "data", classes=2, per_class=2)
    train_model = train.train_model

    def break_then_train(*args, **kwargs):
        for image in (tmp_path / "data" / "train").rglob("*.png"):
            image.write_bytes(b"not a png any more")
        return train_model(*args, **kwargs)

    monkeypatch.setattr(train, "train_model", break_then_train)
    with pytest.raises(SystemExit, match="cannot read image .*png.*--resume continues") as stop:
        train.main(run_on(tmp_path / "data", tmp_path))
    one_line(stop)


@pytest.mark.parametrize("args,message", [
    (["--mixup", "0.8", "--batch-size", "3"], "would hold 3 \\(odd\\); give an even --batch-size"),
    (["--cutmix", "1.0", "--batch-size", "32", "--train-samples", "15"], "would hold 15 \\(odd\\)"),
    (["--aug", "--auto-augment", "nope"], "--auto-augment 'nope'"),
])  # fmt: skip
def test_augmentation_the_data_cannot_take_is_one_line_before_the_run(args, message, tmp_path):
    """Issue 35, 8: mixup with an odd batch failed in the middle of training (timm asserts an even batch); a policy
    timm does not know was an AssertionError traceback."""
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*EPOCH, *args, "--output", str(tmp_path / "out")])
    one_line(stop)
    assert not (tmp_path / "out").exists()


def test_a_link_loop_in_the_training_folder_is_one_line_before_the_run(tmp_path):
    """Issue 41: train/class0/loop -> .. trained silently on 40 times the images, most labelled class0."""
    make_imagefolder(tmp_path / "data", classes=2, per_class=2)
    os.symlink("..", tmp_path / "data" / "train" / "class0" / "loop")
    with pytest.raises(SystemExit, match=r"class0/loop' is .*train' again .* remove the link") as stop:
        train.main(run_on(tmp_path / "data", tmp_path))
    one_line(stop)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dataset", ["imagefolder", "clipfolder"])
def test_a_validation_split_of_one_class_is_one_line_before_the_run(tmp_path, dataset):
    """val/ with class a only (train/ has a and b) reported top-5 100.0 (and top-1 100.0 for a model that always says
    a): an accuracy that measures nothing. A val/ lacking some class but holding two or more is still evaluated (the
    training split's numbering: tests/test_train.py's test_folder_splits_use_the_training_class_indices)."""
    make_folder(tmp_path / "data", dict(train="ab", val="a"), clips=dataset == "clipfolder")
    args = run_on(tmp_path / "data", tmp_path, dataset=dataset)
    if dataset == "clipfolder":
        args = [*args, "--models", "vit_rope3d_tiny"]
    with pytest.raises(SystemExit, match=r"val' holds images of only 1 class \(\['a'\]\) of the 2 classes") as stop:
        train.main(args)
    assert "add images of the other classes to val/" in one_line(stop)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("link", ["split", "image"])
def test_an_image_in_both_splits_is_one_line_before_the_run(tmp_path, link):
    """val -> train (or a val image hard-linked from train/) validated on the training images, silently."""
    make_imagefolder(tmp_path / "data", classes=2, per_class=2)
    data = tmp_path / "data"
    if link == "split":
        for image in (data / "val").rglob("*.png"):
            image.unlink()
        for folder in (data / "val").iterdir():
            folder.rmdir()
        (data / "val").rmdir()
        os.symlink("train", data / "val")
    else:
        victim = sorted((data / "val" / "class1").iterdir())[0]
        victim.unlink()
        os.link(sorted((data / "train" / "class1").iterdir())[0], victim)
    with pytest.raises(SystemExit, match=r"is the same file as .*train/class\d/\d+.png' of the training split") as stop:
        train.main(run_on(data, tmp_path))
    one_line(stop)
    assert not (tmp_path / "out").exists()


def test_a_data_dir_that_is_a_file_is_named_as_one(tmp_path):
    (tmp_path / "data").write_text("not a folder")
    with pytest.raises(SystemExit, match=r"data' is a file, not a folder; imagefolder needs") as stop:
        train.main(run_on(tmp_path / "data", tmp_path))
    one_line(stop)


@pytest.mark.parametrize("vflip", [0.0, 1.0])
def test_vertical_flips_and_no_colour_jitter_reach_the_training_transform(vflip):
    # whole images (--scale 1 1), no horizontal flips and no jitter: the training transform is the evaluation one,
    # turned upside down where --vflip is 1 (an ELPV probe flipped cells both ways, unjittered: brightness is a signal)
    from PIL import Image

    from vit_rope.training import data

    s, _ = train.parse_config(["--aug", "--scale", "1", "1", "--hflip", "0", "--vflip", str(vflip),
                               "--color-jitter", "0"])  # fmt: skip
    rows = torch.linspace(0, 255, 30).round().to(torch.uint8)[:, None].expand(30, 30)
    img = Image.fromarray(torch.stack([rows, rows.T, 255 - rows], -1).numpy())
    norm = dict(mean=(0.5,) * 3, std=(0.5,) * 3)
    train_tf, eval_tf = data.image_transforms(replace(s, img_size=20), norm)
    want = eval_tf(20)(img)
    got = train_tf(img)
    assert torch.allclose(got, want.flip(1) if vflip else want, atol=1e-6)
    assert not torch.allclose(want.flip(1), want)  # (the image is not symmetric: a flip would show)
