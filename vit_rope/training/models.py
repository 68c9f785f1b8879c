"""The models a run builds: ``--models`` entries (``name[:key=value,...]``) made with ``timm.create_model``, modules
of the user's own imported first (``--imports``), the data config each model asks, the sizes it takes, and the
extrapolation modes it is evaluated under."""

import argparse
import importlib
import importlib.util
import os
import re
import stat
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, resolve_data_config

from .data import VIDEO_DATASETS
from .settings import Settings, dropped_message, key_value, none_kwargs
from .weights import load_initial_weights, model_record, read_model_folder, why_unreadable

__all__ = ["build_model", "check_input_sizes", "data_config", "from_model_folder", "import_modules", "scaling_modes",
           "split_spec"]  # fmt: skip


def import_modules(names: tuple[str, ...]) -> None:
    """Import each of ``--imports`` (a dotted module name, or the path of a .py file) so that the families and models
    it registers exist before the models are built; one line for one that cannot be imported. Only the command line
    names these (settings.py refuses a file that does). A file is imported under a private name of its own, never
    its file name: ``string.py`` must not replace the standard library's ``string`` for everything imported later."""
    for name in names:
        try:
            if name.endswith(".py") or "/" in name:
                path = Path(name).resolve()
                if not path.exists() or not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the import
                    raise FileNotFoundError(f"no regular file {path}")
                private = "_vit_rope_imports_" + re.sub(r"\W", "_", path.stem) + f"_{len(sys.modules)}"
                spec = importlib.util.spec_from_file_location(private, path)
                if spec is None or spec.loader is None:
                    raise ImportError(f"{path} is not a Python file")
                module = importlib.util.module_from_spec(spec)
                sys.modules[private] = module  # (dataclasses and pickling look the module up by its name)
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[private]
                    raise
            else:
                importlib.import_module(name)
        except Exception as e:  # the user's module failed: say which and why, not where inside it
            raise SystemExit(f"error: --imports {name!r} cannot be imported ({why_unreadable(e)})") from None


def from_model_folder(settings: Settings, given: dict) -> Settings:
    """With a model folder as ``--initial-checkpoint`` (config.json beside model.safetensors, as a run or timm's
    save_for_hf writes it), the folder names the model: ``models`` becomes its architecture and ``model_kwargs`` its
    model_args (with the normalisation it was trained with, where it gives one), replacing those of the config files;
    ``models`` or ``model_kwargs`` that the command line (or a ``--config`` it names, or a resumed run) says
    otherwise are one line. ``img_size`` (and a video model's ``num_frames``) becomes the size it was trained at
    unless the command line gives one, and is left out of the model kwargs: --img-size is the one source of the
    model's grid (another size builds the model at that size, its APE resampled). The class count stays the data's
    (a classifier of another count is new: train.py says so, and --eval-only refuses it)."""
    path = settings.initial_checkpoint
    if not path or not os.path.isdir(path):
        return settings
    folder = read_model_folder(path)
    kwargs = {k: v for k, v in folder.model_args.items() if k not in RUN_KWARGS}  # (the run's flags set these)
    for key in RUN_KWARGS:  # the size or frame count the folder's model was built at, unless the command line says
        value = folder.model_args.get(key)  # (input_size, where the folder gives it, decides img_size below)
        value = value[0] if isinstance(value, list) and len(value) == 2 and value[0] == value[1] else value
        if key not in given and not resuming_run(settings) and type(value) is int and value > 0:
            settings = replace(settings, **{key: value})
    if folder.mean is not None and folder.std is not None:
        kwargs["pretrained_cfg_overlay"] = dict(mean=folder.mean, std=folder.std)
    wanted = dict(models=(folder.architecture,), model_kwargs=kwargs)
    resuming = resuming_run(settings)
    said = {k: getattr(settings, k) for k in wanted if k in given or resuming}
    differ = [k for k, v in said.items() if v != wanted[k]]
    if differ:
        flags = " and ".join(f"--{k.replace('_', '-')}" for k in differ)
        values = ", ".join(f"{k} {said[k]}" for k in differ)
        raise SystemExit(
            f"error: --initial-checkpoint {path!r} is a model folder, whose config.json names the model "
            f"({folder.architecture} with {kwargs}), and {flags} say otherwise ({values}); leave {flags} out, or "
            "point --initial-checkpoint at the folder's model.safetensors to load its weights into the models you name"
        )
    size = folder.input_size
    if size is not None and size[-1] == size[-2] and "img_size" not in given and not resuming:
        wanted["img_size"] = size[-1]  # the size it was trained at, unless the command line says another
    return replace(settings, **wanted)


