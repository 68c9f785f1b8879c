"""What trains a model besides the data: timm's optimizer (with layer-wise LR decay), its LR schedule, the loss,
mixup/cutmix and EMA; and a saved optimizer state given this machine's implementation of the optimizer."""

from dataclasses import dataclass

import torch
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3

from .settings import Settings

__all__ = ["Training", "make_optimizer", "make_training", "own_implementation"]


@dataclass
class Training:
    """What trains one model besides the data: optimizer, LR schedule, loss, mixup/cutmix and EMA."""

    optimizer: torch.optim.Optimizer
    scheduler: object
    criterion: torch.nn.Module
    mixup: Mixup | None
    ema: ModelEmaV3 | None
    steps: int  # optimizer updates per epoch


# torch's optimizers (timm's names for them) with a fused implementation: one kernel for every weight's update
FUSED_OPTIMIZERS = ("adam", "adamw")


# what says how an optimizer computes its step, not what step it computes: a resumed run keeps its own
IMPLEMENTATION_KEYS = ("fused", "foreach")


def make_optimizer(model: torch.nn.Module, settings: Settings, steps: int) -> tuple:
    """timm's optimizer (with its layer-wise LR decay over the model's group_matcher where --layer-decay asks it)
    and its LR schedule, stepped every update. Adam and AdamW are torch's fused ones where the weights are on a CUDA
    device (the same updates, fewer kernels); on the CPU torch's default implementation."""
    params = list(model.parameters())
    on_cuda = bool(params) and all(p.is_cuda for p in params)
    fused = {"fused": True} if on_cuda and settings.opt.lower() in FUSED_OPTIMIZERS else {}
    optimizer = create_optimizer_v2(
        model,
        settings.opt,
        lr=settings.lr,
        weight_decay=settings.weight_decay,
        layer_decay=settings.layer_decay,
        **fused,
    )
    scheduler, _ = create_scheduler_v2(
        optimizer,
        settings.sched,
        num_epochs=settings.epochs,
        warmup_epochs=settings.warmup_epochs,
        min_lr=settings.min_lr,
        warmup_lr=settings.lr * 0.01,
        step_on_epochs=False,
        updates_per_epoch=steps,
    )
    return optimizer, scheduler


def make_training(settings: Settings, model: torch.nn.Module, num_classes: int, steps: int) -> Training:
    optimizer, scheduler = make_optimizer(model, settings, steps)
    smoothing, mixup = settings.label_smoothing, None
    if settings.mixup > 0 or settings.cutmix > 0:
        mixup = Mixup(mixup_alpha=settings.mixup, cutmix_alpha=settings.cutmix, label_smoothing=smoothing,
                      num_classes=num_classes)  # fmt: skip
        criterion = SoftTargetCrossEntropy()
    elif smoothing:
        criterion = LabelSmoothingCrossEntropy(smoothing)
    else:
        criterion = torch.nn.CrossEntropyLoss()
    ema = ModelEmaV3(model, decay=settings.ema_decay) if settings.ema else None
    return Training(optimizer, scheduler, criterion, mixup, ema, steps)


def own_implementation(saved: dict, optimizer: torch.optim.Optimizer) -> dict:
    """A saved optimizer state whose groups take ``optimizer``'s implementation (fused or not, foreach or not) in
    place of the saved one, which ``load_state_dict`` would otherwise restore: a run saved on a GPU (fused AdamW)
    resumes on the CPU, and the other way round, each with the implementation its device has."""
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        return saved  # (load_state_dict names what is wrong)
    own = [{k: g[k] for k in IMPLEMENTATION_KEYS if k in g} for g in optimizer.param_groups]
    merged = [{**g, **o} if isinstance(g, dict) else g for g, o in zip(groups, own, strict=True)]
    return {**saved, "param_groups": merged}
