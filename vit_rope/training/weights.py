"""Weights a run loads and saves: ``--initial-checkpoint`` weights into a model, and a run's resume state.

Nothing loaded runs code: weights come from safetensors, or from ``torch.load(weights_only=True)``, which reads
tensors and plain data and refuses any other pickled object before it is built. A file that cannot be read, or that
holds another model's weights, is one line naming the file and what to do.

What a run saves says what it is: a *record* of plain strings (the model's name, its kind: class and position
encoding, and its arguments) in ``model.safetensors``'s metadata and in ``checkpoint.pt``. Weights load only into a
model of the kind they record (``--allow-transfer`` lets ``--initial-checkpoint`` cross kinds on purpose); a file
without a record (timm's, another tool's) is matched by its weights' names and shapes alone. Every field read back is
checked for its type and range before it is used: a file a run did not write in this process is data, never trusted.

A run's folder is a timm model folder: ``config.json`` (timm's format: the architecture, its ``model_args`` and the
preprocessing) beside ``model.safetensors``, so that ``timm.create_model("local-dir:<folder>", pretrained=True)``
rebuilds the model, and ``--initial-checkpoint <folder>`` takes the model and its weights from it.
"""

import hashlib
import io
import json
import math
import os
import pickle
import random
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from safetensors.torch import save as safetensors_bytes
from timm.models._hub import save_config_for_hf  # (timm.models exports push_to_hf_hub, not its config writer)
from torch import nn

from ..checkpoint import RECORD, checkpoint_filter_fn, dtype_kind, inflate_image_checkpoint, unwrap_state_dict
from .folder import atomic_write, file_kind, read_own

__all__ = ["CONFIG", "ModelFolder", "check_record", "file_sha256", "load_initial_weights", "model_record",
           "read_checkpoint", "read_model_folder", "read_record", "recorded_labels", "resume_remedy",
           "save_model_folder", "timm_checkpoint_filter", "timm_config", "torch_bytes", "trained_epochs",
           "weights_file"]  # fmt: skip

STATE_KEYS = ("model", "optimizer", "model_ema", "epoch", "rng")  # a checkpoint.pt's resume state
RECORD_FIELDS = ("model", "kind", "model_args")
MAX_EPOCHS = 10**6  # an epoch count past this is no run's
CONFIG, WEIGHTS = "config.json", "model.safetensors"  # a timm model folder's files


def why_unreadable(e: BaseException) -> str:
    """What a loader's exception says about the file, in a few words."""
    chain = [e, e.__cause__, e.__context__]
    if any(isinstance(x, pickle.UnpicklingError) for x in chain):
        return "it holds pickled objects other than tensors and plain data, which are not loaded (nothing in it ran)"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {first[:160]}"


# ------------------------------------------------------------------------------------------------- records
def model_kind(model: nn.Module) -> str:
    """What kind of model this is, as a record names it: for ours, the position encoding (weights of one encoding
    have the names and shapes of another's: RoPE's and LookHere's, say; an image model's weights inflate into the
    video model of its encoding), with an absolute embedding its pos_embed does not name (RoPE + APE's weights are
    RoPE's and a pos_embed); for any other, its class."""
    if type(model).__module__.startswith("vit_rope.") and callable(getattr(model, "weights_kind", None)):
        return model.weights_kind()
    return f"{type(model).__module__}.{type(model).__qualname__}"


def model_record(model: nn.Module, name: str, kwargs: dict) -> dict[str, str]:
    """The record a run saves with a model's weights: plain strings only (safetensors metadata takes nothing else,
    and ``weights_only`` loading reads them back without unpickling anything)."""
    return dict(model=name, kind=model_kind(model), model_args=json.dumps(kwargs, sort_keys=True, default=str))


def check_record_fields(record: object, where: str) -> dict[str, str] | None:
    """A record read from a file, checked: a mapping of the record's fields to strings (None: no record)."""
    if record is None:
        return None
    if not isinstance(record, dict) or any(not isinstance(record.get(k), str) for k in RECORD_FIELDS):
        raise SystemExit(
            f"error: {where} holds a damaged model record ({str(record)[:120]}): each of {list(RECORD_FIELDS)} must be "
            "a string; use the file as the run wrote it"
        )
    return {k: record[k] for k in RECORD_FIELDS}


