"""What a resumed run reads back of its own, checked whole before anything changes: a run's checkpoint.pt (its
weights, EMA, optimizer state and random states fit this very run) and results.json (this run's rows); and the resume
itself, from the checkpoint."""

import json
import math
from pathlib import Path

import torch

from .distributed import rank_world
from .folder import drop_log_rows, read_log, read_own
from .optim import Training, make_optimizer, own_implementation
from .plan import Run
from .rng import restore_rng_state
from .settings import Settings
from .weights import check_record, read_checkpoint, resume_remedy

__all__ = ["check_resume_state", "read_results", "resume_from", "resume_log", "resume_state"]


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


def resume_log(path: Path, tag: str, start: int) -> None:
    """A resumed run's log.csv without ``tag``'s rows past epoch ``start`` (the resumed run logs them again), and one
    line where it lacks some of the epochs the checkpoint has trained (an edited or deleted log)."""
    drop_log_rows(path, tag, after=start)
    logged = {int(r["epoch"]) for r in read_log(path) if r["model"] == tag}
    lacks = sorted(set(range(1, start + 1)) - logged)
    if lacks:
        print(f"[{tag}] log.csv lacks epoch(s) {lacks[:5]} of the checkpoint's {start} (an edited or deleted log): "
              "they are not trained again, so their rows stay missing", flush=True)  # fmt: skip


def resume_state(model: torch.nn.Module, training: Training, epoch: int, rngs: list[dict]) -> dict:
    """What checkpoint.pt holds after ``epoch``: the weights, the optimizer's state, the EMA's (under timm's key, which
    its loader reads), every rank's random states and the model's record."""
    ema = training.ema.state_dict() if training.ema is not None else None
    return dict(model=model.state_dict(), optimizer=training.optimizer.state_dict(), model_ema=ema, epoch=epoch,
                rng=rngs, record=model.vit_rope_record)  # fmt: skip
