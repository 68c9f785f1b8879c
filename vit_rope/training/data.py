"""Datasets for training and evaluation: built-in procedural scenes and clips, torchvision sets, folders.

Built-in data needs no download and is rendered *natively* at any resolution from continuous scene parameters
(deterministic by seed and index), so a model can be evaluated on the same scenes drawn at sizes it never saw.

* ``synthetic``: a warm-coloured disc and a cool-coloured square on a dark textured background; the class is the
  compass direction (8 sectors) of the square as seen from the disc. Texture and shades carry no label: only the
  spatial arrangement does, so position embeddings matter.
* ``synthetic_video``: a disc moving in one of 8 directions; every frame alone is ambiguous and a clip played
  backwards has the opposite label, so the model needs time order.

Video datasets yield float clips ``(C, T, H, W)`` in [0, 1] normalised by mean/std. Your own clips
(``--dataset clipfolder``): ``root/{train,val}/<class>/<clip>/`` with the frames of a clip as image files whose
sorted names give their order (e.g. ``ffmpeg -i v.mp4 clip/%05d.jpg``); frames are resized to the model (or
evaluation) size and ``num_frames`` frames are sampled evenly.
"""

import math
import os
from collections.abc import Callable, Sequence
from functools import cache, lru_cache, partial
from typing import NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from timm.data import create_transform
from torch import Tensor
from torch.utils.data import Dataset
from tqdm import tqdm

from .elpv import ElpvCells, elpv_folder
from .idx import IdxImages, idx_files
from .images import IMAGE_EXTENSIONS, DataError, Walk, check_image, load_rgb, same_files, to_rgb

IMAGE_DATASETS = ("synthetic", "cifar10", "cifar100", "mnist", "fashion_mnist", "elpv", "imagefolder")
VIDEO_DATASETS = ("synthetic_video", "clipfolder")
DATASETS = IMAGE_DATASETS + VIDEO_DATASETS
IN_MEMORY = ("cifar10", "cifar100", "mnist", "fashion_mnist", "elpv")  # read whole into memory: small enough to keep
DIRECTIONS = ("E", "NE", "N", "NW", "W", "SW", "S", "SE")


def _grid(h: int, w: int) -> tuple[Tensor, Tensor]:
    """Pixel centres in [0, 1]: the scene is continuous, the raster is only how it is drawn."""
    y = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    x = (torch.arange(w, dtype=torch.float32) + 0.5) / w
    return torch.meshgrid(y, x, indexing="ij")


def _soft(sdf: Tensor, pixel: float) -> Tensor:
    """Anti-aliased coverage of a shape from its signed distance (negative inside), one pixel wide."""
    return (0.5 - sdf / pixel).clamp(0.0, 1.0)


def _background(g: torch.Generator, y: Tensor, x: Tensor) -> Tensor:
    """A smooth random colour field with random stripes: texture without a label."""
    c0, c1 = torch.rand(3, generator=g) * 0.35, torch.rand(3, generator=g) * 0.35
    a = torch.rand(1, generator=g).item() * 2 * math.pi
    t = (x * math.cos(a) + y * math.sin(a) + 1) / 2
    freq, phase = 4 + 12 * torch.rand(1, generator=g).item(), torch.rand(1, generator=g).item() * 2 * math.pi
    b = torch.rand(1, generator=g).item() * 2 * math.pi
    stripes = 0.08 * torch.sin(freq * 2 * math.pi * (x * math.cos(b) + y * math.sin(b)) + phase)
    return c0[:, None, None] * (1 - t) + c1[:, None, None] * t + stripes