def read_record(path: str | Path) -> dict[str, str] | None:
    """The record of a weights file: model.safetensors's metadata, or a torch file's ``record`` (None for a file
    without one, or one that cannot be read: the loader then says why)."""
    path = str(path)
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, "pt") as f:
                text = (f.metadata() or {}).get(RECORD)
            if text is None:
                return None
            try:
                record = json.loads(text)
            except ValueError:
                record = text
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            record = state.get("record") if isinstance(state, dict) else None
    except Exception:  # unreadable: the loader's own error names the file
        return None
    return check_record_fields(record, path)


def check_record(record: dict[str, str] | None, model: nn.Module, name: str, where: str, fix: str) -> None:
    """Weights that record another kind of model than ``model`` (``name``): one line naming both."""
    if record is None or record["kind"] == model_kind(model):
        return
    raise SystemExit(
        f"error: {where} holds the weights of {record['model']} ({record['kind']}), not of a {name} "
        f"({model_kind(model)}): their weights share names and shapes, but mean other things; {fix}"
    )


# ------------------------------------------------------------------------------------------- resume state
def read_checkpoint(path: Path, remedy: str) -> dict:
    """A run's checkpoint.pt, every field checked for its type and range (:func:`check_state`); one line where it
    cannot be read as one. It is opened as a regular file, never through a link."""
    data = read_own(path, "the checkpoint", remedy)
    if data is None:
        raise SystemExit(f"error: {path} is gone; {remedy}")
    try:
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # anything a garbled, truncated or foreign file makes torch.load raise
        raise SystemExit(f"error: {path} cannot be read as a checkpoint ({why_unreadable(e)}); {remedy}") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise SystemExit(f"error: {path} is not a train.py checkpoint (it lacks {missing}); {remedy}")
    problem = state_problem(state)
    if problem:
        raise SystemExit(f"error: {path} is damaged or forged: {problem}; {remedy}")
    check_record_fields(state.get("record"), str(path))
    return state


def is_weights(value: object) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items())


def state_problem(state: dict) -> str:
    """What is wrong with the fields of a resume state ('' if nothing): their types and ranges, each checked."""
    epoch = state["epoch"]
    if type(epoch) is not int or not 0 <= epoch < MAX_EPOCHS:
        return f"epoch {str(epoch)[:40]!r} is not a whole number in [0, {MAX_EPOCHS})"
    if not is_weights(state["model"]):
        return "its model is not a mapping of weight names to tensors"
    if state["model_ema"] is not None and not is_weights(state["model_ema"]):
        return "its model_ema is neither empty (None) nor a mapping of weight names to tensors"
    optimizer = state["optimizer"]
    if not (isinstance(optimizer, dict) and isinstance(optimizer.get("state"), dict)
            and isinstance(optimizer.get("param_groups"), list)):  # fmt: skip
        return "its optimizer is not an optimizer's state (a mapping with 'state' and 'param_groups')"
    for group in optimizer["param_groups"]:
        if not isinstance(group, dict) or not isinstance(group.get("params"), list):
            return "an optimizer parameter group is not a mapping with its 'params'"
        bad = [k for k, v in group.items() if isinstance(v, float) and not math.isfinite(v)]
        if bad:
            return f"the optimizer's {bad[0]} is {group[bad[0]]}"
    rng = state["rng"]
    if not isinstance(rng, list) or not rng or len(rng) > 1 << 16:
        return "its random-number states are not a list of one per process"
    for i, one in enumerate(rng):
        problem = rng_problem(one)
        if problem:
            return f"the random-number state of process {i} {problem}"
    return ""


