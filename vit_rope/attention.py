"""Multi-head self-attention with its layer's position-encoding table: the table attends (tables.py).

``rope_targets`` picks which of q, k, v and the output turn: ``"qk"`` is standard RoPE (Su et al. 2021); ``"vo"`` is
VO-RoPE ("second kind" RoPE, Su 2025, kexue.fm/archives/10862): v is turned by the key's position and the attention
output back by the query's, ``o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j-i} v_j``, so the output again depends only
on relative positions. Any subset (``"q"``, ``"k"``, ``"v"``, ``"o"``, ``"qkv"``, ``"qkvo"``, ``"none"``) serves the
ablation. A bias (LookHere, PaPE) takes ``"qk"`` alone.
"""

import torch
from einops import rearrange
from timm.layers._fx import register_notrace_module
from torch import Tensor, nn

from .tables import Table

__all__ = ["ROPE_TARGETS", "Attention", "parse_rope_targets"]

ROPE_TARGETS = ("qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none")


def parse_rope_targets(targets: str) -> str:
    """Normalise a targets string to the canonical order of letters in 'qkvo' ('' for none)."""
    letters = "" if targets in ("none", "") else targets
    if not isinstance(targets, str) or any(c not in "qkvo" for c in letters) or len(set(letters)) != len(letters):
        raise ValueError(f"rope_targets={targets!r}: use letters from 'qkvo' once each, e.g. one of {ROPE_TARGETS}")
    return "".join(c for c in "qkvo" if c in letters)


@register_notrace_module  # a leaf for torch.fx: what attention does depends on the table it is given
class Attention(nn.Module):
    """Attention through ``F.scaled_dot_product_attention``, with the position-encoding table of its layer."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        rope_targets: str = "qk",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim={dim} is not divisible by num_heads={num_heads}; choose a divisor")
        dd = dict(device=device, dtype=dtype)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.rope_targets = parse_rope_targets(rope_targets)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias, **dd)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim, **dd)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, table: Table) -> Tensor:
        if table.per_layer:
            raise ValueError("attention takes the table of one layer: pick it with table.layer(i)")
        dropout = self.attn_drop if self.training else 0.0
        x = table.attend(x, self.qkv, self.num_heads, self.rope_targets, dropout)
        x = rearrange(x, "b h n d -> b n (h d)")
        return self.proj_drop(self.proj(x))
