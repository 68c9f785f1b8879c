"""train.py's config: every key with its default, help and valid range; YAML and flags read into one dict; what
``--resume`` does with changed settings; each value checked before a run starts; the models a config names."""

from __future__ import annotations

import argparse
import os
import pickle
from pathlib import Path

import timm
import torch
import yaml
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, resolve_data_config

from . import data as D
from .checkpoint import checkpoint_filter_fn, inflate_image_checkpoint
from .rope import SCALING_MODES

# Every config key with its default and help, in the groups of --help. A YAML key not listed here is an error.
OPTIONS: dict[str, dict[str, tuple[object, str]]] = {
    "data": {
        "dataset": ("synthetic", f"one of {', '.join(D.IMAGE_DATASETS + D.VIDEO_DATASETS)}"),
        "data_dir": ("data", "dataset root: torchvision downloads there; folders hold {train,val}/<class>/"),
        "img_size": (32, "training resolution (px)"),
        "num_frames": (8, "frames per clip (video datasets)"),
        "train_samples": (4000, "training scenes or clips of the built-in synthetic data"),
        "val_samples": (1000, "validation scenes or clips of the built-in synthetic data"),
        "workers": (0, "DataLoader worker processes"),
    },
    "model": {
        "models": (["vit_ape_tiny", "vit_rope_tiny"], "timm models to compare: name or name:key=value,..."),
        "model_kwargs": ({}, "kwargs of every model as key=value (values in YAML: rope_axis_dims=[8,12,12])"),
        "initial_checkpoint": (None, "start from these weights: a .safetensors, or a run's checkpoint.pt"),
        "pretrained": (False, "start from the models' published weights"),
        "drop_path": (0.0, "stochastic depth rate"),
    },
    "optimizer and schedule": {
        "epochs": (10, "epochs per model"),
        "batch_size": (64, "training batch size per process"),
        "opt": ("adamw", "timm optimizer name"),
        "lr": (1e-3, "peak learning rate"),
        "weight_decay": (0.05, "weight decay"),
        "sched": ("cosine", "timm LR schedule name, stepped every update"),
        "warmup_epochs": (1, "epochs of linear warmup from lr / 100"),
        "min_lr": (1e-5, "LR at the end of the schedule"),
        "clip_grad": (1.0, "clip the gradient norm to this (0: off)"),
    },
    "augmentation and regularization": {
        "label_smoothing": (0.1, "label smoothing of the loss"),
        "mixup": (0.0, "mixup alpha (0: off)"),
        "cutmix": (0.0, "cutmix alpha (0: off)"),
        "no_aug": (False, "no crop or flip augmentation"),
        "hflip": (0.5, "horizontal flip probability"),
        "scale": ([0.08, 1.0], "random-resized-crop area range: a b with 0 < a <= b <= 1"),
        "auto_augment": (None, "timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1"),
        "ema": (False, "keep an EMA of the weights; it is what is evaluated and saved"),
        "ema_decay": (0.9998, "EMA decay per update"),
    },
    "evaluation": {
        "eval_sizes": ([32], "resolutions to evaluate every model at"),
        "native_eval": (True, "also evaluate the built-in data drawn natively at each size"),
        "rope_scaling": (["none"], f"RoPE extrapolation modes to evaluate, from {', '.join(SCALING_MODES)}"),
        "eval_batch_size": (128, "evaluation batch size per process"),
        "eval_only": (False, "evaluate --initial-checkpoint or --pretrained weights without training"),
    },
    "run": {
        "output": ("runs/default", "folder of the run's outputs"),
        "resume": (False, "continue the run in --output from its last finished epochs"),
        "seed": (0, "seed of weights, data order and augmentation"),
        "device": ("auto", "auto, cpu, cuda, cuda:N or mps"),
        "amp": (False, "bfloat16 autocast"),
    },
}
DEFAULTS: dict = {key: default for group in OPTIONS.values() for key, (default, _) in group.items()}
NONE_TYPES = {"auto_augment": str, "initial_checkpoint": str}


def _between(low: float, high: float, closed: bool = True):
    return (lambda v: low <= v <= high) if closed else (lambda v: low <= v < high)


