"""MNIST and Fashion-MNIST read from their original IDX files where they lie (as Debian's package
``dataset-fashion-mnist`` installs them in /usr/share/datasets/fashion-mnist), gzipped or not, nothing copied.

The IDX format: a magic number of four bytes (two zero bytes, a code of the element type, the number of dimensions),
each dimension as a big-endian unsigned 32-bit integer, then the elements in row-major order, big-endian.
"""

import gzip
import math
import os
import struct
import zlib

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

# the type code (third byte of the magic number) → numpy's name of the big-endian element type
IDX_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """The array an IDX file holds (``.gz`` read through gzip); a file that is not one, or is cut short, is a
    ValueError naming it."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            raw = f.read()
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path!r} is a damaged gzip file ({e}); download it again") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in IDX_TYPES:
        raise ValueError(
            f"{path!r} is not an IDX file: it starts with {raw[:4].hex() or 'nothing'}, not 0000, a type code "
            f"({', '.join(f'{t:02x}' for t in IDX_TYPES)}) and the number of dimensions"
        )
    header = 4 + 4 * raw[3]
    if len(raw) < header:
        raise ValueError(f"{path!r} is truncated: it ends inside its header of {raw[3]} dimensions; download it again")
    shape = struct.unpack(f">{raw[3]}I", raw[4:header])
    dtype = np.dtype(IDX_TYPES[raw[2]])
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path!r} is truncated or damaged: its header promises {expected} bytes of data (shape {shape}), the "
            f"file holds {len(raw) - header}; download it again"
        )
    return np.frombuffer(raw, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def idx_files(root: str, train: bool) -> tuple[str, str] | None:
    """The images and labels files of a split in ``root`` under MNIST's names (``train-``/``t10k-``), gzipped or
    not; None where either is missing."""
    prefix = "train" if train else "t10k"
    found = []
    for kind in ("images-idx3", "labels-idx1"):
        names = [os.path.join(root, f"{prefix}-{kind}-ubyte{ext}") for ext in ("", ".gz")]
        found += [p for p in names if os.path.isfile(p)][:1]
    return (found[0], found[1]) if len(found) == 2 else None


class IdxImages(Dataset):
    """One split of an MNIST-style dataset from its IDX files: items are (grayscale PIL image, label), as
    torchvision's MNIST gives them without a transform."""

    def __init__(self, root: str, train: bool, classes: list[str]) -> None:
        paths = idx_files(root, train)
        if paths is None:
            raise FileNotFoundError(
                f"no {'train' if train else 't10k'}-{{images-idx3,labels-idx1}}-ubyte[.gz] in {root!r}"
            )
        self.images, self.labels = read_idx(paths[0]), read_idx(paths[1])
        if self.images.ndim != 3 or self.labels.shape != self.images.shape[:1]:
            raise ValueError(
                f"{paths[0]!r} holds images {self.images.shape} and {paths[1]!r} labels {self.labels.shape}: "
                "expected (N, H, W) images with N labels; the two files belong to different datasets or splits"
            )
        if self.labels.dtype.kind not in "iu":
            raise ValueError(f"{paths[1]!r} holds {self.labels.dtype} labels, not integers: it is not a labels file")
        outside = self.labels[(self.labels < 0) | (self.labels >= len(classes))]
        if outside.size:
            raise ValueError(
                f"{paths[1]!r} has labels outside the {len(classes)} classes 0..{len(classes) - 1} (such as "
                f"{int(outside[0])}): the file belongs to another dataset"
            )
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index]), int(self.labels[index])
