"""train.py end to end on tiny settings: outputs, resume after SIGKILL, torchrun, fine-tuning, errors."""

import csv
import functools
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import load_file, save_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

import train
from vit_rope import FAMILIES
from vit_rope.training import data as D
from vit_rope.training import folder, models, optim
from vit_rope.training.data import SyntheticScenes

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "--models", "vit_ape_tiny", "vit_rope_tiny",
    "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2",
    "--img-size", "16", "--eval-sizes", "16", "24", "--rope-scaling", "none", "pi",
    "--train-samples", "96", "--val-samples", "32", "--epochs", "2", "--batch-size", "32", "--warmup-epochs", "0",
]  # fmt: skip


def read_csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def run(*args, env=None):
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args], capture_output=True, text=True, env=env, cwd=ROOT
    )


def test_tiny_comparison_end_to_end(tmp_path):
    rows = train.main([*TINY, "--output", str(tmp_path)])
    results = read_csv(tmp_path / "results.csv")
    assert len(results) == len(rows) == 2 * 2 * 1 + 2 * 2 * 2  # (sizes x protocols) x scaling modes
    assert set(results[0]) >= {"model", "train_size", "eval_size", "top1", "top5", "loss", "params", "rope_scaling"}
    assert {r["rope_scaling"] for r in results if r["model"] == "vit_rope_tiny"} == {"none", "pi"}
    assert {r["protocol"] for r in results} == {"resize", "native"}
    assert all(0 <= float(r["top1"]) <= float(r["top5"]) <= 100 for r in results)
    assert "| vit_rope_tiny | pi |" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "accuracy_vs_resolution.png").stat().st_size > 10_000
    log = read_csv(tmp_path / "log.csv")
    assert [(r["model"], r["epoch"]) for r in log] == [(m, e) for m in ("vit_ape_tiny", "vit_rope_tiny") for e in "12"]
    assert (tmp_path / "config.yaml").exists()
    weights = load_file(tmp_path / "vit_rope_tiny" / "model.safetensors")
    model = timm.create_model(
        "vit_rope_tiny", num_classes=8, img_size=16, patch_size=8, depth=1, embed_dim=32, num_heads=2
    )
    model.load_state_dict(weights)


def test_every_family_compared_in_one_run(tmp_path):
    families = [f for f in FAMILIES.values() if f.model_name and f.min_axes <= 2]  # every image family, ours or not
    models = ["vit_ape_tiny", *(f"vit_{f.model_name}_tiny" for f in families)]
    modes = ["none", "pi", "ntk", "yarn", "normalized"]
    args = [*TINY[3:], "--models", *models, "--rope-scaling", *modes, "--epochs", "1", "--no-native-eval"]
    rows = train.main([*args, "--output", str(tmp_path)])
    for name in models:
        model = timm.create_model(name, patch_size=8, depth=1, embed_dim=32, num_heads=2)
        takes = [m for m in modes if m in model.rope_scaling_modes()] or ["-"]
        mine = [r for r in rows if r["model"] == name]
        assert sorted({r["rope_scaling"] for r in mine}) == sorted(takes), name
        assert len(mine) == 2 * len(takes) and all(0 <= r["top1"] <= 100 for r in mine), name
        assert (tmp_path / name / "model.safetensors").exists()
    for family in families:  # a fixed ladder takes every mode; a learned family's takes no NTK
        takes = {r["rope_scaling"] for r in rows if r["model"] == f"vit_{family.model_name}_tiny"}
        assert takes == set(family.scaling_modes), family.name


def test_resume_after_sigkill_gives_identical_results(tmp_path):
    args = [*TINY, "--epochs", "4"]
    full = run(*args, "--output", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    killed_dir = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args, "--output", str(killed_dir)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    first = killed_dir / "vit_ape_tiny" / "checkpoint.pt"
    deadline = time.time() + 120
    while not first.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed_dir / "results.csv").exists(), "the run finished before it could be killed"
    resumed = run("--output", str(killed_dir), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after epoch" in resumed.stdout
    assert read_csv(killed_dir / "results.csv") == read_csv(tmp_path / "full" / "results.csv")
    strip = ("seconds",)
    log = [{k: v for k, v in r.items() if k not in strip} for r in read_csv(killed_dir / "log.csv")]
    assert log == [{k: v for k, v in r.items() if k not in strip} for r in read_csv(tmp_path / "full" / "log.csv")]


def test_torchrun_two_processes_on_cpu(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
         str(ROOT / "train.py"), *TINY, "--output", str(tmp_path)],
        capture_output=True, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(read_csv(tmp_path / "results.csv")) == 12
    assert len(read_csv(tmp_path / "log.csv")) == 4  # rank 0 writes alone


def make_imagefolder(root: Path, classes: int, per_class: int, size: int = 24) -> None:
    scenes = SyntheticScenes(classes * per_class * 4, size)
    count = {}
    for i in range(len(scenes)):
        img, label = scenes.render(i)
        if label >= classes or count.get(label, 0) >= per_class:
            continue
        count[label] = count.get(label, 0) + 1
        for split in ("train", "val"):
            d = root / split / f"class{label}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray((img.permute(1, 2, 0) * 255).byte().numpy()).save(d / f"{i}.png")


def without_models(args: list[str]) -> list[str]:
    """TINY's arguments without --models, --model-kwargs and --img-size (a model folder names the model and its
    size itself)."""
    flags = [i for i, a in enumerate(args) if a.startswith("--")]
    keep = [(i, j) for i, j in zip(flags, [*flags[1:], len(args)], strict=True)
            if args[i] not in ("--models", "--model-kwargs", "--img-size")]  # fmt: skip
    return [a for i, j in keep for a in args[i:j]]


@pytest.mark.parametrize("start", ["file", "folder"])
def test_finetune_from_checkpoint_with_other_classes_and_size(start, tmp_path):
    """From a run's weights (its model.safetensors named with the model and its kwargs, or its folder, whose
    config.json names them) to another class count and size; the fine-tuned weights evaluated alone give the numbers
    of the end of fine-tuning."""
    train.main([*TINY, "--models", "vit_ape_tiny", "--epochs", "1", "--output", str(tmp_path / "pre")])
    make_imagefolder(tmp_path / "folder", classes=3, per_class=6)
    data = ["--dataset", "imagefolder", "--data-dir", str(tmp_path / "folder"), "--eval-sizes", "24"]
    model = [*TINY, "--models", "vit_ape_tiny"] if start == "file" else without_models(TINY)
    weights = "model.safetensors" if start == "file" else ""
    rows = train.main([
        *model, *data, "--img-size", "24", "--epochs", "1", "--batch-size", "6", "--no-aug",
        "--initial-checkpoint", str(tmp_path / "pre" / "vit_ape_tiny" / weights), "--output", str(tmp_path / "ft"),
    ])  # fmt: skip
    assert [r["eval_size"] for r in rows] == [24] and rows[0]["model"] == "vit_ape_tiny"
    tuned = load_file(tmp_path / "ft" / "vit_ape_tiny" / "model.safetensors")
    # (a model folder's model is made at --img-size, the one source of its grid: its APE resampled to 3x3 patches)
    assert tuned["head.weight"].shape == (3, 32) and tuned["pos_embed"].shape == (1, 9, 32)
    config = json.loads((tmp_path / "ft" / "vit_ape_tiny" / "config.json").read_text())
    assert config["num_classes"] == 3 and config["label_names"] == ["class0", "class1", "class2"]
    assert config["pretrained_cfg"]["input_size"] == [3, 24, 24]
    # eval-only of the fine-tuned weights (its folder: the size it was trained at from config.json)
    size = ["--img-size", "24"] if start == "file" else []
    again = train.main([
        *model, *data, *size, "--eval-only",
        "--initial-checkpoint", str(tmp_path / "ft" / "vit_ape_tiny" / weights), "--output", str(tmp_path / "ev"),
    ])  # fmt: skip
    assert again == rows
    # and a fine-tuned copy of them: the folder's train/ is read for it, where plain --eval-only reads none
    tuned = train.main([
        *model, *data, *size, "--eval-only", "--finetune-sizes", "16", "--finetune-steps", "1", "--batch-size", "6",
        "--initial-checkpoint", str(tmp_path / "ft" / "vit_ape_tiny" / weights), "--output", str(tmp_path / "et"),
    ])  # fmt: skip
    assert tuned[:1] == rows and [(r["protocol"], r["eval_size"]) for r in tuned[1:]] == [("finetune", 16)]


def test_video_comparison_runs(tmp_path):
    rows = train.main([
        "--dataset", "synthetic_video", "--models", "vit_rope3d_tiny:pos_embed=ape", "vit_rope3d_tiny",
        "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2",
        "--img-size", "16", "--num-frames", "4", "--eval-sizes", "16", "24", "--train-samples", "32",
        "--val-samples", "16", "--epochs", "1", "--batch-size", "16", "--output", str(tmp_path),
    ])  # fmt: skip
    assert {r["model"] for r in rows} == {"vit_rope3d_tiny:pos_embed=ape", "vit_rope3d_tiny"}
    assert (tmp_path / "vit_rope3d_tiny__pos_embed=ape" / "model.safetensors").exists()
    config = json.loads((tmp_path / "vit_rope3d_tiny__pos_embed=ape" / "config.json").read_text())
    assert config["model_args"]["pos_embed"] == "ape" and config["model_args"]["num_frames"] == 4
    assert config["pretrained_cfg"]["input_size"] == [3, 4, 16, 16]  # a clip: (C, T, H, W)


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}

    class Exploding(torch.nn.CrossEntropyLoss):
        def forward(self, logits, target):
            calls["n"] += 1
            loss = super().forward(logits, target)
            return loss * float("nan") if calls["n"] > 3 else loss  # 3 steps per epoch: breaks in epoch 2

    monkeypatch.setattr(optim, "LabelSmoothingCrossEntropy", lambda *_: Exploding())
    with pytest.raises(SystemExit, match="loss became nan at epoch 2"):
        train.main([*TINY, "--models", "vit_rope_tiny", "--output", str(tmp_path)])
    state = torch.load(tmp_path / "vit_rope_tiny" / "checkpoint.pt", weights_only=False)
    assert state["epoch"] == 0  # the last finished epoch, nothing newer written


