"""train.py end to end on tiny settings: outputs, resume after SIGKILL, torchrun, fine-tuning, errors."""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import load_file

import train
from vit_rope.data import SyntheticScenes

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


def test_finetune_from_checkpoint_with_other_classes_and_size(tmp_path):
    train.main([*TINY, "--models", "vit_ape_tiny", "--epochs", "1", "--output", str(tmp_path / "pre")])
    make_imagefolder(tmp_path / "folder", classes=3, per_class=6)
    ckpt = tmp_path / "pre" / "vit_ape_tiny" / "model.safetensors"
    rows = train.main([
        *TINY, "--models", "vit_ape_tiny", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "folder"),
        "--img-size", "24", "--eval-sizes", "24", "--epochs", "1", "--batch-size", "6", "--no-aug",
        "--initial-checkpoint", str(ckpt), "--output", str(tmp_path / "ft"),
    ])  # fmt: skip
    assert [r["eval_size"] for r in rows] == [24]
    tuned = load_file(tmp_path / "ft" / "vit_ape_tiny" / "model.safetensors")
    assert tuned["head.weight"].shape == (3, 32) and tuned["pos_embed"].shape == (1, 9, 32)
    # eval-only of the fine-tuned weights gives the same numbers as the end of fine-tuning
    again = train.main([
        *TINY, "--models", "vit_ape_tiny", "--dataset", "imagefolder", "--data-dir", str(tmp_path / "folder"),
        "--img-size", "24", "--eval-sizes", "24", "--eval-only",
        "--initial-checkpoint", str(tmp_path / "ft" / "vit_ape_tiny" / "model.safetensors"),
        "--output", str(tmp_path / "ev"),
    ])  # fmt: skip
    assert again[0]["top1"] == rows[0]["top1"] and again[0]["loss"] == rows[0]["loss"]


def test_video_comparison_runs(tmp_path):
    rows = train.main([
        "--dataset", "synthetic_video", "--models", "vit_rope3d_tiny:pos_embed=ape", "vit_rope3d_tiny",
        "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2",
        "--img-size", "16", "--num-frames", "4", "--eval-sizes", "16", "24", "--train-samples", "32",
        "--val-samples", "16", "--epochs", "1", "--batch-size", "16", "--output", str(tmp_path),
    ])  # fmt: skip
    assert {r["model"] for r in rows} == {"vit_rope3d_tiny:pos_embed=ape", "vit_rope3d_tiny"}
    assert (tmp_path / "vit_rope3d_tiny__pos_embed=ape" / "model.safetensors").exists()


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}

    class Exploding(torch.nn.CrossEntropyLoss):
        def forward(self, logits, target):
            calls["n"] += 1
            loss = super().forward(logits, target)
            return loss * float("nan") if calls["n"] > 3 else loss  # 3 steps per epoch: breaks in epoch 2

    monkeypatch.setattr(train, "LabelSmoothingCrossEntropy", lambda *_: Exploding())
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
    with pytest.raises(ValueError, match="has no images"):
        train.main(
            [*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "empty"), "--output", str(tmp_path)]
        )
    make_imagefolder(tmp_path / "broken", classes=2, per_class=2)
    (tmp_path / "broken" / "train" / "class0" / "zzz.png").write_bytes(b"not a png")
    with pytest.raises(ValueError, match="cannot read image .*zzz.png"):
        train.main([*TINY, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "broken"), "--batch-size", "2",
                    "--output", str(tmp_path / "o")])  # fmt: skip
    with pytest.raises(SystemExit, match="--eval-only needs"):
        train.main([*TINY, "--eval-only", "--output", str(tmp_path / "e")])
    with pytest.raises(SystemExit, match="unknown model 'vit_nope'"):
        train.main([*TINY, "--models", "vit_nope", "--output", str(tmp_path / "m")])


def test_ema_weights_are_the_ones_evaluated_and_saved(tmp_path):
    """With --ema-decay 1 the average never moves off the initial weights: what is saved and evaluated equals an
    untrained run (--lr 0 --min-lr 0, same seed), while the raw weights in the checkpoint did train."""
    one = [*TINY, "--models", "vit_rope_tiny", "--rope-scaling", "none", "--epochs", "1"]
    train.main([*one, "--ema", "--ema-decay", "1.0", "--output", str(tmp_path / "ema")])
    train.main([*one, "--lr", "0", "--min-lr", "0", "--output", str(tmp_path / "still")])
    saved, still = (load_file(tmp_path / d / "vit_rope_tiny" / "model.safetensors") for d in ("ema", "still"))
    raw = torch.load(tmp_path / "ema" / "vit_rope_tiny" / "checkpoint.pt", weights_only=False)["model"]
    for k in still:
        torch.testing.assert_close(saved[k], still[k], rtol=0, atol=0, msg=k)
    assert any(not torch.equal(raw[k], still[k]) for k in still)
    top1 = [[r["top1"] for r in read_csv(tmp_path / d / "results.csv")] for d in ("ema", "still")]
    assert top1[0] == top1[1]


def test_mixup_and_cutmix_feed_soft_targets(tmp_path, monkeypatch):
    """--mixup/--cutmix run timm's Mixup on every batch, and the loss gets its mixed targets."""
    mixed, fed = [], []

    class SpyMixup(train.Mixup):
        def __call__(self, x, target):
            x, soft = super().__call__(x, target)
            mixed.append(soft)
            return x, soft

    class SpyLoss(train.SoftTargetCrossEntropy):
        def forward(self, logits, target):
            fed.append(target)
            return super().forward(logits, target)

    monkeypatch.setattr(train, "Mixup", SpyMixup)
    monkeypatch.setattr(train, "SoftTargetCrossEntropy", SpyLoss)
    args = [*TINY, "--models", "vit_rope_tiny", "--rope-scaling", "none", "--epochs", "1", "--label-smoothing", "0"]
    train.main([*args, "--mixup", "0.8", "--cutmix", "1.0", "--output", str(tmp_path)])
    assert len(mixed) == 3  # 96 samples / batch 32
    assert all(f is m for f, m in zip(fed, mixed, strict=True))
    for soft in mixed:
        assert soft.shape == (32, 8)
        torch.testing.assert_close(soft.sum(1), torch.ones(32))
        assert (soft.amax(1) < 1).any()  # without label smoothing only mixing makes a row soft (not one-hot)


def test_data_config_comes_from_the_models_pretrained_cfg():
    """Without building the model, the same normalisation as timm reads off the built one (with an overlay too)."""
    cfg, _ = train.parse_config([*TINY])
    for overlay in (None, dict(mean=(0.5, 0.25, 0.125), std=(0.2, 0.3, 0.4))):
        cfg["model_kwargs"] = dict(pretrained_cfg_overlay=overlay) if overlay else {}
        built = timm.create_model("vit_rope_tiny", **cfg["model_kwargs"])
        expected = train.resolve_data_config({}, model=built)
        got = train.data_config(cfg, "vit_rope_tiny")
        assert (got["mean"], got["std"]) == (expected["mean"], expected["std"])
    assert got["mean"] == (0.5, 0.25, 0.125)
