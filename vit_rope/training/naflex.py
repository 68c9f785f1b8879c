"""train.py's native-resolution mode (``--naflex``): timm's NaFlex loaders, and the loss of batches of uneven size.

Training batches come from ``timm.data.create_naflex_loader``: each batch draws a token budget from ``--seq-lens``
(the same schedule on every rank), every image is resized with its aspect ratio kept to fill the budget, and a batch
holds ``--batch-size × max(--seq-lens)`` tokens, so batches of smaller budgets hold more images. The order depends
on (seed, epoch) alone, so a resumed run draws what the unbroken one drew. Evaluation at native aspect ratio uses the
same loader at one budget (``--eval-seq-lens``, each a result row of protocol ``naflex`` whose ``eval_size`` is the
budget in tokens).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from timm.data import NaFlexMixup, create_naflex_loader
from torch.utils.data import DataLoader, Dataset

from .distributed import rank_world, resolve_device

__all__ = ["LOSS_SCALES", "batch_to", "images_in", "loss_scale", "naflex_loader"]

LOSS_SCALES = ("linear", "sqrt", "none")


def naflex_loader(
    ds: Dataset,
    settings,
    dc: dict,
    patch_size: tuple[int, int],
    *,
    train: bool,
    epoch: int = 0,
    budget: int | None = None,
    num_classes: int | None = None,
) -> DataLoader:
    """timm's NaFlex loader over ``ds`` (items: RGB PIL image, label): training with the ``--seq-lens`` schedule and
    the settings' augmentation (timm's NaFlex mixup for ``--mixup``/``--cutmix``), or evaluation at ``budget``
    tokens an image."""
    rank, world = rank_world()
    pin = resolve_device(settings.device).type == "cuda"  # page-locked batches copy to a GPU without blocking
    common = dict(patch_size=patch_size, num_workers=settings.workers, use_prefetcher=False, pin_memory=pin,
                  persistent_workers=False, distributed=world > 1, rank=rank, world_size=world, mean=dc["mean"],
                  std=dc["std"], interpolation="bicubic", device=torch.device("cpu"))  # fmt: skip
    if not train:
        return create_naflex_loader(ds, max_seq_len=budget, batch_size=settings.eval_batch_size, **common)
    mixup = None
    if settings.mixup > 0 or settings.cutmix > 0:
        mixup = NaFlexMixup(num_classes=num_classes, mixup_alpha=settings.mixup, cutmix_alpha=settings.cutmix,
                            label_smoothing=settings.label_smoothing)  # fmt: skip
    return create_naflex_loader(
        ds,
        train_seq_lens=tuple(settings.seq_lens),
        max_seq_len=max(settings.seq_lens),
        batch_size=settings.batch_size,
        is_training=True,
        mixup_fn=mixup,
        no_aug=not settings.aug,
        hflip=settings.hflip,
        vflip=settings.vflip,
        color_jitter=settings.color_jitter,
        scale=settings.scale,
        auto_augment=settings.auto_augment,
        seed=settings.seed,
        epoch=epoch,
        **common,
    )


def batch_to(x: torch.Tensor | dict, device: torch.device) -> torch.Tensor | dict:
    """A batch (images, or a NaFlex dict of tensors and its ``seq_len``) on ``device``; copied without blocking (the
    loaders pin their batches' memory for a CUDA device, and work queued after a copy waits for it on the stream)."""
    if isinstance(x, dict):
        return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
    return x.to(device, non_blocking=True)


def images_in(x: torch.Tensor | dict) -> int:
    return (x["patches"] if isinstance(x, dict) else x).shape[0]


def loss_scale(images: int, settings, device: torch.device) -> float:
    """The factor of a NaFlex batch's loss, as timm's train.py: ``images / --batch-size`` (``linear``; its square root
    for ``sqrt``; 1 for ``none``), so that a batch of more, shorter images weighs more; under DDP also
    ``world · images / Σ images``, since ranks average gradients of batches of unequal size."""
    scale = 1.0
    if settings.naflex_loss_scale != "none":
        scale = images / settings.batch_size
        scale = scale**0.5 if settings.naflex_loss_scale == "sqrt" else scale
    world = rank_world()[1]
    if world > 1 and dist.is_initialized():
        total = torch.tensor(float(images), device=device)
        dist.all_reduce(total)
        scale *= world * images / total.item()
    return scale