def test_config_and_data_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("epochs: 1\nlearning_rate: 0.1\n")
    with pytest.raises(SystemExit, match=r"unknown config key\(s\) \['learning_rate'\]"):
        train.parse_config(["--config", str(bad)])
    with pytest.raises(SystemExit, match="imagefolder needs root/train"):
        train.main(
            [*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "nowhere"), "--output", str(tmp_path)]
        )
    (tmp_path / "empty" / "train" / "a").mkdir(parents=True)
    (tmp_path / "empty" / "val" / "a").mkdir(parents=True)
    with pytest.raises(SystemExit, match="has no images"):
        train.main(
            [*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "empty"), "--output", str(tmp_path)]
        )
    make_imagefolder(tmp_path / "broken", classes=2, per_class=2)
    (tmp_path / "broken" / "train" / "class0" / "zzz.png").write_bytes(b"not a png")
    with pytest.raises(SystemExit, match="cannot read image .*zzz.png"):  # every file's header, before the run
        train.main([*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "broken"), "--batch-size", "2",
                    "--output", str(tmp_path / "o")])  # fmt: skip
    assert not (tmp_path / "o").exists()
    with pytest.raises(SystemExit, match="--eval-only needs"):
        train.main([*TINY, "--eval-only", "--output", str(tmp_path / "e")])
    with pytest.raises(SystemExit, match="unknown model 'vit_nope'"):
        train.main([*TINY, "--models", "vit_nope", "--output", str(tmp_path / "m")])


def test_ema_weights_are_the_ones_evaluated_and_saved(tmp_path):
    """With --ema-decay 1 - 1e-12 the average does not move off the initial weights (each update is below float32's
    resolution): what is saved and evaluated equals an untrained run (--lr 0 --min-lr 0, same seed), while the raw
    weights in the checkpoint did train."""
    one = [*TINY, "--models", "vit_rope_tiny", "--rope-scaling", "none", "--epochs", "1"]
    train.main([*one, "--ema", "--ema-decay", "0.999999999999", "--output", str(tmp_path / "ema")])
    train.main([*one, "--lr", "0", "--min-lr", "0", "--output", str(tmp_path / "still")])
    saved, still = (load_file(tmp_path / d / "vit_rope_tiny" / "model.safetensors") for d in ("ema", "still"))
    raw = torch.load(tmp_path / "ema" / "vit_rope_tiny" / "checkpoint.pt", weights_only=False)["model"]
    for k in still:
        torch.testing.assert_close(saved[k], still[k], rtol=0, atol=1e-9, msg=k)
    assert any(not torch.equal(raw[k], still[k]) for k in still)
    top1 = [[r["top1"] for r in read_csv(tmp_path / d / "results.csv")] for d in ("ema", "still")]
    assert top1[0] == top1[1]


def test_data_config_comes_from_the_models_pretrained_cfg():
    """Without building the model, the same normalisation as timm reads off the built one (with an overlay too)."""
    cfg, _ = train.parse_config([*TINY])
    for overlay in (None, dict(mean=(0.5, 0.25, 0.125), std=(0.2, 0.3, 0.4))):
        cfg = replace(cfg, model_kwargs=dict(pretrained_cfg_overlay=overlay) if overlay else {})
        built = timm.create_model("vit_rope_tiny", **cfg.model_kwargs)
        expected = timm.data.resolve_data_config({}, model=built)
        got = models.data_config(cfg, "vit_rope_tiny")
        assert (got["mean"], got["std"]) == (expected["mean"], expected["std"])
    assert got["mean"] == (0.5, 0.25, 0.125)


def make_folder(root: Path, splits: dict, clips: bool = False, size: int = 12) -> None:
    """``splits``: split → class names; one small image (or a 2-frame clip) per class, its colour from the name."""
    for split, classes in splits.items():
        for c in classes:
            d = root / split / c / ("clip0" if clips else "")
            d.mkdir(parents=True, exist_ok=True)
            value = 40 * (ord(c[-1]) - ord("a") + 1)
            for i in range(2 if clips else 1):
                Image.new("RGB", (size, size), (value, i * 60, 0)).save(d / f"{i}.png")


@pytest.mark.parametrize("dataset", ["imagefolder", "clipfolder"])
def test_folder_splits_use_the_training_class_indices(tmp_path, dataset):
    """torchvision sorts each split's folders on its own: val {a, c} would number c as 1 and the model get 2 classes;
    val must use train's numbering, and a val class train lacks is an error naming it."""
    clips = dataset == "clipfolder"
    make_folder(tmp_path / "ok", dict(train="abc", val="ac"), clips=clips)
    cfg, _ = train.parse_config([*TINY, "--dataset", dataset, "--data-dir", str(tmp_path / "ok"), "--num-frames", "2"])
    dc = dict(mean=(0.5,) * 3, std=(0.5,) * 3)
    train_ds, eval_set, num_classes, _ = D.build_data(cfg, dc)
    assert num_classes == 3 and len(train_ds) == 3
    val = eval_set(16, "resize")
    assert sorted(val[i][1] for i in range(len(val))) == [0, 2]
    # --eval-only takes the numbering from train/ when it is there, else from val/
    only, _ = train.parse_config(
        [*TINY, "--dataset", dataset, "--data-dir", str(tmp_path / "ok"), "--eval-only", "--pretrained"]
    )
    assert D.build_data(only, dc)[2] == 3
    make_folder(tmp_path / "valonly", dict(val="ac"), clips=clips)
    only = replace(only, data_dir=str(tmp_path / "valonly"))
    assert D.build_data(only, dc)[2] == 2
    with pytest.raises(FileNotFoundError, match="train' is missing"):  # fine-tuned copies train on train/
        D.build_data(replace(only, finetune_sizes=(16,)), dc)
    make_folder(tmp_path / "extra", dict(train="abc", val="acd"), clips=clips)
    cfg = replace(cfg, data_dir=str(tmp_path / "extra"))
    with pytest.raises(ValueError, match=r"class folder\(s\) \['d'\] that the training split does not have"):
        D.build_data(cfg, dc)


