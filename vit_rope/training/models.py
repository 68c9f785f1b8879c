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
from dataclasses import replace
from pathlib import Path

import timm
import torch
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, resolve_data_config

from .data import VIDEO_DATASETS
from .settings import Settings, key_value
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
    otherwise are one line. ``img_size`` becomes the size it was trained at unless the command line gives one. The
    class count stays the data's (a classifier of another count is re-initialised)."""
    path = settings.initial_checkpoint
    if not path or not os.path.isdir(path):
        return settings
    folder = read_model_folder(path)
    kwargs = dict(folder.model_args)
    if folder.mean is not None and folder.std is not None:
        kwargs["pretrained_cfg_overlay"] = dict(mean=folder.mean, std=folder.std)
    wanted = dict(models=(folder.architecture,), model_kwargs=kwargs)
    saved = Path(settings.output) / "config.yaml"  # a resumed run's settings: the folder's when the run began
    resuming = settings.resume and (saved.exists() or saved.is_symlink())
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
    if settings.drop_path:
        defaults["drop_path_rate"] = settings.drop_path
    return name, kwargs, {k: v for k, v in defaults.items() if k not in kwargs}


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
    model carries the record its saved weights will say what they are by (``vit_rope_record``)."""
    name, kwargs, defaults = model_args(settings, spec)
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
    if settings.initial_checkpoint:
        video = settings.dataset in VIDEO_DATASETS
        load_initial_weights(model, settings.initial_checkpoint, video, spec, settings.allow_transfer)
    model.vit_rope_record = model_record(model, name, used)
    return model


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
    """The ``--rope-scaling`` modes that apply to this model ('-' for a model without RoPE)."""
    own = model.rope_scaling_modes() if hasattr(model, "rope_scaling_modes") else ()
    return [m for m in modes if m in own] if own else ["-"]
