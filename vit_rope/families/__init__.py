"""The registry of position-encoding families: a name → a :class:`Family` class.

A new family is one file in this folder (or in your own code): a ``Family`` subclass decorated with
``@register_family``; the built-in ones are imported at the end of this file. Everything else (the models'
``pos_embed`` values, timm's ``vit_<model_name>_*`` models, train.py's scaling modes) asks the registry and the
family's declarations when it needs them, so a family registered later is as much one as a built-in.
"""

from __future__ import annotations

from .base import Family, Scaling
from .registry import FAMILIES, create_family, on_register, register_family

__all__ = ["FAMILIES", "Family", "Scaling", "create_family", "on_register", "register_family"]

# the built-in families: importing a module registers its family
from . import axial, comrope, goldengate, liere, lookhere, mixed, pape, spiral, string, videorope  # noqa: E402, F401