def test_clipfolder_eval_reads_frames_at_the_eval_size(tmp_path):
    """Clips for another eval size come from the frames, not from clips already shrunk to --img-size."""
    root = tmp_path / "clips"
    for split, name in (("train", "a"), ("train", "b"), ("val", "a"), ("val", "b")):
        d = root / split / name / "c0"
        d.mkdir(parents=True)
        for i in range(2):
            pixels = torch.Generator().manual_seed(i)
            img = (torch.rand(32, 32, 3, generator=pixels) * 255).byte().numpy()
            Image.fromarray(img).save(d / f"{i}.png")
    cfg, _ = train.parse_config(["--dataset", "clipfolder", "--data-dir", str(root), "--img-size", "8",
                                 "--num-frames", "2"])  # fmt: skip
    dc = dict(mean=(0.5,) * 3, std=(0.5,) * 3)
    clip = D.build_data(cfg, dc)[1](32, "resize")[0][0]
    direct = D.ClipFolder(str(root / "val"), 32, 2, dc["mean"], dc["std"])[0][0]
    torch.testing.assert_close(clip, direct, rtol=0, atol=0)


ONE = [*TINY, "--models", "vit_rope_tiny", "--rope-scaling", "none", "--eval-sizes", "16"]


def test_bad_scaling_mode_or_eval_size_stops_before_training(tmp_path, monkeypatch):
    def no_training(*_):
        raise AssertionError("training started")

    monkeypatch.setattr(train, "train_model", no_training)
    with pytest.raises(SystemExit, match=r"unknown --rope-scaling mode\(s\) \['linear'\]"):
        train.main([*TINY, "--rope-scaling", "none", "linear", "--output", str(tmp_path)])
    with pytest.raises(SystemExit, match=r"--eval-sizes \[36\] are not multiples of the patch size 8x8 of vit_ape"):
        train.main([*TINY, "--eval-sizes", "32", "36", "--output", str(tmp_path)])
    with pytest.raises(AssertionError, match="training started"):  # a model that pads takes any size
        train.main([*TINY, "--models", "vit_ape_tiny:dynamic_img_pad=true", "--eval-sizes", "36", "--output",
                    str(tmp_path)])  # fmt: skip


def test_resume_with_more_epochs_follows_the_new_schedule(tmp_path):
    """Flags given on resume override the saved config, --epochs included: the LR follows the longer schedule."""
    train.main([*ONE, "--epochs", "2", "--output", str(tmp_path / "short")])
    (tmp_path / "short" / "vit_rope_tiny" / "results.json").unlink()  # as if killed before its evaluation
    train.main(["--output", str(tmp_path / "short"), "--resume", "--epochs", "4"])
    train.main([*ONE, "--epochs", "4", "--output", str(tmp_path / "long")])
    lrs = [[r["lr"] for r in read_csv(tmp_path / d / "log.csv")] for d in ("short", "long")]
    assert len(lrs[0]) == 4 and lrs[0][2:] == lrs[1][2:]


@pytest.mark.slow
def test_compile_trains_and_evaluates_as_eager(tmp_path):
    """--compile changes how a forward runs, not what it computes: one epoch of a few batches gives the eager run's
    losses and accuracies (to float32 rounding); config.yaml records it, and --resume may switch it (it just
    applies, like --workers)."""
    args = [*ONE, "--epochs", "1", "--train-samples", "64", "--no-native-eval"]
    eager = train.main([*args, "--output", str(tmp_path / "eager")])
    fused = train.main([*args, "--compile", "--output", str(tmp_path / "compiled")])
    logs = [read_csv(tmp_path / d / "log.csv") for d in ("eager", "compiled")]
    for key in ("train_loss", "val_loss"):
        assert float(logs[1][0][key]) == pytest.approx(float(logs[0][0][key]), rel=1e-4), key
    one_sample = 100 / 32 + 1e-6  # (a sample whose two top logits tie to rounding may flip)
    for key in ("train_top1", "val_top1"):
        assert abs(float(logs[1][0][key]) - float(logs[0][0][key])) <= one_sample, key
    assert [r["loss"] for r in fused] == pytest.approx([r["loss"] for r in eager], rel=1e-3)
    assert yaml.safe_load((tmp_path / "compiled" / "config.yaml").read_text())["compile"] is True
    assert yaml.safe_load((tmp_path / "eager" / "config.yaml").read_text())["compile"] is False
    assert train.main(["--output", str(tmp_path / "eager"), "--resume", "--compile"]) == eager


def test_compile_compiles_no_graph_for_the_evaluation_grid(tmp_path, monkeypatch):
    """With --compile every evaluation cell (a size under a scaling mode, one pass over the test set) was a graph of
    its own: a size is a shape, a mode a branch. The protocol's 4 sizes under 5 modes compiled about 16 graphs a model
    (82 for five models, CPU, 2026-11-27), each an inductor compile for one pass over the test set. The cells now run
    eagerly: the graphs compiled are the training's, the validation's and the fine-tunings', however large the grid.
    The backend is Dynamo's alone (``eager``): what is compiled and when is Dynamo's decision."""
    from torch._dynamo.utils import counters

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    graphs = []
    for sizes in (["14"], ["8", "14", "28", "56"]):
        torch._dynamo.reset()  # (a model of the same class and settings would reuse the first run's graphs)
        counters.clear()
        train.main([*TINY, "--models", "vit_rope_tiny", "--img-size", "14", "--model-kwargs", "patch_size=2",
                    "depth=1", "embed_dim=32", "num_heads=2", "--epochs", "1", "--train-samples", "64",
                    "--eval-sizes", *sizes, "--rope-scaling", "none", "pi", "ntk", "yarn", "normalized",
                    "--finetune-sizes", "28", "--finetune-steps", "2", "--no-native-eval", "--compile",
                    "--output", str(tmp_path / f"{len(sizes)}")])  # fmt: skip
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] == graphs[1] >= 2, graphs  # (the training step and the validation at least)


class Killed(BaseException):
    """A kill at a chosen point of a run (BaseException: nothing in train.py catches it)."""


def interrupt(monkeypatch, at: int, before: bool) -> None:
    """Stop the run at the ``at``-th checkpoint.pt write, before it is written or just after."""
    calls = {"n": 0}
    write = train.atomic_write

    def atomic_write(path, fn, obj):
        if path.name == "checkpoint.pt":
            calls["n"] += 1
            if calls["n"] == at and before:
                raise Killed
        write(path, fn, obj)
        if path.name == "checkpoint.pt" and calls["n"] == at:
            raise Killed

    monkeypatch.setattr(train, "atomic_write", atomic_write)


def same_run(a: Path, b: Path) -> None:
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(read_csv(a / "log.csv")) == strip(read_csv(b / "log.csv"))
    assert read_csv(a / "results.csv") == read_csv(b / "results.csv")


def test_kill_while_writing_the_checkpoint_leaves_no_duplicate_log_row(tmp_path, monkeypatch):
    args = [*ONE, "--drop-path", "0.1"]
    train.main([*args, "--output", str(tmp_path / "full")])
    interrupt(monkeypatch, at=2, before=True)  # epoch 2's log row is written, its checkpoint is not
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    train.main(["--output", str(tmp_path / "killed"), "--resume"])
    same_run(tmp_path / "killed", tmp_path / "full")


