"""The files of an image or clip folder (vit_rope/training/images.py): which files are the dataset's (links followed,
no folder visited twice, no file counted twice, an image labelled by the class folder it really lies in, hidden names
skipped) and how an image reaches the model (16-bit and float images scaled, never clipped; a file cut short found
before the run). Each refusal one line naming the path, raised when the dataset is made."""

import io
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vit_rope.training import data as D
from vit_rope.training.images import check_image, to_8bit, to_rgb


def write(path: Path, value: int = 100, size: int = 8) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (value, value, value)).save(path)


def twelve(root: Path) -> Path:
    """train/a and train/b, six images each."""
    for c, value in (("a", 40), ("b", 80)):
        for i in range(6):
            write(root / "train" / c / f"{i}.png", value)
    return root / "train"


def counts(ds) -> dict[int, int]:
    return dict(Counter(ds[i][1] for i in range(len(ds))))


def one_line_error(kind, match: str, make) -> str:
    with pytest.raises(kind, match=match) as error:
        make()
    assert "\n" not in str(error.value)
    return str(error.value)


@pytest.mark.parametrize("link,target", [("a/loop", ".."), ("a/loop", "."), ("c", "a")])
def test_a_link_loop_or_a_folder_linked_twice_is_refused(tmp_path, link, target):
    """a/loop -> .. made torchvision's walk count the 12 images as 492 (486 labelled a, class b's among them); a class
    c -> a held a's images a second time, labelled c."""
    train = twelve(tmp_path)
    os.symlink(target, train / link)
    message = one_line_error(ValueError, "visit it twice", lambda: D.CheckedImageFolder(str(train)))
    assert f"{train / link}' is " in message and "remove the link" in message


def test_a_link_loop_in_a_clip_folder_is_refused(tmp_path):
    for c in "ab":
        for i in range(2):
            write(tmp_path / "train" / c / "clip0" / f"{i}.png")
    os.symlink("..", tmp_path / "train" / "a" / "loop")  # was a third clip, of class a, holding train/
    with pytest.raises(ValueError, match=r"loop' is .*train' again"):
        D.ClipFolder(str(tmp_path / "train"), 8, 2, (0.5,) * 3, (0.5,) * 3)


@pytest.mark.parametrize("link", ["image", "folder"])
def test_an_image_is_labelled_by_the_class_folder_it_really_lies_in(tmp_path, link):
    """a/x.png -> ../b/0.png (or a/more -> ../b) was labelled a: a class b image counted in a too."""
    train = twelve(tmp_path)
    if link == "image":  # one file with two labels
        os.symlink("../b/0.png", train / "a" / "x.png")
        message = one_line_error(ValueError, "one file", lambda: D.CheckedImageFolder(str(train)))
        assert "in two classes" in message and "'a'" in message and "'b'" in message
        return
    os.symlink("../b", train / "a" / "more")
    message = one_line_error(ValueError, "outside its class folder", lambda: D.CheckedImageFolder(str(train)))
    assert "really lies in" in message and str(train / "b") in message


def test_images_linked_from_a_store_are_read_in_the_class_that_holds_the_link(tmp_path):
    """git-annex, DVC and caches keep each image in a store and link it into its class folder: read, each image in
    the class of its link (a first cut of the walk refused every such link as lying outside its class)."""
    train, store = tmp_path / "train", tmp_path / ".store"
    for cls, value in (("a", 40), ("b", 200)):
        for i in range(3):
            write(store / f"{cls}{i}.png", value)
            (train / cls).mkdir(parents=True, exist_ok=True)
            os.symlink(store / f"{cls}{i}.png", train / cls / f"{i}.png")
    ds = D.CheckedImageFolder(str(train), lambda img: np.asarray(img)[0, 0, 0])
    assert counts(ds) == {0: 3, 1: 3}
    assert sorted((int(ds[i][0]), ds[i][1]) for i in range(6)) == [(40, 0)] * 3 + [(200, 1)] * 3


def test_a_class_folder_that_is_a_link_reads_the_folder_it_points_to(tmp_path):
    train = tmp_path / "train"
    for i in range(3):
        write(train / "a" / f"{i}.png", 40)
        write(tmp_path / "elsewhere" / "cats" / f"{i}.png", 200)
    os.symlink(tmp_path / "elsewhere" / "cats", train / "cats")
    ds = D.CheckedImageFolder(str(train), lambda img: np.asarray(img)[0, 0, 0])
    assert ds.class_to_idx == {"a": 0, "cats": 1} and counts(ds) == {0: 3, 1: 3}
    assert sorted(int(ds[i][0]) for i in range(6)) == [40] * 3 + [200] * 3


