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
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, accuracy
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from vit_rope.training.data import Data, DataError, build_data
from vit_rope.training.distributed import all_sum, rank_world, resolve_device, setup_distributed
from vit_rope.training.folder import (
    DISK_FULL,
    MODEL_FILES,
    RESULT_FILES,
    RUN_FILES,
    append_csv,
    atomic_write,
    check_output,
    check_own_files,
    disk_error,
    drop_log_rows,
    locked,
    read_log,
    read_own,
    remove_run_files,
    write_json,
)
from vit_rope.training.memory import check_eval_memory
from vit_rope.training.models import (
    build_model,
    check_input_sizes,
    data_config,
    from_model_folder,
    import_modules,
    scaling_modes,
)
from vit_rope.training.naflex import batch_to, images_in, loss_scale, naflex_loader
from vit_rope.training.plan import Run, plan_runs
from vit_rope.training.report import FINETUNE_PROTOCOL as FINETUNE  # (the rows of a model fine-tuned at the size)
from vit_rope.training.report import write_results
from vit_rope.training.rng import SeededItems, all_rng_states, restore_rng_state, seed_everything
from vit_rope.training.settings import DEFAULTS, Settings, parse, read_yaml, resumed
from vit_rope.training.weights import (
    check_record,
    file_sha256,
    read_checkpoint,
    recorded_labels,
    resume_remedy,
    save_model_folder,
    timm_config,
    trained_epochs,
    weights_file,
)

HERE = Path(__file__).resolve().parent


def parse_config(argv: list[str] | None = None) -> tuple[Settings, dict]:
    """configs/default.yaml, or ``--config``, overridden by flags (``python train.py --help`` lists them); and what
    the command line sets, for --resume."""
    return parse(argv, HERE / "configs" / "default.yaml", __doc__)