# Valid values: key → (test, what it asks). Settings that depend on each other are checked in check_config.
RANGES = {
    **{k: (lambda v: v >= 1, "at least 1") for k in ("epochs", "batch_size", "eval_batch_size", "img_size")},
    **{k: (lambda v: v >= 1, "at least 1") for k in ("num_frames", "train_samples", "val_samples")},
    **{k: (lambda v: v >= 0, "at least 0") for k in ("lr", "min_lr", "weight_decay", "warmup_epochs", "clip_grad")},
    **{k: (lambda v: v >= 0, "at least 0") for k in ("mixup", "cutmix", "workers")},
    "label_smoothing": (_between(0, 1, closed=False), "in [0, 1)"),
    "drop_path": (_between(0, 1, closed=False), "in [0, 1)"),
    "hflip": (_between(0, 1), "in [0, 1]"),
    "ema_decay": (_between(0, 1), "in [0, 1]"),
    "seed": (_between(0, 2**31 - 1), "in [0, 2**31 - 1]"),
    "scale": (lambda v: len(v) == 2 and 0 < v[0] <= v[1] <= 1, "two numbers a b with 0 < a <= b <= 1"),
    "eval_sizes": (lambda v: min(v) >= 1, "sizes of at least 1"),
    "dataset": (lambda v: v in D.IMAGE_DATASETS + D.VIDEO_DATASETS, f"one of {D.IMAGE_DATASETS + D.VIDEO_DATASETS}"),
}


def _kv(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"--model-kwargs takes key=value pairs, got {text!r} (e.g. patch_size=4)")
    k, v = text.split("=", 1)
    try:
        return k, yaml.safe_load(v)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise argparse.ArgumentTypeError(
            f"cannot read the value of {k!r}, {v!r}, as YAML ({problem}); write lists as [8,12,12], strings plainly"
        ) from None


def read_yaml(path: str | Path, what: str) -> dict:
    """A YAML file of config keys; a missing or malformed one is one line naming the file and the place."""
    if not os.path.isfile(path):
        raise SystemExit(f"error: {what} {str(path)!r} not found")
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SystemExit(f"error: {what} {str(path)!r} is not valid YAML: {problem}{where}; fix it there") from None
    if not isinstance(loaded, dict):
        raise SystemExit(f"error: {what} {str(path)!r} holds a {type(loaded).__name__}, not `key: value` lines")
    return loaded


def parse_config(argv: list[str] | None, default_config: str | Path, description: str) -> tuple[dict, dict]:
    """YAML config (``--config``, else ``default_config``) overridden by flags; every key is a flag (``eval_sizes``
    → ``--eval-sizes``), listed by ``--help`` under ``description``.

    Returns the config and what the command line sets (its flags, and the keys of a ``--config`` it names): on
    ``--resume`` these are the changes to the run's saved config.
    """
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    known, rest = pre.parse_known_args(argv)
    path = known.config or str(default_config)
    loaded = read_yaml(path, "config file")
    unknown = sorted(set(loaded) - set(DEFAULTS))
    if unknown:
        raise SystemExit(f"error: unknown config key(s) {unknown} in {path}; valid keys: {sorted(DEFAULTS)}")
    cfg = {**DEFAULTS, **loaded}

    class Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
        pass

    parser = argparse.ArgumentParser(description=description, formatter_class=Help, allow_abbrev=False)
    parser.add_argument("--config", default=path, help="YAML config whose keys the flags below override")
    for title, options in OPTIONS.items():
        group = parser.add_argument_group(title)
        for key, (default, text) in options.items():
            flag, kw = "--" + key.replace("_", "-"), dict(default=cfg[key], help=text)
            if isinstance(default, bool):
                group.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
            elif isinstance(default, dict):
                group.add_argument(flag, nargs="*", type=_kv, metavar="KEY=VALUE", **{**kw, "default": None})
            elif isinstance(default, list):
                group.add_argument(flag, nargs="+", type=type(default[0]), **kw)
            else:
                group.add_argument(flag, type=NONE_TYPES.get(key, type(default)), **kw)
    args = vars(parser.parse_args(rest))
    flag_kwargs = dict(args["model_kwargs"] or [])
    args["model_kwargs"] = {**cfg["model_kwargs"], **flag_kwargs}
    given = {k: args[k] for k in loaded} if known.config else {}
    for a in rest:
        key = a.split("=")[0][2:].replace("-", "_")
        if a.startswith("--") and (key in DEFAULTS or key.removeprefix("no_") in DEFAULTS):
            key = key if key in DEFAULTS else key.removeprefix("no_")
            given[key] = args[key]
    if "model_kwargs" in given:  # on --resume, flags add to the saved kwargs, not to the default config's
        given["model_kwargs"] = {**((loaded.get("model_kwargs") or {}) if known.config else {}), **flag_kwargs}
    return args, given


