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


def test_a_batch_of_seeded_items_is_its_items_one_by_one_and_a_loader_fetches_it_whole(monkeypatch):
    """SeededItems.__getitems__ (what a DataLoader over a Subset calls for a batch) gives each item as ds[i] does, in
    the order asked, and restores the process's generators once for the batch, as after one item."""
    import random

    import numpy as np
    import torch

    from vit_rope.training.rng import SeededItems

    class Draws(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return [i, *torch.rand(2).tolist(), random.random(), float(np.random.rand())]

    ds = SeededItems(Draws(), seed=11)
    one_by_one = [ds[i] for i in (4, 1, 1, 5)]
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    before = torch.rand(1).item(), random.random(), float(np.random.rand())
    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    assert ds.__getitems__([4, 1, 1, 5]) == one_by_one
    assert (torch.rand(1).item(), random.random(), float(np.random.rand())) == before
    fetched = []
    whole = SeededItems.__getitems__
    monkeypatch.setattr(SeededItems, "__getitems__", lambda self, idx: fetched.append(list(idx)) or whole(self, idx))
    loader = torch.utils.data.DataLoader(torch.utils.data.Subset(ds, [4, 1, 1, 5]), batch_size=4, collate_fn=list)
    assert next(iter(loader)) == one_by_one and fetched == [[4, 1, 1, 5]]  # one call a batch, not one an item


def test_a_batch_of_seeded_items_is_what_the_documented_seeding_draws(tmp_path):
    """A loader's batch through SeededItems against the seeding written out here (the way the runs before the batch
    path drew each sample: every generator saved, seeded by (seed * 1_000_003 + index) mod 2**63 (NumPy's mod 2**32),
    the item drawn, every generator restored): the same augmented images bit for bit, with timm's crops, flips and
    colour jitter drawing from Python's and torch's generators."""
    import random

    import numpy as np
    import torch

    from tests.training.test_idx import fashion_args, write_idx
    from vit_rope.training import data as D
    from vit_rope.training.loaders import make_loader

    g = np.random.default_rng(8)
    for split, n in (("train", 12), ("t10k", 2)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", g.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", g.integers(0, 10, n, dtype=np.uint8))
    cfg, _ = train.parse_config([*fashion_args(tmp_path), "--img-size", "14", "--batch-size", "4", "--aug"])
    data = D.build_data(cfg, dict(mean=(0.3, 0.4, 0.5), std=(0.2, 0.3, 0.4)))

    def drawn(seed: int, i: int) -> torch.Tensor:
        item_seed = (seed * 1_000_003 + i) % 2**63
        states = torch.get_rng_state(), random.getstate(), np.random.get_state()
        torch.default_generator.manual_seed(item_seed), random.seed(item_seed), np.random.seed(item_seed % 2**32)
        try:
            return data.train[i][0]
        finally:
            torch.set_rng_state(states[0]), random.setstate(states[1]), np.random.set_state(states[2])

    epoch = 1
    loader = make_loader(data.train, cfg, True, epoch)
    indices = loader.dataset.indices
    for b, (x, _) in enumerate(loader):
        reference = torch.stack([drawn(cfg.seed * 100_003 + epoch, i) for i in indices[4 * b : 4 * b + 4]])
        assert torch.equal(x, reference)


def test_a_training_set_without_augmentation_is_transformed_once_into_the_same_batches(tmp_path, monkeypatch):
    """--no-aug on an in-memory dataset: the training images are transformed once (data.Materialized) and an epoch
    indexes them, with no per-sample seeding; its batches are the per-sample path's, bit for bit, in every epoch, and
    so are the test images, kept for the size being evaluated.
    With --aug, or where the images would not fit MATERIALIZE_BYTES, each sample is transformed as it is drawn."""
    import numpy as np
    import torch

    from tests.training.test_idx import fashion_args, write_idx
    from vit_rope.training import data as D
    from vit_rope.training.loaders import make_loader

    g = np.random.default_rng(3)
    for split, n in (("train", 10), ("t10k", 4)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", g.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", g.integers(0, 10, n, dtype=np.uint8))
    args = [*fashion_args(tmp_path), "--img-size", "14", "--batch-size", "4"]
    cfg, _ = train.parse_config([*args, "--no-aug"])
    dc = dict(mean=(0.3, 0.4, 0.5), std=(0.2, 0.3, 0.4))
    data_once = D.build_data(cfg, dc)
    once = data_once.train
    assert isinstance(once, D.Materialized) and once.images.shape == (10, 3, 14, 14)
    assert data_once.eval_set(28, "resize") is data_once.eval_set(28, "resize")  # kept across scaling modes
    tests_once = {size: data_once.eval_set(size, "resize") for size in (8, 14, 28)}
    monkeypatch.setattr(D, "MATERIALIZE_BYTES", 10 * 3 * 14 * 14 * 4 - 1)  # one byte short of the training set
    data_each = D.build_data(cfg, dc)
    each = data_each.train
    assert not isinstance(each, D.Materialized)
    for epoch in (0, 1):
        batches = zip(make_loader(once, cfg, True, epoch), make_loader(each, cfg, True, epoch), strict=True)
        for (x, y), (x_each, y_each) in batches:
            assert torch.equal(x, x_each) and torch.equal(y, y_each)
    for size in (8, 14, 28):  # the test images too (4 of them fit the limit at 8 and 14 px, not at 28)
        test_once, test_each = tests_once[size], data_each.eval_set(size, "resize")
        assert isinstance(test_once, D.Materialized) and isinstance(test_each, D.Materialized) == (size < 28)
        for (x, y), (x_each, y_each) in zip(test_once, test_each, strict=True):
            assert torch.equal(x, x_each) and y == y_each
    monkeypatch.undo()
    augmented, _ = train.parse_config([*args, "--aug"])
    assert not isinstance(D.build_data(augmented, dc).train, D.Materialized)


def test_train_sizes_from_originals_draws_each_batch_from_the_originals_at_its_size(tmp_path):
    """--train-sizes-from originals: each batch holds its images drawn from the originals at the batch's size (the
    same order and labels, and for each image the same draws, as at --img-size), not the --img-size batch resized
    (--train-sizes-from batch, the default), which has no more detail than --img-size holds."""
    import numpy as np
    import torch

    from tests.training.test_idx import fashion_args, write_idx
    from vit_rope.training import data as D
    from vit_rope.training.loaders import image_sizes_of_batches, make_loader, resize_batch, train_loader
    from vit_rope.training.plan import plan_runs
    from vit_rope.training.rng import SeededItems

    g = np.random.default_rng(5)
    for split, n in (("train", 24), ("t10k", 4)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte.gz", g.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte.gz", g.integers(0, 10, n, dtype=np.uint8))
    args = [*fashion_args(tmp_path), "--img-size", "14", "--batch-size", "4", "--aug", "--train-sizes", "8", "14",
            "28", "--models", "vit_rope_tiny"]  # fmt: skip
    dc = dict(mean=(0.3, 0.4, 0.5), std=(0.2, 0.3, 0.4))
    for epoch in (0, 1):
        cfg, _ = train.parse_config([*args, "--train-sizes-from", "originals"])
        data = D.build_data(cfg, dc)
        run = plan_runs(cfg)[0]
        batches = list(train_loader(run, data, None, epoch))
        sizes = image_sizes_of_batches(cfg, epoch, len(batches))
        assert len(batches) == 6 and set(sizes) == {8, 14, 28}  # (the draw of this seed: every size in two epochs)
        plain_cfg, _ = train.parse_config(args)  # --train-sizes-from batch: the 14-px batches, resized after
        plain = list(make_loader(D.build_data(plain_cfg, dc).train, plain_cfg, True, epoch))
        seeded = {s: SeededItems(data.train_at(s), cfg.seed * 100_003 + epoch) for s in (8, 14, 28)}
        indices = make_loader(data.train, cfg, True, epoch).dataset.indices
        for b, ((x, y), (x14, y14), size) in enumerate(zip(batches, plain, sizes, strict=True)):
            assert x.shape == (4, 3, size, size) and torch.equal(y, y14)
            expected = torch.stack([seeded[size][i][0] for i in indices[4 * b : 4 * b + 4]])
            assert torch.equal(x, expected)  # each image from its original at the batch's size
            if size == 14:
                assert torch.equal(x, x14)  # at --img-size both ways agree
            else:
                assert not torch.allclose(x, resize_batch(x14, size), atol=1e-3)  # not the 14-px batch resized
            if size == 28:  # the same crop of each original as at 14 px: its 28-px image, resized to 14, is near it
                near, far = ((resize_batch(x, 14) - ref).abs().mean() for ref in (x14, x14.roll(1, 0)))
                assert near < far / 3, (near, far)  # (against another image of the batch)


def test_a_run_trained_at_sizes_drawn_from_the_originals_is_the_same_for_any_workers_and_resumes_only_so(tmp_path):
    """train.py --train-sizes-from originals end to end (the built-in scenes, drawn natively at each size): 0 and 2
    workers train the same, the default (batch) trains otherwise, and --resume refuses to switch it."""
    args = [*ONE, "--aug", "--train-sizes", "8", "16", "24", "--train-sizes-from", "originals"]
    train.main([*args, "--output", str(tmp_path / "zero")])
    train.main([*args, "--workers", "2", "--output", str(tmp_path / "two")])
    same_run(tmp_path / "two", tmp_path / "zero")
    train.main([*args[:-1], "batch", "--output", str(tmp_path / "batch")])  # the default: another training
    with pytest.raises(AssertionError):
        same_run(tmp_path / "batch", tmp_path / "zero")
    with pytest.raises(SystemExit, match=r"--resume cannot change train_sizes_from 'originals' -> 'batch'"):
        train.main(["--output", str(tmp_path / "zero"), "--resume", "--train-sizes-from", "batch", "--epochs", "3"])