def test_initial_checkpoint_takes_a_runs_checkpoint_and_its_ema(tmp_path):
    """A run's own checkpoint.pt loads as --initial-checkpoint, with its EMA weights (--ema-decay 1 - 1e-12: the
    initial ones, which are what that run evaluated); an old one that only a full unpickle reads gets a clear
    error."""
    one = [*ONE, "--epochs", "1"]
    train.main([*one, "--ema", "--ema-decay", "0.999999999999", "--output", str(tmp_path / "ema")])
    ckpt = tmp_path / "ema" / "vit_rope_tiny" / "checkpoint.pt"
    rows = train.main([*one, "--eval-only", "--initial-checkpoint", str(ckpt), "--output", str(tmp_path / "ev")])
    assert rows == json.loads((tmp_path / "ema" / "vit_rope_tiny" / "results.json").read_text())
    import numpy as np

    torch.save(dict(model={}, rng=np.zeros(3)), tmp_path / "old.pt")
    with pytest.raises(SystemExit, match="old.pt' cannot be read as weights \\(it holds pickled objects other than"):
        train.main([*one, "--eval-only", "--initial-checkpoint", str(tmp_path / "old.pt"), "--output", str(tmp_path)])


def test_model_spec_values_may_hold_commas():
    assert models.split_spec("vit_rope3d_tiny:rope_axis_dims=[8,12,12],rope_targets=vo") == (
        "vit_rope3d_tiny",
        dict(rope_axis_dims=[8, 12, 12], rope_targets="vo"),
    )
    with pytest.raises(SystemExit, match=r"model 'vit_rope_tiny:rope_axis_dims=\[8,12' .* cannot read the value"):
        models.checked_spec("vit_rope_tiny:rope_axis_dims=[8,12")


def test_scaling_modes_skip_what_a_model_cannot_take():
    modes = ["none", "pi", "ntk", "yarn", "normalized"]
    kw = dict(depth=1, img_size=32, patch_size=8)
    assert models.scaling_modes(timm.create_model("vit_ape_tiny", **kw), modes) == ["-"]
    assert models.scaling_modes(timm.create_model("vit_rope_tiny", **kw), modes) == modes
    mixed = timm.create_model("vit_rope_mixed_tiny", **kw)
    assert models.scaling_modes(mixed, modes) == ["none", "pi", "normalized"]
    vo = timm.create_model("vit_rope_tiny", rope_targets="vo", **kw)
    assert models.scaling_modes(vo, modes) == ["none", "pi", "ntk", "normalized"]


# ----------------------------------------------------------------------------------- hostile input
def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes: two snapshots are equal when nothing was added, removed or
    changed."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """A finished two-model, two-epoch run that the commands below must leave as it is."""
    run = tmp_path_factory.mktemp("finished") / "run"
    train.main([*TINY, "--output", str(run)])
    return run


TINY_KWARGS = ["--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2"]
# (what is wrong, arguments after a fresh run's TINY on the finished run's --output, the error it must give)
FAILING_RUNS = [
    ("data dir typo", ["--dataset", "imagefolder", "--data-dir", "{tmp}/nowhere"], "imagefolder needs root/train"),
    ("no epochs", ["--epochs", "0"], "epochs must be at least 1"),
    ("no batch", ["--batch-size", "0"], "batch_size must be at least 1"),
    ("missing device", ["--device", "cuda:99"], "cuda:99 is not on this machine"),
    ("unknown model", ["--models", "vit_nope"], "unknown model 'vit_nope'"),
    ("model kwarg out of range", ["--models", "vit_rope_tiny", *TINY_KWARGS, "rope_theta=0"],
     r"model vit_rope_tiny cannot be built with .*'rope_theta': 0.*theta=0 must be a positive finite number"),
    ("model kwarg refused", ["--model-kwargs", "embed_dim=30", "num_heads=4"],
     "model vit_ape_tiny cannot be built .*embed_dim=30 is not divisible by num_heads=4"),
    ("eval size", ["--eval-sizes", "36"], r"--eval-sizes \[36\] are not multiples of the patch size"),
    ("scaling mode", ["--rope-scaling", "linear"], r"unknown --rope-scaling mode\(s\) \['linear'\]"),
    ("malformed yaml", ["--config", "{tmp}/bad.yaml"], r"bad.yaml' is not valid YAML: .* at line 3"),
    ("negative lr", ["--lr", "-1"], "--lr -1.0: lr must be at least 0"),
    ("label smoothing", ["--label-smoothing", "1"], r"label_smoothing must be in \[0, 1\)"),
    ("crop scale", ["--scale", "0.5", "0.2"], "scale must be two numbers a b with 0 < a <= b <= 1"),
    ("eval-only without weights", ["--eval-only"], "--eval-only needs --initial-checkpoint PATH or --pretrained"),
    ("missing checkpoint", ["--initial-checkpoint", "{tmp}/none.pt"], "none.pt' does not exist"),
    ("weights of another model", ["--eval-only", "--initial-checkpoint", "{tmp}/rope.safetensors"],
     r"does not fit vit_ape_tiny: .*lacks the model's \['pos_embed'\]"),
    ("unknown optimizer", ["--opt", "nope"], "--opt nope with --sched cosine: Optimizer nope not found"),
    ("eval-only of weights in the run --overwrite replaces",
     ["--eval-only", "--initial-checkpoint", "{run}/vit_rope_tiny/model.safetensors", "--models", "vit_rope_tiny"],
     r"model.safetensors lies in --output .*, whose run --overwrite replaces .*copy the folder out of --output"),
]  # fmt: skip
# (what --resume must refuse, arguments after --output RUN --resume, the error it must give)
REFUSED_RESUMES = [
    ("fewer epochs", ["--epochs", "1"], r"--epochs 1 is fewer than the run in .* has trained .*--epochs 2 or more"),
    ("other lr", ["--lr", "0.5"], "--resume cannot change lr 0.002 -> 0.5: .*another --output"),
    ("other model kwargs", ["--model-kwargs", "embed_dim=16"], "cannot change model_kwargs .*'embed_dim': 16"),
    ("other seed", ["--seed", "1"], "cannot change seed 0 -> 1"),
    ("other img size", ["--img-size", "24"], "cannot change img_size 16 -> 24"),
    ("other dataset", ["--dataset", "synthetic_video"], "cannot change dataset 'synthetic' -> 'synthetic_video'"),
    ("other fine-tuning", ["--finetune-sizes", "24", "--finetune-steps", "7"], "cannot change finetune_steps 300 -> 7"),
]


@pytest.mark.parametrize("case", FAILING_RUNS + REFUSED_RESUMES, ids=[c[0] for c in FAILING_RUNS + REFUSED_RESUMES])
def test_a_failed_command_leaves_the_previous_run_as_it_was(case, finished_run, tmp_path):
    """Every setting is checked, and every model built, before anything in --output changes: after a failing
    command the previous run's folder has the same files with the same bytes, and --resume still works from it."""
    _, args, message = case
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    (tmp_path / "bad.yaml").write_text("epochs: 2\neval_sizes: [16, 24\n")
    shutil.copy(finished_run / "vit_rope_tiny" / "model.safetensors", tmp_path / "rope.safetensors")
    args = [a.format(tmp=tmp_path, run=run) for a in args]
    before = snapshot(run)
    fresh = [*TINY, "--output", str(run), "--overwrite", *args]  # --overwrite: past the refusal of a fresh run there
    command = ["--output", str(run), "--resume", *args] if case in REFUSED_RESUMES else fresh
    with pytest.raises(SystemExit, match=message):
        train.main(command)
    assert snapshot(run) == before


