"""train.py's config: every key with its default, help and valid range; YAML and flags read into one dict; what
``--resume`` does with changed settings; each value checked before a run starts; the models a config names."""

from __future__ import annotations

import argparse
import os
import pickle
import re
from pathlib import Path

import timm
import torch
import yaml
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, resolve_data_config

from . import data as D
from .checkpoint import checkpoint_filter_fn, inflate_image_checkpoint, unwrap_state_dict
from .position_encoding import SCALING_MODES

# Every config key with its default and help, in the groups of --help. A YAML key not listed here is an error.
OPTIONS: dict[str, dict[str, tuple[object, str]]] = {
    "data": {
        "dataset": ("synthetic", f"one of {', '.join(D.IMAGE_DATASETS + D.VIDEO_DATASETS)}"),
        "data_dir": ("data", "dataset root: torchvision downloads there; folders hold {train,val}/<class>/"),
        "img_size": (32, "training resolution (px)"),
        "num_frames": (8, "frames per clip (video datasets)"),
        "train_samples": (4000, "training scenes or clips of the built-in synthetic data"),
        "val_samples": (1000, "validation scenes or clips of the built-in synthetic data"),
        "train_subset": (0, "train on this many samples of the training split, the same for every seed (0: all)"),
        "val_subset": (0, "validate and evaluate on this many validation samples, always the same ones (0: all)"),
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
    "seeds and recipes": {
        "seeds": ([], "train every model once per seed (a run each); empty: --seed alone"),
        "train_sizes": ([], "train each batch at a size drawn from these (px); empty: at --img-size only"),
        "recipes": ({}, "recipe name → training keys it overrides; every model trains under each (empty: one recipe)"),
    },
    "run": {
        "output": ("runs/default", "folder of the run's outputs"),
        "resume": (False, "continue the run in --output from its last finished epochs"),
        "seed": (0, "seed of weights, data order and augmentation (of the one run per model without --seeds)"),
        "device": ("auto", "auto, cpu, cuda, cuda:N or mps"),
        "amp": (False, "bfloat16 autocast"),
    },
}
DEFAULTS: dict = {key: default for group in OPTIONS.values() for key, (default, _) in group.items()}
NONE_TYPES = {"auto_augment": str, "initial_checkpoint": str}
DICT_KEYS = {k for k, default in DEFAULTS.items() if isinstance(default, dict)}
ITEM_TYPES = {"seeds": int, "train_sizes": int}  # lists that may be empty: the type of their items
# what a recipe may set: how a model trains. The data, models, seeds, epochs (what --resume trains on to),
# evaluation and run settings are one for all recipes of a config, so that its runs compare.
RECIPE_KEYS = (
    "train_sizes",
    "model_kwargs",
    "drop_path",
    *(k for k in OPTIONS["optimizer and schedule"] if k != "epochs"),
    *OPTIONS["augmentation and regularization"],
)


def _between(low: float, high: float, closed: bool = True):
    return (lambda v: low <= v <= high) if closed else (lambda v: low <= v < high)


# Valid values: key → (test, what it asks). Settings that depend on each other are checked in check_config.
RANGES = {
    **{k: (lambda v: v >= 1, "at least 1") for k in ("epochs", "batch_size", "eval_batch_size", "img_size")},
    **{k: (lambda v: v >= 1, "at least 1") for k in ("num_frames", "train_samples", "val_samples")},
    **{k: (lambda v: v >= 0, "at least 0") for k in ("lr", "min_lr", "weight_decay", "warmup_epochs", "clip_grad")},
    **{k: (lambda v: v >= 0, "at least 0") for k in ("mixup", "cutmix", "workers", "train_subset", "val_subset")},
    "label_smoothing": (_between(0, 1, closed=False), "in [0, 1)"),
    "drop_path": (_between(0, 1, closed=False), "in [0, 1)"),
    "hflip": (_between(0, 1), "in [0, 1]"),
    "ema_decay": (_between(0, 1), "in [0, 1]"),
    "seed": (_between(0, 2**31 - 1), "in [0, 2**31 - 1]"),
    "seeds": (lambda v: len(set(v)) == len(v) and all(0 <= s < 2**31 for s in v), "distinct seeds in [0, 2**31 - 1]"),
    "train_sizes": (lambda v: all(s >= 1 for s in v), "sizes of at least 1"),
    "scale": (lambda v: len(v) == 2 and 0 < v[0] <= v[1] <= 1, "two numbers a b with 0 < a <= b <= 1"),
    "eval_sizes": (lambda v: min(v) >= 1, "sizes of at least 1"),
    "dataset": (lambda v: v in D.IMAGE_DATASETS + D.VIDEO_DATASETS, f"one of {D.IMAGE_DATASETS + D.VIDEO_DATASETS}"),
}


def _kv(text: str) -> tuple[str, object]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"expected key=value pairs, got {text!r} (e.g. patch_size=4)")
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
                item = ITEM_TYPES.get(key) or type(default[0])
                group.add_argument(flag, nargs="*" if key in ITEM_TYPES else "+", type=item, **kw)
            else:
                group.add_argument(flag, type=NONE_TYPES.get(key, type(default)), **kw)
    args = vars(parser.parse_args(rest))
    from_flags = {k: dict(args[k] or []) for k in DICT_KEYS}  # flags add to the config's model_kwargs and recipes
    for k in DICT_KEYS:
        args[k] = {**cfg[k], **from_flags[k]} if from_flags[k] else cfg[k]
    given = {k: args[k] for k in loaded} if known.config else {}
    flags = set()
    for a in rest:
        key = a.split("=")[0][2:].replace("-", "_")
        if a.startswith("--") and (key in DEFAULTS or key.removeprefix("no_") in DEFAULTS):
            key = key if key in DEFAULTS else key.removeprefix("no_")
            given[key] = args[key]
            flags.add(key)
    for k in DICT_KEYS & given.keys():  # on --resume, flags add to the saved dicts, not to the default config's
        given[k] = {**((loaded.get(k) or {}) if known.config else {}), **from_flags[k]}
    # --seed and --seeds: the command line overrides the file, and one place that gives both is ambiguous
    for where, keys in (("the command line", flags), (f"config file {path!r}", set(loaded))):
        if {"seed", "seeds"} <= keys:
            raise SystemExit(
                f"error: {where} gives both seed and seeds; give seeds for one run per seed, or seed for one run"
            )
    if "seed" in flags:
        args["seeds"] = given["seeds"] = []
    return args, given


