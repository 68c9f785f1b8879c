"""train.py's settings: one frozen dataclass whose fields each carry a default, a help line, a group of ``--help``, the
range of valid values and what ``--resume`` does when the value changes. The flags, the config files (YAML) and the
resume rules derive from the fields, so a new setting is one field.

Values come from a YAML config file (``--config``, else configs/default.yaml), overridden by flags; every value is
checked when a :class:`Settings` is made, each problem one line naming the setting (``error: --lr -1.0: lr must be at
least 0``). Config files are read with ``yaml`` safe loading (UTF-8, bounded in size and in what their aliases
expand to), and a key given twice is an error. A config, like any file a run did not write in this process, is data:
``imports`` named in a file are refused, never imported (code runs only where the command line names it).
"""

import argparse
import math
import re
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from types import UnionType
from typing import Any

import yaml

from ..position_encoding import SCALING_MODES
from .data import DATASETS, VIDEO_DATASETS
from .elpv import DATA_DIR
from .folder import read_own

__all__ = ["Settings", "parse", "read_yaml", "resumed"]

# What --resume does with a value that differs from the run's config.yaml, so that config.yaml always describes the
# results: how the run goes just applies (other models or seeds: the runs they add train, the ones they drop leave
# the results); other evaluation settings evaluate the saved weights again; more epochs train on; any other change
# would alter what was trained, and is refused.
APPLIES, EVALUATES, TRAINS_ON, REFUSED = "applies", "evaluates", "trains on", "refused"
TRAIN_SIZES_FROM = ("batch", "originals")  # --train-sizes-from


def setting(default: Any, help: str, *, check=None, must: str = "", resume: str = REFUSED, recipe: bool = False,
            data: bool = False) -> Any:  # fmt: skip
    """A field of :class:`Settings`: ``check(value)`` tells a valid value (``must`` says which are); ``resume``: what
    ``--resume`` does when it changes; ``recipe``: a recipe may set it (it says how a model trains); ``data``: it
    changes the training data (runs that differ in it load data of their own)."""
    meta = dict(help=help, check=check, must=must, resume=resume, recipe=recipe, data=data)
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


def at_least(low: float):
    return lambda v: v >= low


def between(low: float, high: float, closed: bool = True):
    return (lambda v: low <= v <= high) if closed else (lambda v: low <= v < high)


