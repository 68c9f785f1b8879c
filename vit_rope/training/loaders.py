"""The batches of a run: the training order drawn from (seed, epoch) alone, sharded over ranks, each sample's
augmentation from (seed, epoch, index), so that a resumed run and any --workers see the same batches; the size of
each multi-resolution batch; fine-tuning's batches; timm's NaFlex loader under --naflex."""

import itertools

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

from .data import Data, Materialized
from .distributed import rank_world, resolve_device
from .models import data_config
from .naflex import naflex_loader
from .plan import Run
from .rng import SeededItems
from .settings import Settings

__all__ = ["AtBatchSizes", "epoch_indices", "finetune_loader", "image_sizes_of_batches", "loader", "make_loader",
           "pin_memory", "resize_batch", "sized_loader", "train_loader"]  # fmt: skip


def epoch_indices(n: int, settings: Settings, train: bool, epoch: int) -> list[int]:
    """This rank's share of an epoch's order over ``n`` samples: drawn from (seed, epoch) alone for training (the
    same on every rank, which then takes every world-th), in order for evaluation."""
    rank, world = rank_world()
    if train:
        g = torch.Generator().manual_seed(settings.seed * 100_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        order = order[: n - n % world] if world > 1 else order
    else:
        order = list(range(n))
    return order[rank::world]


def make_loader(ds: Dataset, settings: Settings, train: bool, epoch: int) -> DataLoader:
    """Epoch-seeded shuffling, sharded over ranks: the order, and each training sample's augmentation, depend only on
    (seed, epoch) and the sample, whatever the number of workers, so resuming works, with other --workers too."""
    indices = epoch_indices(len(ds), settings, train, epoch)
    if train:  # each sample's augmentation drawn from (seed, epoch, index): the same batches for any --workers
        ds = ds if isinstance(ds, Materialized) else SeededItems(ds, settings.seed * 100_003 + epoch)  # (none drawn)
    return loader(torch.utils.data.Subset(ds, indices), settings, train, materialized=isinstance(ds, Materialized))


def loader(ds: Dataset, settings: Settings, train: bool, materialized: bool = False) -> DataLoader:
    """A DataLoader over ``ds`` in its order, at the batch size of training or evaluation."""
    bs = settings.batch_size if train else settings.eval_batch_size
    return DataLoader(
        ds,
        batch_size=bs,
        shuffle=False,
        num_workers=0 if materialized else settings.workers,  # (workers would only copy tensors)
        drop_last=train and len(ds) >= bs,
        pin_memory=pin_memory(settings),
    )


class AtBatchSizes(Dataset):
    """Position k of a rank's epoch (``indices[k]``) drawn from the training set at the size of its batch, batch
    ``k // batch_size`` of ``sizes``: each image from its original at that size (--train-sizes-from originals)."""

    def __init__(self, at: dict[int, Dataset], indices: list[int], sizes: list[int], batch_size: int) -> None:
        self.at, self.indices, self.sizes, self.batch_size = at, indices, sizes, batch_size

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, k: int):
        return self.__getitems__([k])[0]

    def __getitems__(self, positions: list[int]) -> list:
        items = []
        for size, group in itertools.groupby(positions, key=lambda k: self.sizes[k // self.batch_size]):
            items += self.at[size].__getitems__([self.indices[k] for k in group])  # (a batch: one size)
        return items


def sized_loader(data: Data, settings: Settings, epoch: int) -> DataLoader:
    """An epoch's training batches, each at its size of ``image_sizes_of_batches`` with every image drawn from its
    original at that size; the order and each sample's draws (seeded by seed, epoch and index) are ``make_loader``'s,
    so an image read from a dataset has the same crop of its original at every size."""
    indices = epoch_indices(len(data.train), settings, True, epoch)
    steps = len(indices) // settings.batch_size if len(indices) >= settings.batch_size else 1  # (drop_last)
    sizes = image_sizes_of_batches(settings, epoch, steps)
    seed = settings.seed * 100_003 + epoch
    at = {size: SeededItems(data.train if size == settings.img_size else data.train_at(size), seed)
          for size in set(sizes)}  # fmt: skip
    return loader(AtBatchSizes(at, indices, sizes, settings.batch_size), settings, True)


def pin_memory(settings: Settings) -> bool:
    """Page-locked batches where they go to a CUDA device: the copy (``non_blocking``) then overlaps the work queued
    before it. Pinning for the CPU would only cost time."""
    return resolve_device(settings.device).type == "cuda"


def image_sizes_of_batches(settings: Settings, epoch: int, steps: int) -> list[int]:
    """The size of each training batch of an epoch, drawn from --train-sizes by (seed, epoch) alone, so that a resumed
    run and every rank draw the same; empty without --train-sizes."""
    if not settings.train_sizes:
        return []
    g = torch.Generator().manual_seed(settings.seed * 100_003 + epoch + 2**62)  # another stream than the order's
    picks = torch.randint(len(settings.train_sizes), (steps,), generator=g).tolist()
    return [settings.train_sizes[i] for i in picks]


def train_loader(run: Run, data: Data, model: torch.nn.Module, epoch: int) -> DataLoader:
    """An epoch's training batches: ``make_loader``'s, ``sized_loader``'s under --train-sizes-from originals, or timm's
    NaFlex loader's under --naflex."""
    settings = run.settings
    if not settings.naflex and settings.train_sizes and settings.train_sizes_from == "originals":
        return sized_loader(data, settings, epoch)
    if not settings.naflex:
        return make_loader(data.train, settings, True, epoch)
    dc = data_config(settings, run.spec)
    return naflex_loader(data.train, settings, dc, model.get_patch_size(), train=True, epoch=epoch,
                         num_classes=data.num_classes)  # fmt: skip


def resize_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """Images (..., H, W) resized to size x size, bicubic and antialiased (as PIL resizes evaluation images): the
    models follow with their RoPE grid or a resampled APE."""
    if x.shape[-2:] == (size, size):
        return x
    flat = x.reshape(-1, 1, *x.shape[-2:])  # channels (and frames) one by one: 4D and 5D batches alike
    out = F.interpolate(flat, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    return out.reshape(*x.shape[:-2], size, size)


def finetune_loader(ds: Dataset, settings: Settings, size: int) -> DataLoader:
    """Exactly --finetune-steps batches per rank, in an order drawn from (seed, size) alone (passes over the data
    follow one another as needed), so that a fine-tuning computed again after a kill is the same one."""
    rank, world = rank_world()
    need = settings.finetune_steps * settings.batch_size * world
    g = torch.Generator().manual_seed(settings.seed * 100_003 + size + 2**61)  # another stream than training's
    order: list[int] = []
    while len(order) < need:
        order += torch.randperm(len(ds), generator=g).tolist()
    ds = SeededItems(ds, settings.seed * 100_003 + size + 2**61)  # (augmentation: the same for any --workers)
    return DataLoader(torch.utils.data.Subset(ds, order[:need][rank::world]), batch_size=settings.batch_size,
                      shuffle=False, num_workers=settings.workers, drop_last=True,
                      pin_memory=pin_memory(settings))  # fmt: skip