@pytest.mark.parametrize(
    "args,message",
    [
        (["--eval-batch-size", "0"], "eval_batch_size must be at least 1"),
        (["--img-size", "0"], "img_size must be at least 1"),
        (["--train-samples", "0"], "train_samples must be at least 1"),
        (["--eval-sizes", "16", "0"], "eval_sizes must be sizes of at least 1"),
        (["--drop-path", "1"], r"drop_path must be in \[0, 1\)"),
        (["--hflip", "1.5"], r"hflip must be in \[0, 1\]"),
        (["--vflip", "-0.5"], r"vflip must be in \[0, 1\]"),
        (["--color-jitter", "-0.1"], "color_jitter must be at least 0"),
        (["--ema-decay", "2"], r"ema_decay must be in \[0, 1\)"),
        (["--ema", "--ema-decay", "1"], r"--ema-decay 1.0: ema_decay must be in \[0, 1\)"),
        (["--model-kwargs", "patch_size=8", "init_values=null"],
         "--model-kwargs init_values=null: timm's create_model drops a kwarg whose value is None.*init_values=0"),
        (["--models", "vit_rope_tiny:init_values=null"], "'vit_rope_tiny:init_values=null' in --models: init_values"),
        (["--model-kwargs", "patch_size=8", "img_size=64"],
         "the model kwarg img_size=64 differs from --img-size 16.*leave img_size out of the model kwargs"),
        (["--model-kwargs", "patch_size=8", "num_classes=3"], "num_classes=3 in the model kwargs; the class count"),
        (["--resume", "--overwrite"], "--resume continues the run in --output and --overwrite deletes it .*one of"),
        (["--eval-sizes", "16", "40000"], r"--eval-sizes 40000: evaluating vit_ape_tiny there needs about .* GiB "
         r"\(25,000,000 tokens an image, batches of 32\), more than the .* GiB of cpu; give a smaller --eval-batch"),
        (["--scale", "0.5"], "scale must be two numbers"),
        (["--scale", "0", "1"], "scale must be two numbers"),
        (["--seed", "-1"], "seed must be in"),
        (["--workers", "-1"], "workers must be at least 0"),
        (["--warmup-epochs", "-1"], "warmup_epochs must be at least 0"),
        (["--min-lr", "0.1"], "--min-lr 0.1 is above --lr 0.002"),
        (["--dataset", "nope"], "dataset must be one of"),
        (["--device", "nope"], "--device 'nope' is not a device name"),
        (["--sched", "nope"], "--sched nope: Unknown scheduler 'nope'"),
        (["--model-kwargs", "patchsize=8"], "vit_ape_tiny cannot be built .*unexpected keyword argument 'patchsize'"),
        (["--models", "vit_rope_mixed_tiny", "--rope-scaling", "ntk"], r"takes none of --rope-scaling \['ntk'\]"),
        (["--img-size", "20"], "refuses a validation sample at --img-size: .*20"),
        (["--config", "{tmp}/float.yaml"], "--num-frames 2.5: num_frames must be int"),
        (["--config", "{tmp}/scalar.yaml"], "--scale 0.5: scale must be a list of float"),
        (["--config", "{tmp}/list.yaml"], "holds a list, not `key: value` lines"),
        (["--finetune-sizes", "20"], r"--finetune-sizes \[20\] are not multiples of the patch size 8x8"),
        (["--finetune-sizes", "24", "24"], "finetune_sizes must be sizes of at least 1, each given once"),
        (["--finetune-sizes", "24", "--finetune-steps", "0"], "finetune_steps must be at least 1"),
        (["--finetune-sizes", "24", "--finetune-scaling", "linear"], r"unknown --finetune-scaling mode\(s\)"),
        (["--models", "vit_rope_mixed_tiny", "--finetune-sizes", "24", "--finetune-scaling", "ntk"],
         r"takes none of --finetune-scaling \['ntk'\]"),
    ],
)  # fmt: skip
def test_out_of_range_values_are_one_line_naming_the_setting(args, message, tmp_path):
    (tmp_path / "float.yaml").write_text("num_frames: 2.5\n")
    (tmp_path / "scalar.yaml").write_text("scale: 0.5\n")
    (tmp_path / "list.yaml").write_text("- epochs: 2\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*TINY, "--output", str(out), *[a.format(tmp=tmp_path) for a in args]])
    assert str(stop.value).startswith("error: ") and "\n" not in str(stop.value)
    assert not out.exists()


def test_a_second_run_on_the_same_output_is_refused_while_the_first_runs(tmp_path):
    """Two runs on one --output would interleave their rows: the second gets a clear error naming the first; the
    lock is the OS's (flock), so a SIGKILLed run leaves none behind."""
    run = tmp_path / "run"
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *ONE, "--epochs", "500", "--output", str(run)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.time() + 120
        while not (run / "config.yaml").exists() and first.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert first.poll() is None, "the first run ended before the second could start"
        with pytest.raises(SystemExit, match=f"is in use by another run \\(pid {first.pid}\\); wait for it to end"):
            train.main([*ONE, "--output", str(run), "--overwrite"])
    finally:
        first.kill()
        first.wait()
    with folder.locked(run):  # released by the OS when the first run was killed
        pass


def test_a_finished_run_is_a_timm_model_folder(finished_run):
    """Each run's folder is a timm model folder: config.json names the architecture with every kwarg the run made it
    with, the run's preprocessing and class names, and timm alone ("local-dir:") rebuilds the model with the logits
    of its weights loaded into a model built by hand."""
    by_hand_args = dict(patch_size=8, depth=1, embed_dim=32, num_heads=2, img_size=16)
    for name in ("vit_ape_tiny", "vit_rope_tiny"):
        folder = finished_run / name
        config = json.loads((folder / "config.json").read_text())
        assert config["architecture"] == name and config["num_classes"] == 8
        assert config["label_names"] == list(D.DIRECTIONS)
        assert {k: config["model_args"][k] for k in by_hand_args} == {**by_hand_args, "img_size": [16, 16]}
        cfg = config["pretrained_cfg"]
        assert (cfg["input_size"], cfg["interpolation"], cfg["crop_pct"]) == ([3, 16, 16], "bicubic", 1.0)
        assert (cfg["mean"], cfg["std"]) == (list(IMAGENET_DEFAULT_MEAN), list(IMAGENET_DEFAULT_STD))
        by_hand = timm.create_model(name, num_classes=8, **by_hand_args).eval()
        by_hand.load_state_dict(load_file(folder / "model.safetensors"))
        loaded = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        x = torch.randn(2, 3, 24, 24)
        with torch.no_grad():
            assert torch.equal(loaded(x), by_hand(x))


def test_eval_only_of_a_run_folder_gives_the_runs_own_results(finished_run, tmp_path):
    """--eval-only --initial-checkpoint <a run's folder>: no model, kwarg or size named, the rows the run wrote."""
    rows = train.main([
        "--eval-only", "--initial-checkpoint", str(finished_run / "vit_rope_tiny"), "--eval-sizes", "16", "24",
        "--rope-scaling", "none", "pi", "--train-samples", "96", "--val-samples", "32", "--output", str(tmp_path),
    ])  # fmt: skip
    assert rows == json.loads((finished_run / "vit_rope_tiny" / "results.json").read_text())


def test_eval_only_fine_tunes_copies_of_the_given_weights(finished_run, tmp_path):
    """--eval-only with --finetune-sizes: the weights' own zero-shot rows, then a fine-tuned copy's row per size and
    mode, the same on a second call; the folder's weights are not changed."""
    folder = finished_run / "vit_rope_tiny"
    weights = (folder / "model.safetensors").read_bytes()
    args = ["--eval-only", "--initial-checkpoint", str(folder), "--eval-sizes", "16", "24", "--rope-scaling", "none",
            "pi", "--train-samples", "96", "--val-samples", "32", "--finetune-sizes", "24", "--finetune-steps", "2",
            "--finetune-scaling", "none", "pi"]  # fmt: skip
    rows, own = train.main([*args, "--output", str(tmp_path / "a")]), json.loads((folder / "results.json").read_text())
    assert rows[: len(own)] == own
    tuned = [(r["protocol"], r["eval_size"], r["rope_scaling"]) for r in rows[len(own) :]]
    assert tuned == [("finetune", 24, "none"), ("finetune", 24, "pi")]
    assert train.main([*args, "--output", str(tmp_path / "b")]) == rows
    assert (folder / "model.safetensors").read_bytes() == weights


def test_eval_only_refuses_weights_that_do_not_fit_a_model(finished_run, tmp_path):
    """One checkpoint for several models must not load into the ones it does not fit (and label their rows)."""
    ape = finished_run / "vit_ape_tiny" / "model.safetensors"
    with pytest.raises(
        SystemExit, match=r"does not fit vit_rope_tiny: .*it has \['pos_embed'\], which the model lacks"
    ):
        train.main([*TINY, "--models", "vit_rope_tiny", "--eval-only", "--initial-checkpoint", str(ape),
                    "--output", str(tmp_path / "ev")])  # fmt: skip
    mixed = ["--models", "vit_rope_mixed_tiny", "--rope-scaling", "none"]
    rope = finished_run / "vit_rope_tiny" / "model.safetensors"
    lacks = r"does not fit vit_rope_mixed_tiny: .*lacks the model's \['position_encoding.family.frequencies'\]"
    with pytest.raises(SystemExit, match=lacks):
        train.main([*TINY, *mixed, "--eval-only", "--initial-checkpoint", str(rope), "--output", str(tmp_path / "ev")])
    assert not (tmp_path / "ev").exists()


def test_resume_with_more_epochs_trains_a_finished_run_on(tmp_path):
    """A finished run resumed with more epochs trains on: its results are those of the last epoch's weights."""
    run = tmp_path / "run"
    train.main([*ONE, "--epochs", "2", "--output", str(run)])
    train.main(["--output", str(run), "--resume", "--epochs", "3"])
    assert [r["epoch"] for r in read_csv(run / "log.csv")] == ["1", "2", "3"]
    assert yaml.safe_load((run / "config.yaml").read_text())["epochs"] == 3
    weights = run / "vit_rope_tiny" / "model.safetensors"
    train.main([*ONE, "--eval-only", "--initial-checkpoint", str(weights), "--output", str(tmp_path / "ev")])
    assert read_csv(run / "results.csv") == read_csv(tmp_path / "ev" / "results.csv")


def test_resume_with_other_eval_settings_evaluates_the_saved_weights_again(tmp_path):
    """New eval sizes or scaling modes on --resume: the saved weights evaluated again, nothing trained again, and
    the results those of a fresh run with the new settings."""
    run, fresh = tmp_path / "run", tmp_path / "fresh"
    train.main([*ONE, "--rope-scaling", "none", "pi", "--output", str(run)])
    trained = ["log.csv", "vit_rope_tiny/checkpoint.pt", "vit_rope_tiny/model.safetensors"]
    before = [(run / f).read_bytes() for f in trained]
    new = ["--eval-sizes", "16", "24", "--rope-scaling", "pi"]
    train.main(["--output", str(run), "--resume", *new])
    assert [(run / f).read_bytes() for f in trained] == before
    train.main([*ONE, *new, "--output", str(fresh)])
    assert read_csv(run / "results.csv") == read_csv(fresh / "results.csv")
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["eval_sizes"], saved["rope_scaling"]) == ([16, 24], ["pi"])


