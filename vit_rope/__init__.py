"""vit-rope: Vision Transformers with n-dimensional rotary position embeddings, registered in timm."""

from .rope import RotaryEmbedding, RotaryTable, apply_rotary

__all__ = ["RotaryEmbedding", "RotaryTable", "apply_rotary"]
__version__ = "0.1.0"
