"""A train.py run: the model runs its config makes (every model under every recipe and seed), its folder (lock,
atomic writes, log rows, resume state), its processes and their RNG state."""

from __future__ import annotations

import csv
import json
import os
import random
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml

from .train_config import recipe_config

try:
    import fcntl
except ImportError:  # Windows: no flock, so no lock (two runs on one folder are then the user's to avoid)
    fcntl = None

LOCK = ".lock"
RESULT_FILES = ("results.csv", "results.md", "accuracy_vs_resolution.png", "extrapolation.png")


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` while the run writes there; a second run on the folder stops with a clear error. The
    OS releases a flock when its process dies, so a killed run leaves no stale lock."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+") as f:
        if fcntl is not None:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise SystemExit(
                    f"error: {folder} is in use by another run ({holder}); wait for it to end, or choose another "
                    "--output"
                ) from None
        f.truncate(0)
        f.write(f"pid {os.getpid()}\n")
        f.flush()
        yield  # closing the file releases the lock


@dataclass
class Run:
    """One model trained under one recipe with one seed."""

    spec: str  # the --models entry
    model: str  # the name its result rows carry: the spec, numbered where --models names it twice
    recipe: str  # '' for the one recipe of a config without recipes
    seed: int
    tag: str  # its name in log.csv and progress lines, and (made filesystem-safe) its folder's
    cfg: dict  # the config it trains with: the recipe's keys and the seed on top of the run's


def plan_runs(cfg: dict) -> list[Run]:
    """Every model under every recipe and seed, seed by seed (an interrupted benchmark has every model's first seeds
    first). Tags gain ``@recipe`` with recipes and ``@seed<n>`` with --seeds, so that a config without them keeps
    its folders; runs whose folders would coincide are an error."""
    names = [m if cfg["models"].count(m) == 1 else f"{m}_{i}" for i, m in enumerate(cfg["models"])]
    plan = []
    for seed in cfg["seeds"] or [cfg["seed"]]:
        for recipe in list(cfg["recipes"]) or [""]:
            for spec, model in zip(cfg["models"], names, strict=True):
                tag = model + (f"@{recipe}" if recipe else "") + (f"@seed{seed}" if cfg["seeds"] else "")
                plan.append(Run(spec, model, recipe, seed, tag, {**recipe_config(cfg, recipe), "seed": seed}))
    folders: dict[Path, str] = {}
    for run in plan:
        folder = model_dir(Path(cfg["output"]), run.tag)
        if folders.setdefault(folder, run.tag) != run.tag:
            raise SystemExit(
                f"error: runs {folders[folder]} and {run.tag} would share the folder {folder}; give the models (or "
                "recipes) names that differ in letters or digits"
            )
    return plan


def model_dir(out: Path, tag: str) -> Path:
    """A filesystem-safe folder per run tag (``name:k=v@recipe@seed1`` → ``name__k=v@recipe@seed1``)."""
    return out / re.sub(r"[^\w.=@-]", "_", tag.replace(":", "__"))


def atomic_write(path: Path, write, obj) -> None:
    """``write(obj, tmp)``, then rename over the target: a kill never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    write(obj, str(tmp))
    os.replace(tmp, path)


def write_json(obj, path: str) -> None:
    Path(path).write_text(json.dumps(obj))


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def append_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


def drop_log_rows(path: Path, tag: str, after: int) -> None:
    """Forget ``tag``'s log rows past epoch ``after``: a kill between appending a row and writing the checkpoint
    leaves a row for an epoch that the resumed run trains (and logs) again."""
    if not path.exists():
        return
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [r for r in rows if not (r["model"] == tag and int(r["epoch"]) > after)]
    if not keep:
        path.unlink()  # append_csv writes the header again
    elif len(keep) < len(rows):
        atomic_write(path, write_csv, keep)


def trained_epochs(checkpoint: Path) -> int:
    """How many epochs a model's checkpoint.pt has finished (0 without one); its tensors are mapped, not read."""
    if not checkpoint.exists():
        return 0
    return torch.load(checkpoint, map_location="cpu", mmap=True, weights_only=False)["epoch"] + 1


def check_epochs(cfg: dict, tags: list[str]) -> dict[str, int]:
    """The epochs each model of a resumed run has trained; fewer --epochs than that is refused (an epoch cannot be
    untrained, and config.yaml would not describe the weights)."""
    out, resuming = Path(cfg["output"]), cfg["resume"] and not cfg["eval_only"]
    trained = {t: trained_epochs(model_dir(out, t) / "checkpoint.pt") if resuming else 0 for t in tags}
    ahead = {t: n for t, n in trained.items() if n > cfg["epochs"]}
    if ahead:
        raise SystemExit(
            f"error: --epochs {cfg['epochs']} is fewer than the run in {out} has trained ({ahead}); resume with "
            f"--epochs {max(ahead.values())} or more, or train for fewer epochs in a new run with another --output"
        )
    return trained


def start_run(cfg: dict) -> None:
    """Clear what this run replaces and write its config.yaml. The result files are written when a run ends, so
    results there always come from config.yaml; a fresh run also forgets an earlier run's log and the resume state
    of every run in the folder (a later --resume that adds models, seeds or recipes must not find an older run's),
    sparing --initial-checkpoint."""
    out = Path(cfg["output"])
    stale = [out / f for f in RESULT_FILES]
    if not cfg["resume"]:
        stale += [out / "log.csv", *out.glob("*/checkpoint.pt"), *out.glob("*/results.json")]
    start = Path(cfg["initial_checkpoint"]).resolve() if cfg["initial_checkpoint"] else None
    for path in stale:
        if path.resolve() != start:
            path.unlink(missing_ok=True)
    atomic_write(out / "config.yaml", lambda c, p: Path(p).write_text(yaml.safe_dump(c, sort_keys=False)), cfg)


# ------------------------------------------------------------------------------------------- processes
def rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def setup_distributed(device: torch.device) -> torch.device:
    """One process per device under torchrun (NCCL on CUDA, gloo on the CPU); this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            return torch.device("cuda", torch.cuda.current_device())
    return device


def all_sum(values: list[float], device: torch.device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# ----------------------------------------------------------------------------------------------------- RNG
def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict:
    """This process's RNG states, in tensors and plain tuples only: a checkpoint holding them still loads with
    ``torch.load(weights_only=True)`` (so timm's loader takes it as --initial-checkpoint)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    return dict(torch=torch.get_rng_state(), cuda=cuda, python=random.getstate(), numpy=numpy)


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]  # keys: a tensor, or the ndarray of older checkpoints
    np.random.set_state((kind, np.asarray(keys).astype(np.uint32), pos, has_gauss, gauss))


def all_rng_states() -> list[dict]:
    """Every rank's RNG state (a collective: all ranks call it), in rank order."""
    if not dist.is_initialized():
        return [rng_state()]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


def restore_rng_state(saved: dict | list[dict], rank: int, world: int) -> None:
    """Each rank continues from its own saved draws; a single dict is a checkpoint from before per-rank states."""
    states = [saved] if isinstance(saved, dict) else saved
    if len(states) != world and rank == 0:
        print(
            f"note: the checkpoint holds the RNG state of {len(states)} process(es), this run has {world}: every "
            "rank continues from rank 0's, so random draws (drop path, mixup) differ from an uninterrupted run",
            flush=True,
        )
    set_rng_state(states[rank] if len(states) == world else states[0])
