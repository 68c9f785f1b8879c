"""Multi-head self-attention whose q, k, v and output can carry the rotary embedding.

``rope_targets`` picks which of them turn: ``"qk"`` is standard RoPE (Su et al. 2021); ``"vo"`` is VO-RoPE
("second kind" RoPE, Su 2025, kexue.fm/archives/10862): v is turned by the key's position and the attention
output back by the query's, ``o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j-i} v_j``, so the output again depends
only on relative positions. Any subset (``"q"``, ``"k"``, ``"v"``, ``"o"``, ``"qkv"``, ``"qkvo"``, ``"none"``)
serves the ablation.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from .rope import RotaryTable, apply_rotary, rotate_split

ROPE_TARGETS = ("qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none")


def hooked(*modules: nn.Module) -> bool:
    """Whether a hook would see a call of these modules, forward or backward (then a fused or in-place path, which
    skips the calls or overwrites their output, is not taken)."""
    glob = nn.modules.module
    hooks = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
    return any(getattr(m, h) for m in modules for h in hooks) or any(getattr(glob, f"_global{h}") for h in hooks)


def parse_rope_targets(targets: str) -> str:
    """Normalise a targets string to the canonical order of letters in 'qkvo' ('' for none)."""
    letters = "" if targets in ("none", "") else targets
    if not isinstance(targets, str) or any(c not in "qkvo" for c in letters) or len(set(letters)) != len(letters):
        raise ValueError(f"rope_targets={targets!r}: use letters from 'qkvo' once each, e.g. one of {ROPE_TARGETS}")
    return "".join(c for c in "qkvo" if c in letters)


class Attention(nn.Module):
    """Attention through ``F.scaled_dot_product_attention``; q/k (and v/o) rotated in as few passes as possible."""

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
        # which of q, k, v turn; they are turned in the projection's output, in place, so attention reads q, k, v
        # where an absolute-embedding ViT would and no rotated copy lives beside the projection
        self._turn_qkv = tuple(c in self.rope_targets for c in "qkv")
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, rope: RotaryTable | None = None) -> Tensor:
        B, N, C = x.shape
        if isinstance(rope, RotaryTable) and rope.cos.ndim > 3:  # (torch.fx hands a proxy: nothing to check)
            raise ValueError(
                f"the rotary table has shape {tuple(rope.cos.shape)}; attention takes ([heads,] N, dim // 2), the "
                "same positions for the whole batch: take one layer of a per-layer table with RotaryTable.layer(i)"
            )
        qkv = self.qkv(x)
        if rope is not None and any(self._turn_qkv):
            if hooked(self.qkv):
                # a forward hook may hold the projection's output, and a backward hook hands it out as a view that
                # may not change in place: turn a copy, so the hooks see the projection as it was
                qkv = qkv.clone()
            split = rotate_split(qkv, rope, self.num_heads, self._turn_qkv)
            del qkv  # where the rotation made a copy (the half layout, say), the projection's output goes now
            q, k, v = split[0], split[1], split[2]  # indexed, not unpacked: torch.fx traces a tuple it cannot size
        else:
            q, k, v = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        if rope is not None and "o" in self.rope_targets:
            x = apply_rotary(x, rope, inverse=True)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))
