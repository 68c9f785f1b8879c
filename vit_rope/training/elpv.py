"""ELPV: electroluminescence images of solar cells, functional and defective (Buerhop-Lutz et al., EU PVSEC 2018;
Deitsch et al., Solar Energy 2019), read in place from the files the PyPI package ``elpv-dataset`` installs.

2,624 grayscale cells of 300 x 300 pixels from 44 modules, each annotated with the probability that it is defective
(0, 1/3, 2/3 or 1, the experts' confidence) and its module's type (mono- or polycrystalline); licence CC BY-NC-SA 4.0
(research, not commercial use). Its detail is fine (cracks, finger interruptions), so it is a dataset whose content
grows with the resolution: native 300 px, where Fashion-MNIST has 28.

The files: ``labels.csv`` (one line a cell: ``images/cell0001.png  1.0  mono``, separated by blanks) beside the
``images/`` folder. The classes here are the four defect probabilities. The dataset has no published split; the
papers split 75/25 stratified by probability and type, and so does :func:`split` here, deterministically (every fourth
cell of each (probability, type) group in file order is a test cell), so that every run tests on the same cells.
"""

import importlib.util
import os
import re
import stat
from pathlib import Path

from PIL import Image
from torch.utils.data import Dataset

from .images import DataError, check_image, to_8bit

INSTALL = "uv run --extra elpv train.py ..."  # (PyPI's elpv-dataset, 91 MB; `pip install elpv-dataset` outside uv)
CLASSES = ("functional", "defective 1/3", "defective 2/3", "defective")  # defect probability 0, 1/3, 2/3, 1
TYPES = ("mono", "poly")
TEST_EVERY = 4  # every fourth cell of a (class, type) group is a test cell: the papers' 75/25
_PATH = re.compile(r"images/[\w.-]+\.png")  # a cell's file: inside images/, never a path out of the folder


class DataNotInstalled(FileNotFoundError):
    """The dataset's files are not where they are looked for."""


DATA_DIR = "data"  # train.py's --data-dir when none is given (settings.py's default): the installed copy may stand in


def elpv_folder(data_dir: str) -> str:
    """The folder that holds ELPV's ``labels.csv`` and ``images/``: ``data_dir`` where it does; the installed
    package's data folder (located, not imported: nothing of it runs) only where ``data_dir`` is the default (no
    --data-dir given): a --data-dir given without labels.csv (a typo) is one line naming it, never the installed
    copy read in its place (the run's config.yaml would name the typo as the data it trained on)."""
    if os.path.isfile(os.path.join(data_dir, "labels.csv")):
        return data_dir
    spec = importlib.util.find_spec("elpv_dataset")
    installed = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            folder = os.path.join(location, "data")
            if os.path.isfile(os.path.join(folder, "labels.csv")):
                installed = folder
                break
    if data_dir != DATA_DIR:
        package = "the installed package's" if installed else f"the package's (install it with `{INSTALL}`)"
        raise FileNotFoundError(
            f"--data-dir {data_dir!r} holds no labels.csv: give the folder that holds ELPV's labels.csv and images/, "
            f"or leave --data-dir out to read {package}"
        )
    if installed is not None:
        return installed
    raise DataNotInstalled(
        f"ELPV is not installed: install it with `{INSTALL}`, or give --data-dir the folder that holds its labels.csv "
        f"and images/ (not {data_dir!r})"
    )


def read_labels(folder: str) -> list[tuple[str, int, str]]:
    """(image path, class index, module type) of every line of ``folder``/labels.csv; a line that is not one (a
    probability other than 0, 1/3, 2/3 or 1, an unknown type, a path outside images/) is a ValueError naming it."""
    path = os.path.join(folder, "labels.csv")
    cells, lines = [], {}
    with open(path, encoding="utf-8-sig") as f:  # (a byte-order mark, as Windows editors write, is no part of line 1)
        try:
            text = f.read()
        except UnicodeDecodeError as e:
            raise ValueError(f"{path!r} is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8") from None
    for number, line in enumerate(text.split("\n"), 1):  # (read with universal newlines: CRLF is LF)
        if not line.strip():
            continue
        fields = line.split()
        where = f"{path!r} line {number} ({line.strip()[:80]!r})"
        if len(fields) != 3:
            raise ValueError(f"{where} has {len(fields)} fields, not 3 (image, defect probability, type)")
        name, probability, kind = fields
        if not _PATH.fullmatch(name):
            raise ValueError(f"{where}: the image must be a .png inside images/, such as images/cell0001.png")
        try:
            level = float(probability) * (len(CLASSES) - 1)
        except ValueError:
            level = -1.0
        if not (0 <= level <= len(CLASSES) - 1 and abs(level - round(level)) < 1e-3):
            raise ValueError(f"{where}: the defect probability must be 0, 1/3, 2/3 or 1")
        if kind not in TYPES:
            raise ValueError(f"{where}: the type must be one of {TYPES}")
        if name in lines:
            raise ValueError(f"{where} lists {name} again (line {lines[name]}): one image would count twice, "
                             "perhaps with two labels; keep one line of it")  # fmt: skip
        lines[name] = number
        cells.append((name, round(level), kind))
    if not cells:
        raise ValueError(f"{path!r} lists no cells")
    return cells


def split(cells: list[tuple[str, int, str]], train: bool) -> list[tuple[str, int, str]]:
    """The training (3/4) or test (1/4) cells, stratified by class and type: within each (class, type) group, in file
    order, every fourth cell is a test cell."""
    seen: dict[tuple[int, str], int] = {}
    picked = []
    for cell in cells:
        k = seen[cell[1:]] = seen.get(cell[1:], -1) + 1
        if (k % TEST_EVERY == TEST_EVERY - 1) != train:
            picked.append(cell)
    return picked


class ElpvCells(Dataset):
    """One split of ELPV: items are (grayscale PIL image at its native size, class index), as torchvision's datasets
    give them without a transform. Every image is checked when the split is made (a regular file, its header, a PNG
    not cut short: ``images.check_image``), so that a missing or broken one is an error now, not in the middle of an
    epoch; the pixels are read when an item is asked for, through ``images.to_8bit`` (a 16-bit cell scaled, not
    clipped)."""

    classes = list(CLASSES)

    def __init__(self, folder: str, train: bool) -> None:
        self.folder = folder
        self.cells = split(read_labels(folder), train)
        for name, _, _ in self.cells:
            image = os.path.join(folder, name)
            try:
                regular = stat.S_ISREG(os.stat(image).st_mode)  # (a FIFO would block the read)
            except OSError:
                regular = False
            if not regular:
                raise FileNotFoundError(
                    f"{image!r}, listed in labels.csv, is missing or not a regular file; install ELPV again "
                    f"(`{INSTALL}`)"
                )
            try:
                check_image(image)  # its header, a PNG not cut short: now, not in the middle of an epoch
            except (OSError, Image.DecompressionBombError) as e:
                raise ValueError(f"cannot read image {image!r}: {e}; install ELPV again (`{INSTALL}`)") from None

    def __len__(self) -> int:
        return len(self.cells)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        name, label, _ = self.cells[index]
        path = Path(self.folder) / name
        try:
            with Image.open(path) as image:
                return to_8bit(image, path).convert("L"), label  # a 16-bit cell scaled, not clipped
        except (OSError, ValueError, Image.DecompressionBombError) as e:  # PIL's UnidentifiedImageError is an OSError
            raise DataError(f"cannot read image {str(path)!r}: {e}; install ELPV again (`{INSTALL}`)") from None