# ------------------------------------------------------------------------------------- checks before a run
# a setting that acts only with another: (the setting, the one it needs, whether a run's settings have that one)
NEEDS = (("seq_lens", "--naflex", lambda s: s.naflex), ("naflex_loss_scale", "--naflex", lambda s: s.naflex),
         ("finetune_steps", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("finetune_lr", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("finetune_scaling", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("allow_transfer", "--initial-checkpoint", lambda s: s.initial_checkpoint),
         ("ema_decay", "--ema", lambda s: s.ema))  # fmt: skip


def idle_settings(given: dict, runs: list[Settings]) -> list[str]:
    """One line for each setting the command line (or a --config it names) gives that no run uses, because the
    setting it acts with is off in every recipe (--seq-lens without --naflex, say): it takes no effect, and says so
    before anything changes."""
    return [
        f"note: --{key.replace('_', '-')} takes no effect without {flag} (no run has it)"
        for key, flag, on in NEEDS
        if key in given and not any(on(s) for s in runs)
    ]


def started_from(settings: Settings) -> Settings:
    """The settings with the sha256 of --initial-checkpoint's weights (hashed once, here), which config.yaml records:
    a resumed run whose recorded hash differs (the file was replaced since the run began, and its results would mix
    rows of two weight files), or a fresh one given --initial-checkpoint-sha256 of another file, is one line."""
    start = settings.initial_checkpoint
    if not start:
        return replace(settings, initial_checkpoint_sha256=None)
    path, digest, recorded = weights_file(start), file_sha256(start), settings.initial_checkpoint_sha256
    if recorded and recorded != digest:
        if settings.resume:
            raise SystemExit(
                f"error: --resume: the run in {settings.output} started from --initial-checkpoint {path} of sha256 "
                f"{recorded[:12]}..., and that file now has sha256 {digest[:12]}...: its results would mix two weight "
                "files; put the original file back, or start a new run with another --output"
            )
        raise SystemExit(
            f"error: --initial-checkpoint {path} has sha256 {digest[:12]}..., not --initial-checkpoint-sha256 "
            f"{recorded[:12]}...; point it at the file of that hash, or leave --initial-checkpoint-sha256 out"
        )
    return replace(settings, initial_checkpoint_sha256=digest)


def check_folder(settings: Settings, plan: list[Run]) -> list[Path]:
    """--output can hold the run (outside a folder dataset's --data-dir), and a fresh run replaces no earlier one
    unasked: it is refused where a run's files are (its config.yaml, results or log, or a run's checkpoint, weights
    or results where this one would write them), unless --resume or --overwrite, and --overwrite of a run that
    --initial-checkpoint lies in (it would delete the files of the folder the weights come from: a model folder no
    more); returns the folders of the earlier runs --overwrite deletes the files of (by name)."""
    out = check_output(settings.output)
    data = Path(settings.data_dir).expanduser().resolve()
    if settings.dataset in ("imagefolder", "clipfolder") and out.is_relative_to(data):  # (the folders it reads)
        raise SystemExit(
            f"error: --output {out} lies in --data-dir {data}: the run's figures and folders would become images and "
            "classes of the dataset (a folder dataset reads every folder of train/ as a class); choose an --output "
            "outside --data-dir"
        )
    check_own_files(out, [run.folder for run in plan])
    earlier = out / "config.yaml"
    found = [out / f for f in RUN_FILES] + [run.folder / f for run in plan for f in MODEL_FILES]
    found = [p for p in found if p.exists() or p.is_symlink()]
    if settings.resume or not found:
        return []
    start = settings.initial_checkpoint
    if settings.overwrite and start and Path(start).resolve().is_relative_to(out):
        raise SystemExit(
            f"error: --initial-checkpoint {start} lies in --output {out}, whose run --overwrite replaces (deleting "
            "the config.json, checkpoint.pt and results of its model folders, and its config.yaml): the weights would "
            "outlive their folder; copy the folder out of --output first (cp -r), or choose another --output"
        )
    if not settings.overwrite:
        raise SystemExit(
            f"error: {out} holds a run already ({found[0]}); continue it with --resume, or replace it with "
            "--overwrite (which deletes its results, log, config and each run's checkpoint.pt, model.safetensors, "
            "config.json and results.json), or choose another --output"
        )
    try:  # the earlier run's own folders, named by its config (one that cannot be read, or names a folder that is not
        # a plain child of --output, names none: a config is data, and deletes only what run_folder allows)
        values = {**DEFAULTS, **read_yaml(earlier, "the earlier run's config", own=True), "output": settings.output}
        return [run.folder for run in plan_runs(Settings(**values))]
    except (SystemExit, TypeError):
        return []


def check_epochs(settings: Settings, plan: list[Run]) -> dict[str, int]:
    """The epochs each run of a resumed run has trained; fewer --epochs than that is refused (an epoch cannot be
    untrained, and config.yaml would not describe the weights)."""
    resuming = settings.resume and not settings.eval_only
    trained = {run.tag: trained_epochs(run.folder / "checkpoint.pt") if resuming else 0 for run in plan}
    ahead = {t: n for t, n in trained.items() if n > settings.epochs}
    if ahead:
        raise SystemExit(
            f"error: --epochs {settings.epochs} is fewer than the run in {settings.output} has trained ({ahead}); "
            f"resume with --epochs {max(ahead.values())} or more, or train for fewer epochs in a new run with another "
            "--output"
        )
    return trained


def checked_data(settings: Settings, dc: dict) -> Data:
    """``build_data``, with one sample of each split read: a missing or unreadable dataset stops the run now."""
    try:
        data = build_data(settings, dc)
        if data.train is not None:
            data.train[0]
        data.eval_set(settings.img_size, "resize")[0]
    except (OSError, ValueError, RuntimeError, IndexError) as e:
        raise SystemExit(f"error: dataset {settings.dataset} in {settings.data_dir!r}: {e}") from None
    except (AssertionError, KeyError, TypeError) as e:  # timm's transforms: a policy (--auto-augment) it cannot read
        raise SystemExit(
            f"error: the training transform of {settings.dataset} fails ({type(e).__name__}: {e}); check "
            f"--auto-augment {settings.auto_augment!r} (timm's policies, e.g. rand-m9-mstd0.5-inc1)"
        ) from None
    return data


def preflight(plan: list[Run]) -> dict[str, tuple[Data, list[str], list[str]]]:
    """The optimizer, the data and every model (under each recipe) built once on the CPU before anything is written,
    so that what would fail later fails now: an optimizer timm lacks, a dataset that is missing or unreadable, a
    kwarg the model refuses or one that makes its outputs non-finite, weights that do not fit, eval or training sizes
    it does not take, or whose evaluation cannot fit the machine's memory (:mod:`~vit_rope.training.memory`). Returns
    run tag → (data, the model's scaling modes, those it fine-tunes under); runs that agree on the data share it."""
    for settings in {run.recipe: run.settings for run in plan}.values():
        try:  # timm's names: its own error says which it knows
            make_optimizer(torch.nn.Linear(1, 1), settings, steps=1)
        except (ValueError, AssertionError) as e:
            raise SystemExit(f"error: --opt {settings.opt} with --sched {settings.sched}: {e}") from None
    data, models, checked = {}, {}, {}
    for run in plan:
        dc = data_config(run.settings, run.spec)
        key = (run.settings.data_key(), dc["mean"], dc["std"])
        if key not in data:
            data[key] = checked_data(run.settings, dc)
        check_batches(run, data[key])
        if (run.spec, run.recipe) not in models:
            models[run.spec, run.recipe] = checked_model(run, data[key])
            n_val = len(data[key].eval_set(run.settings.img_size, "resize"))
            device = resolve_device(run.settings.device)
            check_eval_memory(run.settings, run.spec, models[run.spec, run.recipe][1], n_val, device)
        modes, model = models[run.spec, run.recipe]
        tuned = scaling_modes(model, run.settings.finetune_scaling) if run.settings.finetune_sizes else []
        if run.settings.resume:  # everything the resumed run reads back, checked before anything changes
            if not run.settings.eval_only:
                check_resume_state(run.folder / "checkpoint.pt", model, run)
            read_results(run, eval_jobs(run.settings, modes, tuned))
        checked[run.tag] = (data[key], modes, tuned)
    if plan[0].settings.resume:
        read_log(Path(plan[0].settings.output).resolve() / "log.csv")
    return checked


def check_batches(run: Run, data: Data) -> None:
    """timm's mixup and cutmix pair each sample with another of its batch: every training batch must be even."""
    settings, world = run.settings, rank_world()[1]
    if not (settings.mixup > 0 or settings.cutmix > 0) or data.train is None or settings.naflex:
        return  # (timm's NaFlex mixup pairs a batch with its reverse: any size)
    per_rank = len(data.train) // world
    odd = [n for n in (settings.batch_size, per_rank if per_rank < settings.batch_size else 0) if n % 2]
    if odd:
        raise SystemExit(
            f"error: --mixup/--cutmix pair the samples of a batch, and a batch of run {run.tag} would hold {odd[0]} "
            "(odd); give an even --batch-size (and a training set of at least one batch)"
        )


def check_resume_state(path: Path, model: torch.nn.Module, run: Run) -> None:
    """A run's checkpoint.pt, if it has one, is one this run can continue from, every part of it: its fields' types
    and ranges (:func:`read_checkpoint`), the kind of model it records, weights (and EMA weights) of the very model it
    resumes (not another family's or size's), an optimizer state of this optimizer over these weights, and random
    states the generators take. One line naming the file otherwise, before anything in --output changes."""
    if not (path.exists() or path.is_symlink()):
        return
    remedy = resume_remedy(path)
    state = read_checkpoint(path, remedy)
    check_record(state.get("record"), model, run.spec, str(path), remedy)
    own = {k: v.shape for k, v in model.state_dict().items()}
    for key in ("model", "model_ema") if run.settings.ema else ("model",):
        weights = state[key]
        if weights is None:
            continue
        shapes = own if key == "model" else {f"module.{k}": v for k, v in own.items()}  # (timm's EMA: its .module)
        differ = sorted(k for k in shapes.keys() ^ weights.keys()) + [
            k for k in shapes.keys() & weights.keys() if weights[k].shape != shapes[k]
        ]
        if differ:
            raise SystemExit(
                f"error: {path} holds the {key} weights of another model ({len(differ)} differ in name or shape, such "
                f"as {differ[:3]}); {remedy}"
            )
    problem = optimizer_problem(model, run.settings, state["optimizer"])
    if problem:
        raise SystemExit(
            f"error: {path} holds an optimizer state that does not fit run {run.tag} ({problem}); {remedy}"
        )


def optimizer_problem(model: torch.nn.Module, settings: Settings, saved: dict) -> str:
    """What keeps a saved optimizer state from resuming this run's optimizer ('' if nothing): its groups, and the
    state of every parameter against the state one step of a fresh optimizer makes (its names and shapes), so that a
    state that loads but would fail, or silently misapply, at the first step is refused now."""
    loaded, _ = make_optimizer(model, settings, steps=1)
    try:
        loaded.load_state_dict(own_implementation(saved, loaded))
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    fresh, _ = make_optimizer(model, settings, steps=1)
    for g_new, g_saved in zip(fresh.param_groups, loaded.param_groups, strict=True):
        for k, v in g_new.items():
            w = g_saved.get(k)
            if k != "params" and (type(w) is not type(v) or (isinstance(v, tuple) and len(v) != len(w))):
                return f"its group setting {k} is {str(w)[:40]!r}, not a {type(v).__name__}"
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    fresh.step()  # (the preflight model is thrown away: its weights may move)
    for p, state in loaded.state.items():
        want = fresh.state.get(p, {})
        for k, v in state.items():
            w = want.get(k)
            if k not in want or (
                isinstance(w, torch.Tensor) and (not isinstance(v, torch.Tensor) or v.shape != w.shape)
            ):
                return f"its state {k!r} of a weight of shape {tuple(p.shape)} does not match this optimizer's"
    return ""


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


ROW_FIELDS = ("model", "recipe", "seed", "train_size", "eval_size", "protocol", "rope_scaling", "top1", "top5", "loss",
              "params")  # fmt: skip


def read_results(run: Run, jobs: list[tuple[str, int, str]]) -> list[dict] | None:
    """A run's results.json, every row checked (its fields, this run's model, recipe, seed and training size, numbers
    in their ranges): the rows where they are those ``jobs`` asks, None where there are none or they answer other
    evaluation settings. A damaged or forged file is one line naming it."""
    path = run.folder / "results.json"
    remedy = "delete it, and --resume evaluates the run's saved weights again"
    data = read_own(path, "the results", remedy)
    if data is None:
        return None
    try:
        rows = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SystemExit(f"error: the results {path} cannot be read as JSON ({e}); {remedy}") from None
    problem = results_problem(rows, run)
    if problem:
        raise SystemExit(f"error: the results {path} are damaged or forged: {problem}; {remedy}")
    return rows if [(r["protocol"], r["eval_size"], r["rope_scaling"]) for r in rows] == jobs else None


def results_problem(rows: object, run: Run) -> str:
    """What is wrong with the rows of a results.json ('' if nothing)."""
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "they are not a list of result rows"
    expected = dict(model=run.model, recipe=run.recipe, seed=run.seed, train_size=run.settings.img_size)
    for r in rows:
        if tuple(r) != ROW_FIELDS:
            return f"a row has the fields {list(r)[:12]}, not {list(ROW_FIELDS)}"
        wrong = [k for k, v in expected.items() if r[k] != v or type(r[k]) is not type(v)]
        if wrong:
            return f"a row's {wrong[0]} is {str(r[wrong[0]])[:60]!r}, not this run's {expected[wrong[0]]!r}"
        for k, low, high in (("top1", 0, 100), ("top5", 0, 100), ("loss", 0, math.inf)):
            v = r[k]
            if type(v) not in (int, float) or not (low <= v <= high) or math.isnan(v):
                return f"a row's {k} is {str(v)[:40]!r}, not a number in [{low}, {high}]"
        if type(r["eval_size"]) is not int or r["eval_size"] < 1 or type(r["params"]) is not int or r["params"] < 0:
            return "a row's eval_size or params is not a whole number"
        if not all(isinstance(r[k], str) for k in ("protocol", "rope_scaling")):
            return "a row's protocol or rope_scaling is not a string"
    return ""


def checked_model(run: Run, data: Data) -> tuple[list[str], torch.nn.Module]:
    """A run's model built and fed a validation sample at --img-size and at its other eval and training sizes;
    returns the --rope-scaling modes it takes and the model."""
    settings, spec, where = run.settings, run.spec, f" (recipe {run.recipe})" if run.recipe else ""
    model = build_model(settings, spec, num_classes=data.num_classes).eval()
    check_head(run, model, data)
    check_input_sizes(settings, spec, model, where)
    if (settings.naflex or settings.eval_seq_lens) and not callable(getattr(model, "get_patch_size", None)):
        raise SystemExit(
            f"error: model {spec}{where} has no get_patch_size(): --naflex and --eval-seq-lens need a model that takes "
            "timm's NaFlex batches (this package's ViTs, timm's naflexvit_*)"
        )
    sample = data.eval_set(settings.img_size, "resize")[0][0][None]
    try:
        with torch.no_grad():
            finite = torch.isfinite(model(sample)).all()
    except ValueError as e:  # the model's input checks
        raise SystemExit(f"error: model {spec} refuses a validation sample at --img-size: {e}") from None
    if not finite:
        weights = " and its --initial-checkpoint" if settings.initial_checkpoint else ""
        raise SystemExit(
            f"error: model {spec} with {settings.model_kwargs}{weights} gives non-finite outputs before any training: "
            "one of these is out of range (as rope_theta=0); fix it in --model-kwargs or the model spec"
        )
    if not getattr(model, "dynamic_img_size", False):  # timm's ViTs take other sizes only when built to
        for size in sorted(
            {*settings.eval_sizes, *settings.train_sizes, *settings.finetune_sizes} - {settings.img_size}
        ):
            try:
                with torch.no_grad():
                    model(resize_batch(sample, size))
            except (AssertionError, RuntimeError, ValueError) as e:
                raise SystemExit(
                    f"error: model {spec}{where} refuses {size}-px input ({e}); create it with dynamic_img_size=True "
                    f"(timm's ViTs), or leave {size} out of --eval-sizes and --train-sizes"
                ) from None
    folder_config(run, model, data)  # (config.json can be written: checked before any training)
    for key in ("rope_scaling", "finetune_scaling"):
        if key == "finetune_scaling" and not settings.finetune_sizes:
            continue
        if not scaling_modes(model, getattr(settings, key)):
            raise SystemExit(
                f"error: {spec} takes none of --{key.replace('_', '-')} {list(getattr(settings, key))} (it takes "
                f"{list(model.rope_scaling_modes())}); add one of those"
            )
    modes = scaling_modes(model, settings.rope_scaling)
    collapsed = [m for m in settings.rope_scaling if m in getattr(model, "rope_scaling_modes", tuple)()]
    if len(collapsed) > len(modes) and rank_world()[0] == 0:
        print(f"[{spec}{where}] its RoPE coordinates are normalised (rope_coords=normalized), so --rope-scaling "
              f"{' '.join(collapsed)} all compute the same: evaluated once, as {modes[0]}", flush=True)  # fmt: skip
    return modes, model


def check_head(run: Run, model: torch.nn.Module, data: Data) -> None:
    """The classifier the starting weights give: --eval-only evaluates only a head it loaded, so a class count
    other than the data's (a head initialised anew) is one line, and so are class names (in order: a permutation
    would mislabel every class) other than the ones the checkpoint's folder records (config.json's label_names).
    Training from such weights (a transfer) keeps the new head, and says so in one line."""
    settings = run.settings
    start = f"--initial-checkpoint {settings.initial_checkpoint}" if settings.initial_checkpoint else "--pretrained"
    new = getattr(model, "vit_rope_new_head", [])
    if new and settings.eval_only:
        raise SystemExit(
            f"error: --eval-only of {run.spec}: {start} has a classifier of another class count than the "
            f"{data.num_classes} classes of --dataset {settings.dataset}, so {new[0]} would be a new, random one; "
            "eval-only evaluates only a head it loaded: evaluate on data of the checkpoint's classes, or train "
            "(without --eval-only) to fit a new head"
        )
    quiet = rank_world()[0] != 0
    if new and not quiet:
        print(f"[{run.tag}] {start}: its classifier has another class count; the head ({', '.join(new[:2])}) is "
              f"new, initialised for {data.num_classes} classes", flush=True)  # fmt: skip
    labels = recorded_labels(settings.initial_checkpoint) if settings.initial_checkpoint and not new else None
    names = class_names(data.train) or class_names(data.eval_set(settings.img_size, "resize"))
    if not labels or not names or labels == names:
        return
    pairs = zip(labels, names, strict=False)
    differ = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(labels), len(names)))
    name = lambda names: repr(names[differ][:40]) if differ < len(names) else "missing"  # noqa: E731
    what = (f"class {differ} is {name(names)} in --dataset {settings.dataset} and {name(labels)} in the "
            "checkpoint's config.json label_names")  # fmt: skip
    if settings.eval_only:
        raise SystemExit(
            f"error: --eval-only of {run.spec}: {start} was trained on other classes ({what}); its head would "
            "mislabel them: evaluate on data whose classes (and their order) are the checkpoint's"
        )
    if not quiet:
        print(f"[{run.tag}] {start} was trained on other classes ({what}): its head starts from theirs", flush=True)


def folder_config(run: Run, model: torch.nn.Module, data: Data) -> dict:
    """The config.json of the run's folder (timm's format, :func:`~vit_rope.training.weights.timm_config`): the model
    as built, with the run's normalisation, training size and class names; one line where timm cannot write it."""
    dc = data_config(run.settings, run.spec)
    try:
        return timm_config(model, run.settings.img_size, dc["mean"], dc["std"], class_names(data.train))
    except (ValueError, TypeError) as e:
        raise SystemExit(
            f"error: model {run.spec}: its config.json cannot be written ({e}); give model kwargs of plain values "
            "(numbers, strings, lists, mappings)"
        ) from None


def class_names(ds: Dataset | None) -> list[str] | None:
    """The class names of a training set, where its dataset has them (through subsets and transforms)."""
    while ds is not None and not hasattr(ds, "classes"):
        ds = getattr(ds, "dataset", getattr(ds, "ds", None))  # inside torch's Subset, the harness's Transformed
    names = getattr(ds, "classes", None)
    return [str(c) for c in names] if isinstance(names, list | tuple) else None


# ------------------------------------------------------------------------------------------------------ data
def make_loader(ds: Dataset, settings: Settings, train: bool, epoch: int) -> DataLoader:
    """Epoch-seeded shuffling, sharded over ranks: the order, and each training sample's augmentation, depend only on
    (seed, epoch) and the sample, whatever the number of workers, so resuming works, with other --workers too."""
    rank, world = rank_world()
    n = len(ds)
    if train:  # each sample's augmentation drawn from (seed, epoch, index): the same batches for any --workers
        ds = SeededItems(ds, settings.seed * 100_003 + epoch)
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
        num_workers=settings.workers,
        drop_last=train and len(indices) >= bs,
        pin_memory=pin_memory(settings),
    )


