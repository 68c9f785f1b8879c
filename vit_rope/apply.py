"""Where attention meets its position encoding: q, k, v out of a fused qkv projection, turned as ``targets`` say,
and the bias to add to the logits.
"""

from __future__ import annotations

from timm.layers._fx import register_notrace_function
from torch import Tensor

from .tables import AttentionBias, Encoding, apply_rotary

__all__ = ["apply_encoding", "rotate_output"]


@register_notrace_function  # a leaf for torch.fx: what it does depends on the encoding's type
def apply_encoding(
    qkv: Tensor, encoding: Encoding | None, num_heads: int, targets: str = "qk"
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """A qkv projection ``(B, N, 3 · heads · dim)`` → q, k, v ``(B, heads, N, dim)``, those named in ``targets``
    (letters of "qkv") turned by a rotary ``encoding``, and the bias an attention-bias encoding adds to the logits."""
    if encoding is not None and encoding.per_layer:
        raise ValueError("attention takes the encoding of one layer: pick it with table.layer(i)")
    B, N, _ = qkv.shape
    q, k, v = qkv.view(B, N, 3, num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, N, dim) each
    if encoding is None:
        return q, k, v, None
    if isinstance(encoding, AttentionBias):
        return q, k, v, encoding.bias.to(q.dtype)
    q, k, v = (apply_rotary(t, encoding) if c in targets else t for c, t in zip("qkv", (q, k, v), strict=True))
    return q, k, v, None


@register_notrace_function
def rotate_output(x: Tensor, encoding: Encoding | None) -> Tensor:
    """Attention's output ``(B, heads, N, dim)`` turned back by each query's rotation (VO-RoPE's ``o`` target)."""
    return x if encoding is None or isinstance(encoding, AttentionBias) else apply_rotary(x, encoding, inverse=True)