@dataclass(frozen=True)
class Settings:
    """Every setting of a train.py run (``python train.py --help`` lists them by group)."""

    # data
    dataset: str = setting("synthetic", f"one of {', '.join(DATASETS)}", check=lambda v: v in DATASETS,
                           must=f"one of {DATASETS}")  # fmt: skip
    data_dir: str = setting(DATA_DIR, "dataset root: folders hold {train,val}/<class>/", check=lambda v: "\0" not in v,
                            must="a path (no NUL character)", resume=APPLIES)  # fmt: skip
    img_size: int = setting(32, "training resolution (px)", check=at_least(1), must="at least 1")
    num_frames: int = setting(8, "frames per clip (video datasets)", check=at_least(1), must="at least 1")
    train_samples: int = setting(4000, "training scenes or clips of the built-in synthetic data", check=at_least(1),
                                 must="at least 1")  # fmt: skip
    val_samples: int = setting(1000, "validation scenes or clips of the built-in synthetic data", check=at_least(1),
                               must="at least 1")  # fmt: skip
    train_subset: int = setting(0, "train on this many samples of the training split, the same for every seed (0: "
                                "all)", check=at_least(0), must="at least 0")  # fmt: skip
    val_subset: int = setting(0, "validate and evaluate on this many validation samples, always the same ones (0: "
                              "all)", check=at_least(0), must="at least 0")  # fmt: skip
    workers: int = setting(0, "DataLoader worker processes", check=at_least(0), must="at least 0", resume=APPLIES)
    naflex: bool = setting(False, "native resolution: train through timm's NaFlex loader, each image at its own aspect "
                           "ratio within a token budget, positions per patch (image datasets)", data=True)  # fmt: skip
    seq_lens: tuple[int, ...] = setting((64, 144, 256), "--naflex: token budgets of the training batches, one drawn "
                                        "per batch; a batch holds --batch-size × the largest budget's tokens",
                                        check=lambda v: len(v) and min(v) >= 1, must="budgets of at least 1 token",
                                        recipe=True, data=True)  # fmt: skip
    naflex_loss_scale: str = setting("linear", "--naflex: a batch of b images scales its loss by b / --batch-size "
                                     "(linear, as timm's train.py), its square root (sqrt) or not (none)",
                                     check=lambda v: v in ("linear", "sqrt", "none"),
                                     must="one of linear, sqrt, none", recipe=True)  # fmt: skip
    # model
    models: tuple[str, ...] = setting(("vit_ape_tiny", "vit_rope_tiny"), "timm models to compare: name or "
                                      "name:key=value,...", check=len, must="at least one model",
                                      resume=APPLIES)  # fmt: skip
    model_kwargs: dict[str, Any] = setting({}, "kwargs of every model as key=value (values in YAML: "
                                           "rope_axis_dims=[8,12,12])", recipe=True)  # fmt: skip
    imports: tuple[str, ...] = setting((), "Python modules to import before the models are built (families or "
                                       "models of your own): dotted module names, or paths of .py files",
                                       resume=APPLIES)  # fmt: skip
    initial_checkpoint: str | None = setting(None, "start from these weights: a .safetensors, a run's checkpoint.pt, "
                                             "or a model folder (a run's <model> folder, timm's save_for_hf), whose "
                                             "config.json then names the model and its kwargs")  # fmt: skip
    initial_checkpoint_sha256: str | None = setting(None, "sha256 of --initial-checkpoint's weights (a model folder's "
                                                    "model.safetensors): the run records it, --resume refuses a file "
                                                    "that has changed since; given, a file of another hash is refused",
                                                    check=lambda v: re.fullmatch(r"[0-9a-f]{64}", v) is not None,
                                                    must="64 lowercase hex digits", resume=APPLIES)  # fmt: skip
    allow_transfer: bool = setting(False, "let --initial-checkpoint load weights that record another kind of model "
                                   "(another position encoding or architecture): a deliberate transfer")  # fmt: skip
    pretrained: bool = setting(False, "start from the models' published weights")
    drop_path: float = setting(0.0, "stochastic depth rate", check=between(0, 1, closed=False), must="in [0, 1)",
                               recipe=True)  # fmt: skip
    # optimizer and schedule
    epochs: int = setting(10, "epochs per model", check=at_least(1), must="at least 1", resume=TRAINS_ON)
    batch_size: int = setting(64, "training batch size per process", check=at_least(1), must="at least 1",
                              recipe=True)  # fmt: skip
    opt: str = setting("adamw", "timm optimizer name", recipe=True)
    lr: float = setting(1e-3, "peak learning rate", check=at_least(0), must="at least 0", recipe=True)
    weight_decay: float = setting(0.05, "weight decay", check=at_least(0), must="at least 0", recipe=True)
    layer_decay: float | None = setting(None, "layer-wise LR decay (timm's, over the model's group_matcher): the last "
                                        "block trains at lr, each earlier one at this factor of the next",
                                        check=lambda v: 0 < v <= 1, must="in (0, 1]", recipe=True)  # fmt: skip
    sched: str = setting("cosine", "timm LR schedule name, stepped every update", recipe=True)
    warmup_epochs: int = setting(1, "epochs of linear warmup from lr / 100", check=at_least(0), must="at least 0",
                                 recipe=True)  # fmt: skip
    min_lr: float = setting(1e-5, "LR at the end of the schedule", check=at_least(0), must="at least 0", recipe=True)
    clip_grad: float = setting(1.0, "clip the gradient norm to this (0: off)", check=at_least(0), must="at least 0",
                               recipe=True)  # fmt: skip
    # augmentation and regularization
    label_smoothing: float = setting(0.1, "label smoothing of the loss", check=between(0, 1, closed=False),
                                     must="in [0, 1)", recipe=True)  # fmt: skip
    mixup: float = setting(0.0, "mixup alpha (0: off)", check=at_least(0), must="at least 0", recipe=True)
    cutmix: float = setting(0.0, "cutmix alpha (0: off)", check=at_least(0), must="at least 0", recipe=True)
    aug: bool = setting(True, "random-resized crops, flips and colour jitter when training (--no-aug: none)",
                        recipe=True, data=True)  # fmt: skip
    hflip: float = setting(0.5, "horizontal flip probability", check=between(0, 1), must="in [0, 1]", recipe=True,
                           data=True)  # fmt: skip
    vflip: float = setting(0.0, "vertical flip probability", check=between(0, 1), must="in [0, 1]", recipe=True,
                           data=True)  # fmt: skip
    color_jitter: float = setting(0.4, "colour jitter: brightness, contrast and saturation each scaled by a factor "
                                  "drawn from [1 - x, 1 + x] (0: off)", check=at_least(0), must="at least 0",
                                  recipe=True, data=True)  # fmt: skip
    scale: tuple[float, float] = setting((0.08, 1.0), "random-resized-crop area range: a b with 0 < a <= b <= 1",
                                         check=lambda v: len(v) == 2 and 0 < v[0] <= v[1] <= 1,
                                         must="two numbers a b with 0 < a <= b <= 1", recipe=True,
                                         data=True)  # fmt: skip
    auto_augment: str | None = setting(None, "timm auto-augment policy, e.g. rand-m9-mstd0.5-inc1", recipe=True,
                                       data=True)  # fmt: skip
    ema: bool = setting(False, "keep an EMA of the weights; it is what is evaluated and saved", recipe=True)
    ema_decay: float = setting(0.9998, "EMA decay per update (below 1: an EMA of decay 1 never moves from the initial "
                               "weights, which would be what is evaluated and saved)",
                               check=between(0, 1, closed=False), must="in [0, 1)", recipe=True)  # fmt: skip
    # evaluation
    eval_sizes: tuple[int, ...] = setting((32,), "resolutions to evaluate every model at",
                                          check=lambda v: len(v) and min(v) >= 1 and len(set(v)) == len(v),
                                          must="sizes of at least 1, each given once", resume=EVALUATES)  # fmt: skip
    eval_seq_lens: tuple[int, ...] = setting((), "token budgets to evaluate every model at native aspect ratio "
                                             "(timm's NaFlex loader; image datasets), beside --eval-sizes' square "
                                             "resize", check=lambda v: all(n >= 1 for n in v) and len(set(v)) == len(v),
                                             must="budgets of at least 1 token, each given once",
                                             resume=EVALUATES)  # fmt: skip
    native_eval: bool = setting(True, "also evaluate the built-in data drawn natively at each size", resume=EVALUATES)
    rope_scaling: tuple[str, ...] = setting(("none",), f"RoPE extrapolation modes to evaluate, from "
                                            f"{', '.join(SCALING_MODES)}", check=lambda v: len(set(v)) == len(v),
                                            must="modes each given once (a mode twice would count as two seeds)",
                                            resume=EVALUATES)  # fmt: skip
    eval_batch_size: int = setting(128, "evaluation batch size per process", check=at_least(1), must="at least 1",
                                   resume=APPLIES)  # fmt: skip
    eval_only: bool = setting(False, "evaluate --initial-checkpoint or --pretrained weights without training them "
                              "(--finetune-sizes: and fine-tuned copies of them)")  # fmt: skip
    finetune_sizes: tuple[int, ...] = setting((), "after training, fine-tune a copy of every model at each of these "
                                              "sizes (training images resized from the originals) for "
                                              "--finetune-steps steps, then evaluate it there (protocol 'finetune', "
                                              "beside the zero-shot rows)", check=lambda v: min(v, default=1) >= 1
                                              and len(set(v)) == len(v), must="sizes of at least 1, each given once",
                                              resume=EVALUATES)  # fmt: skip
    finetune_steps: int = setting(300, "optimizer updates of each fine-tuning (--finetune-sizes)", check=at_least(1),
                                  must="at least 1")  # fmt: skip
    finetune_lr: float = setting(1e-4, "peak learning rate of each fine-tuning: no warm-up, the --sched schedule "
                                 "over --finetune-steps down to --min-lr (or to this, where lower)", check=at_least(0),
                                 must="at least 0")  # fmt: skip
    finetune_scaling: tuple[str, ...] = setting(("none",), "RoPE extrapolation modes to fine-tune (and evaluate) "
                                                "under, one fine-tuning each; a model without RoPE fine-tunes once",
                                                check=lambda v: len(v) and len(set(v)) == len(v),
                                                must="modes each given once", resume=EVALUATES)  # fmt: skip
    # seeds and recipes
    seeds: tuple[int, ...] = setting((), "train every model once per seed (a run each); empty: --seed alone",
                                     check=lambda v: len(set(v)) == len(v) and all(0 <= s < 2**31 for s in v),
                                     must="distinct seeds in [0, 2**31 - 1]", resume=APPLIES)  # fmt: skip
    train_sizes: tuple[int, ...] = setting((), "train each batch at a size drawn from these (px); empty: at "
                                           "--img-size only", check=lambda v: all(s >= 1 for s in v),
                                           must="sizes of at least 1", recipe=True)  # fmt: skip
    train_sizes_from: str = setting("batch", "where a --train-sizes batch at another size than --img-size comes from: "
                                    "'batch', the batch drawn at --img-size then resized (no more detail than "
                                    "--img-size holds); 'originals', each image drawn from its original at the "
                                    "batch's size, as the test images are", check=lambda v: v in TRAIN_SIZES_FROM,
                                    must=" or ".join(TRAIN_SIZES_FROM), recipe=True)  # fmt: skip
    recipes: dict[str, Any] = setting(
        {},
        "recipe name → training keys it overrides; every model trains under each (empty: one recipe)",
        resume=APPLIES,
    )  # fmt: skip  (a recipe's keys: resumed)
    # run
    output: str = setting("runs/default", "folder of the run's outputs", check=lambda v: "\0" not in v,
                          must="a path (no NUL character)", resume=APPLIES)  # fmt: skip
    resume: bool = setting(False, "continue the run in --output from its last finished epochs", resume=APPLIES)
    overwrite: bool = setting(False, "start anew in an --output that holds a run: first delete that run's results, "
                              "log and config, and each of its runs' checkpoint.pt, model.safetensors, config.json and "
                              "results.json (by these names; other files stay)", resume=APPLIES)  # fmt: skip
    seed: int = setting(0, "seed of weights, data order and augmentation (of the one run per model without --seeds)",
                        check=between(0, 2**31 - 1), must="in [0, 2**31 - 1]")  # fmt: skip
    device: str = setting("auto", "auto, cpu, cuda, cuda:N or mps", resume=APPLIES)
    amp: bool = setting(False, "bfloat16 autocast")
    compile: bool = setting(False, "torch.compile the training steps (fine-tuning's too) and each epoch's validation "
                            "(the weights saved are the uncompiled module's; the evaluation at --eval-sizes runs "
                            "eagerly: each size and mode is one pass, and would be a graph of its own)",
                            resume=APPLIES)  # fmt: skip

    def __post_init__(self) -> None:
        for f in fields(self):
            object.__setattr__(self, f.name, checked(f, getattr(self, f.name)))
        for key in ("rope_scaling", "finetune_scaling"):
            bad = [m for m in getattr(self, key) if m not in SCALING_MODES]
            if bad or not getattr(self, key):
                flag = "--" + key.replace("_", "-")
                raise SystemExit(f"error: unknown {flag} mode(s) {bad}; choose from {list(SCALING_MODES)}")
        if self.min_lr > self.lr:
            raise SystemExit(f"error: --min-lr {self.min_lr} is above --lr {self.lr}; give a min_lr of at most lr")
        if (self.naflex or self.eval_seq_lens) and self.dataset in ("synthetic", *VIDEO_DATASETS):
            raise SystemExit(
                f"error: --naflex and --eval-seq-lens read images at their own size and aspect ratio; --dataset "
                f"{self.dataset} has none: use imagefolder (or cifar10, cifar100, mnist, fashion_mnist)"
            )
        if self.naflex and self.train_sizes:
            raise SystemExit(
                "error: --naflex draws each batch's size from --seq-lens (token budgets); leave out --train-sizes"
            )
        dropped = none_kwargs(self.model_kwargs)
        if dropped:
            raise SystemExit(dropped_message(f"--model-kwargs {dropped[0]}=null"))
        if self.resume and self.overwrite:
            raise SystemExit(
                "error: --resume continues the run in --output and --overwrite deletes it to start anew; give one of "
                "them"
            )
        if self.eval_only and not (self.initial_checkpoint or self.pretrained):
            raise SystemExit("error: --eval-only needs --initial-checkpoint PATH or --pretrained")
        for name in self.recipes:
            self.for_recipe(name)  # each recipe's values checked

    def for_recipe(self, name: str) -> "Settings":
        """The settings of one recipe ('' for a config without recipes): its keys on top, its model kwargs added to
        the shared ones (a model spec's own kwargs still come last)."""
        if not name:
            return self
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]+", name):
            raise SystemExit(
                f"error: recipe name {name!r}: use letters, digits, '_', '.' and '-' (it names the runs' folders)"
            )
        overrides = self.recipes[name]
        if not isinstance(overrides, dict | None):
            raise SystemExit(f"error: recipe {name!r} is {overrides!r}: give the keys it sets ({{}} for none)")
        overrides = overrides or {}
        if not isinstance(overrides.get("model_kwargs") or {}, dict):
            raise SystemExit(
                f"error: recipe {name!r}: model_kwargs {short(overrides['model_kwargs'])}: give a mapping of model "
                "kwargs (key: value lines)"
            )
        allowed = [f.name for f in fields(self) if f.metadata["recipe"]]
        other = sorted(map(str, set(overrides) - set(allowed)))
        if other:
            raise SystemExit(
                f"error: recipe {name!r} sets {other}: a recipe sets only how models train ({', '.join(allowed)}); "
                "the data, models, seeds, epochs, evaluation and run settings are shared by all recipes of a config"
            )
        kwargs = {**self.model_kwargs, **(overrides.get("model_kwargs") or {})}
        try:
            return replace(self, **{**overrides, "model_kwargs": kwargs, "recipes": {}})
        except SystemExit as e:
            raise SystemExit(str(e).replace("error: ", f"error: recipe {name!r}: ", 1)) from None

    def data_key(self) -> tuple:
        """What tells apart the data of two runs of one config: the settings that change the training data (a recipe
        may change them) and, where it draws the built-in data, the seed."""
        seed = self.seed if self.dataset in ("synthetic", "synthetic_video") else None
        return (*(repr(getattr(self, f.name)) for f in fields(self) if f.metadata["data"]), seed)

    def to_yaml(self) -> str:
        """The settings as a config file: a run's config.yaml, which ``--config`` takes back. It holds the one of
        ``seed`` and ``seeds`` that has effect (a file may not give both), and neither ``resume`` nor ``overwrite``:
        what to do with a folder is the command line's to say, so ``--config runs/x/config.yaml`` never deletes nor
        continues runs/x unasked."""
        plain = {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}
        for k in ("seed" if self.seeds else "seeds", "resume", "overwrite"):
            del plain[k]
        return yaml.safe_dump(plain, sort_keys=False)