class SyntheticScenes(Dataset):
    """A disc and a square; label = direction of the square from the disc (8 classes). Native at any size."""

    num_classes = len(DIRECTIONS)

    def __init__(
        self, size: int, img_size: int | Sequence[int], seed: int = 0, split: str = "train", transform=None
    ) -> None:
        self.size = size
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.seed = seed + (0 if split == "train" else 1_000_003)
        self.transform = transform
        self.classes = list(DIRECTIONS)

    def __len__(self) -> int:
        return self.size

    def scene(self, index: int) -> tuple[dict, int]:
        g = torch.Generator().manual_seed(self.seed * 7_919 + index)
        label = int(torch.randint(len(DIRECTIONS), (1,), generator=g))
        angle = (label + torch.rand(1, generator=g).item() * 0.8 + 0.1 - 0.5) * 2 * math.pi / len(DIRECTIONS)
        dist = 0.28 + 0.2 * torch.rand(1, generator=g).item()
        r, half = 0.07 + 0.05 * torch.rand(2, generator=g)
        # the midpoint is placed so that both shapes stay inside the frame
        dx, dy = dist * math.cos(angle) / 2, -dist * math.sin(angle) / 2  # image y grows downwards
        margin_x = abs(dx) + max(r.item(), half.item()) + 0.02
        margin_y = abs(dy) + max(r.item(), half.item()) + 0.02
        mx = margin_x + (1 - 2 * margin_x) * torch.rand(1, generator=g).item()
        my = margin_y + (1 - 2 * margin_y) * torch.rand(1, generator=g).item()
        # which object is which is easy to see (a warm disc, a cool square, random shades); the label is only in
        # where they are relative to each other
        shade = torch.rand(2, 3, generator=g) * 0.3
        colors = torch.stack(
            [torch.tensor([1.0, 0.35, 0.2]) - shade[0] * 0.5, torch.tensor([0.2, 0.55, 1.0]) - shade[1] * 0.5]
        )
        params = dict(
            disc=(mx - dx, my - dy, r.item()),
            square=(mx + dx, my + dy, half.item()),
            colors=colors,
            g_state=g.get_state(),
        )
        return params, label

    def render(self, index: int, size: Sequence[int] | None = None) -> tuple[Tensor, int]:
        """The scene as a float image (3, H, W) in [0, 1], drawn natively at ``size``."""
        h, w = size or self.img_size
        p, label = self.scene(index)
        g = torch.Generator()
        g.set_state(p["g_state"])
        y, x = _grid(h, w)
        img = _background(g, y, x)
        pixel = 1.0 / min(h, w)
        cx, cy, r = p["disc"]
        disc = _soft(torch.sqrt((x - cx) ** 2 + (y - cy) ** 2) - r, pixel)
        sx, sy, a = p["square"]
        square = _soft(torch.maximum((x - sx).abs(), (y - sy).abs()) - a, pixel)
        for mask, color in ((disc, p["colors"][0]), (square, p["colors"][1])):
            img = img * (1 - mask) + color[:, None, None] * mask
        return img.clamp(0, 1), label

    def __getitem__(self, index: int):
        img, label = self.render(index)
        if self.transform is None:
            return img, label
        pil = Image.fromarray((img.permute(1, 2, 0) * 255).round().to(torch.uint8).numpy())
        return self.transform(pil), label