def pin_memory(settings: Settings) -> bool:
    """Page-locked batches where they go to a CUDA device: the copy (``non_blocking``) then overlaps the work queued
    before it. Pinning for the CPU would only cost time."""
    return resolve_device(settings.device).type == "cuda"


def compiled(module: torch.nn.Module, settings: Settings) -> torch.nn.Module:
    """``module`` under ``torch.compile`` with --compile (else itself): the module a forward runs. The weights stay
    ``module``'s own, so what is saved, averaged (EMA) or checked is the uncompiled module."""
    return torch.compile(module) if settings.compile else module


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


def resume_from(path: Path, model, training: Training) -> int:
    """Model, optimizer, EMA and every rank's RNG from a run's checkpoint.pt (read with weights_only=True); returns
    the number of finished epochs. A file that does not fit the model is one line naming it."""
    state = read_checkpoint(path, resume_remedy(path))  # (checked whole before the run; read again: the same file)
    try:
        model.load_state_dict(state["model"])
        training.optimizer.load_state_dict(own_implementation(state["optimizer"], training.optimizer))
        if training.ema is not None and state["model_ema"] is not None:
            training.ema.load_state_dict(state["model_ema"])
        restore_rng_state(state["rng"], *rank_world())
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError) as e:
        raise SystemExit(
            f"error: {path} does not fit this run's model ({str(e).splitlines()[0][:200]}); {resume_remedy(path)}"
        ) from None
    done = state["epoch"] + 1
    # timm's schedulers compute the LR from the update index alone, so the scheduler is not restored: built from
    # these settings it follows a longer --epochs, and unchanged ones set the LR the uninterrupted run's last
    # step_update set
    training.scheduler.step_update(done * training.steps)
    return done


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
        drop_log_rows(out / "log.csv", run.tag, after=start)
        logged = {int(r["epoch"]) for r in read_log(out / "log.csv") if r["model"] == run.tag}
        lacks = sorted(set(range(1, start + 1)) - logged)
        if lacks:
            print(f"[{run.tag}] log.csv lacks epoch(s) {lacks[:5]} of the checkpoint's {start} (an edited or deleted "
                  "log): they are not trained again, so their rows stay missing", flush=True)  # fmt: skip
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
            ema = training.ema.state_dict() if training.ema is not None else None  # timm's key: its loader reads it
            record = model.vit_rope_record
            state = dict(model=model.state_dict(), optimizer=training.optimizer.state_dict(), model_ema=ema,
                         epoch=epoch, rng=rngs, record=record)  # fmt: skip
            save_checkpoint(run.folder, state, evaluated, record, config)
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