def resuming_run(settings: Settings) -> bool:
    """--resume of a run that has a config.yaml (whose settings are the folder's when the run began)."""
    saved = Path(settings.output) / "config.yaml"
    return settings.resume and (saved.exists() or saved.is_symlink())


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
    return name, dict(key_value(p) for p in parts if p)


def checked_spec(spec: str) -> tuple[str, dict]:
    """``split_spec`` with one clear error for a model timm does not know or a kwarg it cannot read."""
    try:
        name, own = split_spec(spec)
    except argparse.ArgumentTypeError as e:
        raise SystemExit(f"error: model {spec!r} in --models: {e}") from None
    dropped = none_kwargs(own)
    if dropped:
        raise SystemExit(dropped_message(f"model {spec!r} in --models: {dropped[0]}=null"))
    if name not in timm.list_models():
        ours = timm.list_models(module="vit") + timm.list_models(module="video")
        raise SystemExit(f"error: unknown model {name!r}; registered here: {ours} and timm's own (timm.list_models())")
    return name, own


def data_config(settings: Settings, spec: str) -> dict:
    """The model's input normalisation, from its pretrained config (with any ``pretrained_cfg_overlay`` among the
    model kwargs), as timm's ``resolve_data_config`` reads it off a built model; nothing is built or loaded."""
    name, own = checked_spec(spec)
    pretrained = timm.models.get_pretrained_cfg(name)
    pcfg = pretrained.to_dict() if pretrained is not None else {}
    overlay = {**settings.model_kwargs, **own}.get("pretrained_cfg_overlay") or {}
    if not isinstance(overlay, dict):
        raise SystemExit(
            f"error: model {spec}: pretrained_cfg_overlay {str(overlay)[:80]!r} is not a mapping; give keys of timm's "
            "pretrained config, e.g. pretrained_cfg_overlay={file: weights.safetensors}"
        )
    pcfg.update(overlay)
    dc = resolve_data_config({}, pretrained_cfg=pcfg or dict(mean=IMAGENET_DEFAULT_MEAN, std=IMAGENET_DEFAULT_STD))
    return {**dc, "mean": tuple(dc["mean"]), "std": tuple(dc["std"])}  # (an overlay's YAML or JSON lists: hashable)


def model_args(settings: Settings, spec: str) -> tuple[str, dict, dict]:
    """The registered name and the kwargs ``timm.create_model`` gets for one ``--models`` entry: the user's, and the
    defaults the run adds (its image size, frames and drop path) where the user gave none."""
    name, own = checked_spec(spec)
    kwargs = {**settings.model_kwargs, **own}
    defaults = dict(img_size=settings.img_size)
    if settings.dataset in VIDEO_DATASETS:
        defaults["num_frames"] = settings.num_frames
    check_run_kwargs(spec, kwargs, defaults)
    if settings.drop_path:
        defaults["drop_path_rate"] = settings.drop_path
    return name, kwargs, {k: v for k, v in defaults.items() if k not in kwargs}


# model kwargs the run sets itself: a model kwarg may repeat the run's value, never differ from it
RUN_KWARGS = {"img_size": "--img-size", "num_frames": "--num-frames"}


def check_run_kwargs(spec: str, kwargs: dict, run: dict) -> None:
    """A model kwarg that the run sets from a flag of its own (``img_size`` from --img-size: the training grid, which
    every RoPE scaling mode and the APE are measured from; ``num_frames`` from --num-frames) may repeat the flag's
    value, never differ from it: a model built at another grid would train and evaluate at --img-size with every
    extrapolation mode measured from the wrong reference, and its rows published; the class count is the data's alone.
    One line otherwise."""
    if "num_classes" in kwargs:
        raise SystemExit(
            f"error: model {spec}: num_classes={kwargs['num_classes']!r} in the model kwargs; the class count is the "
            "dataset's (the run sets it): leave num_classes out"
        )
    for key, flag in RUN_KWARGS.items():
        if key in kwargs and key in run and kwargs[key] not in (run[key], [run[key]] * 2, (run[key],) * 2):
            raise SystemExit(
                f"error: model {spec}: the model kwarg {key}={kwargs[key]!r} differs from {flag} {run[key]}, which "
                f"the run trains and evaluates at (the model's reference grid and its scaling modes would be "
                f"{key}'s); leave {key} out of the model kwargs ({flag} sets it), or give {flag} {kwargs[key]}"
            )


def create(name: str, pretrained: bool, num_classes: int, kwargs: dict, defaults: dict) -> tuple[torch.nn.Module, dict]:
    """``timm.create_model`` with the run's defaults that the model takes: any timm model (a ResNet takes no
    ``img_size``) is built, and only a kwarg the user gave is an error if refused. Returns the kwargs it was built
    with."""
    while True:
        try:
            return timm.create_model(name, pretrained=pretrained, num_classes=num_classes, **kwargs, **defaults), {
                **kwargs, **defaults}  # fmt: skip
        except TypeError as e:
            refused = [k for k in defaults if f"'{k}'" in str(e)]
            if not refused:
                raise
            defaults = {k: v for k, v in defaults.items() if k not in refused}


