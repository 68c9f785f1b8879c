"""vit_rope/training/preflight.py: what train.py checks before it writes anything (an --output inside the data, settings
that take no effect, the initial weights' hash, scaling modes that compute the same)."""

import shutil

import pytest
import timm
import torch
import yaml
from safetensors.torch import load_file, save_file

import train
from tests.test_train import (  # noqa: F401 (shared settings, helpers and fixtures)
    ONE,
    TINY_KWARGS,
    finished_run,
    make_imagefolder,
    snapshot,
)


def test_an_output_inside_the_data_is_refused(tmp_path):
    """The run's figures and folders inside a folder dataset's train/ would become a class of its next run."""
    make_imagefolder(tmp_path / "data", classes=2, per_class=2)
    for out in (tmp_path / "data" / "train" / "runs", tmp_path / "data"):
        with pytest.raises(SystemExit, match=r"--output .* lies in --data-dir .*; choose an --output outside"):
            train.main([*ONE, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "data"), "--batch-size", "2",
                        "--output", str(out)])  # fmt: skip
    assert sorted(p.name for p in (tmp_path / "data" / "train").iterdir()) == ["class0", "class1"]


def test_a_setting_that_takes_no_effect_says_so(tmp_path, capsys):
    train.main([*ONE, "--epochs", "1", "--seq-lens", "5", "--finetune-steps", "5", "--allow-transfer",
                "--ema-decay", "0.5", "--output", str(tmp_path / "run")])  # fmt: skip
    out = capsys.readouterr().out
    for flag, needs in (("seq-lens", "naflex"), ("finetune-steps", "finetune-sizes"),
                        ("allow-transfer", "initial-checkpoint"), ("ema-decay", "ema")):  # fmt: skip
        assert f"note: --{flag} takes no effect without --{needs} (no run has it)" in out


def test_resume_with_no_run_to_continue_says_it_starts_one(tmp_path, capsys):
    train.main([*ONE, "--epochs", "1", "--resume", "--output", str(tmp_path / "new")])
    assert "holds no run to continue (no config.yaml); starting one" in capsys.readouterr().out


def test_resume_refuses_an_initial_checkpoint_replaced_since_the_run_began(finished_run, tmp_path):  # noqa: F811
    """A run records the sha256 of the weights it started from; --resume after the file was replaced would mix rows
    of two weight files in one table: refused, naming the file and both hashes."""
    start = tmp_path / "start.safetensors"
    shutil.copy(finished_run / "vit_rope_tiny" / "model.safetensors", start)
    args = [*ONE, "--eval-only", "--initial-checkpoint", str(start), "--output", str(tmp_path / "ev")]
    train.main(args)
    digest = yaml.safe_load((tmp_path / "ev" / "config.yaml").read_text())["initial_checkpoint_sha256"]
    assert digest == __import__("hashlib").sha256(start.read_bytes()).hexdigest()
    weights = load_file(start)
    save_file({k: v + 1 if k == "head.bias" else v for k, v in weights.items()}, start)
    before = snapshot(tmp_path / "ev")
    with pytest.raises(SystemExit, match=rf"start.safetensors of sha256 {digest[:12]}\.\.\., and that file now has"):
        train.main(["--output", str(tmp_path / "ev"), "--resume"])
    assert snapshot(tmp_path / "ev") == before
    with pytest.raises(SystemExit, match="not --initial-checkpoint-sha256"):  # a hash given: the file must have it
        train.main([*args[:-1], str(tmp_path / "pinned"), "--initial-checkpoint-sha256", digest])


def test_scaling_modes_that_compute_the_same_are_evaluated_once(tmp_path, capsys):
    """Under rope_coords=normalized every mode computes the same (checked here on the model): one row per size,
    as none, and a line naming the modes it stands for."""
    modes = ["none", "pi", "ntk", "yarn", "normalized"]
    model = timm.create_model("vit_rope_tiny", rope_coords="normalized", img_size=16, patch_size=8, depth=1,
                              embed_dim=32, num_heads=2).eval()  # fmt: skip
    x = torch.randn(2, 3, 24, 24)
    outputs = []
    for mode in modes:
        model.set_rope_scaling(mode)
        with torch.no_grad():
            outputs.append(model(x))
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])
    args = [*ONE, "--model-kwargs", *TINY_KWARGS[1:], "rope_coords=normalized", "--eval-sizes", "16", "24"]
    rows = train.main([*args, "--rope-scaling", *modes, "--epochs", "1", "--no-native-eval", "--output", str(tmp_path)])
    assert [(r["eval_size"], r["rope_scaling"]) for r in rows] == [(16, "none"), (24, "none")]
    assert "--rope-scaling none pi ntk yarn normalized all compute the same: evaluated once, as none" in (
        capsys.readouterr().out
    )