# What --resume does with a setting that differs from the run's config.yaml, so that config.yaml always describes
# the results: settings of how the run goes just apply; evaluation settings evaluate the saved weights again; more
# epochs train on (fewer than trained: refused in check_epochs); any other change would alter what was trained.
HOW_IT_RUNS = ("output", "resume", "device", "workers", "eval_batch_size", "data_dir", "models")
EVALUATION = ("eval_sizes", "rope_scaling", "native_eval")


def resumed_config(cfg: dict, given: dict) -> dict:
    """With ``--resume`` and a run in ``--output``: its saved config, with what the command line changes."""
    saved_path = Path(cfg["output"]) / "config.yaml"
    if not cfg["resume"] or not saved_path.exists():
        return cfg
    saved = {**DEFAULTS, **read_yaml(saved_path, "the run's config")}
    new = {**saved, **given, "resume": True, "output": cfg["output"]}
    new["model_kwargs"] = {**saved["model_kwargs"], **given.get("model_kwargs", {})}
    refused = [k for k in DEFAULTS if new[k] != saved[k] and k not in HOW_IT_RUNS + EVALUATION + ("epochs",)]
    if refused:
        changes = ", ".join(f"{k} {saved[k]!r} -> {new[k]!r}" for k in refused)
        raise SystemExit(
            f"error: --resume cannot change {changes}: the run in {cfg['output']} was trained with the saved "
            "value(s), and its results must come from one recipe; resume without the change, or start a new run "
            "with another --output"
        )
    return new


def resolve_device(name: str) -> torch.device:
    """``--device`` as a torch device (``auto``: CUDA if there is one); a device this machine lacks is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"error: --device {name!r} is not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    backend = getattr(torch, device.type, None)
    count = 1 if device.type == "cpu" else backend.device_count() if backend and backend.is_available() else 0
    if (device.index or 0) >= count:
        raise SystemExit(f"error: --device {name} is not on this machine ({count} {device.type} device(s)); use auto")
    return device


def _type_ok(value, default, key: str) -> bool:
    if default is None:
        return value is None or isinstance(value, NONE_TYPES[key])
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, list):
        return isinstance(value, list) and len(value) > 0 and all(_type_ok(v, default[0], key) for v in value)
    return isinstance(value, type(default))


def check_config(cfg: dict) -> None:
    """Every value's type and range, and settings that only make sense together, each as one line naming the
    setting and the fix, before anything is built or written."""
    for key, default in DEFAULTS.items():
        flag, value = "--" + key.replace("_", "-"), cfg[key]
        if not _type_ok(value, default, key):
            kind = f"a list of {type(default[0]).__name__}" if isinstance(default, list) else type(default).__name__
            raise SystemExit(f"error: {flag} {value!r}: {key} must be {kind if default is not None else 'a string'}")
        test, what = RANGES.get(key, (None, ""))
        if test is not None and not test(value):
            raise SystemExit(f"error: {flag} {value!r}: {key} must be {what}")
    bad = [m for m in cfg["rope_scaling"] if m not in SCALING_MODES]
    if bad:
        raise SystemExit(f"error: unknown --rope-scaling mode(s) {bad}; choose from {list(SCALING_MODES)}")
    if cfg["min_lr"] > cfg["lr"]:
        raise SystemExit(f"error: --min-lr {cfg['min_lr']} is above --lr {cfg['lr']}; give a min_lr of at most lr")
    if cfg["eval_only"] and not (cfg["initial_checkpoint"] or cfg["pretrained"]):
        raise SystemExit("error: --eval-only needs --initial-checkpoint PATH or --pretrained")
    if cfg["initial_checkpoint"] and not os.path.isfile(cfg["initial_checkpoint"]):
        raise SystemExit(f"error: --initial-checkpoint {cfg['initial_checkpoint']!r} does not exist")
    resolve_device(cfg["device"])


# ------------------------------------------------------------------------------------------------ models
def split_spec(spec: str) -> tuple[str, dict]:
    """``name[:key=value,key=value]``: a registered model with its own overrides of ``model_kwargs``."""
    name, _, rest = spec.partition(":")
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(rest):  # commas inside [...], {...} or (...) belong to a value such as [8,12,12]
        depth += (ch in "[{(") - (ch in "]})")
        if ch == "," and depth <= 0:
            parts.append(rest[start:i])
            start = i + 1
    parts.append(rest[start:])
    return name, dict(_kv(p) for p in parts if p)


def checked_spec(spec: str) -> tuple[str, dict]:
    """``split_spec`` with one clear error for a model timm does not know or a kwarg it cannot read."""
    try:
        name, own = split_spec(spec)
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"error: model {spec!r} in --models: {e}") from None
    if name not in timm.list_models():
        raise SystemExit(
            f"error: unknown model {name!r}; registered: {timm.list_models('vit_r*') + timm.list_models('vit_ape*')}"
        )
    return name, own


def data_config(cfg: dict, spec: str) -> dict:
    """The model's input normalisation, from its pretrained config (with any ``pretrained_cfg_overlay`` among the
    model kwargs), as timm's ``resolve_data_config`` reads it off a built model; nothing is built or loaded."""
    name, own = checked_spec(spec)
    pretrained = timm.models.get_pretrained_cfg(name)
    pcfg = pretrained.to_dict() if pretrained is not None else {}
    pcfg.update({**cfg["model_kwargs"], **own}.get("pretrained_cfg_overlay") or {})
    return resolve_data_config({}, pretrained_cfg=pcfg or dict(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD))


