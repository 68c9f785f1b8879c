"""Helpers that several test files share: the families' random-parameter encodings and the tiny models."""

import timm
import torch
from hypothesis import strategies as st
from safetensors.torch import save_file

from vit_rope import RotaryEmbedding

DIM, HEADS = 24, 2  # 24 channels split into 3 axes of 8, 2 axes of 12, blocks of 8 and 6 spiral directions alike


def randomized(encoding, scale=0.3, seed=1):
    """``encoding`` in float64, every learned parameter drawn at random (the properties must not rest on an init)."""
    torch.manual_seed(seed)
    encoding = encoding.double()
    with torch.no_grad():
        for p in encoding.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return encoding


def rope(name, axes, **kwargs):
    return randomized(RotaryEmbedding(DIM, axes=axes, family=name, num_heads=HEADS, **kwargs))


def axial(axes=2):
    return RotaryEmbedding(DIM, axes=axes).double()


def position_lists(axes):
    """``axes`` coordinates, each within ±60 (a hypothesis strategy)."""
    coord = st.floats(-60, 60, allow_nan=False, width=32)
    return st.lists(coord, min_size=axes, max_size=axes)


def tiny(name="vit_rope_tiny", **kwargs):
    """A two-block model: the same code paths, fast."""
    return timm.create_model(name, depth=kwargs.pop("depth", 2), **kwargs)


def save(model, path):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)
