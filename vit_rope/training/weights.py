"""Weights a run loads and saves: ``--initial-checkpoint`` weights into a model, and a run's resume state.

Nothing loaded runs code: weights come from safetensors, or from ``torch.load(weights_only=True)``, which reads
tensors and plain data and refuses any other pickled object before it is built. A file that cannot be read, or that
holds another model's weights, is one line naming the file and what to do.
"""

import pickle
from pathlib import Path

import timm
import torch
from torch import nn

from ..checkpoint import checkpoint_filter_fn, inflate_image_checkpoint, unwrap_state_dict

__all__ = ["load_initial_weights", "read_checkpoint", "resume_remedy", "timm_checkpoint_filter", "trained_epochs"]

STATE_KEYS = ("model", "optimizer", "model_ema", "epoch", "rng")  # a checkpoint.pt's resume state


def why_unreadable(e: BaseException) -> str:
    """What a loader's exception says about the file, in a few words."""
    chain = [e, e.__cause__, e.__context__]
    if any(isinstance(x, pickle.UnpicklingError) for x in chain):
        return "it holds pickled objects other than tensors and plain data, which are not loaded (nothing in it ran)"
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return f"{type(e).__name__}: {first[:160]}"


def read_checkpoint(path: Path, remedy: str, mmap: bool = False) -> dict:
    """A run's checkpoint.pt (its tensors mapped, not read, with ``mmap``); one line where it cannot be read as one."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # anything a garbled, truncated or foreign file makes torch.load raise
        raise SystemExit(f"error: {path} cannot be read as a checkpoint ({why_unreadable(e)}); {remedy}") from None
    missing = [k for k in STATE_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise SystemExit(f"error: {path} is not a train.py checkpoint (it lacks {missing}); {remedy}")
    return state


def resume_remedy(path: Path) -> str:
    """What to do about a run's checkpoint.pt that cannot be resumed from."""
    weights = path.with_name("model.safetensors")
    keep = f"its weights may be whole in {weights} (--initial-checkpoint takes it); " if weights.is_file() else ""
    return f"{keep}start the run anew in another --output, or delete {path.name} to train that run from scratch"


def trained_epochs(path: Path) -> int:
    """How many epochs a run's checkpoint.pt has finished (0 without one)."""
    if not path.is_file():
        return 0
    return read_checkpoint(path, resume_remedy(path), mmap=True)["epoch"] + 1


def load_initial_weights(model: nn.Module, path: str, video: bool, spec: str) -> None:
    """``--initial-checkpoint`` into ``model``: a .safetensors, or any torch file of tensors (a run's checkpoint.pt
    gives its EMA weights if it has them, else its model's); ours rename and resample timm's keys, timm's own models
    take their own weights as saved."""
    filter_fn = inflate_image_checkpoint if video else checkpoint_filter_fn
    if not type(model).__module__.startswith("vit_rope."):
        filter_fn = timm_checkpoint_filter
    try:
        timm.models.load_checkpoint(model, path, filter_fn=filter_fn)
    except ValueError as e:  # the filter's: the weights of another kind of model
        raise SystemExit(f"error: --initial-checkpoint {path!r} does not fit {spec}: {e}") from None
    except Exception as e:  # a file safetensors or torch.load (weights_only) cannot read
        raise SystemExit(
            f"error: --initial-checkpoint {path!r} cannot be read as weights ({why_unreadable(e)}); point it at a "
            ".safetensors file or a torch file of tensors and plain data (a run's model.safetensors, next to its "
            "checkpoint.pt, holds the weights it evaluated)"
        ) from None


def timm_checkpoint_filter(state_dict: dict, model: nn.Module) -> dict:
    """Weights for one of timm's own models, as saved: a classifier of another class count keeps the model's new one;
    any other key the two do not share, or share with another shape, is an error naming it."""
    weights, own = unwrap_state_dict(state_dict), model.state_dict()
    heads = model.pretrained_cfg.get("classifier", "head") if hasattr(model, "pretrained_cfg") else "head"
    heads = tuple(f"{h}." for h in ([heads] if isinstance(heads, str) else heads))
    weights = {k: v for k, v in weights.items() if not (k.startswith(heads) and k in own and v.shape != own[k].shape)}
    differ = sorted(k for k in own.keys() ^ weights.keys() if not k.startswith(heads))
    differ += [k for k in weights.keys() & own.keys() if weights[k].shape != own[k].shape]
    if differ:
        raise ValueError(
            f"{len(differ)} weight(s) of the checkpoint and the model differ in name or shape ({differ[:6]}); create "
            "the model the checkpoint was saved from (its kwargs), or load that model's own checkpoint"
        )
    return {**{k: v for k, v in own.items() if k.startswith(heads)}, **weights}