def test_resume_reads_an_edited_config_file(tmp_path):
    """--resume --config FILE: the file's keys are changes like flags (here more epochs), not silently ignored."""
    cfg = dict(models=["vit_rope_tiny"], model_kwargs=dict(patch_size=8, depth=1, embed_dim=32, num_heads=2),
               img_size=16, eval_sizes=[16], rope_scaling=["none"], train_samples=96, val_samples=32, epochs=1,
               batch_size=32, warmup_epochs=0, output=str(tmp_path / "run"))  # fmt: skip
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    train.main(["--config", str(path)])
    path.write_text(yaml.safe_dump({**cfg, "epochs": 2}))
    train.main(["--config", str(path), "--resume"])
    assert [r["epoch"] for r in read_csv(tmp_path / "run" / "log.csv")] == ["1", "2"]


def nan_gradient_at(step: int, monkeypatch) -> None:
    """The training loss keeps its value, but its gradient is NaN from the ``step``-th call on (0 · d√x at 0)."""
    calls = {"n": 0}

    class Poisoned(torch.nn.CrossEntropyLoss):
        def forward(self, logits, target):
            calls["n"] += 1
            loss = super().forward(logits, target)
            return loss + 0 * torch.sqrt(logits.sum() * 0) if calls["n"] >= step else loss

    monkeypatch.setattr(optim, "LabelSmoothingCrossEntropy", lambda *_: Poisoned())


def test_non_finite_weights_stop_the_run_before_they_are_saved(tmp_path, monkeypatch):
    nan_gradient_at(3, monkeypatch)  # the last step of epoch 1: its loss is finite, the weights after it are not
    with pytest.raises(SystemExit, match=r"weights became non-finite in epoch 1 .*No checkpoint was written yet"):
        train.main([*ONE, "--output", str(tmp_path)])
    assert not (tmp_path / "vit_rope_tiny" / "checkpoint.pt").exists()
    assert not (tmp_path / "log.csv").exists()


def test_non_finite_validation_loss_stops_the_run(tmp_path, monkeypatch):
    nan = lambda logits, y, **kw: torch.tensor(float("nan"))  # noqa: E731
    monkeypatch.setattr(torch.nn.functional, "cross_entropy", nan)  # validation's loss only (training smooths labels)
    with pytest.raises(SystemExit, match="the validation loss became nan after epoch 1"):
        train.main([*ONE, "--output", str(tmp_path)])
    assert not (tmp_path / "vit_rope_tiny" / "checkpoint.pt").exists()


def test_a_stop_names_only_files_that_exist(tmp_path, monkeypatch):
    """A run that diverges before its first checkpoint says so, rather than naming a checkpoint that is not there."""
    nan_gradient_at(1, monkeypatch)  # NaN weights after step 1: the loss of step 2 is NaN
    with pytest.raises(SystemExit, match="loss became nan at epoch 1, step 2") as stop:
        train.main([*ONE, "--output", str(tmp_path)])
    assert "No checkpoint was written yet" in str(stop.value) and "checkpoint.pt" not in str(stop.value)


def test_ctrl_c_is_one_line(capsys):
    """Issue 35, 8: SIGINT (Ctrl-C) ended the run with a KeyboardInterrupt traceback through whatever was running;
    train.py's command makes it one line saying how to continue, with the exit status of an interrupted command."""

    def interrupted():
        os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt here, as in the middle of a run
        time.sleep(5)

    assert train.run_command(interrupted) == 130
    assert capsys.readouterr().err == "interrupted; --resume continues from the last finished epoch\n"


# ---------------------------------------------------------------------------------------------- fine-tuning


def test_the_finetuning_config_trains_from_a_timm_checkpoint(tmp_path):
    """configs/finetune_rope_vit_s.yaml, offline: timm's RoPE-ViT-S weights from a file (random here), a new head
    for three classes, layer decay, the sweep under every extrapolation mode; small sizes to stay fast."""
    timm_model = timm.create_model("vit_small_patch16_rope_224")
    save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    make_imagefolder(tmp_path / "images", classes=3, per_class=2, size=32)
    rows = train.main([
        "--config", "configs/finetune_rope_vit_s.yaml", "--data-dir", str(tmp_path / "images"), "--no-pretrained",
        "--initial-checkpoint", str(tmp_path / "w.safetensors"), "--img-size", "32", "--eval-sizes", "32", "48",
        "--epochs", "1", "--batch-size", "2", "--workers", "0", "--no-amp", "--output", str(tmp_path / "run"),
    ])  # fmt: skip
    assert {r["rope_scaling"] for r in rows} == {"none", "pi", "ntk", "yarn", "normalized"}
    settings, _ = train.parse_config(["--config", "configs/finetune_rope_vit_s.yaml"])
    assert 0.65 <= settings.layer_decay <= 0.75 and settings.pretrained and settings.models == ("vit_rope_small",)
    tuned = torch.load(tmp_path / "run" / "vit_rope_small" / "checkpoint.pt", weights_only=True)["model"]
    assert tuned["head.weight"].shape == (3, 384)  # a new head for three classes, the trunk timm's