class SyntheticMotion(Dataset):
    """A disc moving in one of 8 directions over ``num_frames`` frames; label = direction. Native at any size."""

    num_classes = len(DIRECTIONS)

    def __init__(self, size, img_size, num_frames=8, seed=0, split="train", mean=(0.5,) * 3, std=(0.5,) * 3):
        self.size, self.num_frames = size, num_frames
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.seed = seed + (0 if split == "train" else 1_000_003)
        self.mean, self.std = torch.tensor(mean)[:, None, None, None], torch.tensor(std)[:, None, None, None]
        self.classes = list(DIRECTIONS)

    def __len__(self) -> int:
        return self.size

    def render(self, index: int, size: Sequence[int] | None = None, num_frames: int | None = None):
        h, w = size or self.img_size
        T = num_frames or self.num_frames
        g = torch.Generator().manual_seed(self.seed * 7_919 + index)
        label = int(torch.randint(len(DIRECTIONS), (1,), generator=g))
        angle = (label + torch.rand(1, generator=g).item() * 0.8 + 0.1 - 0.5) * 2 * math.pi / len(DIRECTIONS)
        travel, r = 0.4 + 0.2 * torch.rand(1, generator=g).item(), 0.08 + 0.04 * torch.rand(1, generator=g).item()
        dx, dy = travel * math.cos(angle), -travel * math.sin(angle)
        x0 = r + 0.02 + max(-dx, 0) + (1 - 2 * r - 0.04 - abs(dx)) * torch.rand(1, generator=g).item()
        y0 = r + 0.02 + max(-dy, 0) + (1 - 2 * r - 0.04 - abs(dy)) * torch.rand(1, generator=g).item()
        color = torch.rand(3, generator=g) * 0.5 + 0.5
        y, x = _grid(h, w)
        bg = _background(g, y, x)
        frames = []
        for t in range(T):
            f = t / max(T - 1, 1)
            mask = _soft(torch.sqrt((x - x0 - f * dx) ** 2 + (y - y0 - f * dy) ** 2) - r, 1.0 / min(h, w))
            frames.append(bg * (1 - mask) + color[:, None, None] * mask)
        return torch.stack(frames, dim=1).clamp(0, 1), label  # (C, T, H, W)

    def __getitem__(self, index: int):
        clip, label = self.render(index)
        return (clip - self.mean) / self.std, label


def class_folders(root: str) -> dict[str, int]:
    """The class → index map of a ``root/<class>/...`` folder: its class folders (not hidden) sorted by name
    (torchvision's rule)."""
    return {c: i for i, c in enumerate(Walk(root).classes())}


def restrict_classes(root: str, present: Sequence[str], class_to_idx: dict[str, int]) -> dict[str, int]:
    """The training split's indices for the classes found in ``root``; a class training never saw is an error (a
    split mapped on its own would number its folders differently and silently mislabel them)."""
    unknown = [c for c in present if c not in class_to_idx]
    if unknown:
        raise ValueError(
            f"{root!r} has class folder(s) {unknown} that the training split does not have (training classes: "
            f"{sorted(class_to_idx)}); remove them, or add them to the training split and train again"
        )
    return {c: class_to_idx[c] for c in present}


class ClipFolder(Dataset):
    """``root/<class>/<clip>/<frames>`` → normalised clips (C, T, H, W); ``T`` frames sampled evenly.

    The folders are walked once, when the dataset is made, by the rules of vit_rope/training/images.py (hidden names
    skipped, links followed but no folder twice, a frame labelled by the class it really lies in); a clip without
    frames is an error then. ``class_to_idx`` (the training split's) numbers the classes of another split the same
    way; ``classes`` is then the training split's list, so ``len(classes)`` is the model's class count."""

    EXTENSIONS = IMAGE_EXTENSIONS

    def __init__(
        self,
        root: str,
        img_size: int | Sequence[int],
        num_frames: int,
        mean: Sequence[float],
        std: Sequence[float],
        class_to_idx: dict[str, int] | None = None,
    ) -> None:
        if not os.path.isdir(root):
            raise FileNotFoundError(f"clip folder {root!r} does not exist; expected root/<class>/<clip>/<frames>")
        self.walk = Walk(root)
        present = self.walk.classes()
        if class_to_idx is None:
            class_to_idx = {c: i for i, c in enumerate(present)}
        mapped = restrict_classes(root, present, class_to_idx)
        self.class_to_idx = dict(class_to_idx)
        self.classes = sorted(class_to_idx, key=class_to_idx.__getitem__)
        self.samples, self.clip_frames = [], []
        for c in present:
            clips = self.walk.clips(os.path.join(root, c), c)
            if not clips:
                raise ValueError(f"class folder {os.path.join(root, c)!r} has no clips; remove it or add clips")
            for path, frames in clips:
                if not frames:
                    raise ValueError(
                        f"clip {path!r} has no frames ({', '.join(self.EXTENSIONS)}); add them or remove it"
                    )
                self.samples.append((path, mapped[c]))
                self.clip_frames.append(frames)
        if not self.samples:
            raise ValueError(f"{root!r} has no class folders with clips")
        self.img_size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
        self.num_frames = num_frames
        self.mean, self.std = torch.tensor(mean)[:, None, None, None], torch.tensor(std)[:, None, None, None]

    def __len__(self):
        return len(self.samples)

    def image_paths(self) -> list[str]:
        """Every frame of every clip."""
        return [p for frames in self.clip_frames for p in frames]

    def __getitem__(self, index):
        path, label = self.samples[index]
        frames = self.clip_frames[index]
        pick = torch.linspace(0, len(frames) - 1, self.num_frames).round().long().tolist()
        out = []
        for i in pick:
            try:
                img = load_rgb(frames[i])
            except (OSError, ValueError, Image.DecompressionBombError) as e:
                raise DataError(f"cannot read frame {frames[i]!r}: {e}") from None
            t = torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1).float() / 255
            out.append(
                F.interpolate(t[None], size=self.img_size, mode="bilinear", antialias=True, align_corners=False)[0]
            )
        clip = torch.stack(out, dim=1)
        return (clip - self.mean) / self.std, label


