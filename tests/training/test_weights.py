"""Weights a run loads and saves (vit_rope/training/weights.py): nothing loaded runs code, every field of a checkpoint
is checked for its type and range when it is read, and weights load only into the kind of model they record. A
broken, forged or foreign file is one line naming it, and the run's folder stays as it was."""

import json
import os
import pathlib
import shutil

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import train
from tests.test_train import TINY, snapshot
from tests.training.test_folder import EPOCH, copy_of, finish, one_line


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> pathlib.Path:
    return finish(tmp_path_factory)


class Planted:
    """A pickled object whose unpickling creates ``marker``: were anything loaded with a full unpickle, it would
    run."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def plant(path: pathlib.Path, marker: pathlib.Path, **extra) -> pathlib.Path:
    torch.save(dict(model=Planted(marker), optimizer={}, model_ema=None, epoch=0, rng=[], **extra), path)
    return path


# ------------------------------------------------------------------------------------------------ loaders
def test_a_planted_pickle_in_a_runs_checkpoint_runs_nothing_on_resume(finished, tmp_path):
    run, marker = copy_of(finished, tmp_path), tmp_path / "ran"
    plant(run / "vit_rope_tiny" / "checkpoint.pt", marker)
    before = snapshot(run)
    with pytest.raises(SystemExit) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    text = one_line(stop)
    assert "checkpoint.pt cannot be read as a checkpoint (it holds pickled objects" in text
    assert "model.safetensors" in text  # the weights that may be whole, and what else to do
    assert not marker.exists() and snapshot(run) == before


@pytest.mark.parametrize("where", ["initial-checkpoint", "eval-only", "video", "pretrained"])
def test_a_planted_pickle_runs_nothing_through_any_loader(where, tmp_path):
    marker, path = tmp_path / "ran", plant(tmp_path / "weights.pt", tmp_path / "ran")
    args = {
        "initial-checkpoint": [*EPOCH, "--initial-checkpoint", str(path)],
        "eval-only": [*EPOCH, "--eval-only", "--initial-checkpoint", str(path)],
        "video": ["--dataset", "synthetic_video", "--models", "vit_rope3d_tiny", *TINY[3:8], "--num-frames", "2",
                  "--img-size", "16", "--eval-sizes", "16", "--initial-checkpoint", str(path)],
        "pretrained": [*EPOCH, "--pretrained", "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32",
                       "num_heads=2", f"pretrained_cfg_overlay={{file: {path}}}"],
    }[where]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        train.main([*args, "--output", str(tmp_path / "out")])
    assert "weights.pt" in one_line(stop) or "pretrained weights of" in one_line(stop)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_timms_pretrained_path_runs_no_pickle_either(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(Exception):  # noqa: B017 (timm's own error: it refuses the file)
        timm.create_model("vit_rope_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(plant(
            tmp_path / "w.pt", marker))))  # fmt: skip
    assert not marker.exists()


def test_the_planted_pickle_would_run_under_a_full_unpickle(tmp_path):
    """The tests above have teeth: loading the same file without weights_only runs it."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "w.pt", marker), weights_only=False)
    assert marker.exists()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "ok.safetensors"))  # (a whole file, for contrast)


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "empty", "another model"])
def test_a_broken_checkpoint_is_one_line_and_the_results_stay(damage, finished, tmp_path):
    run = copy_of(finished, tmp_path)
    ckpt = run / "vit_rope_tiny" / "checkpoint.pt"
    if damage == "random bytes":
        ckpt.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:  # a whole checkpoint of another size: it reads, and does not fit
        other = tmp_path / "other"
        train.main([*EPOCH, "--model-kwargs", "embed_dim=16", "--output", str(other)])
        shutil.copy(other / "vit_rope_tiny" / "checkpoint.pt", ckpt)
    before = snapshot(run)
    with pytest.raises(SystemExit) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    text = one_line(stop)
    assert str(ckpt) in text and ("cannot be read" in text or "weights of another model" in text)
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", ["truncated", "garbled header"])
def test_a_broken_safetensors_file_is_one_line(damage, finished, tmp_path):
    path = tmp_path / "w.safetensors"
    whole = (finished / "vit_rope_tiny" / "model.safetensors").read_bytes()
    path.write_bytes(whole[:100] if damage == "truncated" else b"\xff" * 8 + whole[8:])
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--initial-checkpoint", str(path), "--output", str(tmp_path / "out")])
    assert f"--initial-checkpoint '{path}' cannot be read as weights" in one_line(stop)


# ------------------------------------------------------------------------------- forged checkpoint fields
def garbage_rng(state: dict) -> list:
    one = state["rng"][0]
    return [{**one, "python": (3, (1, 2, 3), None)}]


def wrong_optimizer_shape(state: dict) -> dict:
    opt = {**state["optimizer"], "state": {k: dict(v) for k, v in state["optimizer"]["state"].items()}}
    opt["state"][0]["exp_avg"] = torch.zeros(3)
    return opt


