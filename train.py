"""Train image/video classifiers with different position embeddings under one recipe, then evaluate each at
resolutions it never saw: the APE-vs-RoPE comparison.

    python train.py                                   # configs/default.yaml: offline, 2-core CPU, ~10 min
    python train.py --config configs/cifar10.yaml     # any config key is also a flag: --epochs 3 --lr 1e-3 ...
    python train.py --config configs/resolution_fashion.yaml   # 8 encodings x 2 recipes x 3 seeds, 90 min on 2 cores
    torchrun --nproc_per_node 8 train.py --config configs/imagenet_deit3_s.yaml --data-dir /data/imagenet
    python train.py --output runs/x --resume          # continue a killed run from its last finished epoch

Every model trains once per seed (--seeds) under every recipe (``recipes``: named overrides of training keys, such
as multi-resolution training with --train-sizes): a run each. Outputs in --output: results.csv (one row per run,
eval size, protocol and RoPE scaling mode), results.md (mean ± std over seeds), accuracy_vs_resolution.png,
extrapolation.png, overview.png, log.csv (per epoch), config.yaml (resolved), and per run <tag>/model.safetensors
(last weights) with <tag>/config.json (timm's: the folder is a timm model folder,
``timm.create_model("local-dir:<tag folder>")``) and <tag>/checkpoint.pt (resume state), written atomically every
epoch.

Every setting is checked, and every model built once, before anything in --output changes; the run then holds a
lock on the folder and writes only its own files there. What --resume does with changed settings, and what
--overwrite deletes: docs/what_happens_when.md.
"""

import copy
import math
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.utils import accuracy
from tqdm import tqdm

from vit_rope.training.data import Data, DataError
from vit_rope.training.distributed import all_sum, rank_world, resolve_device, setup_distributed
from vit_rope.training.folder import (
    RESULT_FILES,
    RUN_FILES,
    append_csv,
    atomic_write,
    check_output,
    locked,
    made,
    remove_run_files,
    write_json,
)
from vit_rope.training.loaders import finetune_loader, image_sizes_of_batches, make_loader, resize_batch, train_loader
from vit_rope.training.models import build_model, data_config
from vit_rope.training.naflex import batch_to, images_in, loss_scale, naflex_loader
from vit_rope.training.optim import Training, make_training
from vit_rope.training.plan import Run, eval_jobs
from vit_rope.training.preflight import folder_config, prepare
from vit_rope.training.report import FINETUNE_PROTOCOL as FINETUNE  # (the rows of a model fine-tuned at the size)
from vit_rope.training.report import write_results
from vit_rope.training.resume import read_results, resume_from, resume_log, resume_state
from vit_rope.training.rng import all_rng_states, seed_everything
from vit_rope.training.settings import Settings, parse
from vit_rope.training.weights import save_model_folder, torch_bytes, weights_file

HERE = Path(__file__).resolve().parent


def parse_config(argv: list[str] | None = None) -> tuple[Settings, dict]:
    """configs/default.yaml, or ``--config``, overridden by flags (``python train.py --help`` lists them); and what
    the command line sets, for --resume."""
    return parse(argv, HERE / "configs" / "default.yaml", __doc__)


# ------------------------------------------------------------------------------------------------------ model


def compiled(module: torch.nn.Module, settings: Settings) -> torch.nn.Module:
    """``module`` under ``torch.compile`` with --compile (else itself): the module a forward runs. The weights stay
    ``module``'s own, so what is saved, averaged (EMA) or checked is the uncompiled module."""
    return torch.compile(module) if settings.compile else module


# --------------------------------------------------------------------------------------------------- training


def stop(tag: str, problem: str, checkpoint: Path) -> NoReturn:
    """End a run that diverged, naming only files that exist."""
    kept = f"The last good checkpoint is {checkpoint}" if checkpoint.exists() else "No checkpoint was written yet"
    raise SystemExit(
        f"error: [{tag}] {problem}; stopping. {kept} (lower --lr, raise --warmup-epochs or keep --clip-grad)"
    )