class CheckedImageFolder(Dataset):
    """``root/<class>/<images>`` as (image, class index) items, torchvision ImageFolder's classes, extensions and
    order, walked by the rules of vit_rope/training/images.py (hidden names skipped, links followed but no folder
    visited twice, no file counted twice, an image labelled by the class folder it really lies in): a folder that
    breaks them, an empty class folder, is one clear error when the dataset is made. Images are read through
    ``to_rgb`` (16-bit and float images scaled, never clipped).

    ``class_to_idx`` (the training split's) makes another split use the same indices (a class training never saw is
    an error), and ``classes`` then is the training split's list, so ``len(classes)`` is the model's class count."""

    def __init__(
        self, root: str, transform: Callable | None = None, class_to_idx: dict[str, int] | None = None
    ) -> None:
        if not os.path.isdir(root):
            raise FileNotFoundError(f"image folder {root!r} does not exist; expected root/<class>/<images>")
        self.walk = Walk(root)
        present = self.walk.classes()
        if not present:
            raise FileNotFoundError(f"{root!r} has no class folders; expected root/<class>/<images>")
        if class_to_idx is None:
            class_to_idx = {c: i for i, c in enumerate(present)}
        mapped = restrict_classes(root, present, class_to_idx)
        self.samples: list[tuple[str, int]] = []
        for c in present:
            d = os.path.join(root, c)
            images = self.walk.images(d, c)
            if not images:
                raise ValueError(
                    f"class folder {d!r} has no images ({', '.join(IMAGE_EXTENSIONS)}); add some or remove it"
                )
            self.samples += [(p, mapped[c]) for p in images]
        self.transform = transform
        self.class_to_idx = dict(class_to_idx)
        self.classes = sorted(self.class_to_idx, key=self.class_to_idx.__getitem__)

    def __len__(self) -> int:
        return len(self.samples)

    def image_paths(self) -> list[str]:
        return [path for path, _ in self.samples]

    def __getitem__(self, index: int):
        path, label = self.samples[index]
        try:
            img = load_rgb(path)
        except (OSError, ValueError, Image.DecompressionBombError) as e:  # UnidentifiedImageError is an OSError
            raise DataError(f"cannot read image {path!r}: {e}; delete or replace the file") from None
        return (img if self.transform is None else self.transform(img)), label


def torchvision_dataset(name: str, root: str, train: bool) -> Dataset:
    """CIFAR-10/100, MNIST or Fashion-MNIST as (PIL image, label) items: MNIST's and Fashion-MNIST's IDX files where
    they lie in ``root`` (as Debian's dataset-fashion-mnist installs them), else through torchvision (downloaded into
    ``root`` on first use)."""
    import torchvision.datasets as tvd

    cls = {"cifar10": tvd.CIFAR10, "cifar100": tvd.CIFAR100, "mnist": tvd.MNIST, "fashion_mnist": tvd.FashionMNIST}[
        name
    ]
    idx = name in ("mnist", "fashion_mnist")
    if idx and idx_files(root, train):
        return IdxImages(root, train, cls.classes)
    try:
        return cls(root, train=train, download=True)
    except (OSError, RuntimeError) as e:
        idx_layout = "its four IDX files, as train-images-idx3-ubyte.gz, or " if idx else ""
        raise RuntimeError(
            f"could not download {name} into {root!r} ({e}); without network access, put the dataset files there "
            f"yourself ({idx_layout}torchvision's layout) or use --dataset synthetic"
        ) from e


