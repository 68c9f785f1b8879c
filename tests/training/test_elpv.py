"""ELPV (vit_rope/training/elpv.py): its labels.csv and images read in place, on tiny files written in the same format
here; the split, the classes, errors naming the line, and one line with the install command when it is missing."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import train
from vit_rope.training import data as D
from vit_rope.training import elpv
from vit_rope.training.elpv import ElpvCells, elpv_folder, read_labels, split

# (probability as the file writes it, type): 8 functional mono cells, 4 of each other level, mixed types
LEVELS = ["0.0"] * 8 + ["0.3333333333333333"] * 4 + ["0.6666666666666666"] * 4 + ["1.0"] * 4
TYPES = ["mono", "poly"] * 10


def write_elpv(root: Path, size: int = 12, lines: list[str] | None = None) -> list[np.ndarray]:
    """labels.csv (blank-separated, as the package's) and one grayscale PNG a cell; returns the pixels."""
    (root / "images").mkdir(parents=True)
    g = np.random.default_rng(0)
    pixels, rows = [], []
    for i, (p, kind) in enumerate(zip(LEVELS, TYPES, strict=True)):
        name = f"images/cell{i + 1:04d}.png"
        pixels.append(g.integers(0, 256, (size, size), dtype=np.uint8))
        Image.fromarray(pixels[-1]).save(root / name)
        rows.append(f"{name}  {p:<20}{kind}")
    (root / "labels.csv").write_text("\n".join(lines if lines is not None else rows) + "\n")
    return pixels


def test_labels_split_and_items_are_read_in_place(tmp_path):
    pixels = write_elpv(tmp_path)
    cells = read_labels(str(tmp_path))
    assert [c[1] for c in cells] == [0] * 8 + [1] * 4 + [2] * 4 + [3] * 4
    assert [c[2] for c in cells] == TYPES
    test, train_cells = split(cells, train=False), split(cells, train=True)
    assert sorted(test + train_cells) == sorted(cells) and not set(test) & set(train_cells)
    # every fourth cell of each (class, type) group: the functional mono cells are 1, 3, 5, 7, the poly ones 2, 4, 6, 8
    assert [c[0] for c in test] == ["images/cell0007.png", "images/cell0008.png"]
    assert len(train_cells) == 18
    ds = ElpvCells(str(tmp_path), train=False)
    assert len(ds) == 2 and ds.classes == list(elpv.CLASSES)
    image, label = ds[0]
    assert image.mode == "L" and label == 0 and np.array_equal(np.asarray(image), pixels[6])


@pytest.mark.parametrize("line,message", [
    ("images/cell0001.png 0.5 mono", "defect probability must be 0, 1/3, 2/3 or 1"),
    ("images/cell0001.png yes mono", "defect probability must be 0, 1/3, 2/3 or 1"),
    ("images/cell0001.png 1.0 thin", "the type must be one of"),
    ("../outside.png 1.0 mono", "must be a .png inside images/"),
    ("images/cell0001.png 1.0", "has 2 fields, not 3"),
])  # fmt: skip
def test_a_line_that_is_not_a_cell_is_named(tmp_path, line, message):
    write_elpv(tmp_path, lines=["images/cell0002.png 0.0 mono", line])
    with pytest.raises(ValueError, match=message) as error:
        read_labels(str(tmp_path))
    assert "line 2" in str(error.value)


def test_a_missing_image_is_an_error_before_the_run(tmp_path):
    write_elpv(tmp_path)
    (tmp_path / "images" / "cell0003.png").unlink()
    with pytest.raises(FileNotFoundError, match=r"cell0003.png', listed in labels.csv, is missing"):
        ElpvCells(str(tmp_path), train=True)


def test_not_installed_is_one_line_with_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.chdir(tmp_path)  # no --data-dir: ./data, which does not hold ELPV
    with pytest.raises(
        FileNotFoundError, match=r"ELPV is not installed: install it with `uv run --extra elpv train.py \.\.\.`"
    ):
        elpv_folder("data")
    with pytest.raises(SystemExit, match=r"uv run --extra elpv train.py \.\.\.") as stop:
        train.main(["--dataset", "elpv", "--output", str(tmp_path / "out")])
    assert "\n" not in str(stop.value) and not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match=r"holds no labels.csv: .*install it with `uv run --extra elpv"):
        elpv_folder(str(tmp_path))  # given, without labels.csv: named, with the command


def test_a_run_trains_below_the_native_size_and_evaluates_from_the_originals(tmp_path):
    """ELPV through train.py's data: the training images are the originals resized to --img-size, every evaluation
    size is resized from the originals (PIL's bicubic resize, what torchvision's Resize does to a PIL image)."""
    pixels = write_elpv(tmp_path, size=40)
    cfg, _ = train.parse_config(["--dataset", "elpv", "--data-dir", str(tmp_path), "--img-size", "8", "--no-aug"])
    data = D.build_data(cfg, dict(mean=(0.0,) * 3, std=(1.0,) * 3))
    assert data.num_classes == 4 and len(data.train) == 18
    x, y = data.train[0]  # cell 1 (functional, mono): the first training cell
    resized = Image.fromarray(pixels[0]).resize((8, 8), Image.BICUBIC)
    assert y == 0 and x.shape == (3, 8, 8)
    np.testing.assert_allclose(x[0].numpy() * 255, np.asarray(resized, dtype=np.float32), atol=0.5)
    x, y = data.eval_set(56, "resize")[0]  # cell 7: the first test cell
    upsampled = Image.fromarray(pixels[6]).resize((56, 56), Image.BICUBIC)
    np.testing.assert_allclose(x[2].numpy() * 255, np.asarray(upsampled, dtype=np.float32), atol=0.5)
    assert data.train_at(24)[0][0].shape == (3, 24, 24)


