"""The batches of a run: the training order drawn from (seed, epoch) alone, sharded over ranks, each sample's
augmentation from (seed, epoch, index), so that a resumed run and any --workers see the same batches; the size of
each multi-resolution batch; fine-tuning's batches; timm's NaFlex loader under --naflex."""

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

__all__ = ["finetune_loader", "image_sizes_of_batches", "make_loader", "pin_memory", "resize_batch", "train_loader"]


def make_loader(ds: Dataset, settings: Settings, train: bool, epoch: int) -> DataLoader:
    """Epoch-seeded shuffling, sharded over ranks: the order, and each training sample's augmentation, depend only on
    (seed, epoch) and the sample, whatever the number of workers, so resuming works, with other --workers too."""
    rank, world = rank_world()
    n = len(ds)
    if train:  # each sample's augmentation drawn from (seed, epoch, index): the same batches for any --workers
        ds = ds if isinstance(ds, Materialized) else SeededItems(ds, settings.seed * 100_003 + epoch)  # (none drawn)
        g = torch.Generator().manual_seed(settings.seed * 100_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        order = order[: n - n % world] if world > 1 else order
    else:
        order = list(range(n))
    indices = order[rank::world]
    bs = settings.batch_size if train else settings.eval_batch_size
    return DataLoader(
        torch.utils.data.Subset(ds, indices),
        batch_size=bs,
        shuffle=False,
        num_workers=0 if isinstance(ds, Materialized) else settings.workers,  # (workers would only copy tensors)
        drop_last=train and len(indices) >= bs,
        pin_memory=pin_memory(settings),
    )


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
    """An epoch's training batches: ``make_loader``'s, or timm's NaFlex loader's under --naflex."""
    settings = run.settings
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