def torch_bytes(obj: object) -> bytes:
    """``torch.save`` into memory: the file is then one plain write (a full disk is one error naming it, not torch's
    writer's RuntimeError)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def made(folder: Path) -> None:
    """A run's folder made (a full disk: one line naming it)."""
    try:
        folder.mkdir(exist_ok=True)
    except OSError as e:
        if e.errno in DISK_FULL:
            raise disk_error(folder, e) from None
        raise


def log_epoch(out: Path, run: Run, row: dict) -> None:
    append_csv(out / "log.csv", row)
    print(
        f"[{row['model']}] epoch {row['epoch']}/{run.settings.epochs}  "
        f"train loss {row['train_loss']:.3f} acc {row['train_top1']:.1f}  "
        f"val loss {row['val_loss']:.3f} acc {row['val_top1']:.1f}  ({row['seconds']:.0f}s)",
        flush=True,
    )


# ------------------------------------------------------------------------------------------------- evaluation
def eval_jobs(settings: Settings, modes: list[str], tuned: list[str] = ()) -> list[tuple[str, int, str]]:
    """(protocol, eval size, scaling mode) of every result row of one model, in order: zero-shot under ``modes``,
    then each fine-tuning (--finetune-sizes) under ``tuned``."""
    native = settings.native_eval and settings.dataset in ("synthetic", "synthetic_video")
    jobs = [(p, s, m) for p in ["resize"] + ["native"] * native for s in settings.eval_sizes for m in modes]
    # n: tokens an image; NTK and YaRN rescale one frequency ladder for a whole batch, and the images of a NaFlex
    # batch each ask their own scale: the modes of coordinates (per image) alone
    jobs += [("naflex", n, m) for n in settings.eval_seq_lens for m in modes if m not in ("ntk", "yarn")]
    return jobs + [(FINETUNE, s, m) for s in settings.finetune_sizes for m in tuned]