def rng_problem(state: object) -> str:
    """What is wrong with one process's saved generators ('' if nothing): tried on the generators themselves, which
    are put back as they were, so that only a state they take is ever resumed from."""
    from .rng import set_rng_state

    if not isinstance(state, dict) or not {"torch", "cuda", "python", "numpy"} <= set(state):
        return "is not a mapping of the torch, cuda, python and numpy generators"
    if not isinstance(state["torch"], torch.Tensor) or state["torch"].dtype != torch.uint8:
        return "has no torch generator state (a uint8 tensor)"
    cuda = state["cuda"]
    if cuda is not None and not (isinstance(cuda, list) and all(isinstance(t, torch.Tensor) for t in cuda)):
        return "has a cuda state that is not a list of tensors"
    numpy = state["numpy"]
    if not (isinstance(numpy, tuple) and len(numpy) == 5 and isinstance(numpy[1], torch.Tensor)):
        return "has a numpy state that is not numpy's five fields"
    saved = torch.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        set_rng_state({**state, "cuda": None})
    except (TypeError, ValueError, RuntimeError, IndexError, OverflowError) as e:
        return f"is not one the generators take ({why_unreadable(e)})"
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])
    return ""


def resume_remedy(path: Path) -> str:
    """What to do about a run's checkpoint.pt that cannot be resumed from."""
    weights = path.with_name("model.safetensors")
    keep = f"its weights may be whole in {weights} (--initial-checkpoint takes it); " if weights.is_file() else ""
    return f"{keep}start the run anew in another --output, or delete {path.name} to train that run from scratch"


def trained_epochs(path: Path) -> int:
    """How many epochs a run's checkpoint.pt has finished (0 without one)."""
    if not path.exists() and not path.is_symlink():
        return 0
    return read_checkpoint(path, resume_remedy(path))["epoch"] + 1


# -------------------------------------------------------------------------------------------- initial weights
def load_initial_weights(
    model: nn.Module, path: str, video: bool, spec: str, allow_transfer: bool = False
) -> list[str]:
    """``--initial-checkpoint`` into ``model``: a .safetensors, or any torch file of tensors (a run's checkpoint.pt
    gives its EMA weights if it has them, else its model's), or a model folder's model.safetensors; ours rename and
    resample timm's keys, timm's own models take their own weights as saved. Weights that record another kind of
    model are refused unless ``allow_transfer``; a tensor of another kind of dtype than the model's (integers or
    booleans for float weights, floats for an integer buffer) is refused, never cast (float to float, bf16 to fp32
    say, loads). Returns the keys the file gave none for, whose values are the model's own initialisation: a
    classifier of another class count (a new head)."""
    path = weights_file(path)
    filter_fn = inflate_image_checkpoint if video else checkpoint_filter_fn
    if not type(model).__module__.startswith("vit_rope."):
        filter_fn = timm_checkpoint_filter
    new: list[str] = []

    def checked_filter(state_dict: dict, model: nn.Module) -> dict:
        out, own = filter_fn(state_dict, model), model.state_dict()
        new[:] = [k for k, v in out.items() if k in own and v.data_ptr() == own[k].data_ptr() and v.numel()]
        wrong = [
            (k, v.dtype, own[k].dtype)
            for k, v in out.items()
            if k in own and dtype_kind(v.dtype) != dtype_kind(own[k].dtype)
        ]
        if wrong:
            k, have, want = wrong[0]
            raise ValueError(
                f"{len(wrong)} tensor(s) have another kind of dtype than the model's, such as {k} ({have}, where the "
                f"model has {want}), which loading would cast silently; give weights saved in the model's dtypes "
                "(floats as any float dtype)"
            )
        return out

    try:
        timm.models.load_checkpoint(model, path, filter_fn=checked_filter)
    except ValueError as e:  # the filter's: the weights of another kind of model
        raise SystemExit(f"error: --initial-checkpoint {path!r} does not fit {spec}: {e}") from None
    except Exception as e:  # a file safetensors or torch.load (weights_only) cannot read
        raise SystemExit(
            f"error: --initial-checkpoint {path!r} cannot be read as weights ({why_unreadable(e)}); point it at a "
            ".safetensors file or a torch file of tensors and plain data (a run's model.safetensors, next to its "
            "checkpoint.pt, holds the weights it evaluated)"
        ) from None
    if not allow_transfer:  # (after the load: weights that do not fit are named as such first)
        fix = (
            "point --initial-checkpoint at weights of this kind of model, or pass --allow-transfer to load them "
            "on purpose"
        )
        check_record(read_record(path), model, spec, f"--initial-checkpoint {path!r}", fix)
    return new


