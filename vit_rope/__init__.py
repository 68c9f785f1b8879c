"""vit-rope: Vision Transformers with n-dimensional rotary position embeddings, registered in timm."""
# ruff: noqa: E402  (the installed timm is checked before any module that uses it is imported)

from .checks import check_timm

check_timm()  # before the models register: an older timm is one clear ImportError
from . import video, vit  # noqa: F401  (register the models in timm)
from .checkpoint import checkpoint_filter_fn
from .families import FAMILIES, Family, register_family
from .position_encoding import SCALING_MODES, PositionEncoding, RotaryEmbedding
from .tables import AttentionBias, Build, ParabolicBias, RotaryTable, Table
from .video import VideoVisionTransformer
from .vit import VisionTransformer

__all__ = [
    "FAMILIES",
    "SCALING_MODES",
    "AttentionBias",
    "Build",
    "Family",
    "ParabolicBias",
    "PositionEncoding",
    "RotaryEmbedding",
    "RotaryTable",
    "Table",
    "VideoVisionTransformer",
    "VisionTransformer",
    "checkpoint_filter_fn",
    "register_family",
]
__version__ = "0.1.0"
