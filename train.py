"""Train image/video classifiers with different position embeddings under one recipe, then evaluate each at
resolutions it never saw: the APE-vs-RoPE comparison.

    python train.py                                   # configs/default.yaml: offline, 2-core CPU, ~10 min
    python train.py --config configs/cifar10.yaml     # any config key is also a flag: --epochs 3 --lr 1e-3 ...
    torchrun --nproc_per_node 8 train.py --config configs/imagenet_deit3_s.yaml --data-dir /data/imagenet
    python train.py --output runs/x --resume          # continue a killed run from its last finished epoch

Outputs in --output: results.csv / results.md (one row per model, eval size, protocol and RoPE scaling mode),
accuracy_vs_resolution.png, log.csv (per epoch), config.yaml (resolved), <model>/model.safetensors (last
weights) and <model>/checkpoint.pt (resume state, written atomically every epoch).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import pickle
import random
import re
import sys
import time
from pathlib import Path

import numpy as np
import timm
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup, create_transform, resolve_data_config
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3, accuracy
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

import vit_rope  # noqa: F401  (registers the models)
from vit_rope import data as D
from vit_rope.checkpoint import checkpoint_filter_fn, inflate_image_checkpoint
from vit_rope.rope import SCALING_MODES

HERE = Path(__file__).resolve().parent

# Every config key, its default and (for None defaults) its type. A YAML key not listed here is an error.
DEFAULTS: dict = dict(
    dataset="synthetic",
    data_dir="data",
    models=["vit_ape_tiny", "vit_rope_tiny"],  # name or name:key=value,... (per-model kwargs)
    model_kwargs={},
    img_size=32,
    num_frames=8,
    eval_sizes=[32],
    native_eval=True,
    rope_scaling=["none"],
    train_samples=4000,
    val_samples=1000,
    epochs=10,
    batch_size=64,
    lr=1e-3,
    weight_decay=0.05,
    opt="adamw",
    sched="cosine",
    warmup_epochs=1,
    min_lr=1e-5,
    label_smoothing=0.1,
    mixup=0.0,
    cutmix=0.0,
    no_aug=False,
    hflip=0.5,
    scale=[0.08, 1.0],
    auto_augment=None,
    drop_path=0.0,
    clip_grad=1.0,
    ema=False,
    ema_decay=0.9998,
    seed=0,
    output="runs/default",
    resume=False,
    device="auto",
    amp=False,
    workers=0,
    initial_checkpoint=None,
    pretrained=False,
    eval_only=False,
    eval_batch_size=128,
)
NONE_TYPES = {"auto_augment": str, "initial_checkpoint": str}
SCALING_LABELS = {
    "none": "none",
    "pi": "position interpolation",
    "ntk": "NTK-aware",
    "yarn": "YaRN",
    "normalized": "normalized",
}


# ----------------------------------------------------------------------------------------------------- config
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


def parse_config(argv: list[str] | None = None) -> tuple[dict, set[str]]:
    """YAML config (``--config``) overridden by flags; every key is a flag (``eval_sizes`` → ``--eval-sizes``).

    Returns the config and the keys given as flags (they also override a resumed run's saved config).
    """
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=str(HERE / "configs" / "default.yaml"))
    known, rest = pre.parse_known_args(argv)
    cfg = dict(DEFAULTS)
    if not os.path.isfile(known.config):
        raise SystemExit(f"error: config file {known.config!r} not found")
    with open(known.config) as f:
        loaded = yaml.safe_load(f) or {}
    unknown = sorted(set(loaded) - set(DEFAULTS))
    if unknown:
        raise SystemExit(f"error: unknown config key(s) {unknown} in {known.config}; valid keys: {sorted(DEFAULTS)}")
    cfg.update(loaded)

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--config", default=known.config, help="YAML config whose keys the flags below override")
    for key, default in DEFAULTS.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(default, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=cfg[key])
        elif isinstance(default, dict):
            parser.add_argument(flag, nargs="*", type=_kv, default=None, metavar="KEY=VALUE")
        elif isinstance(default, list):
            parser.add_argument(flag, nargs="+", type=type(default[0]), default=cfg[key])
        else:
            parser.add_argument(flag, type=NONE_TYPES.get(key, type(default)), default=cfg[key])
    args = vars(parser.parse_args(rest))
    args["model_kwargs"] = {**cfg["model_kwargs"], **dict(args["model_kwargs"] or [])}
    given = set()
    for a in rest:
        key = a.split("=")[0][2:].replace("-", "_")
        if a.startswith("--") and (key in DEFAULTS or key.removeprefix("no_") in DEFAULTS):
            given.add(key if key in DEFAULTS else key.removeprefix("no_"))
    return args, given


# ---------------------------------------------------------------------------------------------- distributed
def setup_distributed(cfg: dict) -> tuple[torch.device, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    want = cfg["device"]
    if want == "auto":
        want = "cuda" if torch.cuda.is_available() else "cpu"
    if world > 1:
        dist.init_process_group("nccl" if want == "cuda" else "gloo")
        rank = dist.get_rank()
        if want == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            return torch.device("cuda", torch.cuda.current_device()), rank, world
        return torch.device(want), rank, world
    return torch.device(want), 0, 1


def all_sum(values: list[float], device) -> list[float]:
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


# ------------------------------------------------------------------------------------------------------ data
def is_video(cfg: dict) -> bool:
    return cfg["dataset"] in D.VIDEO_DATASETS


class Resized(Dataset):
    """Video clips resized spatially (the 'resize' protocol for clips)."""

    def __init__(self, ds: Dataset, size: int) -> None:
        self.ds, self.size = ds, size

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        clip, y = self.ds[i]
        return F.interpolate(clip, size=(self.size, self.size), mode="bilinear", antialias=True, align_corners=False), y


class NativeVideo(Dataset):
    def __init__(self, ds: D.SyntheticMotion, size: int) -> None:
        self.ds, self.size = ds, size

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        clip, y = self.ds.render(i, (self.size, self.size))
        return (clip - self.ds.mean) / self.ds.std, y


class NativeImages(Dataset):
    """The synthetic validation scenes drawn natively at another size."""

    def __init__(self, ds: D.SyntheticScenes, size: int, transform) -> None:
        self.ds, self.size, self.transform = ds, size, transform

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        img, y = self.ds.render(i, (self.size, self.size))
        return self.transform(img), y


def _normalize(mean, std):
    m, s = torch.tensor(mean)[:, None, None], torch.tensor(std)[:, None, None]
    return lambda img: (img - m) / s


def image_transforms(cfg: dict, dc: dict) -> tuple:
    train_tf = create_transform(
        input_size=(3, cfg["img_size"], cfg["img_size"]),
        is_training=True,
        no_aug=cfg["no_aug"],
        hflip=cfg["hflip"],
        scale=tuple(cfg["scale"]),
        auto_augment=cfg["auto_augment"],
        interpolation="bicubic",
        mean=dc["mean"],
        std=dc["std"],
    )

    def eval_tf(size: int):
        # the whole image, resized (shorter side to size, centre crop at ratio 1.0: RoPE-ViT's protocol)
        return create_transform(
            input_size=(3, size, size), crop_pct=1.0, interpolation="bicubic", mean=dc["mean"], std=dc["std"]
        )

    return train_tf, eval_tf


def build_data(cfg: dict, dc: dict) -> tuple[Dataset, callable, int]:
    """The training set, a factory ``(size, protocol) -> eval dataset``, and the number of classes; ``dc`` is the
    model's data config (its normalisation)."""
    name, root = cfg["dataset"], cfg["data_dir"]
    if name not in D.IMAGE_DATASETS + D.VIDEO_DATASETS:
        raise SystemExit(f"error: unknown dataset {name!r}; choose one of {D.IMAGE_DATASETS + D.VIDEO_DATASETS}")
    if name == "synthetic_video":
        kw = dict(
            img_size=cfg["img_size"], num_frames=cfg["num_frames"], seed=cfg["seed"], mean=dc["mean"], std=dc["std"]
        )
        train = D.SyntheticMotion(cfg["train_samples"], split="train", **kw)
        val = D.SyntheticMotion(cfg["val_samples"], split="val", **kw)
        return train, (lambda s, p: NativeVideo(val, s) if p == "native" else Resized(val, s)), val.num_classes
    if name in ("imagefolder", "clipfolder"):
        return folder_data(cfg, dc)
    train_tf, eval_tf = image_transforms(cfg, dc)
    if name == "synthetic":
        train = D.SyntheticScenes(cfg["train_samples"], cfg["img_size"], cfg["seed"], "train", transform=train_tf)
        val = D.SyntheticScenes(cfg["val_samples"], cfg["img_size"], cfg["seed"], "val")

        def make(size, protocol):
            if protocol == "native":
                return NativeImages(val, size, _normalize(dc["mean"], dc["std"]))
            return D.SyntheticScenes(cfg["val_samples"], cfg["img_size"], cfg["seed"], "val", transform=eval_tf(size))

        return train, make, val.num_classes
    train = None if cfg["eval_only"] else D.torchvision_dataset(name, root, True, train_tf)
    val = D.torchvision_dataset(name, root, False, eval_tf(cfg["img_size"]))
    return train, (lambda s, p: D.torchvision_dataset(name, root, False, eval_tf(s))), len(val.classes)


def folder_data(cfg: dict, dc: dict) -> tuple[Dataset | None, callable, int]:
    """``build_data`` for ``imagefolder`` and ``clipfolder``: every split numbered as the training split (torchvision
    sorts each folder's classes on its own), the class count from it (from val with --eval-only and no train/), and
    clips read from their frames at each evaluation size."""
    name, root = cfg["dataset"], cfg["data_dir"]
    layout = (
        "root/train/<class>/ and root/val/<class>/"
        if name == "imagefolder"
        else "root/{train,val}/<class>/<clip>/<frames>"
    )
    train_root, val_root = os.path.join(root, "train"), os.path.join(root, "val")
    for split in (train_root, val_root):
        if not os.path.isdir(split) and not (split == train_root and cfg["eval_only"]):
            raise SystemExit(f"error: {split!r} is missing; {name} needs {layout}")
    if name == "imagefolder":
        train_tf, eval_tf = image_transforms(cfg, dc)

        def make(root: str, size: int, class_to_idx: dict | None = None, train: bool = False) -> Dataset:
            return D.CheckedImageFolder(root, train_tf if train else eval_tf(size), class_to_idx)
    else:

        def make(root: str, size: int, class_to_idx: dict | None = None, train: bool = False) -> Dataset:
            # read at the requested size: resizing clips already shrunk to img_size would upsample them
            return D.ClipFolder(root, size, cfg["num_frames"], dc["mean"], dc["std"], class_to_idx)

    train = None
    if not cfg["eval_only"]:
        train = make(train_root, cfg["img_size"], train=True)
        class_to_idx = train.class_to_idx
    elif os.path.isdir(train_root):  # evaluating a model trained on this folder: its numbering
        class_to_idx = D.class_folders(train_root)
    else:
        class_to_idx = make(val_root, cfg["img_size"]).class_to_idx
    make(val_root, cfg["img_size"], class_to_idx)  # a val class training never saw is an error now, not after training
    return train, (lambda s, p: make(val_root, s, class_to_idx)), len(class_to_idx)


# ----------------------------------------------------------------------------------------------------- model
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
    if is_video(cfg):
        kwargs.setdefault("num_frames", cfg["num_frames"])
    if cfg["drop_path"]:
        kwargs.setdefault("drop_path_rate", cfg["drop_path"])
    return name, kwargs


def check_eval_config(cfg: dict) -> None:
    """Settings that evaluation would reject, checked before any training: unknown RoPE scaling modes and eval
    sizes a model's patch size does not divide (unless it pads)."""
    bad = [m for m in cfg["rope_scaling"] if m not in SCALING_MODES]
    if bad:
        raise SystemExit(f"error: unknown --rope-scaling mode(s) {bad}; choose from {list(SCALING_MODES)}")
    for spec in dict.fromkeys(cfg["models"]):
        name, kwargs = model_args(cfg, spec)
        # the built model's own patch size (a registered default or a kwarg), from one block: the patch size does not
        # depend on depth, and a large model's other blocks would cost seconds and memory; nothing is loaded
        model = timm.create_model(name, num_classes=1, **{**kwargs, "depth": 1})
        patch_embed = getattr(model, "patch_embed", None)
        if patch_embed is None or getattr(patch_embed, "dynamic_img_pad", False):
            continue
        ph, pw = patch_embed.patch_size[-2:]
        bad = [s for s in cfg["eval_sizes"] if s % ph or s % pw]
        if bad:
            pad = "" if is_video(cfg) else " (or give the model dynamic_img_pad=True to pad)"
            raise SystemExit(
                f"error: --eval-sizes {bad} are not multiples of the patch size {ph}x{pw} of {spec}; "
                f"choose multiples of it{pad}"
            )


def build_model(cfg: dict, spec: str, num_classes: int):
    name, kwargs = model_args(cfg, spec)
    try:
        model = timm.create_model(name, pretrained=cfg["pretrained"], num_classes=num_classes, **kwargs)
    except RuntimeError as e:
        if cfg["pretrained"]:
            raise SystemExit(
                f"error: could not fetch pretrained weights for {name} ({e}); use --initial-checkpoint PATH offline"
            ) from e
        raise
    if cfg["initial_checkpoint"]:
        path = cfg["initial_checkpoint"]
        if not os.path.isfile(path):
            raise SystemExit(f"error: --initial-checkpoint {path!r} does not exist")
        filter_fn = inflate_image_checkpoint if is_video(cfg) else checkpoint_filter_fn
        try:  # a train.py checkpoint.pt gives its EMA weights (timm's key model_ema) if it has them, else its model's
            timm.models.load_checkpoint(model, path, filter_fn=filter_fn)
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


# -------------------------------------------------------------------------------------------------- training
def atomic_write(path: Path, write, obj) -> None:
    """``write(obj, tmp)``, then rename over the target: a kill never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    write(obj, str(tmp))
    os.replace(tmp, path)


def write_json(obj, path: str) -> None:
    Path(path).write_text(json.dumps(obj))


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


def write_csv(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def make_loader(ds: Dataset, cfg: dict, train: bool, epoch: int, rank: int, world: int) -> DataLoader:
    """Epoch-seeded shuffling, sharded over ranks: the order depends only on (seed, epoch), so resuming works."""
    n = len(ds)
    if train:
        g = torch.Generator().manual_seed(cfg["seed"] * 100_003 + epoch)
        order = torch.randperm(n, generator=g).tolist()
        order = order[: n - n % world] if world > 1 else order
    else:
        order = list(range(n))
    indices = order[rank::world]
    bs = cfg["batch_size"] if train else cfg["eval_batch_size"]
    return DataLoader(
        torch.utils.data.Subset(ds, indices),
        batch_size=bs,
        shuffle=False,
        num_workers=cfg["workers"],
        drop_last=train and len(indices) >= bs,
    )


@torch.no_grad()
def evaluate(model, loader, device, amp: bool) -> dict:
    model.eval()
    loss_sum = top1 = top5 = count = 0.0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            out = model(x)
        loss_sum += F.cross_entropy(out.float(), y, reduction="sum").item()
        a1, a5 = accuracy(out, y, topk=(1, min(5, out.shape[1])))
        top1 += a1.item() * x.shape[0] / 100
        top5 += a5.item() * x.shape[0] / 100
        count += x.shape[0]
    loss_sum, top1, top5, count = all_sum([loss_sum, top1, top5, count], device)
    return dict(loss=loss_sum / max(count, 1), top1=100 * top1 / max(count, 1), top5=100 * top5 / max(count, 1))


def train_model(cfg: dict, name: str, tag: str, out: Path, device, rank: int, world: int) -> tuple:
    """Train one model (resuming from its checkpoint if asked); returns the model and its eval-set factory."""
    seed_everything(cfg["seed"])
    train_ds, eval_set, num_classes = build_data(cfg, data_config(cfg, name))
    seed_everything(cfg["seed"])
    model = build_model(cfg, name, num_classes).to(device)
    if cfg["eval_only"]:
        if not (cfg["initial_checkpoint"] or cfg["pretrained"]):
            raise SystemExit("error: --eval-only needs --initial-checkpoint PATH or --pretrained")
        return model, eval_set
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    seed_everything(cfg["seed"] + rank)  # same weights on every rank (DDP syncs them), own dropout/mixup draws
    optimizer = create_optimizer_v2(model, cfg["opt"], lr=cfg["lr"], weight_decay=cfg["weight_decay"])
    steps = max(len(train_ds) // world // cfg["batch_size"], 1)
    scheduler, _ = create_scheduler_v2(
        optimizer,
        cfg["sched"],
        num_epochs=cfg["epochs"],
        warmup_epochs=cfg["warmup_epochs"],
        min_lr=cfg["min_lr"],
        warmup_lr=cfg["lr"] * 0.01,
        step_on_epochs=False,
        updates_per_epoch=steps,
    )
    mix = cfg["mixup"] > 0 or cfg["cutmix"] > 0
    mixup = (
        Mixup(
            mixup_alpha=cfg["mixup"],
            cutmix_alpha=cfg["cutmix"],
            label_smoothing=cfg["label_smoothing"],
            num_classes=num_classes,
        )
        if mix
        else None
    )
    criterion = (
        SoftTargetCrossEntropy()
        if mix
        else LabelSmoothingCrossEntropy(cfg["label_smoothing"])
        if cfg["label_smoothing"]
        else torch.nn.CrossEntropyLoss()
    )
    ema = ModelEmaV3(model, decay=cfg["ema_decay"]) if cfg["ema"] else None

    ckpt_path, start = model_dir(out, tag) / "checkpoint.pt", 0
    if cfg["resume"] and ckpt_path.exists():
        state = torch.load(ckpt_path, map_location="cpu", weights_only=False)  # RNG states must stay on the CPU
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        ema_state = state.get("model_ema", state.get("ema"))  # "ema" in checkpoints of older train.py
        if ema is not None and ema_state is not None:
            ema.load_state_dict(ema_state)
        restore_rng_state(state["rng"], rank, world)
        start = state["epoch"] + 1
        # timm's schedulers compute the LR from the update index alone, so the scheduler is not restored: built
        # from this config it follows a changed --epochs/--lr, and an unchanged one sets the LR the uninterrupted
        # run's last step_update set
        scheduler.step_update(start * steps)
        if rank == 0:
            print(f"[{tag}] resumed after epoch {start} of {cfg['epochs']}", flush=True)
    if cfg["resume"] and rank == 0:
        drop_log_rows(out / "log.csv", tag, after=start)

    for epoch in range(start, cfg["epochs"]):
        ddp.train()
        loader = make_loader(train_ds, cfg, True, epoch, rank, world)
        bar = tqdm(
            loader, desc=f"{tag} epoch {epoch + 1}/{cfg['epochs']}", disable=None if rank == 0 else True, leave=False
        )
        loss_sum = correct = seen = 0.0
        t0 = time.time()
        for step, (x, y) in enumerate(bar):
            x, y = x.to(device), y.to(device)
            target = y
            if mixup is not None:
                x, target = mixup(x, y)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg["amp"]):
                logits = ddp(x)
                loss = criterion(logits.float(), target)
            if not torch.isfinite(loss):
                raise SystemExit(
                    f"error: [{tag}] the loss became {loss.item()} at epoch {epoch + 1}, step {step + 1}; stopping. "
                    f"The last good checkpoint is {ckpt_path} (lower --lr, raise --warmup-epochs or keep --clip-grad)"
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg["clip_grad"]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["clip_grad"])
            optimizer.step()
            scheduler.step_update(epoch * steps + step + 1)
            if ema is not None:
                ema.update(model)
            loss_sum += loss.item() * x.shape[0]
            correct += (logits.argmax(-1) == y).sum().item()
            seen += x.shape[0]
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}")
        loss_sum, correct, seen = all_sum([loss_sum, correct, seen], device)
        eval_model = ema.module if ema is not None else model
        val = evaluate(
            eval_model, make_loader(eval_set(cfg["img_size"], "resize"), cfg, False, 0, rank, world), device, cfg["amp"]
        )
        rngs = all_rng_states()  # every rank's, so that each resumes its own draws
        if rank == 0:
            row = dict(
                model=tag,
                epoch=epoch + 1,
                train_loss=loss_sum / seen,
                train_top1=100 * correct / seen,
                val_loss=val["loss"],
                val_top1=val["top1"],
                lr=optimizer.param_groups[0]["lr"],
                seconds=time.time() - t0,
            )
            append_csv(out / "log.csv", row)
            print(
                f"[{tag}] epoch {epoch + 1}/{cfg['epochs']}  "
                f"train loss {row['train_loss']:.3f} acc {row['train_top1']:.1f}  "
                f"val loss {val['loss']:.3f} acc {val['top1']:.1f}  ({row['seconds']:.0f}s)",
                flush=True,
            )
            state = dict(
                model=model.state_dict(),
                optimizer=optimizer.state_dict(),
                model_ema=ema.state_dict() if ema is not None else None,  # timm's key: load_checkpoint finds it
                epoch=epoch,
                rng=rngs,
            )
            model_dir(out, tag).mkdir(parents=True, exist_ok=True)
            weights = {k: v.detach().cpu().contiguous() for k, v in eval_model.state_dict().items()}
            atomic_write(model_dir(out, tag) / "model.safetensors", save_file, weights)
            atomic_write(ckpt_path, torch.save, state)
        if dist.is_initialized():
            dist.barrier()
    if ema is not None:
        model.load_state_dict(ema.module.state_dict())
    return model, eval_set


def model_dir(out: Path, tag: str) -> Path:
    """A filesystem-safe folder per model spec (``name:k=v`` → ``name__k=v``)."""
    return out / re.sub(r"[^\w.=-]", "_", tag.replace(":", "__"))


def append_csv(path: Path, row: dict) -> None:
    new = not path.exists()
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(row))
        if new:
            w.writeheader()
        w.writerow(row)


# ------------------------------------------------------------------------------------------------ evaluation
def scaling_modes(model, modes: list[str]) -> list[str]:
    """The RoPE scaling modes that apply to this model ('-' for models without RoPE): learned mixed frequencies
    have no ladder for NTK or YaRN to rescale, and YaRN's temperature would scale v and o under VO-RoPE."""
    supported = model.rope_scaling_modes() if hasattr(model, "rope_scaling_modes") else ()
    return [m for m in modes if m in supported] if supported else ["-"]


def evaluate_sizes(cfg, model, tag, eval_set, device, rank, world) -> list[dict]:
    protocols = ["resize"] + (
        ["native"] if cfg["native_eval"] and cfg["dataset"] in ("synthetic", "synthetic_video") else []
    )
    params = sum(p.numel() for p in model.parameters())
    rows = []
    modes = scaling_modes(model, cfg["rope_scaling"])
    jobs = [(p, s, m) for p in protocols for s in cfg["eval_sizes"] for m in modes]
    for protocol, size, mode in tqdm(jobs, desc=f"{tag} eval", disable=None if rank == 0 else True, leave=False):
        if mode != "-":
            model.set_rope_scaling(mode)
        r = evaluate(model, make_loader(eval_set(size, protocol), cfg, False, 0, rank, world), device, cfg["amp"])
        rows.append(
            dict(
                model=tag,
                train_size=cfg["img_size"],
                eval_size=size,
                protocol=protocol,
                rope_scaling=mode,
                top1=round(r["top1"], 2),
                top5=round(r["top5"], 2),
                loss=round(r["loss"], 4),
                params=params,
            )
        )
    if modes != ["-"]:
        model.set_rope_scaling("none")
    return rows


def write_results(rows: list[dict], out: Path, cfg: dict) -> None:
    write_csv(rows, str(out / "results.csv"))
    sizes = sorted({r["eval_size"] for r in rows})
    lines = []
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        lines.append(f"\n**top-1 (%), trained at {cfg['img_size']}, evaluated with protocol `{protocol}`**\n")
        lines.append("| model | RoPE scaling | params | " + " | ".join(str(s) for s in sizes) + " |")
        lines.append("|---|---|---|" + "---|" * len(sizes))
        for key in dict.fromkeys((r["model"], r["rope_scaling"]) for r in rows if r["protocol"] == protocol):
            cells = {
                r["eval_size"]: r for r in rows if (r["model"], r["rope_scaling"]) == key and r["protocol"] == protocol
            }
            params = next(iter(cells.values()))["params"]
            lines.append(
                f"| {key[0]} | {key[1]} | {params / 1e6:.2f}M | "
                + " | ".join(f"{cells[s]['top1']:.1f}" if s in cells else "" for s in sizes)
                + " |"
            )
    (out / "results.md").write_text("\n".join(lines).lstrip() + "\n")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    fig, axes = plt.subplots(1, len(protocols), figsize=(6 * len(protocols), 5.5), squeeze=False)
    for ax, protocol in zip(axes[0], protocols, strict=True):
        for key in dict.fromkeys((r["model"], r["rope_scaling"]) for r in rows if r["protocol"] == protocol):
            pts = sorted(
                (r["eval_size"], r["top1"])
                for r in rows
                if (r["model"], r["rope_scaling"]) == key and r["protocol"] == protocol
            )
            label = key[0] if key[1] in ("-", "none") else f"{key[0]} ({SCALING_LABELS.get(key[1], key[1])})"
            ax.plot(
                *zip(*pts, strict=True), marker="o", label=label, linestyle="-" if key[1] in ("-", "none") else "--"
            )
        ax.axvline(cfg["img_size"], color="gray", linestyle=":", linewidth=1)
        ax.set(
            title=f"{cfg['dataset']}: eval protocol '{protocol}'",
            xlabel="evaluation resolution (px)",
            ylabel="top-1 (%)",
        )
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * math.ceil(len(labels) / 3), 1, 1))
    fig.savefig(out / "accuracy_vs_resolution.png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> list[dict]:
    cfg, given = parse_config(argv)
    out = Path(cfg["output"])
    if cfg["resume"] and (out / "config.yaml").exists():
        # the interrupted run's resolved config, with what this command line sets explicitly on top
        saved = yaml.safe_load((out / "config.yaml").read_text())
        saved.update({k: cfg[k] for k in given | {"resume", "output"}})
        cfg = saved
    check_eval_config(cfg)
    device, rank, world = setup_distributed(cfg)
    if device.type == "cpu" and world == 1 and os.environ.get("OMP_NUM_THREADS") is None:
        torch.set_num_threads(os.cpu_count() or 1)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        if not cfg["resume"]:  # a fresh run: nothing of an earlier run in this folder may be resumed later
            for stale in ("log.csv", "results.csv", "results.md"):
                (out / stale).unlink(missing_ok=True)
            for spec in cfg["models"]:
                for i in range(len(cfg["models"])):
                    for tag in (spec, f"{spec}_{i}"):
                        for stale in ("checkpoint.pt", "results.json"):
                            (model_dir(out, tag) / stale).unlink(missing_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    tags = [m if cfg["models"].count(m) == 1 else f"{m}_{i}" for i, m in enumerate(cfg["models"])]
    rows: list[dict] = []
    for name, tag in zip(cfg["models"], tags, strict=True):
        done = model_dir(out, tag) / "results.json"
        if cfg["resume"] and done.exists():
            rows += json.loads(done.read_text())
            if rank == 0:
                print(f"[{tag}] finished earlier; its results are kept", flush=True)
            continue
        model, eval_set = train_model(cfg, name, tag, out, device, rank, world)
        model_rows = evaluate_sizes(cfg, model, tag, eval_set, device, rank, world)
        rows += model_rows
        if rank == 0:
            done.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(done, write_json, model_rows)
            print(
                f"[{tag}] "
                + ", ".join(
                    f"{r['eval_size']}px/{r['protocol']}/{r['rope_scaling']}: {r['top1']:.1f}" for r in model_rows
                ),
                flush=True,
            )
    if rank == 0:
        write_results(rows, out, cfg)
        print((out / "results.md").read_text())
        print(f"wrote {out / 'results.csv'}, {out / 'results.md'}, {out / 'accuracy_vs_resolution.png'}")
    if dist.is_initialized():
        dist.destroy_process_group()
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
