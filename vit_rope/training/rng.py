"""Random state: seeding a run, and each process's generators saved and restored with its checkpoint, as tensors and
plain numbers only (so that a checkpoint loads with ``torch.load(weights_only=True)``, which runs no pickled code)."""

import random

import numpy as np
import torch
import torch.distributed as dist

__all__ = ["SeededItems", "all_rng_states", "restore_rng_state", "seed_everything"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class SeededItems(torch.utils.data.Dataset):
    """``ds`` whose item ``i`` is drawn with torch's, Python's and numpy's generators seeded by ``(seed, i)`` alone
    (``seed``: the run's seed and epoch), the process's own generators restored after: an augmented sample is the same
    whichever process (DataLoader worker or the main one) makes it, so any --workers gives the same batches, a run
    resumed with other --workers included, and the draws of the training step (dropout, mixup) do not depend on it.
    A DataLoader fetches a batch through ``__getitems__``: the same items, the generators saved and restored once a
    batch instead of once an item (numpy's state alone takes about 100 µs to save and restore, a sixth of an item)."""

    def __init__(self, ds: torch.utils.data.Dataset, seed: int) -> None:
        self.ds, self.seed = ds, seed

    def __len__(self) -> int:
        return len(self.ds)

    def __getitem__(self, i: int):
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list:
        python, numpy = random.getstate(), np.random.get_state()
        with torch.random.fork_rng(devices=[]):  # the CPU's alone: torch.manual_seed would also reseed (and leave
            # reseeded) every CUDA generator, at 30 times the cost
            try:
                return [self.drawn(i) for i in indices]
            finally:
                random.setstate(python)
                np.random.set_state(numpy)

    def drawn(self, i: int):
        """Item ``i`` with every generator seeded by (seed, i) first (the caller restores them)."""
        item_seed = (self.seed * 1_000_003 + int(i)) % 2**63
        torch.default_generator.manual_seed(item_seed)
        random.seed(item_seed)
        np.random.seed(item_seed % 2**32)
        return self.ds[i]


def rng_state() -> dict:
    """This process's generators: torch's (and CUDA's) as tensors, Python's and numpy's as numbers and tensors."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    numpy = (kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)
    return dict(torch=torch.get_rng_state(), cuda=cuda, python=random.getstate(), numpy=numpy)


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))


def all_rng_states() -> list[dict]:
    """Every rank's generators (a collective: all ranks call it), in rank order."""
    if not dist.is_initialized():
        return [rng_state()]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


def restore_rng_state(saved: list[dict], rank: int, world: int) -> None:
    """Each rank continues from its own saved draws; with another number of processes, every rank from rank 0's."""
    if len(saved) != world and rank == 0:
        print(
            f"note: the checkpoint holds the RNG state of {len(saved)} process(es), this run has {world}: every "
            "rank continues from rank 0's, so random draws (drop path, mixup) differ from an uninterrupted run",
            flush=True,
        )
    set_rng_state(saved[rank] if len(saved) == world else saved[0])
