"""Processes and devices: one process per device under torchrun, and this process's rank among them."""

import os

import torch
import torch.distributed as dist

__all__ = ["all_sum", "rank_world", "resolve_device", "setup_distributed"]


def rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def resolve_device(name: str) -> torch.device:
    """``--device`` as a torch device (``auto``: CUDA if there is one); a device this machine lacks is an error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SystemExit(f"error: --device {name!r} is not a device name; use auto, cpu, cuda, cuda:N or mps") from None
    backend = getattr(torch, device.type, None)
    count = 1 if device.type == "cpu" else backend.device_count() if backend and backend.is_available() else 0
    if (device.index or 0) >= count:
        raise SystemExit(f"error: --device {name} is not on this machine ({count} {device.type} device(s)); use auto")
    return device


def setup_distributed(device: torch.device) -> torch.device:
    """One process per device under torchrun (NCCL on CUDA, gloo on the CPU); this process's device."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            return torch.device("cuda", torch.cuda.current_device())
    return device


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """Each value summed over every process."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()