FORGED = {  # field → (its forged value from the real state, the error's words)
    "epoch None": ("epoch", lambda s: None, "epoch 'None' is not a whole number"),
    "epoch a string": ("epoch", lambda s: "1", "epoch '1' is not a whole number"),
    "epoch 0.5": ("epoch", lambda s: 0.5, "epoch '0.5' is not a whole number"),
    "epoch -3": ("epoch", lambda s: -3, "epoch '-3' is not a whole number"),
    "epoch True": ("epoch", lambda s: True, "epoch 'True' is not a whole number"),
    "model a list": ("model", lambda s: [1, 2], "its model is not a mapping of weight names to tensors"),
    "model of numbers": ("model", lambda s: dict.fromkeys(s["model"], 1), "its model is not a mapping"),
    "model_ema a string": ("model_ema", lambda s: "x", "its model_ema is neither"),
    "optimizer a list": ("optimizer", lambda s: [], "its optimizer is not an optimizer's state"),
    "optimizer of another shape": ("optimizer", wrong_optimizer_shape, "optimizer state that does not fit"),
    "optimizer of other groups": ("optimizer", lambda s: {**s["optimizer"], "param_groups": []},
                                  "optimizer state that does not fit"),
    "optimizer lr a string": ("optimizer", lambda s: {**s["optimizer"], "param_groups": [
        {**g, "lr": "fast"} for g in s["optimizer"]["param_groups"]]}, "group setting lr is 'fast'"),
    "rng empty": ("rng", lambda s: [], "random-number states are not a list"),
    "rng garbage": ("rng", garbage_rng, "random-number state of process 0 is not one the generators take"),
    "record garbled": ("record", lambda s: {"model": 1}, "damaged model record"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_checkpoint_field_is_one_line_and_the_run_stays(case, finished, tmp_path):
    """Issue 35, 5: a checkpoint.pt whose fields parse but lie (an epoch of -3 trained epochs -1..2 silently; the
    others gave tracebacks after the results were deleted): every field is checked when it is read, and the refusal
    comes before anything in --output changes."""
    key, forge, message = FORGED[case]
    run = copy_of(finished, tmp_path)
    path = run / "vit_rope_tiny" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, key: forge(state)}, path)
    before = snapshot(run)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "3"])
    assert str(path) in one_line(stop)
    assert snapshot(run) == before


# ------------------------------------------------------------------------------------------ family records
def test_saved_weights_record_what_model_they_are_as_plain_strings(finished):
    weights = finished / "vit_rope_tiny" / "model.safetensors"
    load_file(weights)  # plain safetensors: loads anywhere
    with safe_open(str(weights), "pt") as f:
        record = json.loads(f.metadata()["vit_rope.record"])
    assert record["model"] == "vit_rope_tiny" and record["kind"] == "vit_rope ViT, pos_embed=rope"
    assert json.loads(record["model_args"])["embed_dim"] == 32
    state = torch.load(finished / "vit_rope_tiny" / "checkpoint.pt", weights_only=True)
    assert state["record"] == record


@pytest.mark.parametrize("other", ["vit_lookhere_tiny", "vit_goldengate_tiny", "vit_spiral_tiny",
                                   "vit_rope_tiny:pos_embed=none"])  # fmt: skip
@pytest.mark.parametrize("file", ["model.safetensors", "checkpoint.pt"])
def test_weights_of_one_family_are_refused_by_another(other, file, finished, tmp_path):
    """Issue 35, 4: RoPE's weights have the names and shapes of these models' (their encodings learn nothing), so
    they loaded silently and were evaluated as another encoding; the record names both."""
    weights = finished / "vit_rope_tiny" / file
    args = [*EPOCH, "--models", other, "--eval-only", "--initial-checkpoint", str(weights)]
    with pytest.raises(SystemExit, match="holds the weights of vit_rope_tiny .*pos_embed=rope.*, not of a") as stop:
        train.main([*args, "--output", str(tmp_path / "ev")])
    assert other in one_line(stop) and "--allow-transfer" in str(stop.value)
    assert not (tmp_path / "ev").exists()
    if file == "model.safetensors" and other == "vit_lookhere_tiny":  # a deliberate transfer is one flag away
        rows = train.main([*args, "--allow-transfer", "--output", str(tmp_path / "ev")])
        assert rows and rows[0]["model"] == other


def test_a_run_resumed_as_another_family_is_refused(finished, tmp_path):
    """Issue 35, 4: a RoPE run's folder renamed and its config edited to say LookHere resumed as LookHere."""
    run = copy_of(finished, tmp_path)
    (run / "vit_rope_tiny").rename(run / "vit_lookhere_tiny")
    for name in ("config.yaml", "log.csv"):
        (run / name).write_text((run / name).read_text().replace("vit_rope_tiny", "vit_lookhere_tiny"))
    (run / "vit_lookhere_tiny" / "results.json").unlink()
    before = snapshot(run)
    with pytest.raises(SystemExit, match="holds the weights of vit_rope_tiny .*, not of a vit_lookhere_tiny") as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    one_line(stop)
    assert snapshot(run) == before


def test_ema_weights_are_checked_against_timms_ema_names_on_resume(tmp_path):
    """The EMA state of a checkpoint has timm's names (``module.`` first): a whole one resumes, one of another model
    is refused before anything changes."""
    run = tmp_path / "run"
    train.main([*EPOCH, "--ema", "--output", str(run)])
    path = run / "vit_rope_tiny" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "model_ema": {k: v[..., :1] for k, v in state["model_ema"].items()}}, path)
    before = snapshot(run)
    with pytest.raises(SystemExit, match="holds the model_ema weights of another model") as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    one_line(stop)
    assert snapshot(run) == before
    torch.save(state, path)
    train.main(["--output", str(run), "--resume", "--epochs", "2"])
    assert torch.load(path, weights_only=True)["epoch"] == 1
