"""vit_rope/training/resume.py: what a resumed run reads back (each rank's random states, its log) and continues
from."""

import csv
import shutil
from pathlib import Path

import pytest
import torch

import train
from tests.test_train import ONE, Killed, interrupt, read_csv, same_run  # noqa: F401 (shared settings, helpers and fixtures)


def test_resume_restores_each_ranks_rng(tmp_path, monkeypatch, capsys):
    """The checkpoint keeps every rank's RNG state (one here), as tensors and plain numbers; another world size
    continues from rank 0's with a note."""

    args = [*ONE, "--drop-path", "0.1"]  # drop path draws from the RNG: a wrong state changes the numbers
    train.main([*args, "--output", str(tmp_path / "full")])
    interrupt(monkeypatch, at=1, before=False)
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    ckpt = Path("vit_rope_tiny") / "checkpoint.pt"
    state = torch.load(tmp_path / "killed" / ckpt, weights_only=True)  # plain data: no pickled numpy objects
    assert isinstance(state["rng"], list) and len(state["rng"]) == 1
    variants = dict(new=state["rng"], two=[state["rng"][0], state["rng"][0]])  # (every process's state is checked)
    for name, rng in variants.items():
        shutil.copytree(tmp_path / "killed", tmp_path / name)
        torch.save(dict(state, rng=rng), tmp_path / name / ckpt)
        capsys.readouterr()
        train.main(["--output", str(tmp_path / name), "--resume"])
        assert ("RNG state of 2 process(es), this run has 1" in capsys.readouterr().out) == (name == "two")
        same_run(tmp_path / name, tmp_path / "full")


def test_a_resumed_log_that_lacks_epochs_says_so(tmp_path, capsys):
    run = tmp_path / "run"
    train.main([*ONE, "--epochs", "2", "--output", str(run)])
    rows = read_csv(run / "log.csv")
    with open(run / "log.csv", "w", newline="") as f:  # (epoch 2's row lost, its checkpoint kept)
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows[:1])
    capsys.readouterr()
    train.main(["--output", str(run), "--resume", "--epochs", "3"])
    assert "[vit_rope_tiny] log.csv lacks epoch(s) [2] of the checkpoint's 2" in capsys.readouterr().out