def model_args(cfg: dict, spec: str) -> tuple[str, dict]:
    """The registered name and the kwargs ``timm.create_model`` gets for one ``--models`` entry."""
    name, own = checked_spec(spec)
    kwargs = {**cfg["model_kwargs"], **own}
    kwargs.setdefault("img_size", cfg["img_size"])
    if D.is_video(cfg["dataset"]):
        kwargs.setdefault("num_frames", cfg["num_frames"])
    if cfg["drop_path"]:
        kwargs.setdefault("drop_path_rate", cfg["drop_path"])
    return name, kwargs


def check_eval_sizes(cfg: dict, spec: str, model: torch.nn.Module) -> None:
    """Eval sizes a model's patch size does not divide (unless it pads) are an error before any training."""
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None or getattr(patch_embed, "dynamic_img_pad", False):
        return
    ph, pw = patch_embed.patch_size[-2:]
    bad = [s for s in cfg["eval_sizes"] if s % ph or s % pw]
    if bad:
        pad = "" if D.is_video(cfg["dataset"]) else " (or give the model dynamic_img_pad=True to pad)"
        raise SystemExit(
            f"error: --eval-sizes {bad} are not multiples of the patch size {ph}x{pw} of {spec}; "
            f"choose multiples of it{pad}"
        )


def build_model(cfg: dict, spec: str, num_classes: int) -> torch.nn.Module:
    """``timm.create_model`` for one ``--models`` entry, with its --pretrained or --initial-checkpoint weights; a
    kwarg the model refuses, or weights that do not fit it, is one line naming the model."""
    name, kwargs = model_args(cfg, spec)
    try:
        model = timm.create_model(name, pretrained=cfg["pretrained"], num_classes=num_classes, **kwargs)
    except (ValueError, TypeError, AssertionError) as e:
        raise SystemExit(f"error: model {spec} cannot be built with {kwargs}: {e}") from None
    except RuntimeError as e:
        if cfg["pretrained"]:
            raise SystemExit(
                f"error: could not fetch pretrained weights for {name} ({e}); use --initial-checkpoint PATH offline"
            ) from e
        raise
    if cfg["initial_checkpoint"]:
        path = cfg["initial_checkpoint"]
        filter_fn = inflate_image_checkpoint if D.is_video(cfg["dataset"]) else checkpoint_filter_fn
        try:  # a train.py checkpoint.pt gives its EMA weights (timm's key model_ema) if it has them, else its model's
            timm.models.load_checkpoint(model, path, filter_fn=filter_fn)
        except ValueError as e:  # the filter's: the weights of another kind of model
            raise SystemExit(f"error: --initial-checkpoint {path!r} does not fit {spec}: {e}") from None
        except (pickle.UnpicklingError, RuntimeError) as e:
            # torch.load(weights_only=True) refuses anything but tensors and plain data (timm re-raises it wrapped)
            if not isinstance(e, pickle.UnpicklingError) and not isinstance(e.__cause__, pickle.UnpicklingError):
                raise
            raise SystemExit(
                f"error: --initial-checkpoint {path!r} holds more than weights and plain data, so it is not loaded "
                "(a checkpoint.pt of an older train.py keeps numpy objects): point it at the model.safetensors next "
                "to it (the same weights, the EMA's if the run used --ema)"
            ) from None
    return model
