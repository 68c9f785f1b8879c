"""The files of an image or clip folder, found and read by one set of rules (vit_rope/training/data.py's folders,
idx.py's and elpv.py's images read through the same conversion).

**Which files are the dataset's.** A folder dataset is ``root/<class>/...``: the class folders are the folders of
``root`` (sorted by name, torchvision's numbering), their images every file with one of torchvision's image extensions
(any case) inside them, at any depth. Names starting with a dot (``.thumbs/``, ``.ipynb_checkpoints/``,
``.DS_Store``) are not the dataset's, as ``ls`` does not show them: a hidden folder is no class, a hidden file or folder
inside a class is skipped.

**Links.** The folders are walked following symbolic links, and the walk

* never enters one folder twice: a link loop (``a/loop -> ..``) or a second link to a folder already walked is
  refused, naming the folder, rather than counting its images again (torchvision's walk counted 12 images as 492);
* labels an image by the class folder it lies in: a class folder may itself be a link (``train/cats -> /data/cats``,
  its images are those of the real folder), but a folder inside a class whose real path is not inside the class
  folder's real path (``a/more -> ../b``, a link into another class or elsewhere) is refused; an image file may be a
  link (git-annex, DVC, a cache's store), labelled by the class folder that holds the link;
* counts one file once: names that are one file (hard links, or symbolic links to one image, same device and inode)
  inside one class are one image, the first name in sorted order; one file in two classes (one image, two labels) is
  refused, and so is one file in both the training and the validation split (validation would test on training
  images; a ``val`` that is a link to ``train`` is such a case).

A hard-linked image (more than one link) is the dataset's nevertheless: datasets are often hard-linked copies
(``cp -al`` snapshots, deduplicating tools), and reading one never changes it; what matters is that it is counted once
and labelled by one class. (A file the run *writes* under --output is another matter: folder.py refuses one with more
than one link.)

**Reading.** Every image reaches the model through :func:`to_rgb`: 8-bit images as PIL converts them, wider ones
(PIL's modes ``I;16*``, ``I``, ``F``) scaled to 8 bits by their type's range, never clipped (PIL's ``convert`` clips:
a 16-bit image reached the model all white). See :func:`to_8bit`.
"""

import os
import stat

import numpy as np
from PIL import Image


class DataError(ValueError):
    """A file of the dataset that cannot be read as it must be (found while training: changed since the run's checks);
    train.py ends the run with its message on one line."""


# torchvision's image extensions (torchvision.datasets.folder.IMG_EXTENSIONS), for images and frames alike
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
SIXTEEN = ("I;16", "I;16L", "I;16B", "I;16N")  # PIL's 16-bit unsigned grayscale modes
WIDE = (*SIXTEEN, "I", "F")  # modes whose values PIL's convert() would clip to 8 bits
TAIL = 4_096  # the last bytes of a PNG or JPEG read for its end marker (a whole file ends with it)


def hidden(name: str) -> bool:
    """A name ``ls`` does not show: not the dataset's."""
    return name.startswith(".")


def is_image_name(name: str) -> bool:
    return not hidden(name) and name.lower().endswith(IMAGE_EXTENSIONS)


def outside_unit_range(a: np.ndarray) -> str:
    """What keeps a float array from being values in [0, 1] ('' if nothing): values that are not finite, or the range
    they span."""
    if not bool(np.isfinite(a).all()):
        return "values that are not finite"
    return f"values from {a.min():g} to {a.max():g}" if a.size and (a.min() < 0 or a.max() > 1) else ""


