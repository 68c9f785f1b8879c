"""vit_rope/training/loaders.py: batches drawn from (seed, epoch) and each sample's augmentation from (seed, epoch,
index), so that any --workers, and a resumed run, see the same ones."""

import pytest

import train
from tests.test_train import ONE, Killed, interrupt, same_run  # noqa: F401 (shared settings, helpers and fixtures)


def test_any_workers_give_the_same_augmented_batches_and_a_resume_may_change_them(tmp_path, monkeypatch):
    """--workers is documented as just applying on --resume: each training sample's augmentation is drawn from
    (seed, epoch, index), so 0 and 2 workers train the same, and a run killed after epoch 1 and resumed with 2
    workers ends as the unbroken run with 0."""
    args = [*ONE, "--aug", "--drop-path", "0.1"]  # (random crops and flips; drop path draws in the main process)
    train.main([*args, "--output", str(tmp_path / "full")])
    train.main([*args, "--workers", "2", "--output", str(tmp_path / "two")])
    same_run(tmp_path / "two", tmp_path / "full")
    interrupt(monkeypatch, at=1, before=False)
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    train.main(["--output", str(tmp_path / "killed"), "--resume", "--workers", "2"])
    same_run(tmp_path / "killed", tmp_path / "full")
