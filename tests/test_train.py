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
    train_ds, eval_set, num_classes = train.build_data(cfg, dc)
    assert num_classes == 3 and len(train_ds) == 3
    val = eval_set(16, "resize")
    assert sorted(val[i][1] for i in range(len(val))) == [0, 2]
    # --eval-only takes the numbering from train/ when it is there, else from val/
    only, _ = train.parse_config([*TINY, "--dataset", dataset, "--data-dir", str(tmp_path / "ok"), "--eval-only"])
    assert train.build_data(only, dc)[2] == 3
    make_folder(tmp_path / "valonly", dict(val="ac"), clips=clips)
    only["data_dir"] = str(tmp_path / "valonly")
    assert train.build_data(only, dc)[2] == 2
    make_folder(tmp_path / "extra", dict(train="abc", val="acd"), clips=clips)
    cfg["data_dir"] = str(tmp_path / "extra")
    with pytest.raises(ValueError, match=r"class folder\(s\) \['d'\] that the training split does not have"):
        train.build_data(cfg, dc)


def test_clipfolder_eval_reads_frames_at_the_eval_size(tmp_path):
    """Clips for another eval size come from the frames, not from clips already shrunk to --img-size."""
    root = tmp_path / "clips"
    for split in ("train", "val"):
        d = root / split / "a" / "c0"
        d.mkdir(parents=True)
        for i in range(2):
            pixels = torch.Generator().manual_seed(i)
            img = (torch.rand(32, 32, 3, generator=pixels) * 255).byte().numpy()
            Image.fromarray(img).save(d / f"{i}.png")
    cfg, _ = train.parse_config(["--dataset", "clipfolder", "--data-dir", str(root), "--img-size", "8",
                                 "--num-frames", "2"])  # fmt: skip
    dc = dict(mean=(0.5,) * 3, std=(0.5,) * 3)
    clip = train.build_data(cfg, dc)[1](32, "resize")[0][0]
    direct = train.D.ClipFolder(str(root / "val"), 32, 2, dc["mean"], dc["std"])[0][0]
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
    cfg, _ = train.parse_config([*TINY, "--models", "vit_ape_tiny:dynamic_img_pad=true", "--eval-sizes", "36"])
    train.check_eval_config(cfg)  # a model that pads takes any size


def test_resume_with_more_epochs_follows_the_new_schedule(tmp_path):
    """Flags given on resume override the saved config, --epochs included: the LR follows the longer schedule."""
    train.main([*ONE, "--epochs", "2", "--output", str(tmp_path / "short")])
    (tmp_path / "short" / "vit_rope_tiny" / "results.json").unlink()  # as if killed before its evaluation
    train.main(["--output", str(tmp_path / "short"), "--resume", "--epochs", "4"])
    train.main([*ONE, "--epochs", "4", "--output", str(tmp_path / "long")])
    lrs = [[r["lr"] for r in read_csv(tmp_path / d / "log.csv")] for d in ("short", "long")]
    assert len(lrs[0]) == 4 and lrs[0][2:] == lrs[1][2:]


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


def test_resume_restores_each_ranks_rng_and_reads_old_checkpoints(tmp_path, monkeypatch, capsys):
    """The checkpoint keeps every rank's RNG state (one here); a single dict (older checkpoints, with numpy's key
    array) still resumes exactly, and another world size continues from rank 0's with a note."""
    import shutil

    import numpy as np

    args = [*ONE, "--drop-path", "0.1"]  # drop path draws from the RNG: a wrong state changes the numbers
    train.main([*args, "--output", str(tmp_path / "full")])
    interrupt(monkeypatch, at=1, before=False)
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    ckpt = Path("vit_rope_tiny") / "checkpoint.pt"
    state = torch.load(tmp_path / "killed" / ckpt, weights_only=True)  # plain data: no pickled numpy objects
    assert isinstance(state["rng"], list) and len(state["rng"]) == 1
    old = dict(state["rng"][0])
    kind, keys, *rest = old["numpy"]
    old["numpy"] = (kind, keys.numpy().astype(np.uint32), *rest)
    variants = dict(new=state["rng"], old=old, two=[state["rng"][0], {}])
    for name, rng in variants.items():
        shutil.copytree(tmp_path / "killed", tmp_path / name)
        torch.save(dict(state, rng=rng), tmp_path / name / ckpt)
        capsys.readouterr()
        train.main(["--output", str(tmp_path / name), "--resume"])
        assert ("RNG state of 2 process(es), this run has 1" in capsys.readouterr().out) == (name == "two")
        same_run(tmp_path / name, tmp_path / "full")


def test_initial_checkpoint_takes_a_runs_checkpoint_and_its_ema(tmp_path):
    """A run's own checkpoint.pt loads as --initial-checkpoint, with its EMA weights (--ema-decay 1: the initial
    ones, which are what that run evaluated); an old one that only a full unpickle reads gets a clear error."""
    one = [*ONE, "--epochs", "1"]
    train.main([*one, "--ema", "--ema-decay", "1.0", "--output", str(tmp_path / "ema")])
    ckpt = tmp_path / "ema" / "vit_rope_tiny" / "checkpoint.pt"
    rows = train.main([*one, "--eval-only", "--initial-checkpoint", str(ckpt), "--output", str(tmp_path / "ev")])
    assert rows == train.json.loads((tmp_path / "ema" / "vit_rope_tiny" / "results.json").read_text())
    import numpy as np

    torch.save(dict(model={}, rng=np.zeros(3)), tmp_path / "old.pt")
    with pytest.raises(SystemExit, match="point it at the model.safetensors next to it"):
        train.main([*one, "--eval-only", "--initial-checkpoint", str(tmp_path / "old.pt"), "--output", str(tmp_path)])


def test_model_spec_values_may_hold_commas():
    assert train.split_spec("vit_rope3d_tiny:rope_axis_dims=[8,12,12],rope_targets=vo") == (
        "vit_rope3d_tiny",
        dict(rope_axis_dims=[8, 12, 12], rope_targets="vo"),
    )
    with pytest.raises(SystemExit, match=r"model 'vit_rope_tiny:rope_axis_dims=\[8,12' .* cannot read the value"):
        train.checked_spec("vit_rope_tiny:rope_axis_dims=[8,12")


def test_scaling_modes_skip_what_a_model_cannot_take():
    modes = ["none", "pi", "ntk", "yarn", "normalized"]
    kw = dict(depth=1, img_size=32, patch_size=8)
    assert train.scaling_modes(timm.create_model("vit_ape_tiny", **kw), modes) == ["-"]
    assert train.scaling_modes(timm.create_model("vit_rope_tiny", **kw), modes) == modes
    mixed = timm.create_model("vit_rope_mixed_tiny", **kw)
    assert train.scaling_modes(mixed, modes) == ["none", "pi", "normalized"]
    vo = timm.create_model("vit_rope_tiny", rope_targets="vo", **kw)
    assert train.scaling_modes(vo, modes) == ["none", "pi", "ntk", "normalized"]