def recorded_labels(path: str | Path) -> list[str] | None:
    """The class names (config.json's ``label_names``) of the model folder that ``--initial-checkpoint`` is, or whose
    model.safetensors or checkpoint.pt it names; None where the folder records none (or has no config.json). Read as
    a run's own file (regular, one link); a damaged one records none: :func:`read_model_folder` names its faults."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    if not path.is_dir() and path.name not in (WEIGHTS, "checkpoint.pt"):
        return None
    try:
        data = read_own(folder / CONFIG, "the model folder's", "give it as a regular file")
        config = json.loads(data.decode("utf-8")) if data is not None and len(data) <= MAX_CONFIG_BYTES else None
    except (SystemExit, UnicodeDecodeError, ValueError, RecursionError):
        return None
    labels = config.get("label_names") if isinstance(config, dict) else None
    if isinstance(labels, dict):  # timm's other form: {"0": name, ...}
        try:
            labels = [labels[k] for k in sorted(labels, key=int)]
        except ValueError:
            return None
    return labels if isinstance(labels, list) and all(isinstance(v, str) for v in labels) else None


def file_sha256(path: str | Path) -> str:
    """The sha256 of the weights ``--initial-checkpoint`` names (a model folder's model.safetensors), read once in
    blocks."""
    digest = hashlib.sha256()
    with open(weights_file(path), "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def timm_checkpoint_filter(state_dict: dict, model: nn.Module) -> dict:
    """Weights for one of timm's own models, as saved: a classifier of another class count keeps the model's new one;
    any other key the two do not share, or share with another shape, is an error naming it."""
    weights, own = unwrap_state_dict(state_dict), model.state_dict()
    heads = model.pretrained_cfg.get("classifier", "head") if hasattr(model, "pretrained_cfg") else "head"
    heads = tuple(f"{h}." for h in ([heads] if isinstance(heads, str) else heads))
    weights = {k: v for k, v in weights.items() if not (k.startswith(heads) and k in own and v.shape != own[k].shape)}
    differ = sorted(k for k in own.keys() ^ weights.keys() if not k.startswith(heads))
    differ += [k for k in weights.keys() & own.keys() if weights[k].shape != own[k].shape]
    if differ:
        raise ValueError(
            f"{len(differ)} weight(s) of the checkpoint and the model differ in name or shape ({differ[:6]}); create "
            "the model the checkpoint was saved from (its kwargs), or load that model's own checkpoint"
        )
    return {**{k: v for k, v in own.items() if k.startswith(heads)}, **weights}


# ------------------------------------------------------------------------------------------ timm model folders
# create_model's own arguments, which say where weights come from or how layers are made, not what the model is: a
# config.json's model_args never holds them (a received folder must not name a file or URL to load)
LOADER_ARGS = frozenset({"pretrained", "pretrained_cfg", "pretrained_cfg_overlay", "pretrained_model_args",
                         "checkpoint_path", "cache_dir", "scriptable", "exportable", "no_jit", "device",
                         "dtype"})  # fmt: skip
MAX_CONFIG_BYTES = 16 << 20  # ImageNet-22k's label names fit many times over


def timm_config(
    model: nn.Module, img_size: int, mean: Sequence[float], std: Sequence[float], labels: Sequence[str] | None = None
) -> dict[str, Any]:
    """The config.json of a run's model folder, by timm's own writer (``save_config_for_hf``): the architecture, the
    arguments timm's factory recorded (plus a pretrained tag's), the class count, and the preprocessing the run used:
    input size ``img_size`` at the model's channels, ``mean`` and ``std``, evaluation's bicubic resize with crop 1.0;
    ``labels`` (one per class) where the data names them. A video model's input size keeps its frames, (C, T, H, W),
    as its registered config and timm's loader of it have it. A model argument JSON cannot hold is a ValueError."""
    data_config = dict(img_size=img_size, mean=tuple(mean), std=tuple(std), interpolation="bicubic", crop_pct=1.0)
    extra = dict(label_names=list(labels)) if labels and len(labels) == getattr(model, "num_classes", None) else {}
    # timm writes by path (following a link, not atomically): into a private folder, whose bytes atomic_write moves
    with tempfile.TemporaryDirectory(prefix="vit_rope_config_") as private:
        path = Path(private) / CONFIG
        save_config_for_hf(model, str(path), model_config=extra, data_config=data_config)
        config = json.loads(path.read_text(encoding="utf-8"))
    registered = getattr(model, "pretrained_cfg", {}).get("input_size", ())
    if len(registered) == 4:  # a clip model: timm's writer knows images only
        channels, height, width = config["pretrained_cfg"]["input_size"]
        frames = config.get("model_args", {}).get("num_frames", registered[1])
        config["pretrained_cfg"]["input_size"] = [channels, frames, height, width]
    return config