INSTALLED = importlib.util.find_spec("elpv_dataset") is not None


@pytest.mark.skipif(not INSTALLED, reason="elpv-dataset not installed (uv run --extra elpv ...)")
def test_the_installed_elpv_reads_in_place(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no --data-dir: the installed package's
    folder = elpv_folder("data")
    train_cells, test = ElpvCells(folder, train=True), ElpvCells(folder, train=False)
    assert len(train_cells) + len(test) == 2624 and len(test) == 654
    image, label = test[0]
    assert image.size == (300, 300) and 0 <= label < 4


class FakePackage:
    """What importlib.util.find_spec returns for an installed elpv_dataset whose data folder is ``folder``/data."""

    def __init__(self, folder: Path) -> None:
        self.submodule_search_locations = [str(folder)]


def test_a_data_dir_given_without_labels_is_refused_even_with_the_package_installed(tmp_path, monkeypatch):
    """--data-dir <a typo> trained on the installed package's copy, and config.yaml recorded the typo; the installed
    copy is read only where --data-dir is not given."""
    write_elpv(tmp_path / "package" / "data")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: FakePackage(tmp_path / "package"))
    monkeypatch.chdir(tmp_path)  # (the default --data-dir, ./data, is not there)
    assert elpv_folder("data") == str(tmp_path / "package" / "data")
    with pytest.raises(FileNotFoundError, match=r"--data-dir '/no/typo' holds no labels.csv: .* leave --data-dir out"):
        elpv_folder("/no/typo")
    args = ["--dataset", "elpv", "--data-dir", "tpyo", "--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit, match=r"'tpyo' holds no labels.csv: .*read the installed package's") as stop:
        train.main(args)
    assert "\n" not in str(stop.value) and not (tmp_path / "out").exists()


def test_labels_with_a_byte_order_mark_and_crlf_are_read(tmp_path):
    """A labels.csv saved by a Windows editor (BOM, CRLF) was refused at line 1 ('\\ufeffimages/...')."""
    write_elpv(tmp_path)
    text = (tmp_path / "labels.csv").read_text()
    (tmp_path / "labels.csv").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert [c[:2] for c in read_labels(str(tmp_path))][:2] == [("images/cell0001.png", 0), ("images/cell0002.png", 0)]
    assert len(read_labels(str(tmp_path))) == 20


def test_an_image_listed_twice_is_named(tmp_path):
    """The same cell on two lines (here with two labels) was one image counted twice, in two classes."""
    write_elpv(tmp_path, lines=["images/cell0001.png 0.0 mono", "images/cell0002.png 0.0 mono",
                                "images/cell0001.png 1.0 mono"])  # fmt: skip
    with pytest.raises(ValueError, match=r"line 3 .* lists images/cell0001.png again \(line 1\)"):
        read_labels(str(tmp_path))


def test_a_16_bit_cell_is_scaled_not_clipped(tmp_path):
    """A 16-bit cell (PIL's I;16) reached the model through convert('L'), clipped: 30000 became 255."""
    write_elpv(tmp_path)
    values = np.linspace(0, 65535, 144).round().astype(np.uint16).reshape(12, 12)
    Image.fromarray(values).save(tmp_path / "images" / "cell0007.png")  # the first test cell
    image, _ = ElpvCells(str(tmp_path), train=False)[0]
    assert image.mode == "L"
    np.testing.assert_array_equal(np.asarray(image), np.round(values / 257).astype(np.uint8))


def test_a_cell_cut_short_is_an_error_when_the_split_is_made(tmp_path):
    """A PNG cut in half passed the split's checks (a regular file) and failed in the middle of an epoch."""
    write_elpv(tmp_path, size=40)
    cell = tmp_path / "images" / "cell0005.png"
    cell.write_bytes(cell.read_bytes()[:-30])
    with pytest.raises(ValueError, match=r"cell0005.png': it is a PNG file cut short .* install ELPV again"):
        ElpvCells(str(tmp_path), train=True)


def test_labels_that_are_not_utf8_are_named(tmp_path):
    """A labels.csv in Latin-1 gave 'error: dataset elpv in ...: 'utf-8' codec can't decode byte ...', no file named."""
    write_elpv(tmp_path)
    (tmp_path / "labels.csv").write_bytes("images/cell0001.png 0.0 mono # défaut\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"labels.csv' is not UTF-8 text \(invalid continuation byte at byte 32\)"):
        read_labels(str(tmp_path))
