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

from .images import outside_unit_range

# the type code (third byte of the magic number) → numpy's name of the big-endian element type
IDX_TYPES = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


MAX_BYTES = 2 << 30  # the most data an IDX file may promise: the array is held in memory, so a header promising
# more is refused before any of it is inflated (why 2 GiB, and what a refusal costs: docs/speed.md)


def read_idx(path: str) -> np.ndarray:
    """The array an IDX file holds (``.gz`` read through gzip, as a stream): the header first, then exactly the bytes
    it promises, if they are at most :data:`MAX_BYTES`, then one byte more to see that nothing follows. A file that is
    not one, is cut short, holds more than its header says or promises too much is a ValueError naming it."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
            magic = f.read(4)
            if len(magic) < 4 or magic[:2] != b"\0\0" or magic[2] not in IDX_TYPES:
                raise ValueError(
                    f"{path!r} is not an IDX file: it starts with {magic.hex() or 'nothing'}, not 0000, a type code "
                    f"({', '.join(f'{t:02x}' for t in IDX_TYPES)}) and the number of dimensions"
                )
            dims = f.read(4 * magic[3])
            if len(dims) < 4 * magic[3]:
                raise ValueError(
                    f"{path!r} is truncated: it ends inside its header of {magic[3]} dimensions; download it again"
                )
            shape = struct.unpack(f">{magic[3]}I", dims)
            dtype = np.dtype(IDX_TYPES[magic[2]])
            expected = math.prod(shape) * dtype.itemsize
            if expected > MAX_BYTES:
                raise ValueError(
                    f"{path!r} promises {expected} bytes of data (shape {shape}), more than the {MAX_BYTES} bytes an "
                    "IDX file is read into memory here: it is damaged or not an image dataset; download it again"
                )
            raw = f.read(expected)
            if len(raw) != expected:
                raise ValueError(
                    f"{path!r} is truncated or damaged: its header promises {expected} bytes of data (shape "
                    f"{shape}), the file holds {len(raw)}; download it again"
                )
            if f.read(1):
                raise ValueError(
                    f"{path!r} is longer than its header says ({expected} bytes of data, shape {shape}): it is "
                    "damaged or two files in one; download it again"
                )
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise ValueError(f"{path!r} is a damaged gzip file ({e}); download it again") from None
    return np.frombuffer(raw, dtype).reshape(shape).astype(dtype.newbyteorder("="))


def eight_bit(images: np.ndarray, path: str) -> np.ndarray:
    """IDX images as 8-bit pixels: uint8 as they are (MNIST's); integers of another type taken as they are where
    every value lies in 0..255, else refused (an IDX file declares no range to scale them by); floats read as values
    in [0, 1] (scaled by 255, rounded), else refused. PIL would have clipped them, silently (an int32 image of 1000s
    all white, floats of 0.5 all black)."""
    if images.dtype == np.uint8:
        return images
    if images.dtype.kind in "iu":
        if images.size and (images.min() < 0 or images.max() > 255):
            raise ValueError(
                f"{path!r} holds {images.dtype} pixels from {images.min()} to {images.max()}: integer IDX images are "
                "read as 8-bit values 0..255; write them as uint8 (or as floats in [0, 1])"
            )
        return images.astype(np.uint8)
    values = outside_unit_range(images)
    if values:
        raise ValueError(
            f"{path!r} holds {images.dtype} pixels with {values}: float IDX images are read as values in [0, 1]; "
            "write them scaled to [0, 1] (or as uint8)"
        )
    return np.round(images.astype(np.float64) * 255).astype(np.uint8)


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
    """One split of an MNIST-style dataset from its IDX files: items are (grayscale 8-bit PIL image, label), as
    torchvision's MNIST gives them without a transform; images of a wider type are made 8-bit (or refused) here,
    by :func:`eight_bit`."""

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
        if not len(self.labels):
            raise ValueError(f"{paths[0]!r} holds no images (its header says 0); download it again")
        self.images = eight_bit(self.images, paths[0])
        self.classes = list(classes)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Image.Image, int]:
        return Image.fromarray(self.images[index]), int(self.labels[index])