def train_one_epoch(model, ddp, loader, training: Training, run: Run, epoch: int, device) -> tuple[float, float]:
    """One pass over the training set; returns the mean training loss and top-1 (%) over all ranks."""
    settings = run.settings
    ddp.train()
    desc, quiet = f"{run.tag} epoch {epoch + 1}/{settings.epochs}", rank_world()[0] != 0
    bar = tqdm(loader, desc=desc, disable=True if quiet else None, leave=False)
    loss_sum = correct = seen = 0.0
    sizes = image_sizes_of_batches(settings, epoch, len(loader))
    for step, (x, y) in enumerate(bar):
        x, y = batch_to(x, device), y.to(device, non_blocking=True)
        if sizes:
            x = resize_batch(x, sizes[step])
        target = y
        if training.mixup is not None and not settings.naflex:  # (a NaFlex loader mixes its batches itself)
            x, target = training.mixup(x, y)
        y = y.argmax(-1) if y.ndim == 2 else y  # mixed soft targets: the larger label counts for accuracy
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.amp):
            logits = ddp(x)
            loss = training.criterion(logits.float(), target)
        if not torch.isfinite(loss):
            stop(run.tag, f"the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}",
                 run.folder / "checkpoint.pt")  # fmt: skip
        training.optimizer.zero_grad(set_to_none=True)
        (loss * loss_scale(images_in(x), settings, device) if settings.naflex else loss).backward()
        if settings.clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_grad)
        training.optimizer.step()
        training.scheduler.step_update(epoch * training.steps + step + 1)
        if training.ema is not None:
            training.ema.update(model)
        loss_sum += loss.item() * images_in(x)
        correct += (logits.argmax(-1) == y).sum().item()
        seen += images_in(x)
        bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}")
    loss_sum, correct, seen = all_sum([loss_sum, correct, seen], device)
    return loss_sum / seen, 100 * correct / seen


@torch.no_grad()
def validate(model: torch.nn.Module, loader, device, amp: bool) -> dict:
    """Loss, top-1 and top-5 (%) over the whole loader, summed over ranks."""
    model.eval()
    loss_sum = top1 = top5 = count = 0.0
    for x, y in loader:
        x, y = batch_to(x, device), y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss_sum += F.cross_entropy(out.float(), y, reduction="sum").item()
        a1, a5 = accuracy(out, y, topk=(1, min(5, out.shape[1])))
        top1 += a1.item() * len(y) / 100
        top5 += a5.item() * len(y) / 100
        count += len(y)
    loss_sum, top1, top5, count = all_sum([loss_sum, top1, top5, count], device)
    return dict(loss=loss_sum / max(count, 1), top1=100 * top1 / max(count, 1), top5=100 * top5 / max(count, 1))