def build_model(settings: Settings, spec: str, num_classes: int) -> torch.nn.Module:
    """``timm.create_model`` for one ``--models`` entry, with its --pretrained or --initial-checkpoint weights; a
    kwarg the model refuses, or weights that cannot be read or do not fit it, is one line naming the model. The
    model carries the record its saved weights will say what they are by (``vit_rope_record``), and the keys its
    starting weights gave none for (``vit_rope_new_head``: a classifier of another class count, initialised anew)."""
    name, kwargs, defaults = model_args(settings, spec)
    with warnings.catch_warnings():  # the library's warning of a new classifier: check_head says it in a line
        warnings.filterwarnings("ignore", message="the checkpoint's classifier has", category=UserWarning)
        return _built(settings, spec, num_classes, name, kwargs, defaults)


def _built(settings: Settings, spec: str, num_classes: int, name: str, kwargs: dict, defaults: dict) -> torch.nn.Module:
    try:
        model, used = create(name, settings.pretrained, num_classes, kwargs, defaults)
    except (ValueError, TypeError, AssertionError) as e:
        raise SystemExit(f"error: model {spec} cannot be built with { {**kwargs, **defaults} }: {e}") from None
    except Exception as e:  # pretrained weights: a hub out of reach, or a file that cannot be read
        if not (settings.pretrained or kwargs.get("pretrained_cfg_overlay")):
            raise
        raise SystemExit(
            f"error: the pretrained weights of {spec} cannot be loaded ({why_unreadable(e)}); without network access "
            "use --initial-checkpoint PATH (a .safetensors file)"
        ) from None
    model.vit_rope_new_head = new_head(model, settings.pretrained, num_classes)
    if settings.initial_checkpoint:
        video = settings.dataset in VIDEO_DATASETS
        model.vit_rope_new_head = load_initial_weights(
            model, settings.initial_checkpoint, video, spec, settings.allow_transfer
        )
    model.vit_rope_record = model_record(model, name, used)
    return model


def new_head(model: torch.nn.Module, pretrained: bool, num_classes: int) -> list[str]:
    """Where --pretrained weights come with a classifier of another class count than the data's, timm leaves the
    model's new one: its classifier's name (else nothing)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if not pretrained or cfg.get("num_classes") in (None, num_classes):
        return []
    head = cfg.get("classifier", "head")
    return [head] if isinstance(head, str) else list(head)


def check_input_sizes(settings: Settings, spec: str, model: torch.nn.Module, where: str = "") -> None:
    """Eval and training sizes a model's patch size does not divide (unless it pads) are an error before any
    training; ``where`` ends the message (the recipe)."""
    patch_embed = getattr(model, "patch_embed", None)
    if patch_embed is None or getattr(patch_embed, "dynamic_img_pad", False):
        return
    ph, pw = patch_embed.patch_size[-2:]
    for key in ("eval_sizes", "train_sizes", "finetune_sizes"):
        bad = [s for s in getattr(settings, key) if s % ph or s % pw]
        if bad:
            pad = "" if settings.dataset in VIDEO_DATASETS else " (or give the model dynamic_img_pad=True to pad)"
            raise SystemExit(
                f"error: --{key.replace('_', '-')} {bad} are not multiples of the patch size {ph}x{pw} of {spec}"
                f"{where}; choose multiples of it{pad}"
            )


def scaling_modes(model: torch.nn.Module, modes: tuple[str, ...]) -> list[str]:
    """The ``--rope-scaling`` modes that apply to this model ('-' for a model without RoPE), each a distinct one: a
    model whose RoPE coordinates are normalised (``rope_coords=normalized``: they span the image whatever its size,
    so no mode rescales them) computes the same under every mode, and its modes collapse to one (``none`` where
    given): one row, not five equal ones with one of them "best"."""
    own = model.rope_scaling_modes() if hasattr(model, "rope_scaling_modes") else ()
    taken = [m for m in modes if m in own] if own else ["-"]
    if len(taken) > 1 and same_under_every_mode(model):
        return ["none"] if "none" in taken else taken[:1]
    return taken


def same_under_every_mode(model: torch.nn.Module) -> bool:
    """Whether every RoPE scaling mode computes the same for ``model``: its position encoding's coordinates are
    normalised (the encoding then scales by 1 under every mode)."""
    return getattr(getattr(model, "position_encoding", None), "coords", None) == "normalized"