# What --resume does with a setting that differs from the run's config.yaml, so that config.yaml always describes
# the results: settings of how the run goes just apply (other models, seeds or recipe names: the runs they add train,
# the ones they drop leave the results); evaluation settings evaluate the saved weights again; more epochs train on
# (fewer than trained: refused in check_epochs); any other change, a recipe's keys included, would alter what was
# trained.
HOW_IT_RUNS = ("output", "resume", "device", "workers", "eval_batch_size", "data_dir", "models", "seeds")
EVALUATION = ("eval_sizes", "rope_scaling", "native_eval")


def resumed_config(cfg: dict, given: dict) -> dict:
    """With ``--resume`` and a run in ``--output``: its saved config, with what the command line changes."""
    saved_path = Path(cfg["output"]) / "config.yaml"
    if not cfg["resume"] or not saved_path.exists():
        return cfg
    saved = {**DEFAULTS, **read_yaml(saved_path, "the run's config")}
    new = {**saved, **given, "resume": True, "output": cfg["output"]}
    for k in DICT_KEYS:
        new[k] = {**saved[k], **given.get(k, {})}
    kept = HOW_IT_RUNS + EVALUATION + ("epochs", "recipes")
    refused = [(k, saved[k], new[k]) for k in DEFAULTS if new[k] != saved[k] and k not in kept]
    refused += [
        (f"recipe {name!r}", old, new["recipes"][name])
        for name, old in saved["recipes"].items()
        if (old or {}) != (new["recipes"].get(name, old) or {})
    ]
    if refused:
        changes = ", ".join(f"{k} {old!r} -> {now!r}" for k, old, now in refused)
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
        item = ITEM_TYPES[key]() if key in ITEM_TYPES else default[0]
        return isinstance(value, list) and (value or key in ITEM_TYPES) and all(_type_ok(v, item, key) for v in value)
    return isinstance(value, type(default))


