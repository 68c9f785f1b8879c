"""The registry of position-encoding families: a name → a :class:`Family` class.

A new family is one file in this folder: a ``Family`` subclass decorated with ``@register_family``, and one line
below that imports it. Everything else (the models' ``pos_embed`` values, timm's ``vit_<model_name>_*`` models,
train.py's extrapolation modes) asks the registry and the family's declarations.
"""

from __future__ import annotations

import inspect

from .base import Extrapolation, Family

__all__ = ["FAMILIES", "Extrapolation", "Family", "create_family", "register_family"]

FAMILIES: dict[str, type[Family]] = {}


def register_family(cls: type[Family]) -> type[Family]:
    """Class decorator: make ``cls`` available under ``cls.name``."""
    FAMILIES[cls.name] = cls
    return cls


def create_family(name: str, dim: int, axes: int, **kwargs) -> Family:
    """Build family ``name``; one clear error for an unknown name or an option the family does not take."""
    if name not in FAMILIES:
        raise ValueError(f"unknown position-encoding family {name!r}; registered: {sorted(FAMILIES)}")
    cls = FAMILIES[name]
    accepted = {p for c in cls.__mro__ if issubclass(c, Family) for p in inspect.signature(c.__init__).parameters}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        options = sorted(accepted - {"self", "dim", "axes", "kwargs", "common"})
        raise ValueError(f"family {name!r} takes no option {', '.join(unknown)}; its options: {', '.join(options)}")
    return cls(dim, axes, **kwargs)


# the built-in families: importing a module registers its family
from . import axial, comrope, liere, lookhere, mixed, spiral, string  # noqa: E402, F401