def test_one_file_is_one_image_in_its_class_and_refused_in_two(tmp_path):
    """A hard link (or a symbolic link to an image of the same class) was counted twice; one file in two classes was
    an image with two labels."""
    train = twelve(tmp_path)
    os.link(train / "a" / "0.png", train / "a" / "copy.png")
    os.symlink("0.png", train / "a" / "same.png")
    ds = D.CheckedImageFolder(str(train))
    assert counts(ds) == {0: 6, 1: 6} and str(train / "a" / "0.png") in ds.image_paths()
    os.link(train / "a" / "1.png", train / "b" / "z.png")
    one_line_error(ValueError, r"z.png' and .*1.png' are one file .* in two classes, 'a' and 'b'",
                   lambda: D.CheckedImageFolder(str(train)))  # fmt: skip


def test_hidden_folders_and_files_are_not_the_datasets(tmp_path):
    """.thumbs/ was a class (every other class numbered one higher), .ipynb_checkpoints' images were counted."""
    train = twelve(tmp_path)
    write(train / ".thumbs" / "0.png")
    write(train / "a" / ".ipynb_checkpoints" / "0.png")
    write(train / "a" / ".hidden.png")
    (train / "a" / ".DS_Store").write_bytes(b"\0\1")
    ds = D.CheckedImageFolder(str(train))
    assert ds.class_to_idx == {"a": 0, "b": 1} and counts(ds) == {0: 6, 1: 6}
    assert D.class_folders(str(train)) == {"a": 0, "b": 1}


def test_samples_keep_torchvisions_order(tmp_path):
    """Each folder's files sorted, folders in sorted order of their paths (torchvision's order: the same subsets and
    shuffles as before)."""
    train = twelve(tmp_path)
    write(train / "a" / "sub" / "0.png")
    write(train / "a" / "z.png")
    from torchvision.datasets import ImageFolder

    assert D.CheckedImageFolder(str(train)).image_paths() == [p for p, _ in ImageFolder(str(train)).samples]


@pytest.mark.parametrize("case,kind,message", [
    ("stray", ValueError, "stray.png' lies outside every class folder"),
    ("dangling", FileNotFoundError, r"zz.png' is a symbolic link to nothing \('nowhere.png'\)"),
    ("unreadable", ValueError, r"cannot list folder .*locked' \(Permission denied\)"),
])  # fmt: skip
def test_files_the_walk_skipped_silently_are_one_line(tmp_path, monkeypatch, case, kind, message):
    """An image in train/ itself (outside every class) and an unreadable folder were left out silently; a link to
    nothing was found only when its header was read."""
    train = twelve(tmp_path)
    if case == "stray":
        write(train / "stray.png")
    elif case == "dangling":
        os.symlink("nowhere.png", train / "a" / "zz.png")
    else:  # (chmod 0 would not stop root: the folder's listing fails as it does for another user)
        write(train / "a" / "locked" / "0.png")
        scandir = os.scandir

        def denied(path):
            if str(path).endswith("locked"):
                raise PermissionError(13, "Permission denied", str(path))
            return scandir(path)

        monkeypatch.setattr(os, "scandir", denied)
    one_line_error(kind, message, lambda: D.CheckedImageFolder(str(train)))


def test_clip_frames_are_torchvisions_image_files_in_clip_folders(tmp_path):
    """A .tif frame was skipped (the clip read without it); frames lying in the class folder, outside any clip, were
    left out silently."""
    for c in "ab":
        write(tmp_path / c / "clip0" / "0.png", 10)
        Image.new("RGB", (8, 8), (250, 250, 250)).save(tmp_path / c / "clip0" / "1.tif")
    ds = D.ClipFolder(str(tmp_path), 8, 2, (0.0,) * 3, (1.0,) * 3)
    clip = ds[0][0]
    assert clip.shape == (3, 2, 8, 8) and float(clip[0, 1].mean()) == pytest.approx(250 / 255)
    write(tmp_path / "a" / "0.png")
    one_line_error(ValueError, "0.png' lies in a class folder, not in a clip folder",
                   lambda: D.ClipFolder(str(tmp_path), 8, 2, (0.0,) * 3, (1.0,) * 3))  # fmt: skip


def tensor_reaching_the_model(tmp_path: Path, name: str, image: Image.Image) -> torch.Tensor:
    """The image as CheckedImageFolder gives it through an identity transform (ToTensor's [0, 1] values)."""
    import torchvision.transforms.functional as TF

    (tmp_path / "a").mkdir(parents=True)
    image.save(tmp_path / "a" / name)
    write(tmp_path / "b" / "0.png")
    D.check_files(ds := D.CheckedImageFolder(str(tmp_path), TF.to_tensor), str(tmp_path))
    return ds[0][0]