class Transformed(Dataset):
    """``transform`` applied to the image of each (PIL image, label) item, as RGB (the models take three channels,
    MNIST's images have one): one dataset in memory serves training and every evaluation size. Without a transform
    the items stay PIL images, for timm's NaFlex loaders (which set ``transform`` or transform them themselves)."""

    def __init__(self, ds: Dataset, transform: Callable | None) -> None:
        self.ds, self.transform = ds, transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, index: int):
        img, label = self.ds[index]
        img = to_rgb(img)
        return (img if self.transform is None else self.transform(img)), label


class Materialized(Dataset):
    """Every item of a dataset whose transform draws nothing at random, computed once and kept as one tensor: an
    epoch then indexes it instead of decoding, resizing and normalising each image again (and needs no per-sample
    seeding). The items are the ones the dataset gives, bit for bit; labels stay ints."""

    def __init__(self, ds: Dataset, what: str = "images") -> None:
        self.images, self.labels = None, []
        for i in tqdm(range(len(ds)), desc=f"{what}, transformed once", leave=False, mininterval=5):
            x, y = ds[i]
            if self.images is None:  # (N, C, H, W), filled in place: the set is held once, not twice
                self.images = torch.empty(len(ds), *x.shape, dtype=x.dtype)
            self.images[i] = x
            self.labels.append(int(y))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


MATERIALIZE_BYTES = 2 << 30  # in memory at most: MNIST-sized sets fit hundreds of times over, ImageNet does not


def materialized(ds: Dataset, img_size: int, what: str) -> Dataset:
    """``ds`` as a :class:`Materialized` set where its images (three channels of float32 at ``img_size``) fit
    ``MATERIALIZE_BYTES``; else ``ds`` itself."""
    return Materialized(ds, what) if len(ds) * 3 * img_size**2 * 4 <= MATERIALIZE_BYTES else ds


def fixed_subset(ds: Dataset, n: int) -> Dataset:
    """The same ``n`` samples of ``ds`` for every run and seed (drawn by a fixed seed, kept in their order); all of
    it for n = 0 or n at least its length."""
    if not n or n >= len(ds):
        return ds
    keep = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))[:n].sort().values
    return torch.utils.data.Subset(ds, keep.tolist())


# ------------------------------------------------------------------------------------------- train.py's data
EvalSets = Callable[[int, str], Dataset]  # (eval size, protocol 'resize', 'native' or 'naflex') → the validation set


def is_video(dataset: str) -> bool:
    return dataset in VIDEO_DATASETS


