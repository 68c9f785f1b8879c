"""Everything train.py checks before it writes anything: the settings that take no effect, the initial weights'
hash, --output (and what --overwrite would delete), the epochs a resumed run has trained, the data (one sample of
each split read), every model built and fed a sample at each size (its head, its scaling modes, its config.json), the
memory each evaluation needs, and everything a resumed run reads back. Each failure is one line; --output is left as
it was."""

import os
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import Dataset

from .data import Data, build_data
from .distributed import rank_world, resolve_device
from .folder import MODEL_FILES, RUN_FILES, check_output, check_own_files, read_log
from .loaders import resize_batch
from .memory import check_eval_memory
from .models import build_model, check_input_sizes, data_config, from_model_folder, import_modules, scaling_modes
from .optim import make_optimizer
from .plan import Run, eval_jobs, plan_runs
from .resume import check_resume_state, read_results
from .settings import DEFAULTS, Settings, read_yaml, resumed
from .weights import file_sha256, recorded_labels, timm_config, trained_epochs, weights_file

__all__ = ["prepare", "check_epochs", "check_folder", "checked_data", "checked_model", "folder_config", "idle_settings",
           "preflight", "started_from"]  # fmt: skip


def prepare(settings: Settings, given: dict) -> tuple[Settings, list[Run], list[Path], dict[str, int], dict]:
    """Every check of a command, before anything in --output changes: the settings resumed, the user's modules
    imported (``--imports``), the device, the initial weights (their model folder, their hash), the runs planned,
    settings that take no effect named, --output, the epochs trained, then :func:`preflight`. Returns the settings,
    the runs, the earlier runs' folders --overwrite clears, each run's trained epochs and what preflight checked."""
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
    settings = started_from(from_model_folder(settings, given))  # a model folder names the model: its config.json
    one_process = int(os.environ.get("WORLD_SIZE", "1")) == 1
    if resolve_device(settings.device).type == "cpu" and one_process and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(os.cpu_count() or 1)
    plan = plan_runs(settings)
    for note in idle_settings(given, [run.settings for run in plan]) if rank_world()[0] == 0 else []:
        print(note, flush=True)
    earlier = check_folder(settings, plan)
    trained = check_epochs(settings, plan)
    return settings, plan, earlier, trained, preflight(plan)


# a setting that acts only with another: (the setting, the one it needs, whether a run's settings have that one)
NEEDS = (("seq_lens", "--naflex", lambda s: s.naflex), ("naflex_loss_scale", "--naflex", lambda s: s.naflex),
         ("finetune_steps", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("finetune_lr", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("finetune_scaling", "--finetune-sizes", lambda s: s.finetune_sizes),
         ("allow_transfer", "--initial-checkpoint", lambda s: s.initial_checkpoint),
         ("ema_decay", "--ema", lambda s: s.ema),
         ("train_sizes_from", "--train-sizes", lambda s: s.train_sizes))  # fmt: skip


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
    return checked_modes(run, model), model


def checked_modes(run: Run, model: torch.nn.Module) -> list[str]:
    """The --rope-scaling modes a run's model is evaluated under: those it takes, one for modes that compute the same
    (said in a line); a model that takes none of --rope-scaling (or of --finetune-scaling) is one line."""
    settings, spec, where = run.settings, run.spec, f" (recipe {run.recipe})" if run.recipe else ""
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
    return modes


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