def test_a_16_bit_png_reaches_the_model_scaled_not_clipped(tmp_path):
    """PIL's convert("RGB") clipped 16-bit values at 255: this image reached the model 98% white."""
    values = np.linspace(0, 65535, 64 * 4).round().astype(np.uint16).reshape(16, 16)
    with Image.fromarray(values) as image:
        x = tensor_reaching_the_model(tmp_path, "x.png", image)
    with Image.open(tmp_path / "a" / "x.png") as back:
        assert back.mode in ("I;16", "I")
    expected = torch.from_numpy(np.round(values / 257)).float() / 255
    assert x.shape == (3, 16, 16) and float((x == 1).float().mean()) < 0.01
    torch.testing.assert_close(x, expected.expand(3, -1, -1), atol=1 / 255 + 1e-6, rtol=0)


def test_a_float_tiff_reaches_the_model_as_values_in_0_1_and_others_are_refused(tmp_path):
    """A float image of values in [0, 1] reached the model as 0 or 1/255 (PIL clipped the floats to integers)."""
    values = np.linspace(0, 1, 64, dtype=np.float32).reshape(8, 8)
    x = tensor_reaching_the_model(tmp_path / "ok", "x.tif", Image.fromarray(values))
    torch.testing.assert_close(x[1], torch.from_numpy(np.round(values * 255) / 255).float(), atol=1e-6, rtol=0)
    nan = np.full((8, 8), np.nan, np.float32)
    for bad, what in ((values * 300, "values from 0 to 300"), (nan, "values that are not finite")):
        with pytest.raises(ValueError, match=f"x.tif' is a float image with {what}: .* values in \\[0, 1\\]"):
            tensor_reaching_the_model(tmp_path / what.split()[-1], "x.tif", Image.fromarray(bad))


def test_32_bit_integer_images_are_read_as_16_bit_or_refused(tmp_path):
    ok = Image.fromarray(np.array([[0, 65535]], np.int32), mode="I")
    assert np.asarray(to_rgb(ok))[0, :, 0].tolist() == [0, 255]
    with pytest.raises(ValueError, match=r"'big.tif' is a 32-bit integer image with values from 0 to 70000"):
        to_8bit(Image.fromarray(np.array([[0, 70000]], np.int32), mode="I"), "big.tif")


@pytest.mark.parametrize("kind", ["JPEG", "PNG"])
def test_an_image_cut_short_is_refused_by_the_checks(tmp_path, kind):
    """A JPEG or PNG cut in half opens (its header is whole) and failed when decoded, in the middle of an epoch, as
    'changed since the checks'."""
    buffer = io.BytesIO()
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(buffer, kind)
    whole, cut = tmp_path / f"whole.{kind}", tmp_path / f"cut.{kind}"
    whole.write_bytes(buffer.getvalue())
    cut.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    check_image(str(whole))
    with pytest.raises(OSError, match=f"it is a {kind} file cut short"):
        check_image(str(cut))


def test_a_jpeg_with_data_after_its_end_is_whole(tmp_path):
    """A motion photo (a JPEG with a video after its end marker) decodes: taken, not "cut short" (a first cut of the
    check read only the file's last bytes for the marker)."""
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buffer, "JPEG")
    path = tmp_path / "motion.jpg"
    path.write_bytes(buffer.getvalue() + bytes(300_000))  # zeros: no end marker among them
    check_image(str(path))


def test_palette_and_cmyk_images_are_read_as_rgb():
    palette = Image.new("P", (2, 2))
    palette.putpalette([10, 20, 30] * 256)
    palette.info["transparency"] = 0
    assert np.asarray(to_rgb(palette))[0, 0].tolist() == [10, 20, 30]
    assert to_rgb(Image.new("CMYK", (2, 2), (0, 255, 0, 0))).getpixel((0, 0)) == (255, 0, 255)


def test_one_frame_in_clips_of_two_classes_is_refused_and_may_repeat_in_one(tmp_path):
    """A still scene repeats a frame (hard links, as deduplicating tools leave them): fine within a class; a frame of
    class a hard-linked into a clip of class b is one image with two labels."""
    for c in "ab":
        write(tmp_path / c / "clip0" / "0.png")
    os.link(tmp_path / "a" / "clip0" / "0.png", tmp_path / "a" / "clip0" / "1.png")
    assert len(D.ClipFolder(str(tmp_path), 8, 2, (0.5,) * 3, (0.5,) * 3).image_paths()) == 3
    os.link(tmp_path / "a" / "clip0" / "0.png", tmp_path / "b" / "clip0" / "1.png")
    one_line_error(ValueError, r"b/clip0/1.png' and .*a/clip0/0.png' are one file .* in two classes",
                   lambda: D.ClipFolder(str(tmp_path), 8, 2, (0.5,) * 3, (0.5,) * 3))  # fmt: skip