def to_8bit(img: Image.Image, path: object = None) -> Image.Image:
    """``img`` as an image of 8-bit channels: as it is unless its mode is wider than 8 bits; then grayscale ("L")
    scaled by the range of its type, rounded:

    * 16-bit integers (``I;16``, PNG's 16-bit grayscale): value / 65535 of the 8-bit range (value / 257);
    * 32-bit integers (``I``, which PIL gives 16-bit PNGs and TIFFs): read as 16-bit values, refused where a value
      lies outside 0..65535 (there is no range to scale it by);
    * floats (``F``, a float TIFF): values in [0, 1] (the convention of float images: ToTensor's output), refused
      where one lies outside or is not finite (scaling by the image's own minimum and maximum would change every
      image's brightness differently and silently).

    A refusal is a ValueError naming ``path`` and the remedy."""
    if img.mode not in WIDE:
        return img
    a = np.asarray(img)
    where = f"image {str(path)!r}" if path is not None else "an image"
    if img.mode == "F":
        values = outside_unit_range(a)
        if values:
            raise ValueError(
                f"{where} is a float image with {values}: float images are read as values in [0, 1]; save it scaled "
                "to [0, 1], or as an 8- or 16-bit image"
            )
        scaled = a.astype(np.float64) * 255
    elif img.mode == "I":
        if a.size and (a.min() < 0 or a.max() > 65535):
            raise ValueError(
                f"{where} is a 32-bit integer image with values from {a.min()} to {a.max()}: integer images are read "
                "as 8- or 16-bit values (0..65535); save it as an 8- or 16-bit image"
            )
        scaled = a.astype(np.float64) / 257
    else:
        scaled = a.astype(np.float64) / 257
    return Image.fromarray(np.round(scaled).astype(np.uint8))


def to_rgb(img: Image.Image, path: object = None) -> Image.Image:
    """The image as the models take it: three 8-bit channels (:func:`to_8bit` first, so nothing is clipped; a palette
    image with transparency through RGBA, as PIL asks; an alpha channel is dropped, as torchvision's loader does)."""
    img = to_8bit(img, path)
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def load_rgb(path: str) -> Image.Image:
    """The image file at ``path`` through :func:`to_rgb` (OSError, ValueError where it cannot be)."""
    with Image.open(path) as img:
        return to_rgb(img, path)


