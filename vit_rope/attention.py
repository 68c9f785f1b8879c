"""Multi-head self-attention that applies a position encoding: a rotation of q, k (and v, o), or a bias.

``rope_targets`` picks which of q, k, v and the output turn: ``"qk"`` is standard RoPE (Su et al. 2021); ``"vo"`` is
VO-RoPE ("second kind" RoPE, Su 2025, kexue.fm/archives/10862): v is turned by the key's position and the attention
output back by the query's, ``o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j-i} v_j``, so the output again depends only
on relative positions. Any subset (``"q"``, ``"k"``, ``"v"``, ``"o"``, ``"qkv"``, ``"qkvo"``, ``"none"``) serves the
ablation. An attention bias (LookHere) is added to the logits instead.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .apply import apply_encoding, rotate_output
from .tables import AttentionBias, Encoding, RotaryTable

ROPE_TARGETS = ("qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none")


def parse_rope_targets(targets: str) -> str:
    """Normalise a targets string to the canonical order of letters in 'qkvo' ('' for none)."""
    letters = "" if targets in ("none", "") else targets
    if not isinstance(targets, str) or any(c not in "qkvo" for c in letters) or len(set(letters)) != len(letters):
        raise ValueError(f"rope_targets={targets!r}: use letters from 'qkvo' once each, e.g. one of {ROPE_TARGETS}")
    return "".join(c for c in "qkvo" if c in letters)


def fold_basis(linear: nn.Linear, basis: Tensor, num_heads: int) -> tuple[Tensor, Tensor | None]:
    """The qkv projection's weight and bias with q's and k's rows turned by a basis ``(heads | 1, dim, dim)``:
    ``P W_q``, ``P W_k`` (Cayley-STRING's change of basis folded into the projection)."""
    w = linear.weight.unflatten(0, (3, num_heads, -1))  # (3, heads, dim, C)
    weight = torch.cat((basis.to(w.dtype) @ w[:2], w[2:])).flatten(0, 2)
    if linear.bias is None:
        return weight, None
    b = linear.bias.unflatten(0, (3, num_heads, -1, 1))  # (3, heads, dim, 1)
    return weight, torch.cat((basis.to(b.dtype) @ b[:2], b[2:])).flatten()


class Attention(nn.Module):
    """Attention through ``F.scaled_dot_product_attention``, with the position encoding of its layer."""

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        rope_targets: str = "qk",
    ) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"embed_dim={dim} is not divisible by num_heads={num_heads}; choose a divisor")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.rope_targets = parse_rope_targets(rope_targets)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, pos: Encoding | None = None) -> Tensor:
        B, N, C = x.shape
        if not self.rope_targets and not isinstance(pos, AttentionBias):
            pos = None  # rope_targets="none": a rotation turns nothing
        if isinstance(pos, RotaryTable) and pos.basis is not None and self.rope_targets == "qk":
            # <Pᵀ R P q, Pᵀ R P k> = <R P q, R P k>: the basis folds into the q and k projections, exactly
            qkv = F.linear(x, *fold_basis(self.qkv, pos.basis, self.num_heads))
            pos = replace(pos, basis=None)
        else:
            qkv = self.qkv(x)  # (B, N, 3 * C)
        q, k, v, bias = apply_encoding(qkv, pos, self.num_heads, self.rope_targets)  # (B, heads, N, head_dim) each
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=self.attn_drop if self.training else 0.0)
        if "o" in self.rope_targets:
            x = rotate_output(x, pos)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))