def check_config(cfg: dict) -> None:
    """Every value's type and range, and settings that only make sense together, each as one line naming the
    setting and the fix, before anything is built or written; each recipe's too."""
    check_values(cfg)
    check_recipes(cfg)
    if cfg["eval_only"] and not (cfg["initial_checkpoint"] or cfg["pretrained"]):
        raise SystemExit("error: --eval-only needs --initial-checkpoint PATH or --pretrained")
    if cfg["initial_checkpoint"] and not os.path.isfile(cfg["initial_checkpoint"]):
        raise SystemExit(f"error: --initial-checkpoint {cfg['initial_checkpoint']!r} does not exist")
    resolve_device(cfg["device"])


def check_values(cfg: dict, where: str = "") -> None:
    """``check_config``'s checks of each value alone, and of the training settings that go together; ``where``
    begins each message (the recipe)."""
    for key, default in DEFAULTS.items():
        flag, value = "--" + key.replace("_", "-"), cfg[key]
        if not _type_ok(value, default, key):
            item = ITEM_TYPES[key] if key in ITEM_TYPES else type(default[0]) if isinstance(default, list) else None
            kind = f"a list of {item.__name__}" if item else type(default).__name__
            raise SystemExit(
                f"error: {where}{flag} {value!r}: {key} must be {kind if default is not None else 'a string'}"
            )
        test, what = RANGES.get(key, (None, ""))
        if test is not None and not test(value):
            raise SystemExit(f"error: {where}{flag} {value!r}: {key} must be {what}")
    bad = [m for m in cfg["rope_scaling"] if m not in SCALING_MODES]
    if bad:
        raise SystemExit(f"error: unknown --rope-scaling mode(s) {bad}; choose from {list(SCALING_MODES)}")
    if cfg["min_lr"] > cfg["lr"]:
        raise SystemExit(
            f"error: {where}--min-lr {cfg['min_lr']} is above --lr {cfg['lr']}; give a min_lr of at most lr"
        )


def check_recipes(cfg: dict) -> None:
    """Recipe names fit for folder names; each recipe's keys among RECIPE_KEYS, and its values checked."""
    for name, overrides in cfg["recipes"].items():
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
            raise SystemExit(
                f"error: recipe name {name!r}: use letters, digits, '_', '.' and '-' (it names the runs' folders)"
            )
        if not isinstance(overrides, dict | None):
            raise SystemExit(f"error: recipe {name!r} is {overrides!r}: give the keys it sets ({{}} for none)")
        other = sorted(set(overrides or {}) - set(RECIPE_KEYS))
        if other:
            raise SystemExit(
                f"error: recipe {name!r} sets {other}: a recipe sets only how models train ({', '.join(RECIPE_KEYS)}); "
                "the data, models, seeds, epochs, evaluation and run settings are shared by all recipes of a config"
            )
        check_values({**cfg, **(overrides or {})}, f"recipe {name!r}: ")


def recipe_config(cfg: dict, recipe: str) -> dict:
    """``cfg`` under one recipe ('' for a config without recipes): the recipe's keys on top, its model kwargs added
    to the shared ones (a model spec's own kwargs still come last)."""
    overrides = (cfg["recipes"][recipe] or {}) if recipe else {}
    return {**cfg, **overrides, "model_kwargs": {**cfg["model_kwargs"], **overrides.get("model_kwargs", {})}}


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


def check_input_sizes(cfg: dict, spec: str, model: torch.nn.Module, where: str = "") -> None:
    """Eval and training sizes a model's patch size does not divide (unless it pads) are an error before any
    training; ``where`` ends the message (the recipe)."""
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None or getattr(patch_embed, "dynamic_img_pad", False):
        return
    ph, pw = patch_embed.patch_size[-2:]
    for key in ("eval_sizes", "train_sizes"):
        bad = [s for s in cfg[key] if s % ph or s % pw]
        if bad:
            pad = "" if D.is_video(cfg["dataset"]) else " (or give the model dynamic_img_pad=True to pad)"
            raise SystemExit(
                f"error: --{key.replace('_', '-')} {bad} are not multiples of the patch size {ph}x{pw} of {spec}"
                f"{where}; choose multiples of it{pad}"
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
        if not type(model).__module__.startswith("vit_rope."):  # ours rename timm's keys into this package's models
            filter_fn = timm_checkpoint_filter
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


def timm_checkpoint_filter(state_dict: dict, model: torch.nn.Module) -> dict:
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