def save_model_folder(folder: Path, model: nn.Module, record: dict[str, str], config: dict[str, Any]) -> None:
    """``model``'s weights (model.safetensors, its metadata the model's record) and ``config`` (config.json, from
    :func:`timm_config`) in ``folder``, each through the run's one atomic, no-follow write."""
    weights = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    metadata = {"format": "pt", RECORD: json.dumps(record)}
    atomic_write(folder / WEIGHTS, lambda w, f: f.write(safetensors_bytes(w, metadata)), weights)
    atomic_write(folder / CONFIG, lambda c, f: f.write(json.dumps(c, indent=2).encode()), config)


@dataclass(frozen=True)
class ModelFolder:
    """What a timm model folder's config.json says, every field checked: the registered model to build, its
    arguments (without the class count, which the data decides) and, where it gives them, the normalisation the
    weights were trained with."""

    path: Path
    architecture: str
    model_args: dict[str, Any]
    input_size: list[int] | None  # (C, H, W), or (C, T, H, W) for a clip model
    mean: list[float] | None
    std: list[float] | None


def folder_error(path: Path, problem: str) -> SystemExit:
    return SystemExit(
        f"error: --initial-checkpoint {str(path)!r}: {problem}; give it a model folder as train.py or timm's "
        f"save_for_hf writes one ({CONFIG} and {WEIGHTS}), or point it at a weights file and name the model with "
        "--models"
    )


def weights_file(path: str | Path) -> str:
    """The weights of ``--initial-checkpoint``: the file itself, or a model folder's model.safetensors, which must be
    a regular file and not a link (a folder received from someone else is data: a link could point anywhere)."""
    if not os.path.isdir(path):
        return str(path)
    weights = Path(path) / WEIGHTS
    try:
        mode = os.lstat(weights).st_mode
    except FileNotFoundError:
        raise folder_error(Path(path), f"the folder has no {WEIGHTS}") from None
    if not stat.S_ISREG(mode):
        raise folder_error(Path(path), f"its {WEIGHTS} is {file_kind(mode)}, not a regular file")
    return str(weights)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    twice = sorted({k for k in keys if keys.count(k) > 1})
    if twice:
        raise ValueError(f"the key {twice[0]!r} is given twice")
    return dict(pairs)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON has")


def is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def config_problem(config: Any, registered: set[str]) -> str:
    """What is wrong with a config.json's fields ('' if nothing): their types, a registered architecture, model
    arguments that are model arguments, and the preprocessing fields this harness reads."""
    if not isinstance(config, dict):
        return f"it holds a JSON {type(config).__name__}, not an object of timm's fields"
    arch = config.get("architecture")
    if not isinstance(arch, str):
        return f"its architecture is {str(arch)[:60]!r}, not a model name"
    if arch not in registered:  # an exact registry name: no tag, no hf-hub: or local-dir: source, no module path
        return (
            f"its architecture {arch[:80]!r} is no model registered in timm here (vit_rope's or timm's own; nothing "
            "named in a config.json is imported: --imports the module that registers a model of your own)"
        )
    num_classes = config.get("num_classes")
    if num_classes is not None and (type(num_classes) is not int or num_classes < 0):
        return f"its num_classes is {str(num_classes)[:40]!r}, not a whole number of at least 0"
    args = config.get("model_args", {})
    if not isinstance(args, dict):
        return f"its model_args is a JSON {type(args).__name__}, not an object of argument names to values"
    bad = [k for k in args if not k.isidentifier() or k in LOADER_ARGS]
    if bad:
        return f"its model_args holds {bad[0][:60]!r}, which is not an argument of a model (it says how to load one)"
    return preprocessing_problem(config)


