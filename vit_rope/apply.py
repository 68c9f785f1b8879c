"""Where attention meets its position encoding: q, k, v out of a fused qkv projection, turned as ``targets`` say,
and the bias to add to the logits. The one place speed machinery may live; it is tested equal to the reference
apply (:mod:`vit_rope.tables`).
"""

from __future__ import annotations

import torch
from timm.layers._fx import register_notrace_function
from torch import Tensor

from .tables import AttentionBias, Encoding, RotaryTable, apply_rotary

__all__ = ["apply_encoding", "rotate_output", "tracing"]


def tracing() -> bool:
    """True while torch.compile, torch.export, ONNX export or TorchScript tracing sees the code."""
    return torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.jit.is_scripting()


def _turn_complex(x: Tensor, cis: Tensor) -> Tensor:
    """Channel pairs (2i, 2i+1) of ``x`` times ``cis`` as complex numbers: one pass over x, in the table's precision,
    rounded once; x a view whose pairs a complex view can take (q or k of a fresh qkv projection)."""
    real = torch.float64 if cis.dtype == torch.complex128 else torch.float32
    z = torch.view_as_complex(x.to(real).unflatten(-1, (-1, 2)))
    return torch.view_as_real(z * cis).flatten(-2).to(x.dtype)


def _complex_viewable(x: Tensor) -> bool:
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


@register_notrace_function  # a leaf for torch.fx: what it does depends on the encoding's type
def apply_encoding(
    qkv: Tensor, encoding: Encoding | None, num_heads: int, targets: str = "qk"
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """A qkv projection ``(B, N, 3 · heads · dim)`` → q, k, v ``(B, heads, N, dim)``, those named in ``targets``
    (letters of "qkv") turned by a rotary ``encoding``, and the bias an attention-bias encoding adds to the logits.

    Per-pair tables turn eagerly as complex numbers, one multiply a tensor as RoPE-ViT does, where the reference takes
    five passes: 1.09x the forward and 1.06x the train-step throughput of the same model through the reference (ViT-S,
    224², batch 8, 2 CPU cores; ``bench/throughput.py --sections apply``).
    """
    if encoding is not None and encoding.per_layer:
        raise ValueError("attention takes the encoding of one layer: pick it with table.layer(i)")
    B, N, _ = qkv.shape
    q, k, v = qkv.view(B, N, 3, num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, N, dim) each
    if encoding is None:
        return q, k, v, None
    if isinstance(encoding, AttentionBias):
        # the bias expanded to every batch dim (a view): CPU attention then takes its fused kernel, 2.4x faster than
        # with a bias that broadcasts over the batch (ViT-S at 224², batch 8, 2 CPU cores)
        return q, k, v, encoding.bias.to(q.dtype).expand(B, num_heads, N, N)
    fast = (
        isinstance(encoding, RotaryTable)
        and encoding.basis is None
        and encoding.layout == "interleaved"
        and not tracing()
        and _complex_viewable(qkv)
    )
    if fast:
        cis = torch.complex(encoding.cos, encoding.sin)  # (..., N, dim // 2)
        turn = lambda t: _turn_complex(t, cis)  # noqa: E731
    else:
        turn = lambda t: apply_rotary(t, encoding)  # noqa: E731
    q, k, v = (turn(t) if c in targets else t for c, t in zip("qkv", (q, k, v), strict=True))
    return q, k, v, None


@register_notrace_function
def rotate_output(x: Tensor, encoding: Encoding | None) -> Tensor:
    """Attention's output ``(B, heads, N, dim)`` turned back by each query's rotation (VO-RoPE's ``o`` target)."""
    return x if encoding is None or isinstance(encoding, AttentionBias) else apply_rotary(x, encoding, inverse=True)