def make_mixed_folder(root: Path, per_class: int = 6) -> None:
    """Built-in scenes drawn at native wide, tall and square sizes: an image folder of mixed aspect ratios."""
    scenes = SyntheticScenes(64, 16)
    sizes, count = [(16, 40), (40, 16), (24, 24)], {}
    for i in range(len(scenes)):
        _, label = scenes.render(i, (8, 8))
        if label >= 2 or count.get(label, 0) >= per_class:
            continue
        count[label] = count.get(label, 0) + 1
        img, _ = scenes.render(i, sizes[i % 3])
        for split in ("train", "val"):
            d = root / split / f"class{label}"
            d.mkdir(parents=True, exist_ok=True)
            Image.fromarray((img.permute(1, 2, 0) * 255).byte().numpy()).save(d / f"{i}.png")


NAFLEX = [
    "--models", "vit_ape_tiny", "vit_rope_tiny", "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32",
    "num_heads=2", "--img-size", "16", "--eval-sizes", "16", "--rope-scaling", "none", "pi", "ntk", "--epochs", "2",
    "--batch-size", "4", "--warmup-epochs", "0", "--dataset", "imagefolder", "--naflex", "--seq-lens", "4", "9",
    "--eval-seq-lens", "4", "9", "--mixup", "0.8",
]  # fmt: skip


def test_naflex_trains_and_evaluates_at_native_aspect_ratio(tmp_path):
    make_mixed_folder(tmp_path / "folder")
    rows = train.main([*NAFLEX, "--data-dir", str(tmp_path / "folder"), "--output", str(tmp_path / "run")])
    native = [r for r in rows if r["protocol"] == "naflex"]
    assert sorted({(r["eval_size"], r["rope_scaling"]) for r in native if r["model"] == "vit_rope_tiny"}) == [
        (4, "none"),
        (4, "pi"),
        (9, "none"),
        (9, "pi"),
    ]  # fmt: skip  (NTK: one scale a batch; not per image)
    assert {r["eval_size"] for r in native if r["model"] == "vit_ape_tiny"} == {4, 9}
    assert {r["protocol"] for r in rows} == {"resize", "naflex"}
    assert all(0 <= r["top1"] <= 100 for r in rows)
    assert "a column per token budget" in (tmp_path / "run" / "results.md").read_text()
    log = read_csv(tmp_path / "run" / "log.csv")
    assert all(math.isfinite(float(r["train_loss"])) for r in log) and len(log) == 4


def test_naflex_resumes_after_a_kill_as_the_unbroken_run(tmp_path, monkeypatch):
    make_mixed_folder(tmp_path / "folder")
    args = [*NAFLEX, "--data-dir", str(tmp_path / "folder"), "--models", "vit_rope_tiny", "--eval-sizes", "16"]
    train.main([*args, "--output", str(tmp_path / "full")])
    interrupt(monkeypatch, at=1, before=False)
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    train.main(["--output", str(tmp_path / "killed"), "--resume"])
    same_run(tmp_path / "killed", tmp_path / "full")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--dataset", "synthetic"], "--dataset synthetic has none: use imagefolder"),
        (["--train-sizes", "16", "24"], "leave out --train-sizes"),
        (["--seq-lens", "0", "4"], "seq_lens must be budgets of at least 1 token"),
    ],
)
def test_naflex_settings_that_cannot_work_are_one_line(extra, message, tmp_path):
    make_mixed_folder(tmp_path / "folder", per_class=2)
    with pytest.raises(SystemExit, match=message):
        train.main([*NAFLEX, "--data-dir", str(tmp_path / "folder"), *extra, "--output", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_naflex_needs_a_model_that_takes_naflex_batches(tmp_path):
    make_mixed_folder(tmp_path / "folder", per_class=2)
    (tmp_path / "empty.yaml").write_text("{}\n")
    plain = NAFLEX[NAFLEX.index("--img-size") :]  # without --models and --model-kwargs
    with pytest.raises(SystemExit, match="resnet18 has no get_patch_size"):
        train.main(["--config", str(tmp_path / "empty.yaml"), *plain, "--models", "resnet18", "--data-dir",
                    str(tmp_path / "folder"), "--output", str(tmp_path / "run")])  # fmt: skip


# ------------------------------------------------------------------------------------------------ fine-tuning
FINETUNE = [*TINY, "--epochs", "1", "--no-native-eval", "--finetune-steps", "2", "--finetune-scaling", "none", "pi"]


def test_finetuning_trains_a_copy_at_each_size_and_evaluates_it_there(tmp_path, monkeypatch):
    """--finetune-sizes: after training, a copy of each model trains --finetune-steps batches at each size (under each
    --finetune-scaling mode it takes; APE once) and is evaluated there (protocol 'finetune'); the zero-shot rows are
    those of a run without fine-tuning (the trained model itself is not changed)."""
    seen: dict = {}
    build = train.build_model

    def build_model(settings, spec, num_classes):
        model = build(settings, spec, num_classes)
        sizes = seen.setdefault(spec, [])  # a copy keeps the hook: its batches land here too
        model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[-1]) if m.training else None)
        return model

    monkeypatch.setattr(train, "build_model", build_model)
    rows = train.main([*FINETUNE, "--finetune-sizes", "24", "32", "--output", str(tmp_path / "ft")])
    tuned = [(r["model"], r["eval_size"], r["rope_scaling"]) for r in rows if r["protocol"] == "finetune"]
    assert tuned == [("vit_ape_tiny", 24, "-"), ("vit_ape_tiny", 32, "-")] + [
        ("vit_rope_tiny", s, m) for s in (24, 32) for m in ("none", "pi")
    ]
    steps = len(train.make_loader(SyntheticScenes(96, 16), train.parse_config(TINY)[0], True, 0))  # one epoch's
    assert seen["vit_ape_tiny"] == [16] * steps + [24] * 2 + [32] * 2
    assert seen["vit_rope_tiny"] == [16] * steps + [24] * 4 + [32] * 4
    assert all(0 <= r["top1"] <= 100 and r["train_size"] == 16 for r in rows)
    loss = {(r["model"], r["protocol"], r["rope_scaling"]): r["loss"] for r in rows if r["eval_size"] == 24}
    assert loss["vit_rope_tiny", "finetune", "none"] != loss["vit_rope_tiny", "resize", "none"]  # it trained
    assert loss["vit_ape_tiny", "finetune", "-"] != loss["vit_ape_tiny", "resize", "-"]
    monkeypatch.undo()
    plain = train.main([*FINETUNE, "--output", str(tmp_path / "plain")])
    assert plain == [r for r in rows if r["protocol"] == "resize"]
    md = (tmp_path / "ft" / "results.md").read_text()
    assert "evaluated with protocol `finetune`" in md


class KilledWhileFineTuning(BaseException):
    """A kill in the middle of a fine-tuning (BaseException: nothing in train.py catches it)."""


