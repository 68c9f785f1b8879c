"""Train image/video classifiers with different position embeddings under one recipe, then evaluate each at
resolutions it never saw: the APE-vs-RoPE comparison.

    python train.py                                   # configs/default.yaml: offline, 2-core CPU, ~12 min
    python train.py --config configs/cifar10.yaml     # any config key is also a flag: --epochs 3 --lr 1e-3 ...
    python train.py --config configs/resolution_fashion.yaml   # 8 encodings x 2 recipes x 3 seeds, 90 min on 2 cores
    torchrun --nproc_per_node 8 train.py --config configs/imagenet_deit3_s.yaml --data-dir /data/imagenet
    python train.py --output runs/x --resume          # continue a killed run from its last finished epoch

Every model trains once per seed (--seeds) under every recipe (``recipes``: named overrides of training keys, such
as multi-resolution training with --train-sizes): a run each. Outputs in --output: results.csv (one row per run,
eval size, protocol and RoPE scaling mode), results.md (mean ± std over seeds), accuracy_vs_resolution.png,
extrapolation.png, log.csv (per epoch), config.yaml (resolved), and per run <tag>/model.safetensors (last weights)
and <tag>/checkpoint.pt (resume state, written atomically every epoch).

Every setting is checked, and every model built once, before anything in --output changes; the run then holds a
lock on the folder. What --resume does with changed settings: docs/what_happens_when.md.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, accuracy
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from vit_rope import data as D
from vit_rope import runs
from vit_rope import train_config as config
from vit_rope.report import write_results
from vit_rope.runs import all_sum, atomic_write, model_dir, rank_world

HERE = Path(__file__).resolve().parent


def parse_config(argv: list[str] | None = None) -> tuple[dict, dict]:
    """configs/default.yaml, or ``--config``, overridden by flags; every config key and its help:
    vit_rope/train_config.py (``python train.py --help`` lists them)."""
    return config.parse_config(argv, HERE / "configs" / "default.yaml", __doc__)


# ------------------------------------------------------------------------------------- checks before a run
def checked_data(cfg: dict, dc: dict) -> tuple:
    """``build_data``, with one sample of each split read: a missing or unreadable dataset stops the run now."""
    try:
        data = D.build_data(cfg, dc)
        train_ds, eval_set, _ = data
        if train_ds is not None:
            train_ds[0]
        eval_set(cfg["img_size"], "resize")[0]
    except (OSError, ValueError, RuntimeError, IndexError) as e:
        raise SystemExit(f"error: dataset {cfg['dataset']} in {cfg['data_dir']!r}: {e}") from None
    return data


def preflight(plan: list[runs.Run]) -> dict[str, tuple]:
    """The optimizer, the data and every model (under each recipe) built once on the CPU before anything is written,
    so that what would fail later fails now: an optimizer timm lacks, a dataset that is missing or unreadable, a
    kwarg the model refuses or one that makes its outputs non-finite, weights that do not fit, eval or training sizes
    it does not take. Returns run tag → (data, the model's scaling modes); runs that agree on the data share it."""
    for cfg in {run.recipe: run.cfg for run in plan}.values():
        try:  # timm's names: its own error says which it knows
            make_optimizer(torch.nn.Linear(1, 1), cfg, steps=1)
        except (ValueError, AssertionError) as e:
            raise SystemExit(f"error: --opt {cfg['opt']} with --sched {cfg['sched']}: {e}") from None
    data_by_key, modes, checked = {}, {}, {}
    for run in plan:
        dc = config.data_config(run.cfg, run.spec)
        key = D.data_key(run.cfg, dc)
        if key not in data_by_key:
            data_by_key[key] = checked_data(run.cfg, dc)
        if (run.spec, run.recipe) not in modes:
            modes[run.spec, run.recipe] = checked_model(run, data_by_key[key])
        checked[run.tag] = (data_by_key[key], modes[run.spec, run.recipe])
    return checked


def checked_model(run: runs.Run, data: tuple) -> list[str]:
    """A run's model built and fed a validation sample at --img-size and at its other eval and training sizes;
    returns the --rope-scaling modes it takes."""
    cfg, spec, where = run.cfg, run.spec, f" (recipe {run.recipe})" if run.recipe else ""
    model = config.build_model(cfg, spec, num_classes=data[2]).eval()
    config.check_input_sizes(cfg, spec, model, where)
    sample = data[1](cfg["img_size"], "resize")[0][0][None]
    try:
        with torch.no_grad():
            finite = torch.isfinite(model(sample)).all()
    except ValueError as e:  # the model's input checks
        raise SystemExit(f"error: model {spec} refuses a validation sample at --img-size: {e}") from None
    if not finite:
        kwargs = {**cfg["model_kwargs"], **config.split_spec(spec)[1]}
        weights = " and its --initial-checkpoint" if cfg["initial_checkpoint"] else ""
        raise SystemExit(
            f"error: model {spec} with {kwargs}{weights} gives non-finite outputs before any training: one of "
            "these is out of range (as rope_theta=0); fix it in --model-kwargs or the model spec"
        )
    if not getattr(model, "dynamic_img_size", False):  # timm's ViTs take other sizes only when built to
        for size in sorted({*cfg["eval_sizes"], *cfg["train_sizes"]} - {cfg["img_size"]}):
            try:
                with torch.no_grad():
                    model(resize_batch(sample, size))
            except (AssertionError, RuntimeError, ValueError) as e:
                raise SystemExit(
                    f"error: model {spec}{where} refuses {size}-px input ({e}); create it with dynamic_img_size=True "
                    f"(timm's ViTs), or leave {size} out of --eval-sizes and --train-sizes"
                ) from None
    modes = scaling_modes(model, cfg["rope_scaling"])
    if not modes:
        raise SystemExit(
            f"error: {spec} takes none of --rope-scaling {cfg['rope_scaling']} (it takes "
            f"{list(model.rope_scaling_modes())}); add one of those"
        )
    return modes


# ------------------------------------------------------------------------------------------------------ data
def make_loader(ds: Dataset, cfg: dict, train: bool, epoch: int) -> DataLoader:
    """Epoch-seeded shuffling, sharded over ranks: the order depends only on (seed, epoch), so resuming works."""
    rank, world = rank_world()
    n = len(ds)
    if train:
        g = torch.Generator().manual_seed(cfg["seed"] * 100_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        order = order[: n - n % world] if world > 1 else order
    else:
        order = list(range(n))
    indices = order[rank::world]
    bs = cfg["batch_size"] if train else cfg["eval_batch_size"]
    return DataLoader(
        torch.utils.data.Subset(ds, indices),
        batch_size=bs,
        shuffle=False,
        num_workers=cfg["workers"],
        drop_last=train and len(indices) >= bs,
    )


def batch_sizes(cfg: dict, epoch: int, steps: int) -> list[int]:
    """The size of each training batch of an epoch, drawn from --train-sizes by (seed, epoch) alone, so that a resumed
    run and every rank draw the same; empty without --train-sizes."""
    if not cfg["train_sizes"]:
        return []
    g = torch.Generator().manual_seed(cfg["seed"] * 100_003 + epoch + 2**62)  # another stream than the order's
    return [cfg["train_sizes"][i] for i in torch.randint(len(cfg["train_sizes"]), (steps,), generator=g).tolist()]


def resize_batch(x: torch.Tensor, size: int) -> torch.Tensor:
    """Images (..., H, W) resized to size x size, bicubic and antialiased (as PIL resizes evaluation images): the
    models follow with their RoPE grid or a resampled APE."""
    if x.shape[-2:] == (size, size):
        return x
    flat = x.reshape(-1, 1, *x.shape[-2:])  # channels (and frames) one by one: 4D and 5D batches alike
    out = F.interpolate(flat, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
    return out.reshape(*x.shape[:-2], size, size)


# --------------------------------------------------------------------------------------------------- training
@dataclass
class Training:
    """What trains one model besides the data: optimizer, LR schedule, loss, mixup/cutmix and EMA."""

    optimizer: torch.optim.Optimizer
    scheduler: object
    criterion: torch.nn.Module
    mixup: Mixup | None
    ema: ModelEmaV3 | None
    steps: int  # optimizer updates per epoch


def make_optimizer(model: torch.nn.Module, cfg: dict, steps: int) -> tuple:
    optimizer = create_optimizer_v2(model, cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    scheduler, _ = create_scheduler_v2(
        optimizer,
        cfg["sched"],
        num_epochs=cfg["epochs"],
        warmup_epochs=cfg["warmup_epochs"],
        min_lr=cfg["min_lr"],
        warmup_lr=cfg["lr"] * 0.01,
        step_on_epochs=False,
        updates_per_epoch=steps,
    )
    return optimizer, scheduler


def make_training(cfg: dict, model: torch.nn.Module, num_classes: int, steps: int) -> Training:
    optimizer, scheduler = make_optimizer(model, cfg, steps)
    mix, smoothing = cfg["mixup"] > 0 or cfg["cutmix"] > 0, cfg["label_smoothing"]
    mixup = None
    if mix:
        mixup = Mixup(
            mixup_alpha=cfg["mixup"], cutmix_alpha=cfg["cutmix"], label_smoothing=smoothing, num_classes=num_classes
        )
        criterion = SoftTargetCrossEntropy()
    elif smoothing:
        criterion = LabelSmoothingCrossEntropy(smoothing)
    else:
        criterion = torch.nn.CrossEntropyLoss()
    ema = ModelEmaV3(model, decay=cfg["ema_decay"]) if cfg["ema"] else None
    return Training(optimizer, scheduler, criterion, mixup, ema, steps)


def stop(tag: str, problem: str, checkpoint: Path) -> NoReturn:
    """End a run that diverged, naming only files that exist."""
    kept = f"The last good checkpoint is {checkpoint}" if checkpoint.exists() else "No checkpoint was written yet"
    raise SystemExit(
        f"error: [{tag}] {problem}; stopping. {kept} (lower --lr, raise --warmup-epochs or keep --clip-grad)"
    )


def train_one_epoch(
    model: torch.nn.Module, ddp: torch.nn.Module, loader, training: Training, cfg: dict, epoch: int, device, tag: str
) -> tuple[float, float]:
    """One pass over the training set; returns the mean training loss and top-1 (%) over all ranks."""
    ddp.train()
    bar = tqdm(
        loader,
        desc=f"{tag} epoch {epoch + 1}/{cfg['epochs']}",
        disable=None if rank_world()[0] == 0 else True,
        leave=False,
    )
    loss_sum = correct = seen = 0.0
    sizes = batch_sizes(cfg, epoch, len(loader))
    for step, (x, y) in enumerate(bar):
        x, y = x.to(device), y.to(device)
        if sizes:
            x = resize_batch(x, sizes[step])
        target = y
        if training.mixup is not None:
            x, target = training.mixup(x, y)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["amp"]):
            logits = ddp(x)
            loss = training.criterion(logits.float(), target)
        if not torch.isfinite(loss):
            stop(tag, f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}", checkpoint_path(cfg, tag))
        training.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg["clip_grad"]:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip_grad"])
        training.optimizer.step()
        training.scheduler.step_update(epoch * training.steps + step + 1)
        if training.ema is not None:
            training.ema.update(model)
        loss_sum += loss.item() * x.shape[0]
        correct += (logits.argmax(-1) == y).sum().item()
        seen += x.shape[0]
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}")
    loss_sum, correct, seen = all_sum([loss_sum, correct, seen], device)
    return loss_sum / seen, 100 * correct / seen


@torch.no_grad()
def validate(model: torch.nn.Module, loader, device, amp: bool) -> dict:
    """Loss, top-1 and top-5 (%) over the whole loader, summed over ranks."""
    model.eval()
    loss_sum = top1 = top5 = count = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss_sum += F.cross_entropy(out.float(), y, reduction="sum").item()
        a1, a5 = accuracy(out, y, topk=(1, min(5, out.shape[1])))
        top1 += a1.item() * x.shape[0] / 100
        top5 += a5.item() * x.shape[0] / 100
        count += x.shape[0]
    loss_sum, top1, top5, count = all_sum([loss_sum, top1, top5, count], device)
    return dict(loss=loss_sum / max(count, 1), top1=100 * top1 / max(count, 1), top5=100 * top5 / max(count, 1))


def checkpoint_path(cfg: dict, tag: str) -> Path:
    return model_dir(Path(cfg["output"]), tag) / "checkpoint.pt"


def save_checkpoint(cfg: dict, tag: str, model, training: Training, epoch: int, rngs: list[dict]) -> None:
    """The evaluated weights (model.safetensors) and the resume state (checkpoint.pt), each written atomically."""
    state = dict(
        model=model.state_dict(),
        optimizer=training.optimizer.state_dict(),
        model_ema=training.ema.state_dict() if training.ema is not None else None,  # timm's key: load_checkpoint reads
        epoch=epoch,
        rng=rngs,
    )
    folder = checkpoint_path(cfg, tag).parent
    folder.mkdir(parents=True, exist_ok=True)
    evaluated = training.ema.module if training.ema is not None else model
    weights = {k: v.detach().cpu().contiguous() for k, v in evaluated.state_dict().items()}
    atomic_write(folder / "model.safetensors", save_file, weights)
    atomic_write(folder / "checkpoint.pt", torch.save, state)


def resume_from(path: Path, model, training: Training) -> int:
    """Model, optimizer, EMA and every rank's RNG from a checkpoint.pt; returns the number of finished epochs."""
    state = torch.load(path, map_location="cpu", weights_only=False)  # RNG states must stay on the CPU
    model.load_state_dict(state["model"])
    training.optimizer.load_state_dict(state["optimizer"])
    ema_state = state.get("model_ema", state.get("ema"))  # "ema" in checkpoints of older train.py
    if training.ema is not None and ema_state is not None:
        training.ema.load_state_dict(ema_state)
    runs.restore_rng_state(state["rng"], *rank_world())
    done = state["epoch"] + 1
    # timm's schedulers compute the LR from the update index alone, so the scheduler is not restored: built from
    # this config it follows a longer --epochs, and an unchanged one sets the LR the uninterrupted run's last
    # step_update set
    training.scheduler.step_update(done * training.steps)
    return done


def train_model(cfg: dict, spec: str, tag: str, data: tuple, device: torch.device) -> torch.nn.Module:
    """Build one model and train it to ``epochs`` (from its checkpoint with --resume); returns the weights to
    evaluate (the EMA's with --ema)."""
    rank, world = rank_world()
    out, (train_ds, eval_set, num_classes) = Path(cfg["output"]), data
    runs.seed_everything(cfg["seed"])
    model = config.build_model(cfg, spec, num_classes).to(device)
    if cfg["eval_only"]:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    runs.seed_everything(cfg["seed"] + rank)  # same weights on every rank (DDP syncs them), own dropout/mixup draws
    training = make_training(cfg, model, num_classes, steps=max(len(train_ds) // world // cfg["batch_size"], 1))
    checkpoint, start = checkpoint_path(cfg, tag), 0
    if cfg["resume"] and checkpoint.exists():
        start = resume_from(checkpoint, model, training)
        if rank == 0:
            print(f"[{tag}] resumed after epoch {start} of {cfg['epochs']}", flush=True)
    if cfg["resume"] and rank == 0:
        runs.drop_log_rows(out / "log.csv", tag, after=start)
    for epoch in range(start, cfg["epochs"]):
        t0 = time.time()
        loader = make_loader(train_ds, cfg, True, epoch)
        train_loss, train_top1 = train_one_epoch(model, ddp, loader, training, cfg, epoch, device, tag)
        broken = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
        if broken:
            stop(tag, f"weights became non-finite in epoch {epoch + 1} ({broken[:3]}...)", checkpoint)
        evaluated = training.ema.module if training.ema is not None else model
        val = validate(evaluated, make_loader(eval_set(cfg["img_size"], "resize"), cfg, False, 0), device, cfg["amp"])
        if not math.isfinite(val["loss"]):
            stop(tag, f"the validation loss became {val['loss']} after epoch {epoch + 1}", checkpoint)
        rngs = runs.all_rng_states()  # every rank's, so that each resumes its own draws
        if rank == 0:
            lr = training.optimizer.param_groups[0]["lr"]
            row = dict(model=tag, epoch=epoch + 1, train_loss=train_loss, train_top1=train_top1,
                       val_loss=val["loss"], val_top1=val["top1"], lr=lr, seconds=time.time() - t0)  # fmt: skip
            log_epoch(out, cfg, row)
            save_checkpoint(cfg, tag, model, training, epoch, rngs)
        if dist.is_initialized():
            dist.barrier()
    if training.ema is not None:
        model.load_state_dict(training.ema.module.state_dict())
    return model


def log_epoch(out: Path, cfg: dict, row: dict) -> None:
    runs.append_csv(out / "log.csv", row)
    print(
        f"[{row['model']}] epoch {row['epoch']}/{cfg['epochs']}  "
        f"train loss {row['train_loss']:.3f} acc {row['train_top1']:.1f}  "
        f"val loss {row['val_loss']:.3f} acc {row['val_top1']:.1f}  ({row['seconds']:.0f}s)",
        flush=True,
    )


# ------------------------------------------------------------------------------------------------- evaluation
def scaling_modes(model: torch.nn.Module, modes: list[str]) -> list[str]:
    """The ``--rope-scaling`` modes that apply to this model ('-' for a model without RoPE)."""
    own = model.rope_scaling_modes() if hasattr(model, "rope_scaling_modes") else ()
    return [m for m in modes if m in own] if own else ["-"]


def eval_jobs(cfg: dict, modes: list[str]) -> list[tuple[str, int, str]]:
    """(protocol, eval size, scaling mode) of every result row of one model, in order."""
    native = cfg["native_eval"] and cfg["dataset"] in ("synthetic", "synthetic_video")
    return [(p, s, m) for p in ["resize"] + ["native"] * native for s in cfg["eval_sizes"] for m in modes]


def evaluate_resolutions(run: runs.Run, model, eval_set, modes: list[str], device) -> list[dict]:
    """One result row per eval size, protocol and RoPE scaling mode."""
    cfg, params = run.cfg, sum(p.numel() for p in model.parameters())
    rows = []
    bar = dict(desc=f"{run.tag} eval", disable=None if rank_world()[0] == 0 else True, leave=False)
    for protocol, size, mode in tqdm(eval_jobs(cfg, modes), **bar):
        if mode != "-":
            model.set_rope_scaling(mode)
        r = validate(model, make_loader(eval_set(size, protocol), cfg, False, 0), device, cfg["amp"])
        rows.append(
            dict(model=run.model, recipe=run.recipe, seed=run.seed, train_size=cfg["img_size"], eval_size=size,
                 protocol=protocol, rope_scaling=mode, top1=round(r["top1"], 2), top5=round(r["top5"], 2),
                 loss=round(r["loss"], 4), params=params)
        )  # fmt: skip
    if modes != ["-"]:
        model.set_rope_scaling("none")
    return rows


def model_results(run: runs.Run, checked: tuple, trained: int, device) -> list[dict]:
    """One run's result rows: a resumed run's, when they are what the config asks of weights trained for
    ``epochs``; else the model trained (on) and evaluated."""
    (data, modes), rank, cfg, tag = checked, rank_world()[0], run.cfg, run.tag
    done = model_dir(Path(cfg["output"]), tag) / "results.json"
    if cfg["resume"] and done.exists() and (cfg["eval_only"] or trained == cfg["epochs"]):
        # rows of a train.py before recipes and seeds lack those columns: they come first, as in new rows
        first = {"model": run.model, "recipe": run.recipe, "seed": run.seed}
        rows = [{**first, **r} for r in json.loads(done.read_text())]
        if [(r["protocol"], r["eval_size"], r["rope_scaling"]) for r in rows] == eval_jobs(cfg, modes):
            if rank == 0:
                print(f"[{tag}] finished earlier; its results are kept", flush=True)
            return rows
        if rank == 0:
            print(f"[{tag}] the evaluation settings changed: evaluating its saved weights again", flush=True)
    model = train_model(cfg, run.spec, tag, data, device)
    t0 = time.time()
    rows = evaluate_resolutions(run, model, data[1], modes, device)
    if rank == 0:
        done.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(done, runs.write_json, rows)
        summary = ", ".join(f"{r['eval_size']}px/{r['protocol']}/{r['rope_scaling']}: {r['top1']:.1f}" for r in rows)
        print(f"[{tag}] evaluated in {time.time() - t0:.0f}s: {summary}", flush=True)
    return rows


# ------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> list[dict]:
    # every check first: a command that fails leaves --output as it was
    cfg, given = parse_config(argv)
    cfg = config.resumed_config(cfg, given)
    config.check_config(cfg)
    one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
    if config.resolve_device(cfg["device"]).type == "cpu" and one_process and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    plan = runs.plan_runs(cfg)
    trained = runs.check_epochs(cfg, [run.tag for run in plan])
    checked = preflight(plan)

    device = runs.setup_distributed(config.resolve_device(cfg["device"]))
    rank = rank_world()[0]
    out = Path(cfg["output"])
    with runs.locked(out) if rank == 0 else nullcontext():
        if rank == 0:
            runs.start_run(cfg)
        if dist.is_initialized():
            dist.barrier()
        rows: list[dict] = []
        for i, run in enumerate(plan):
            if rank == 0 and len(plan) > 1:
                print(f"run {i + 1}/{len(plan)}: {run.tag}", flush=True)
            rows += model_results(run, checked[run.tag], trained[run.tag], device)
        if rank == 0:
            write_results(rows, out, cfg["img_size"], cfg["dataset"])
            print((out / "results.md").read_text())
            print(f"wrote {', '.join(str(out / f) for f in runs.RESULT_FILES)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