def train_model(run: Run, data: Data, device: torch.device) -> torch.nn.Module:
    """Build one model and train it to ``epochs`` (from its checkpoint with --resume); returns the weights to
    evaluate (the EMA's with --ema)."""
    settings, out, (rank, world) = run.settings, run.folder.parent, rank_world()
    seed_everything(settings.seed)
    model = build_model(settings, run.spec, data.num_classes).to(device)
    if settings.eval_only:
        return model
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    forward = compiled(ddp, settings)  # (model keeps the weights: saved, averaged by the EMA, checked)
    seed_everything(settings.seed + rank)  # same weights on every rank (DDP syncs them), own dropout/mixup draws
    steps = max(len(data.train) // world // settings.batch_size, 1)
    if settings.naflex:  # timm's schedule: the same number of batches every epoch
        steps = len(train_loader(run, data, model, 0))
    training = make_training(settings, model, data.num_classes, steps)
    checkpoint, start, config = run.folder / "checkpoint.pt", 0, folder_config(run, model, data)
    if settings.resume and (checkpoint.exists() or checkpoint.is_symlink()):
        start = resume_from(checkpoint, model, training)
        if rank == 0:
            print(f"[{run.tag}] resumed after epoch {start} of {settings.epochs}", flush=True)
    if settings.resume and rank == 0:
        resume_log(out / "log.csv", run.tag, start)
    evaluated = training.ema.module if training.ema is not None else model
    validated = compiled(evaluated, settings)
    for epoch in range(start, settings.epochs):
        t0 = time.time()
        loader = train_loader(run, data, model, epoch)
        train_loss, train_top1 = train_one_epoch(model, forward, loader, training, run, epoch, device)
        broken = [n for n, p in model.named_parameters() if not torch.isfinite(p).all()]
        if broken:
            stop(run.tag, f"weights became non-finite in epoch {epoch + 1} ({broken[:3]}...)", checkpoint)
        val_loader = make_loader(data.eval_set(settings.img_size, "resize"), settings, False, 0)
        val = validate(validated, val_loader, device, settings.amp)
        if not math.isfinite(val["loss"]):
            stop(run.tag, f"the validation loss became {val['loss']} after epoch {epoch + 1}", checkpoint)
        rngs = all_rng_states()  # every rank's, so that each resumes its own draws
        if rank == 0:
            lr = training.optimizer.param_groups[0]["lr"]
            row = dict(model=run.tag, epoch=epoch + 1, train_loss=train_loss, train_top1=train_top1,
                       val_loss=val["loss"], val_top1=val["top1"], lr=lr, seconds=time.time() - t0)  # fmt: skip
            log_epoch(out, run, row)
            state = resume_state(model, training, epoch, rngs)
            save_checkpoint(run.folder, state, evaluated, model.vit_rope_record, config)
        if dist.is_initialized():
            dist.barrier()
    if training.ema is not None:
        model.load_state_dict(training.ema.module.state_dict())
    return model


def save_checkpoint(
    folder: Path, state: dict, evaluated: torch.nn.Module, record: dict[str, str], config: dict
) -> None:
    """The evaluated weights as a timm model folder (model.safetensors, its metadata the model's record, and timm's
    config.json) and the resume state (checkpoint.pt), each written atomically."""
    made(folder)
    save_model_folder(folder, evaluated, record, config)
    atomic_write(folder / "checkpoint.pt", lambda s, f: f.write(torch_bytes(s)), state)


def log_epoch(out: Path, run: Run, row: dict) -> None:
    append_csv(out / "log.csv", row)
    print(
        f"[{row['model']}] epoch {row['epoch']}/{run.settings.epochs}  "
        f"train loss {row['train_loss']:.3f} acc {row['train_top1']:.1f}  "
        f"val loss {row['val_loss']:.3f} acc {row['val_top1']:.1f}  ({row['seconds']:.0f}s)",
        flush=True,
    )


# ------------------------------------------------------------------------------------------------- evaluation


def evaluate_resolutions(run: Run, model, data: Data, modes: list[str], device) -> list[dict]:
    """One result row per eval size, protocol and RoPE scaling mode."""
    settings, params = run.settings, sum(p.numel() for p in model.parameters())
    # eager even with --compile: each (size, mode) cell is one pass over the test set, and each would be a graph of
    # its own (a size is a shape, a mode a branch): compiling them cost more than it saved
    rows = []
    bar = dict(desc=f"{run.tag} eval", disable=None if rank_world()[0] == 0 else True, leave=False)
    for protocol, size, mode in tqdm(eval_jobs(settings, modes), **bar):
        if mode != "-":
            model.set_rope_scaling(mode)
        if protocol == "naflex":  # each image at its own aspect ratio within a budget of `size` tokens
            dc = data_config(settings, run.spec)
            loader = naflex_loader(data.eval_set(size, protocol), settings, dc, model.get_patch_size(), train=False,
                                   budget=size)  # fmt: skip
        else:
            loader = make_loader(data.eval_set(size, protocol), settings, False, 0)
        r = validate(model, loader, device, settings.amp)
        rows.append(
            dict(model=run.model, recipe=run.recipe, seed=run.seed, train_size=settings.img_size, eval_size=size,
                 protocol=protocol, rope_scaling=mode, top1=round(r["top1"], 2), top5=round(r["top5"], 2),
                 loss=round(r["loss"], 4), params=params)
        )  # fmt: skip
    if modes != ["-"]:
        model.set_rope_scaling("none")
    return rows


def finetune(run: Run, model: torch.nn.Module, data: Data, tuned: list[str], device) -> list[dict]:
    """A copy of the trained ``model`` fine-tuned at each --finetune-sizes size under each mode of ``tuned`` (the
    training images resized from the originals to that size; --finetune-lr, no warm-up, the LR schedule over
    --finetune-steps, no EMA, no multi-resolution batches), then evaluated there: one row each, protocol 'finetune'.
    Every fine-tuning starts from the same weights and seeds, so each is a function of the trained model alone, and
    a run resumed after a kill computes the same ones again."""
    settings, rank, world = run.settings, *rank_world()
    if not settings.finetune_sizes:
        return []
    # fine-tuning trains square images at each size, after --naflex training too
    ft = replace(settings, lr=settings.finetune_lr, min_lr=min(settings.min_lr, settings.finetune_lr), epochs=1,
                 warmup_epochs=0, train_sizes=(), ema=False, naflex=False)  # fmt: skip
    params, rows = sum(p.numel() for p in model.parameters()), []
    for size in settings.finetune_sizes:
        for mode in tuned:
            t0 = time.time()
            seed_everything(settings.seed + rank)
            tuned_model = copy.deepcopy(model)
            if mode != "-":
                tuned_model.set_rope_scaling(mode)
            ddp = torch.nn.parallel.DistributedDataParallel(tuned_model) if world > 1 else tuned_model
            training = make_training(ft, tuned_model, data.num_classes, settings.finetune_steps)
            job = replace(run, settings=ft, tag=f"{run.tag} finetune {size}px {mode}")
            loader = finetune_loader(data.train_at(size), ft, size)
            loss, _ = train_one_epoch(tuned_model, compiled(ddp, ft), loader, training, job, 0, device)
            r = validate(tuned_model, make_loader(data.eval_set(size, "resize"), settings, False, 0), device,
                         settings.amp)  # one pass: eager, as evaluate_resolutions  # fmt: skip
            rows.append(
                dict(model=run.model, recipe=run.recipe, seed=run.seed, train_size=settings.img_size, eval_size=size,
                     protocol=FINETUNE, rope_scaling=mode, top1=round(r["top1"], 2), top5=round(r["top5"], 2),
                     loss=round(r["loss"], 4), params=params)
            )  # fmt: skip
            if rank == 0:
                print(f"[{job.tag}] {settings.finetune_steps} steps (train loss {loss:.3f}) in "
                      f"{time.time() - t0:.0f}s: top-1 {r['top1']:.1f}", flush=True)  # fmt: skip
    return rows


def model_results(run: Run, checked: tuple[Data, list[str], list[str]], trained: int, device) -> list[dict]:
    """One run's result rows: a resumed run's, when they are what the settings ask of weights trained for
    ``epochs``; else the model trained (on) and evaluated."""
    (data, modes, tuned), rank, settings = checked, rank_world()[0], run.settings
    done = run.folder / "results.json"
    if settings.resume and (settings.eval_only or trained == settings.epochs):
        rows = read_results(run, eval_jobs(settings, modes, tuned))
        if rows is not None:
            if rank == 0:
                print(f"[{run.tag}] finished earlier; its results are kept", flush=True)
            return rows
        if rank == 0 and done.exists():
            print(f"[{run.tag}] the evaluation settings changed: evaluating its saved weights again", flush=True)
    model = train_model(run, data, device)
    t0 = time.time()
    rows = evaluate_resolutions(run, model, data, modes, device)
    rows += finetune(run, model, data, tuned, device)
    if rank == 0:
        made(run.folder)  # an --eval-only run trained nothing into it
        atomic_write(done, write_json, rows)
        summary = ", ".join(f"{r['eval_size']}px/{r['protocol']}/{r['rope_scaling']}: {r['top1']:.1f}" for r in rows)
        print(f"[{run.tag}] evaluated in {time.time() - t0:.0f}s: {summary}", flush=True)
    return rows


# ------------------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> list[dict]:
    # every check first: a command that fails leaves --output as it was
    settings, plan, earlier, trained, checked = prepare(*parse_config(argv))

    device = setup_distributed(resolve_device(settings.device))
    rank = rank_world()[0]
    out = check_output(settings.output)
    with locked(out) if rank == 0 else nullcontext():
        if rank == 0:
            start_run(settings, plan, earlier)
        if dist.is_initialized():
            dist.barrier()
        rows: list[dict] = []
        for i, run in enumerate(plan):
            if rank == 0 and len(plan) > 1:
                print(f"run {i + 1}/{len(plan)}: {run.tag}", flush=True)
            try:
                rows += model_results(run, checked[run.tag], trained[run.tag], device)
            except DataError as e:  # a dataset file changed since the checks (a DataLoader worker's: its last line)
                problem = str(e).strip().splitlines()[-1].removeprefix(f"{DataError.__module__}.DataError: ")
                raise SystemExit(
                    f"error: [{run.tag}] {problem}; then --resume continues from the last finished epoch"
                ) from None
        if rank == 0:
            data = checked[plan[0].tag][0]
            about = f"{settings.dataset}, trained at {settings.img_size} px for {settings.epochs} epochs"
            if settings.eval_only:  # (nothing was trained here: --epochs says nothing of the weights)
                start = Path(settings.initial_checkpoint).name if settings.initial_checkpoint else "pretrained"
                about = f"{settings.dataset}, {start} weights evaluated at {settings.img_size} px (not trained here)"
            print(write_results(rows, out, settings.img_size, about, chance=100 / data.num_classes))
            print(f"wrote {', '.join(str(out / f) for f in RESULT_FILES)}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return rows


def start_run(settings: Settings, plan: list[Run], earlier: list[Path]) -> None:
    """Before the runs: the result files go (they are written when every run has ended, so that the ones in a folder
    always come from its config.yaml); a fresh run also removes its runs' own resume state and log, and with
    --overwrite the earlier run's files (by name, never a glob); then config.yaml is written."""
    out, start = check_output(settings.output), settings.initial_checkpoint
    keep = Path(weights_file(start)).resolve() if start else None  # it may be an earlier run's weights
    if settings.resume:
        remove_run_files(out, [], RESULT_FILES)
    else:
        remove_run_files(out, [*earlier, *(run.folder for run in plan)], RUN_FILES, keep=keep)
    atomic_write(out / "config.yaml", lambda s, f: f.write(s.to_yaml().encode()), settings)


def run_command(command: Callable[[], object]) -> int:
    """``command``'s exit status, a Ctrl-C one line rather than a traceback through whatever was running (every
    file is whole: each is renamed into place, so the last finished epoch is kept)."""
    try:
        return 0 if command() is not None else 1
    except KeyboardInterrupt:
        print("interrupted; --resume continues from the last finished epoch", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(run_command(main))