def check_image(path: str) -> None:
    """What can be known of an image file without decoding all of it, and all of it where its values must be
    checked: a regular file (a FIFO would block the read, a device never end it), a header PIL reads (no decompression
    bomb), a PNG or JPEG whole (its end marker within its last bytes: a file cut short opens but fails when decoded,
    in the middle of an epoch), a wide image's values within its range (:func:`to_8bit`). OSError or ValueError."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise OSError(f"it is not a regular file (mode {stat.filemode(mode)})")
    with Image.open(path) as img:
        img.size  # noqa: B018 (the header is read here)
        kind = img.format
        if img.mode in WIDE:
            to_8bit(img, path)
    marker = {"PNG": b"IEND", "JPEG": b"\xff\xd9"}.get(kind)  # (0xFFD9 cannot occur inside JPEG's coded data)
    if marker is None:
        return
    with open(path, "rb") as f:
        f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL))
        if marker in f.read():
            return
    try:  # no end marker where a whole file has it: decoded, to tell a file cut short from one with data after its
        with Image.open(path) as img:  # end (a motion photo's video after a JPEG): PIL refuses a truncated image
            img.load()
    except OSError:
        raise OSError(f"it is a {kind} file cut short (its end marker is missing and it does not decode)") from None


class Walk:
    """One walk over a dataset's folders, following symbolic links, by the rules of this module's docstring: every
    folder entered once, every file counted once, every image inside the real folder of its class. Errors are
    ValueError (FileNotFoundError for a link to nothing), one line naming the path and the remedy."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.folders: dict[tuple[int, int], str] = {}  # (st_dev, st_ino) → the folder's path
        self.files: dict[int, str] = {}  # st_dev, st_ino (as one int: ImageNet holds 1.3 M files) → the file's path
        self.enter(root)

    def enter(self, path: str) -> None:
        st = os.stat(path)
        key = (st.st_dev, st.st_ino)
        if key in self.folders:
            raise ValueError(
                f"folder {path!r} is {self.folders[key]!r} again (a symbolic link loop, or a second link to one "
                "folder): the dataset would visit it twice and count its images twice; remove the link"
            )
        self.folders[key] = path

    def entries(self, folder: str) -> list[os.DirEntry]:
        """The entries of ``folder`` that ``ls`` shows, sorted by name."""
        try:
            with os.scandir(folder) as it:
                return sorted((e for e in it if not hidden(e.name)), key=lambda e: e.name)
        except OSError as e:  # torchvision's os.walk skipped a folder it could not read, silently
            raise ValueError(f"cannot list folder {folder!r} ({e.strerror}); make it readable or remove it") from None

    def classes(self) -> list[str]:
        """The class folders of the root (folders or links to folders, not hidden), sorted by name; an image lying
        in the root itself, outside every class, is refused (it would be left out silently)."""
        found = []
        for e in self.entries(self.root):
            if e.is_dir():
                found.append(e.name)
            elif is_image_name(e.name):
                raise ValueError(
                    f"image {e.path!r} lies outside every class folder of {self.root!r}; move it into the folder of "
                    "its class (root/<class>/<image>)"
                )
        return found

    def inside(self, entry: os.DirEntry, class_folder: str) -> None:
        """Refuse a folder inside a class folder that is a link out of the class folder's real path (a folder that is
        no link lies where its parent does: inside, by induction). A file may be a link anywhere: git-annex, DVC and
        caches keep images in a store and link them into their class; such an image is labelled by the class folder
        holding the link, and one file linked into two classes is refused by :meth:`file`."""
        if not entry.is_symlink() or not entry.is_dir():
            return
        path = entry.path
        real, home = os.path.realpath(path), os.path.realpath(class_folder)
        if os.path.commonpath([real, home]) != home:
            raise ValueError(
                f"{path!r} really lies in {real!r}, outside its class folder {class_folder!r} (which is {home!r}): "
                "an image is labelled by the class folder it lies in; move or copy it there (a class folder may "
                "itself be a link)"
            )

    def file(self, path: str, label: str) -> bool:
        """Whether ``path`` (an image of class ``label``) is a file not counted yet; the same file in another class
        is refused."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"{path!r} is a symbolic link to nothing ({os.readlink(path)!r}); remove it or restore its target"
            ) from None
        key = st.st_dev << 64 | st.st_ino
        if key in self.files:
            other = self.files[key]
            other_label = os.path.relpath(other, self.root).split(os.sep)[0]
            if other_label != label:
                raise ValueError(
                    f"{path!r} and {other!r} are one file (a hard or symbolic link) in two classes, "
                    f"{other_label!r} and {label!r}: one image with two labels; remove the one in the wrong class"
                )
            return False
        self.files[key] = path
        return True

    def images(self, class_folder: str, label: str) -> list[str]:
        """The images of one class folder, at any depth, in torchvision's order (folder by folder in sorted order of
        their paths, each folder's files sorted), every file once."""
        self.enter(class_folder)
        found: list[tuple[str, list[str]]] = []

        def visit(folder: str) -> None:
            names = []
            for e in self.entries(folder):
                if e.is_dir():
                    self.enter(e.path)
                    self.inside(e, class_folder)
                    visit(e.path)
                elif is_image_name(e.name):
                    self.inside(e, class_folder)
                    names.append(e.path)
            found.append((folder, names))

        visit(class_folder)
        return [p for _, names in sorted(found) for p in names if self.file(p, label)]

    def clips(self, class_folder: str, label: str) -> list[tuple[str, list[str]]]:
        """The clips of one class folder (its folders) with their frames (each clip's images, sorted by name); a
        frame may repeat inside a class (a still scene), not across classes."""
        self.enter(class_folder)
        clips = []
        for e in self.entries(class_folder):
            if e.is_dir():
                self.enter(e.path)
                self.inside(e, class_folder)
                frames = []
                for f in self.entries(e.path):
                    if not f.is_dir() and is_image_name(f.name):
                        self.inside(f, class_folder)
                        self.file(f.path, label)
                        frames.append(f.path)
                clips.append((e.path, frames))
            elif is_image_name(e.name):
                raise ValueError(
                    f"frame {e.path!r} lies in a class folder, not in a clip folder; move the frames of each clip "
                    "into a folder of their own (root/<class>/<clip>/<frames>)"
                )
        return clips


def same_files(train: Walk, val: Walk) -> None:
    """Refuse a file that is in both splits (validation would test on what was trained on)."""
    for key, path in val.files.items():
        if key in train.files:
            raise ValueError(
                f"{path!r} is the same file as {train.files[key]!r} of the training split: validation would "
                "test on training images; remove it from one split (val/ must not be, or hold, links into train/)"
            )
