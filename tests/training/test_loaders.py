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


def test_a_seeded_item_leaves_every_generator_of_the_process_as_it_was(monkeypatch):
    """SeededItems draws each item from (seed, index) alone and restores the process's torch, Python and NumPy
    generators; CUDA's are never touched (torch.manual_seed would reseed them, and fork_rng would not restore them)."""
    import random

    import numpy as np
    import torch

    from vit_rope.training.rng import SeededItems

    class Draws(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return torch.rand(2).tolist() + [random.random(), float(np.random.rand())]

    reseeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: reseeded.append(seed))
    ds = SeededItems(Draws(), seed=7)
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    before = torch.rand(1).item(), random.random(), float(np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    reseeded.clear()
    first = ds[2]
    assert (torch.rand(1).item(), random.random(), float(np.random.rand())) == before
    assert ds[2] == first and ds[3] != first and reseeded == []