NAMES = tuple(f.name for f in fields(Settings))
DICTS = ("model_kwargs", "recipes")
DEFAULTS = {f.name: {} if f.name in DICTS else f.default for f in fields(Settings)}
# the groups of --help: each begins at its first setting, in the class's order
GROUP_STARTS = {"dataset": "data", "models": "model", "epochs": "optimizer and schedule",
                "label_smoothing": "augmentation and regularization", "eval_sizes": "evaluation",
                "seeds": "seeds and recipes", "output": "run"}  # fmt: skip


# ----------------------------------------------------------------------------------------------- checking values
class _Mismatch(Exception):
    """A value that is not of its setting's type (the message: what it must be instead, if not the type)."""


def convert(value: Any, kind: Any) -> Any:
    """``value`` as a value of type ``kind`` (lists as tuples, integers as floats where a float is asked); raises
    _Mismatch where it is not one."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (UnionType, typing.Union):  # X | None
        return None if value is None else convert(value, args[0])
    if origin is tuple:  # (a fixed length is the range check's to enforce)
        if not isinstance(value, list | tuple):
            raise _Mismatch
        return tuple(convert(v, args[0]) for v in value)
    if origin is dict:
        if value is not None and not isinstance(value, dict):
            raise _Mismatch
        return dict(value or {})
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise _Mismatch("finite")
        return float(value)
    if kind in (bool, int, str) and isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise _Mismatch


def describe(kind: Any) -> str:
    """What a value of type ``kind`` is, for an error message."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (UnionType, typing.Union):
        return describe(args[0])
    if origin is tuple:
        return f"a list of {describe(args[0])}"
    if origin is dict:
        return "a mapping of keys to values"
    return kind.__name__