def preprocessing_problem(config: dict) -> str:
    """What is wrong with a config.json's preprocessing fields (``pretrained_cfg``'s input size, mean, std, class
    count, interpolation and crop) and its label names ('' if nothing)."""
    pretrained = config.get("pretrained_cfg", {})
    if not isinstance(pretrained, dict):
        return f"its pretrained_cfg is a JSON {type(pretrained).__name__}, not an object"
    size = pretrained.get("input_size")
    if size is not None and not (
        isinstance(size, list) and len(size) in (3, 4) and all(type(s) is int and s >= 1 for s in size)
    ):
        return f"its pretrained_cfg input_size is {str(size)[:60]}, not 3 or 4 whole numbers of at least 1"
    for key in ("mean", "std"):
        value = pretrained.get(key)
        if value is not None and not (
            isinstance(value, list) and 1 <= len(value) <= 64 and all(is_number(v) for v in value)
            and (key == "mean" or all(v > 0 for v in value))
        ):  # fmt: skip
            return f"its pretrained_cfg {key} is {str(value)[:60]}, not a list of finite numbers" + (
                " above 0" if key == "std" else ""
            )
    for key, check, what in (
        ("num_classes", lambda v: type(v) is int and v >= 0, "a whole number of at least 0"),
        ("interpolation", lambda v: isinstance(v, str), "a string"),
        ("crop_pct", lambda v: is_number(v) and v > 0, "a number above 0"),
    ):
        if pretrained.get(key) is not None and not check(pretrained[key]):
            return f"its pretrained_cfg {key} is {str(pretrained[key])[:40]!r}, not {what}"
    for where, labels in (("", config.get("label_names")), ("pretrained_cfg ", pretrained.get("label_names"))):
        if labels is not None and not (
            (isinstance(labels, list) and all(isinstance(v, str) for v in labels))
            or (isinstance(labels, dict) and all(isinstance(v, str) for v in labels.values()))
        ):
            return f"its {where}label_names is not a list (or an object) of strings"
    return ""


def read_model_folder(path: str | Path) -> ModelFolder:
    """A timm model folder's config.json, read as data from a possibly hostile source: a regular file (not a link,
    FIFO or device) of UTF-8 JSON, at most 16 MiB, no key twice, no NaN; every field it uses checked
    (:func:`config_problem`). The architecture is looked up in timm's registry, never imported; one line otherwise."""
    path = Path(path)
    remedy = f"give the folder {CONFIG} as a regular file (copy the file in place of a link)"
    data = read_own(path / CONFIG, f"--initial-checkpoint {str(path)!r}: its", remedy, expected="a regular file")
    if data is None:
        raise folder_error(path, f"the folder has no {CONFIG}")
    weights_file(path)  # (the weights' file, checked now as well)
    if len(data) > MAX_CONFIG_BYTES:
        raise folder_error(path, f"its {CONFIG} is larger than {MAX_CONFIG_BYTES >> 20} MiB, no model's config")
    try:
        config = json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise folder_error(path, f"its {CONFIG} cannot be read as JSON ({str(e)[:120] or type(e).__name__})") from None
    problem = config_problem(config, set(timm.list_models()))
    if problem:
        raise folder_error(path, f"its {CONFIG} is not a model's config: {problem}")
    pretrained = config.get("pretrained_cfg", {})
    args = {k: v for k, v in config.get("model_args", {}).items() if k != "num_classes"}
    return ModelFolder(path, config["architecture"], args, pretrained.get("input_size"), pretrained.get("mean"),
                       pretrained.get("std"))  # fmt: skip


def torch_bytes(obj: object) -> bytes:
    """``torch.save`` into memory: the file is then one plain write (a full disk is one error naming it, not torch's
    writer's RuntimeError)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()