def test_a_run_killed_while_fine_tuning_resumes_to_the_same_results(tmp_path, monkeypatch, capsys):
    """Killed after one step of its second fine-tuning, the run resumes (--resume) to the results and log of an
    unbroken run: the trained model from its checkpoint, every fine-tuning computed again from it with the same
    seeds. Other --finetune-sizes on resume fine-tune the saved weights again without training them again."""
    args = [
        *FINETUNE,
        "--models",
        "vit_rope_tiny",
        "--finetune-sizes",
        "24",
        "--finetune-steps",
        "3",
        "--drop-path",
        "0.1",
    ]  # fmt: skip  (drop path draws from the RNG: unseeded fine-tuning would differ)
    train.main([*args, "--output", str(tmp_path / "full")])
    original, calls = train.train_one_epoch, {"n": 0}

    def train_one_epoch(model, ddp, loader, training, run, epoch, device):
        if "finetune" in run.tag:
            calls["n"] += 1
            if calls["n"] == 2:
                real = loader

                class OneBatchThenKill:
                    def __len__(self):
                        return len(real)

                    def __iter__(self):
                        batches = iter(real)
                        yield next(batches)
                        raise KilledWhileFineTuning

                loader = OneBatchThenKill()
        return original(model, ddp, loader, training, run, epoch, device)

    monkeypatch.setattr(train, "train_one_epoch", train_one_epoch)
    with pytest.raises(KilledWhileFineTuning):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    assert calls["n"] == 2 and not (tmp_path / "killed" / "results.csv").exists()
    capsys.readouterr()
    train.main(["--output", str(tmp_path / "killed"), "--resume"])
    assert "[vit_rope_tiny] resumed after epoch 1 of 1" in capsys.readouterr().out
    same_run(tmp_path / "killed", tmp_path / "full")
    full = read_csv(tmp_path / "full" / "results.csv")
    rows = train.main(["--output", str(tmp_path / "killed"), "--resume", "--finetune-sizes", "24", "32"])
    assert len(read_csv(tmp_path / "killed" / "log.csv")) == 1  # not trained again
    again = [{k: str(v) for k, v in r.items()} for r in rows if r["eval_size"] != 32]
    assert again == full and {r["eval_size"] for r in rows if r["protocol"] == "finetune"} == {24, 32}


# ------------------------------------------------------------------------------ hostile round 5: train.py's inputs
def test_eval_only_never_evaluates_a_head_it_did_not_load(finished_run, tmp_path):
    """An 8-class model on 2-class data: its classifier would be a new, random one; eval-only refuses it. Class names
    the checkpoint's folder records in another order would mislabel every class: refused too."""
    make_imagefolder(tmp_path / "two", classes=2, per_class=3)
    data = ["--dataset", "imagefolder", "--data-dir", str(tmp_path / "two"), "--eval-sizes", "16"]
    with pytest.raises(SystemExit, match=r"--eval-only of vit_rope_tiny: .* another class count than the 2 classes"):
        train.main([*data, "--eval-only", "--initial-checkpoint", str(finished_run / "vit_rope_tiny"),
                    "--rope-scaling", "none", "--output", str(tmp_path / "ev")])  # fmt: skip
    folder = tmp_path / "permuted"
    shutil.copytree(finished_run / "vit_rope_tiny", folder)
    config = json.loads((folder / "config.json").read_text())
    config["label_names"] = config["label_names"][::-1]
    (folder / "config.json").write_text(json.dumps(config))
    for start, args in ((folder, without_models(ONE)), (folder / "model.safetensors", ONE)):
        with pytest.raises(SystemExit, match=r"was trained on other classes \(class 0 is '.*' in --dataset synthetic"):
            train.main([*args, "--eval-only", "--initial-checkpoint", str(start), "--output", str(tmp_path / "ev")])
    assert not (tmp_path / "ev").exists()


def test_training_from_weights_of_another_class_count_says_the_head_is_new(finished_run, tmp_path, capsys):
    make_imagefolder(tmp_path / "three", classes=3, per_class=4)
    start = str(finished_run / "vit_rope_tiny")
    train.main([*without_models(TINY), "--dataset", "imagefolder", "--data-dir", str(tmp_path / "three"),
                "--eval-sizes", "16", "--epochs", "1", "--batch-size", "4", "--rope-scaling", "none",
                "--initial-checkpoint", start, "--output", str(tmp_path / "ft")])  # fmt: skip
    assert "its classifier has another class count; the head (head.weight, head.bias) is new, initialised for 3" in (
        capsys.readouterr().out
    )


def test_weights_of_another_dtype_kind_are_refused_not_cast(finished_run, tmp_path):
    weights = load_file(finished_run / "vit_rope_tiny" / "model.safetensors")
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()}, tmp_path / "bf16.safetensors")
    rows = train.main([*ONE, "--eval-only", "--initial-checkpoint", str(tmp_path / "bf16.safetensors"),
                       "--output", str(tmp_path / "bf16")])  # fmt: skip
    assert rows  # (float to float loads)
    for dtype in (torch.int32, torch.bool):
        save_file({**weights, "head.weight": weights["head.weight"].to(dtype)}, tmp_path / "int.safetensors")
        with pytest.raises(SystemExit, match=rf"1 tensor\(s\) have another kind of dtype .* head.weight \({dtype}"):
            train.main([*ONE, "--eval-only", "--initial-checkpoint", str(tmp_path / "int.safetensors"),
                        "--output", str(tmp_path / "int")])  # fmt: skip


class FullDisk:
    """A file opened for writing whose writes fail as on a full disk."""

    def __init__(self, f):
        self.f = f

    def write(self, data):
        raise OSError(__import__("errno").ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def full_disk_at(monkeypatch, name: str) -> None:
    """Writing the file ``name`` (its temporary, by atomic_write) fails with ENOSPC; every other file is written."""
    fdopen = folder.os.fdopen

    def full(fd, *args, **kwargs):
        f = fdopen(fd, *args, **kwargs)
        return FullDisk(f) if f".{name}." in os.readlink(f"/proc/self/fd/{fd}") else f

    monkeypatch.setattr(folder.os, "fdopen", full)


@pytest.mark.parametrize("name", ["checkpoint.pt", "model.safetensors", "log.csv", "results.csv", "overview.png"])
def test_a_full_disk_is_one_line_naming_the_file_and_resume_finishes_the_run(name, tmp_path, monkeypatch):
    args = [*ONE, "--epochs", "1"]
    train.main([*args, "--output", str(tmp_path / "full")])
    out = tmp_path / "run"
    full_disk_at(monkeypatch, name)
    with pytest.raises(SystemExit, match=rf"^error: no space left writing {out}/(vit_rope_tiny/)?{name}; .*--resume"):
        train.main([*args, "--output", str(out)])
    assert not [p for p in out.rglob(".*.tmp")]  # (the temporary removed)
    monkeypatch.undo()
    train.main(["--output", str(out), "--resume"])
    assert read_csv(out / "results.csv") == read_csv(tmp_path / "full" / "results.csv")


def test_the_printed_results_are_the_ones_written_never_a_file_planted_after(tmp_path, monkeypatch, capsys):
    """results.md is printed from what the run wrote, not read back by path: a link planted there afterwards (to
    a file of someone else's) is neither followed nor printed."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not the run's")
    write = train.write_results

    def then_a_link(rows, out, *args, **kwargs):
        text = write(rows, out, *args, **kwargs)
        (out / "results.md").unlink()
        (out / "results.md").symlink_to(secret)
        return text

    monkeypatch.setattr(train, "write_results", then_a_link)
    train.main([*ONE, "--epochs", "1", "--output", str(tmp_path / "run")])
    printed = capsys.readouterr().out
    assert "not the run's" not in printed and "| vit_rope_tiny |" in printed


def test_eval_only_figures_do_not_claim_a_training(finished_run, tmp_path, monkeypatch):
    said = []
    write = train.write_results
    monkeypatch.setattr(train, "write_results", lambda rows, out, size, about, **kw: said.append(about) or write(
        rows, out, size, about, **kw))  # fmt: skip
    weights = finished_run / "vit_rope_tiny" / "model.safetensors"
    train.main([*ONE, "--eval-only", "--initial-checkpoint", str(weights), "--output", str(tmp_path / "ev")])
    assert said == ["synthetic, model.safetensors weights evaluated at 16 px (not trained here)"]