def checked(f: Any, value: Any) -> Any:
    """A field's value converted to its type and checked against its range: one line naming the setting if not."""
    flag = "--" + f.name.replace("_", "-")
    try:
        converted = convert(value, f.type)
    except _Mismatch as e:
        raise SystemExit(
            f"error: {flag} {short(value)}: {f.name} must be {e.args[0] if e.args else describe(f.type)}"
        ) from None
    check = f.metadata["check"]
    if converted is not None and check is not None and not check(converted):
        raise SystemExit(f"error: {flag} {short(value)}: {f.name} must be {f.metadata['must']}")
    return converted


def none_kwargs(kwargs: dict) -> list[str]:
    """The model kwargs whose value is None (YAML's null): ``timm.create_model`` drops them, so the model keeps its
    default while config.yaml would record null."""
    return [str(k) for k, v in kwargs.items() if v is None]


def dropped_message(what: str) -> str:
    return (
        f"error: {what}: timm's create_model drops a kwarg whose value is None, so the model would keep its default "
        "while config.yaml records null; leave the kwarg out for the default, or give a value (init_values=0 turns "
        "LayerScale off)"
    )


def short(value: Any, limit: int = 160) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error line stays one readable line, whatever a file held."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# ------------------------------------------------------------------------------------------ files and flags
class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader (plain data only), refusing a key given twice in one mapping instead of keeping the last."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, str | int | float | bool | None):  # a list or mapping as a key: not a setting
                raise yaml.constructor.ConstructorError(
                    None, None, f"a {type(key).__name__} as a key ({short(key, 60)})", key_node.start_mark
                )
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} is given twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


