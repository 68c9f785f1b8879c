"""vit-rope: Vision Transformers with n-dimensional rotary position embeddings, registered in timm."""

from . import video, vit  # noqa: F401  (register the models in timm)
from .checkpoint import checkpoint_filter_fn
from .families import FAMILIES, Family, register_family
from .position_encoding import SCALING_MODES, PositionEncoding, RotaryEmbedding
from .tables import AttentionBias, ParabolicBias, RotaryTable, apply_rotary
from .video import VideoVisionTransformer
from .vit import VisionTransformer

__all__ = [
    "FAMILIES",
    "SCALING_MODES",
    "AttentionBias",
    "Family",
    "ParabolicBias",
    "PositionEncoding",
    "RotaryEmbedding",
    "RotaryTable",
    "VideoVisionTransformer",
    "VisionTransformer",
    "apply_rotary",
    "checkpoint_filter_fn",
    "register_family",
]
__version__ = "0.1.0"
