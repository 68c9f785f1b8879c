"""The registry itself: family name → :class:`Family` class, and the listeners told of each new one (a module of its
own, so that the built-in families import it without importing the package that imports them)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

from .base import Family

__all__ = ["FAMILIES", "create_family", "on_register", "register_family"]

FAMILIES: dict[str, type[Family]] = {}
_LISTENERS: list[Callable[[type[Family]], None]] = []


def register_family(cls: type[Family]) -> type[Family]:
    """Class decorator: make ``cls`` available under ``cls.name`` (its models too, once vit_rope.vit is imported)."""
    if not (isinstance(cls, type) and issubclass(cls, Family)) or not isinstance(getattr(cls, "name", None), str):
        raise TypeError(f"register_family takes a Family subclass with a string `name`, got {cls!r}")
    FAMILIES[cls.name] = cls
    for listener in _LISTENERS:
        listener(cls)
    return cls


def on_register(listener: Callable[[type[Family]], None]) -> None:
    """Call ``listener(cls)`` for every family registered, now and later (vit.py registers each family's models)."""
    _LISTENERS.append(listener)
    for cls in list(FAMILIES.values()):
        listener(cls)


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