MAX_CONFIG_BYTES = 1 << 20  # a config is a page of settings; a larger file is not one
MAX_NODES = 100_000  # values in a config with every alias expanded: aliases cannot make a small file huge


def expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``node`` holds with every alias expanded; a YAMLError for a node that holds itself (an alias
    of an anchor inside it) or for more than :data:`MAX_NODES`."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise yaml.YAMLError("an alias refers to a value that holds it (a recursive value is no setting)")
    open_.add(id(node))
    children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else (
        node.value if isinstance(node, yaml.SequenceNode) else [])  # fmt: skip
    size = 1 + sum(expanded_size(c, sizes, open_) for c in children)
    open_.discard(id(node))
    if size > MAX_NODES:
        raise yaml.YAMLError(f"its aliases expand to more than {MAX_NODES} values")
    sizes[id(node)] = size
    return size


def read_yaml(path: str | Path, what: str, own: bool = False) -> dict:
    """A YAML file of settings; a missing or malformed one (a key twice, a Python tag, not UTF-8, recursive or
    exploding aliases, ...) is one line naming the file and the place. ``own``: a file a run wrote (its config.yaml),
    read only if it is a regular file and not a link."""
    fix = "fix it there" if not own else "resume with the config.yaml the run wrote, or start anew in another --output"
    if own:
        data = read_own(Path(path), what, fix)
        if data is None:
            raise SystemExit(f"error: {what} {str(path)!r} not found")
    else:
        if not Path(path).is_file():  # (a FIFO or folder would block or fail to read)
            raise SystemExit(f"error: {what} {str(path)!r} not found, or not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)  # (a huge file is refused, not read whole)
    if len(data) > MAX_CONFIG_BYTES:
        raise SystemExit(f"error: {what} {str(path)!r} is larger than {MAX_CONFIG_BYTES} bytes: not a config; {fix}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SystemExit(
            f"error: {what} {str(path)!r} is not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r}); save it "
            f"as UTF-8, or {fix}"
        ) from None
    loader = _UniqueKeys(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            expanded_size(node, {}, set())
        loaded = (loader.construct_document(node) if node is not None else None) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SystemExit(f"error: {what} {str(path)!r} is not valid YAML: {problem}{where}; {fix}") from None
    finally:
        loader.dispose()
    if not isinstance(loaded, dict):
        raise SystemExit(f"error: {what} {str(path)!r} holds a {type(loaded).__name__}, not `key: value` lines")
    return loaded


def key_value(text: str) -> tuple[str, Any]:
    """``key=value``, the value read as YAML (``[8,12,12]``, ``true``, ``0.5``, a plain string)."""
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


def argument_parser(description: str, now: dict, config: str) -> argparse.ArgumentParser:
    """A flag per setting, in the groups of --help, each saying its value under the config file; a flag not given
    is absent from the parsed namespace."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--config", default=config, help=f"YAML config whose keys the flags override (now {config})")
    groups = {}
    for f in fields(Settings):
        title = GROUP_STARTS.get(f.name) or next(reversed(groups))
        g = groups.setdefault(title, parser.add_argument_group(title))
        flag, origin = "--" + f.name.replace("_", "-"), typing.get_origin(f.type)
        kw = dict(default=argparse.SUPPRESS, help=f"{f.metadata['help']} (now: {now[f.name]!r})")
        if f.type is bool:
            g.add_argument(flag, action=argparse.BooleanOptionalAction, **kw)
        elif origin is dict:
            g.add_argument(flag, nargs="*", type=key_value, metavar="KEY=VALUE", **kw)
        elif origin is tuple:
            nargs = "*" if DEFAULTS[f.name] == () else "+"
            g.add_argument(flag, nargs=nargs, type=typing.get_args(f.type)[0], **kw)
        else:
            kind = typing.get_args(f.type)[0] if origin in (UnionType, typing.Union) else f.type
            g.add_argument(flag, type=kind, **kw)
    return parser


def parse(argv: list[str] | None, default_config: str | Path, description: str) -> tuple[Settings, dict]:
    """Settings from a YAML config (``--config``, else ``default_config``) overridden by flags; and what the command
    line sets (its flags, and the keys of a ``--config`` it names), which ``--resume`` applies to a saved run."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config")
    named = pre.parse_known_args(argv)[0].config
    path = named or str(default_config)
    loaded = read_yaml(path, "config file")
    unknown = sorted(map(str, set(loaded) - set(NAMES)))
    if unknown:
        raise SystemExit(f"error: unknown config key(s) {short(unknown)} in {path}; valid keys: {sorted(NAMES)}")
    if {"seed", "seeds"} <= set(loaded) and (not loaded["seeds"] or loaded["seed"] == DEFAULTS["seed"]):
        # a run's config.yaml written before to_yaml kept one of them: drop the one without effect (empty seeds,
        # or the default seed beside seeds); a file that gives both otherwise is refused below
        loaded.pop("seeds" if not loaded["seeds"] else "seed")
    flags = vars(argument_parser(description, {**DEFAULTS, **loaded}, path).parse_args(argv))
    flags.pop("config")
    for k in DICTS:  # flags add to the file's mapping
        if k in flags:
            flags[k] = {**(loaded.get(k) or {}), **dict(flags[k])}
    for where, keys in (("the command line", flags), (f"config file {path!r}", loaded)):
        if {"seed", "seeds"} <= set(keys):
            raise SystemExit(
                f"error: {where} gives both seed and seeds; give seeds for one run per seed, or seed for one run"
            )
    if "seed" in flags:  # --seed on the command line means that one seed
        flags["seeds"] = ()
    named_in_file(loaded.get("imports"), flags.get("imports"), f"config file {path!r}")
    flags["imports"] = flags.get("imports", ())  # code runs only where this command line names it, never a file
    given = {**(loaded if named else {}), **flags}
    return Settings(**{**DEFAULTS, **loaded, **flags}), given


def named_in_file(in_file: Any, on_argv: Any, where: str) -> None:
    """Modules a file names for ``--imports`` and this command line does not: one line. Nothing a run reads runs code
    (a config received from someone else is data); the user imports a module by naming it in the command."""
    missing = [m for m in (in_file or ()) if m not in (on_argv or ())] if isinstance(in_file, list | tuple) else in_file
    if missing:
        names = " ".join(map(str, missing)) if isinstance(missing, list) else short(missing)
        raise SystemExit(
            f"error: {where} names imports {short(missing)}, which are not imported: nothing read from a file runs "
            f"code; if you trust them, name them on the command line (--imports {names})"
        )


def resumed(settings: Settings, given: dict) -> Settings:
    """With ``--resume`` and a run in ``--output``: its saved settings, with what the command line changes where that
    is allowed (the fields' ``resume``); a change that would mix two recipes in one table is one line."""
    saved_path = Path(settings.output) / "config.yaml"
    if not settings.resume or not (saved_path.exists() or saved_path.is_symlink()):
        return settings
    values = read_yaml(saved_path, "the run's config", own=True)
    unknown = sorted(map(str, set(values) - set(NAMES)))
    if unknown:
        raise SystemExit(f"error: the run's config {str(saved_path)!r} has unknown key(s) {unknown}; resume it with "
                         "the train.py that made it, or start a new run in another --output")  # fmt: skip
    saved = Settings(**{**DEFAULTS, **values})
    named_in_file(saved.imports, given.get("imports"), f"the run's config {str(saved_path)!r}")
    merged = {k: {**getattr(saved, k), **given[k]} for k in DICTS if k in given}
    new = replace(saved, **{**given, **merged, "resume": True, "output": settings.output, "overwrite": False})
    refused = [
        (f.name, getattr(saved, f.name), getattr(new, f.name))
        for f in fields(Settings)
        if f.metadata["resume"] == REFUSED and getattr(new, f.name) != getattr(saved, f.name)
    ]
    refused += [
        (f"recipe {name!r}", old, new.recipes[name])
        for name, old in saved.recipes.items()
        if (old or {}) != (new.recipes.get(name, old) or {})
    ]
    if refused:
        changes = ", ".join(f"{k} {old!r} -> {now!r}" for k, old, now in refused)
        raise SystemExit(
            f"error: --resume cannot change {changes}: the run in {settings.output} was trained with the saved "
            "value(s), and its results must come from one recipe; resume without the change, or start a new run "
            "with another --output"
        )
    return new