class Standardize:
    """``(x - mean) / std`` per channel of an image (C, H, W) or a clip (C, T, H, W); a class, so that DataLoader
    workers started by spawning can pickle it."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean, self.std = torch.tensor(mean), torch.tensor(std)

    def __call__(self, x: Tensor) -> Tensor:
        shape = (-1,) + (1,) * (x.ndim - 1)
        return (x - self.mean.view(shape)) / self.std.view(shape)


def resize_clip(clip: Tensor, size: int) -> Tensor:
    """A clip (C, T, H, W) resized spatially to size × size: the 'resize' protocol for clips."""
    return F.interpolate(clip, size=(size, size), mode="bilinear", antialias=True, align_corners=False)


class ValidationAt(Dataset):
    """A validation set at another size: each built-in scene or clip rendered natively there (``native``), else
    each item as it comes; then ``transform``."""

    def __init__(self, ds: Dataset, size: int, native: bool, transform: Callable[[Tensor], Tensor]) -> None:
        self.ds, self.size, self.native, self.transform = ds, size, native, transform

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        x, y = self.ds.render(i, (self.size, self.size)) if self.native else self.ds[i]
        return self.transform(x), y


def train_transform(settings, dc: dict, size: int) -> Callable:
    """timm's training transform at ``size`` (the settings' augmentation), applied to the dataset's own images: an
    image is resized (or random-resized-cropped) from its native resolution to ``size``, never from another size."""
    return create_transform(
        input_size=(3, size, size),
        is_training=True,
        no_aug=not settings.aug,
        hflip=settings.hflip,
        vflip=settings.vflip,
        color_jitter=settings.color_jitter,
        scale=settings.scale,
        auto_augment=settings.auto_augment,
        interpolation="bicubic",
        mean=dc["mean"],
        std=dc["std"],
    )


def image_transforms(settings, dc: dict) -> tuple[Callable, Callable[[int], Callable]]:
    """timm's training transform at ``img_size`` (the settings' augmentation), and the eval transform at a size."""
    train_tf = train_transform(settings, dc, settings.img_size)

    def eval_tf(size: int):
        # the whole image, resized (shorter side to size, centre crop at ratio 1.0: RoPE-ViT's protocol)
        return create_transform(
            input_size=(3, size, size), crop_pct=1.0, interpolation="bicubic", mean=dc["mean"], std=dc["std"]
        )

    return train_tf, eval_tf


class Data(NamedTuple):
    """A run's data: the training set (None with ``eval_only`` where there is none), the validation set at an
    evaluation size and protocol, the number of classes, and the training set at another size (its images resized
    from the originals, for fine-tuning at an evaluation size; None where there is no training set)."""

    train: Dataset | None
    eval_set: EvalSets
    num_classes: int
    train_at: Callable[[int], Dataset] | None = None


def reads_training_images(settings) -> bool:
    """Whether a run reads the training split: --eval-only trains nothing, but fine-tuned copies (--finetune-sizes)
    train on it."""
    return not settings.eval_only or bool(settings.finetune_sizes)


def build_data(settings, dc: dict) -> Data:
    """The data of a train.py run (``dc``: the model's data config, its normalisation); ``train_subset`` and
    ``val_subset`` keep a fixed part of each split."""
    train, eval_set, num_classes, train_at = all_data(settings, dc)
    if train is not None:
        train = fixed_subset(train, settings.train_subset)
        train = Transformed(train, None) if settings.naflex else train  # PIL images, RGB, for timm's NaFlex loader
        if settings.dataset in IN_MEMORY and not settings.aug and not settings.naflex:  # the same images every epoch
            train = materialized(train, settings.img_size, f"{settings.dataset}'s training images")

    @lru_cache(maxsize=1)  # the size being evaluated: a model is evaluated under each scaling mode in turn
    def kept(size: int) -> Dataset:
        subset = fixed_subset(eval_set(size, "resize"), settings.val_subset)
        return materialized(subset, size, f"{settings.dataset}'s test images at {size}")

    def eval_at(size: int, protocol: str) -> Dataset:
        if settings.dataset in IN_MEMORY and protocol == "resize":
            return kept(size)
        subset = fixed_subset(eval_set(size, protocol), settings.val_subset)
        return Transformed(subset, None) if protocol == "naflex" else subset  # the loader sets its transform

    @cache  # (--train-sizes-from originals asks for each size every epoch: a folder read once)
    def at(size: int) -> Dataset:
        return fixed_subset(train_at(size), settings.train_subset)

    return Data(train, eval_at, num_classes, None if train_at is None else at)


def all_data(settings, dc: dict) -> Data:
    """``build_data`` before the subsets."""
    name, root = settings.dataset, settings.data_dir
    if name == "synthetic_video":
        return synthetic_video_data(settings, dc)
    if name in ("imagefolder", "clipfolder"):
        return folder_data(settings, dc)
    if name == "synthetic":
        return synthetic_data(settings, dc)
    train_tf, eval_tf = image_transforms(settings, dc)
    read = partial(ElpvCells, elpv_folder(root)) if name == "elpv" else partial(torchvision_dataset, name, root)
    originals = read(train=True) if reads_training_images(settings) else None
    val = read(train=False)

    def eval_set(size: int, protocol: str) -> Dataset:  # naflex: PIL images, for timm's NaFlex loader
        return val if protocol == "naflex" else Transformed(val, eval_tf(size))

    if originals is None:
        return Data(None, eval_set, len(val.classes))
    return Data(
        originals if settings.naflex else Transformed(originals, train_tf),  # naflex: timm's loader transforms
        eval_set,
        len(val.classes),
        lambda size: Transformed(originals, train_transform(settings, dc, size)),
    )


def synthetic_video_data(settings, dc: dict) -> Data:
    """The built-in clips: training clips drawn at any size, validation clips drawn natively or resized."""
    kw = dict(img_size=settings.img_size, num_frames=settings.num_frames, seed=settings.seed, mean=dc["mean"],
              std=dc["std"])  # fmt: skip

    def train_at(size):
        return SyntheticMotion(settings.train_samples, split="train", **{**kw, "img_size": size})

    val = SyntheticMotion(settings.val_samples, split="val", **kw)

    def clips(size, protocol):
        if protocol == "native":
            return ValidationAt(val, size, True, Standardize(dc["mean"], dc["std"]))
        return ValidationAt(val, size, False, partial(resize_clip, size=size))

    return Data(train_at(settings.img_size), clips, val.num_classes, train_at)


def synthetic_data(settings, dc: dict) -> Data:
    """The built-in scenes: drawn natively at every size (then timm's transform there), or resized for 'resize'."""
    train_tf, eval_tf = image_transforms(settings, dc)
    scenes = partial(SyntheticScenes, img_size=settings.img_size, seed=settings.seed)
    val = scenes(settings.val_samples, split="val")

    def scenes_at(size):  # drawn natively at the size, then timm's training transform there
        return scenes(settings.train_samples, split="train", img_size=size,
                      transform=train_transform(settings, dc, size))  # fmt: skip

    def make(size, protocol):
        if protocol == "native":
            return ValidationAt(val, size, True, Standardize(dc["mean"], dc["std"]))
        return scenes(settings.val_samples, split="val", transform=eval_tf(size))

    return Data(scenes(settings.train_samples, split="train", transform=train_tf), make, val.num_classes,
                scenes_at)  # fmt: skip


def folder_data(settings, dc: dict) -> Data:
    """``build_data`` for ``imagefolder`` and ``clipfolder``: every split numbered as the training split (torchvision
    sorts each folder's classes on its own), the class count from it (from val with eval_only and no train/), and
    clips read from their frames at each evaluation size. The folders are walked by the rules of images.py (links,
    hidden names, one file once, in one class and one split) and every file is checked now (``check_files``), so that
    a broken one stops the run before it starts, naming the file; so does a val/ holding fewer than two classes (its
    accuracy would measure nothing)."""
    name, root = settings.dataset, settings.data_dir
    layout = LAYOUTS[name]
    train_root, val_root = split_folders(settings)
    make = folder_maker(settings, dc)
    train = None
    if reads_training_images(settings):
        train = make(train_root, None if settings.naflex else settings.img_size, train=True)
        class_to_idx = train.class_to_idx
        check_files(train, train_root)
    elif os.path.isdir(train_root):  # evaluating a model trained on this folder: its numbering
        class_to_idx = class_folders(train_root)
    else:
        class_to_idx = make(val_root, settings.img_size).class_to_idx
    if len(class_to_idx) < 2:
        raise ValueError(
            f"{root!r} has {len(class_to_idx)} class folder(s) ({sorted(class_to_idx)}): a classifier needs at least "
            f"two, one folder each in {name}'s {layout}"
        )
    val = make(val_root, settings.img_size, class_to_idx)  # a val class training never saw is an error now
    check_val_classes(val, class_to_idx, val_root)
    if train is not None:
        same_files(train.walk, val.walk)  # val/ a link to train/, or images linked from it
    check_files(val, val_root)
    for ds in (train, val):
        if ds is not None:
            ds.walk = None  # (its record of every file, for the checks only)

    def light(ds: Dataset) -> Dataset:
        ds.walk = None
        return ds

    train_at = None if train is None else lambda s: light(make(train_root, s, class_to_idx, train=True))
    return Data(train, lambda s, p: light(make(val_root, None if p == "naflex" else s, class_to_idx)),
                len(class_to_idx), train_at)  # fmt: skip


LAYOUTS = {"imagefolder": "root/train/<class>/ and root/val/<class>/",
           "clipfolder": "root/{train,val}/<class>/<clip>/<frames>"}  # fmt: skip


def split_folders(settings) -> tuple[str, str]:
    """``root/train`` and ``root/val`` of a folder dataset; one line where the root or a split it needs is missing
    (train/ may be, where the run reads no training images)."""
    name, root = settings.dataset, settings.data_dir
    if not os.path.isdir(root):
        what = "a file" if os.path.exists(root) else "missing"
        raise FileNotFoundError(f"{root!r} is {what}, not a folder; {name} needs {LAYOUTS[name]} there")
    train_root, val_root = os.path.join(root, "train"), os.path.join(root, "val")
    for split in (train_root, val_root):
        if not os.path.isdir(split) and not (split == train_root and not reads_training_images(settings)):
            raise FileNotFoundError(f"{split!r} is missing; {name} needs {LAYOUTS[name]}")
    return train_root, val_root


def folder_maker(settings, dc: dict) -> Callable[..., Dataset]:
    """``make(split folder, size, class_to_idx=None, train=False)``: a split of an image folder (timm's training or
    evaluation transform at ``size``; PIL images for ``size`` None, for timm's NaFlex loader) or of a clip folder
    (clips read at ``size``: resizing clips already shrunk to img_size would upsample them)."""
    if settings.dataset == "clipfolder":
        return lambda root, size, class_to_idx=None, train=False: ClipFolder(
            root, size, settings.num_frames, dc["mean"], dc["std"], class_to_idx
        )
    eval_tf = image_transforms(settings, dc)[1]

    def make(root: str, size: int | None, class_to_idx: dict | None = None, train: bool = False) -> Dataset:
        if size is None:
            return CheckedImageFolder(root, None, class_to_idx)
        transform = train_transform(settings, dc, size) if train else eval_tf(size)
        return CheckedImageFolder(root, transform, class_to_idx)

    return make


def check_val_classes(val: Dataset, class_to_idx: dict[str, int], val_root: str) -> None:
    """A val/ of fewer than two classes is refused: its accuracy would be the share of one answer (100 % for a model
    that always gives it). One that lacks some of train/'s classes is fine (rare classes often are)."""
    present = sorted({label for _, label in val.samples})
    if len(present) < 2:
        names = sorted(class_to_idx, key=class_to_idx.__getitem__)
        raise ValueError(
            f"{val_root!r} holds images of only {len(present)} class ({[names[i] for i in present]}) of the "
            f"{len(names)} classes {names}: its accuracy would measure nothing (a model that always answers that "
            "class scores 100%); add images of the other classes to val/"
        )


def check_files(ds: Dataset, root: str) -> None:
    """Check every image (every frame of every clip) of a folder dataset with ``images.check_image`` (a regular
    file, its header, a PNG or JPEG not cut short, a 16-bit or float image's values): one broken file stops the run
    before it starts, naming the file, rather than in the middle of an epoch."""
    paths = ds.image_paths()
    for path in tqdm(paths, desc=f"checking {root}", disable=None, leave=False):
        try:
            check_image(path)
        except (OSError, Image.DecompressionBombError) as e:  # PIL's UnidentifiedImageError is an OSError
            raise ValueError(f"cannot read image {path!r}: {e}; delete or replace the file") from None
