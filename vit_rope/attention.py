"""Multi-head self-attention that applies a position encoding's table: a rotation of q, k (and v, o), or a bias.

``rope_targets`` picks which of q, k, v and the output turn: ``"qk"`` is standard RoPE (Su et al. 2021); ``"vo"`` is
VO-RoPE ("second kind" RoPE, Su 2025, kexue.fm/archives/10862): v is turned by the key's position and the attention
output back by the query's, ``o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j-i} v_j``, so the output again depends only
on relative positions. Any subset (``"q"``, ``"k"``, ``"v"``, ``"o"``, ``"qkv"``, ``"qkvo"``, ``"none"``) serves the
ablation. An attention bias (LookHere) is added to the logits instead; a parabolic bias (PaPE) appends columns to q
and k whose products are its bias.
"""

import torch
import torch.nn.functional as F
from timm.layers._fx import register_notrace_function, register_notrace_module
from torch import Tensor, nn

from .tables import AttentionBias, ParabolicBias, RotaryTable, Table, outside_autocast

__all__ = ["ROPE_TARGETS", "Attention", "attend", "fold_basis", "parse_rope_targets"]

ROPE_TARGETS = ("qk", "vo", "qkvo", "q", "k", "v", "o", "qkv", "none")


def parse_rope_targets(targets: str) -> str:
    """Normalise a targets string to the canonical order of letters in 'qkvo' ('' for none)."""
    letters = "" if targets in ("none", "") else targets
    if not isinstance(targets, str) or any(c not in "qkvo" for c in letters) or len(set(letters)) != len(letters):
        raise ValueError(f"rope_targets={targets!r}: use letters from 'qkvo' once each, e.g. one of {ROPE_TARGETS}")
    return "".join(c for c in "qkvo" if c in letters)


def fold_basis(weight: Tensor, bias: Tensor | None, basis: Tensor, num_heads: int) -> tuple[Tensor, Tensor | None]:
    """A qkv projection's weight and bias with q's and k's rows turned by a basis ``(heads | 1, dim, dim)``:
    ``P W_q``, ``P W_k`` (Cayley-STRING's change of basis folded into the projection)."""
    w = weight.unflatten(0, (3, num_heads, -1))  # (3, heads, dim, C)
    folded = torch.cat((basis.to(w.dtype) @ w[:2], w[2:])).flatten(0, 2)
    if bias is None:
        return folded, None
    b = bias.unflatten(0, (3, num_heads, -1)).unsqueeze(-1)  # (3, heads, dim, 1)
    return folded, torch.cat((basis.to(b.dtype) @ b[:2], b[2:])).flatten()


@register_notrace_function  # a leaf for torch.fx: what it does depends on the kind of table
def attend(qkv: Tensor, table: Table | None, num_heads: int, targets: str, dropout: float) -> Tensor:
    """Attention over a qkv projection ``(B, N, 3 · heads · dim)`` → ``(B, heads, N, dim)``: q, k, v turned by a
    rotary table as ``targets`` says (letters of "qkvo"; "o": the output turned back by each query's rotation), or the
    logits biased by an attention bias (LookHere's a block of queries at a time; PaPE's as columns appended to q and k,
    in one SDPA call whose ``scale`` stays the head dim's 1/√d)."""
    B, N, _ = qkv.shape
    q, k, v = qkv.view(B, N, 3, num_heads, -1).permute(2, 0, 3, 1, 4).unbind(0)  # (B, heads, N, dim) each
    if isinstance(table, AttentionBias):
        if table.per_layer:
            raise ValueError("attention takes the table of one layer: pick it with table.layer(i)")
        return attend_biased(q, k, v, table, dropout)
    if isinstance(table, ParabolicBias):
        if table.per_layer:
            raise ValueError("attention takes the table of one layer: pick it with table.layer(i)")
        return attend_parabolic(q, k, v, table, dropout)
    if table is not None:
        if table.per_layer:
            raise ValueError("attention takes the table of one layer: pick it with table.layer(i)")
        q = table.rotate(q) if "q" in targets else q
        k = table.rotate(k) if "k" in targets else k
        v = table.rotate(v) if "v" in targets else v
    x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    if isinstance(table, RotaryTable) and "o" in targets:
        x = table.rotate(x, True)
    return x


def attend_biased(q: Tensor, k: Tensor, v: Tensor, table: AttentionBias, dropout: float) -> Tensor:
    """Attention with a bias on its logits, a block of queries at a time (as many as keep a block's bias within
    ``table.block_bytes``): each block's bias is built (or sliced from a small grid's dense bias) as the block is
    attended, so no ``N × N`` bias is held for a whole layer (ViT-S at 1024²: a 1.05 GB peak against axial RoPE's
    1.06 GB, bench/memory.py)."""
    B, heads, N, _ = q.shape
    rows = max(1, table.block_bytes // (4 * heads * N))
    out: list[Tensor] = []
    for start in range(0, N, rows):
        stop = min(start + rows, N)
        # expanded to every batch dim (a view): CPU attention then takes its fused kernel, 2.4x faster than with a
        # bias that broadcasts over the batch (ViT-S at 224², batch 8, 2 CPU cores)
        bias = table.block(start, stop).to(q.dtype).expand(B, heads, stop - start, N)
        out.append(F.scaled_dot_product_attention(q[:, :, start:stop], k, v, attn_mask=bias, dropout_p=dropout))
    return out[0] if len(out) == 1 else torch.cat(out, dim=2)


def attend_parabolic(q: Tensor, k: Tensor, v: Tensor, table: ParabolicBias, dropout: float) -> Tensor:
    """Attention whose logits carry a parabolic bias as the products of columns appended to q and k: one SDPA call,
    no ``N × N`` bias, its ``scale`` the head dim's 1/√d. v is padded with zero columns to q's width, since fused CPU
    attention takes one head dim for q, k and v: PaPE ViT-S forward 1.07x, train step 1.00x (224², batch 16, 2 CPUs)."""
    dim, dtype = q.shape[-1], v.dtype
    q, k = table.extend(q, k)  # float32 at least (16-bit columns would round the bias away at large offsets)
    v = F.pad(v.to(q.dtype), [0, q.shape[-1] - dim])
    if torch.jit.is_scripting():
        x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=dim**-0.5)
    else:
        with outside_autocast(q.device.type):  # autocast would round q and k to 16 bits again
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=dim**-0.5)
    return x[..., :dim].to(dtype)


@register_notrace_module  # a leaf for torch.fx: whether a basis folds into qkv depends on the table it is given
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

    def forward(self, x: Tensor, table: Table | None = None) -> Tensor:
        B, N, C = x.shape
        basis = table.basis if isinstance(table, RotaryTable) else None
        if isinstance(table, RotaryTable) and basis is not None and self.rope_targets == "qk":
            # <Pᵀ R P q, Pᵀ R P k> = <R P q, R P k>: the basis folds into the q and k projections, exactly
            qkv = F.linear(x, *fold_basis(self.qkv.weight, self.qkv.bias, basis, self.num_heads))
            table = table.without_basis()
        else:
            qkv = self.qkv(x)  # (B, N, 3 * C)
        x = attend(qkv, table, self.num_heads, self.rope_targets, self.attn_drop if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))
