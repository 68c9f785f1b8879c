"""vit-rope: Vision Transformers with n-dimensional rotary position embeddings, registered in timm."""

from . import video, vit  # noqa: F401  (register the models in timm)
from .rope import SCALING_MODES, RotaryEmbedding, RotaryTable, apply_rotary, rotate_packed, rotate_split
from .video import VideoVisionTransformer
from .vit import VisionTransformer, checkpoint_filter_fn

__all__ = [
    "SCALING_MODES",
    "RotaryEmbedding",
    "RotaryTable",
    "VideoVisionTransformer",
    "VisionTransformer",
    "apply_rotary",
    "checkpoint_filter_fn",
    "rotate_packed",
    "rotate_split",
]
__version__ = "0.1.0"