def evaluate_resolutions(run: Run, model, data: Data, modes: list[str], device) -> list[dict]:
    """One result row per eval size, protocol and RoPE scaling mode."""
    settings, params = run.settings, sum(p.numel() for p in model.parameters())
    rows, forward = [], compiled(model, settings)
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
        r = validate(forward, loader, device, settings.amp)
        rows.append(
            dict(model=run.model, recipe=run.recipe, seed=run.seed, train_size=settings.img_size, eval_size=size,
                 protocol=protocol, rope_scaling=mode, top1=round(r["top1"], 2), top5=round(r["top5"], 2),
                 loss=round(r["loss"], 4), params=params)
        )  # fmt: skip
    if modes != ["-"]:
        model.set_rope_scaling("none")
    return rows


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
            r = validate(compiled(tuned_model, ft), make_loader(data.eval_set(size, "resize"), settings, False, 0),
                         device, settings.amp)  # fmt: skip
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
    settings, given = parse_config(argv)
    saved = Path(settings.output) / "config.yaml"
    if settings.resume and not (saved.exists() or saved.is_symlink()) and rank_world()[0] == 0:
        print(f"--resume: {settings.output} holds no run to continue (no config.yaml); starting one", flush=True)
    settings = resumed(settings, given)
    import_modules(settings.imports)  # the user's own families and models, named on this command line only
    resolve_device(settings.device)
    start = settings.initial_checkpoint
    if start and not (os.path.isfile(start) or os.path.isdir(start)):
        raise SystemExit(
            f"error: --initial-checkpoint {start!r} does not exist or is neither a regular file nor a model folder"
        )
    settings = from_model_folder(settings, given)  # a model folder names the model: its config.json
    settings = started_from(settings)
    one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
    if resolve_device(settings.device).type == "cpu" and one_process and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    plan = plan_runs(settings)
    for note in idle_settings(given, [run.settings for run in plan]) if rank_world()[0] == 0 else []:
        print(note, flush=True)
    earlier = check_folder(settings, plan)
    trained = check_epochs(settings, plan)
    checked = preflight(plan)

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
