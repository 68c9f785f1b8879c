"""ComRoPE (Yu et al., "ComRoPE: Scalable and Robust Rotary Position Embedding Parameterized by Trainable Commuting
Angle Matrices", CVPR 2025, arXiv 2506.03737).

``R(p) = exp(Σ_a p_a A_a)`` with block-diagonal skew-symmetric ``A_a`` that commute pairwise, so attention stays
exactly relative. Each b×b block j of a head carries one learned skew matrix ``B_j = P_j - P_jᵀ``, and the position
turns it by one scalar ``t_j(p)``: ``R_j(p) = exp(t_j(p) B_j)``.

* **AP** (axis-partitioned): block j belongs to axis ``j mod axes`` (grid axis order: rows first), ``t_j = p_axis``;
  where the blocks do not divide among the axes (8 blocks over (t, h, w)) the first axes get one more (the authors'
  code asks them to divide evenly).
* **LD** (linearly dependent): every axis shares the block, ``t_j = Σ_a θ_{a,j} p_a`` with learned θ per axis, head
  and block (the paper's appendix E.2.4; its code shares θ across heads).

Block size 8 (the paper's experiments), per layer and head. P ~ N(0, init_std²) as the authors' code; their
coordinates are patch centres in (0, 1) at every resolution, ours patch indices, so the init's scale is divided by the
reference grid's side. The cls token (prefix tokens) turns as if at the image's centre, as the authors' code places it
(``cls_position=0.5`` of its (0, 1) coordinates; ``cls_at_centre=False`` leaves it unturned). Scaling modes:
``none``, ``pi``, ``normalized`` (on the coordinates); learned, so NTK and YaRN, which rescale a fixed ladder, do not
apply.

Each block's skew matrix is split once a step into ``B = Q Λ Qᵀ`` (``Λ`` 2×2 rotation generators ``λ_k``), so that
``exp(t B) = Q R(t λ) Qᵀ``: the table turns channel pairs by ``t_j(p) λ_k`` inside the basis ``Q``, which attention
folds into its q and k projections (as Cayley-STRING's). One eigendecomposition a block instead of one exponential a
token and block, which brings ComRoPE to axial RoPE's speed (docs/speed.md), exact up to float64 round-off (the split
runs in float64, its eigenvectors' phases fixed so that the gradient is defined; blocks with eigenvalues within 1e-9
of each other take the plain exponentials instead, and so do ``torch.export`` and the meta device, which take no
branch on data).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..tables import RotaryTable
from .base import Build, Family, Scaling, head_angles
from .registry import register_family

__all__ = ["ComRoPEAP", "ComRoPELD", "block_diagonal", "spectral_split"]


def spectral_split(B: Tensor, gap: float = 1e-9) -> tuple[Tensor, Tensor] | None:
    """Skew-symmetric blocks ``B (..., b, b)`` (b even) as ``Q (..., b, b)`` orthogonal and ``λ (..., b / 2) ≥ 0`` with
    ``B = Q Λ Qᵀ``, ``Λ`` turning the column pairs (2k, 2k+1) of ``Q`` by ``λ_k``: ``exp(t B) = Q R(t λ) Qᵀ``; in
    float64, cast back. None where two eigenvalues lie within ``gap`` (their eigenvectors' gradients divide by the
    difference)."""
    b = B.shape[-1]
    w, V = torch.linalg.eigh(1j * B.double())  # Hermitian; eigenvalues ascending: -λ ..., λ ...
    # torch.compile cannot branch on the eigenvalues: compiled, the split is taken (a learned block's eigenvalues
    # meet with probability zero; eager checks)
    if not torch.compiler.is_compiling() and w.diff(dim=-1).abs().min() < gap:
        return None
    v = V[..., b // 2 :]  # λ_k > 0: B v = -iλ v, so a = Re v and c = Im v span the plane B turns by λ (B a = λ c)
    # each eigenvector's phase fixed (its largest entry real): the split then depends on V only through what the
    # rotation does, so the eigendecomposition's gradient is defined
    top = v.abs().argmax(dim=-2, keepdim=True).detach()
    phase = v.gather(-2, top)
    v = v * (phase.conj() / phase.abs())
    Q = torch.stack((v.real, v.imag), dim=-1).flatten(-2) * 2**0.5  # columns a_1, c_1, a_2, c_2, ...
    return Q.to(B.dtype), w[..., b // 2 :].to(B.dtype)


def block_diagonal(blocks: Tensor) -> Tensor:
    """``(..., n, b, b)`` blocks as one ``(..., n · b, n · b)`` block-diagonal matrix."""
    n, b = blocks.shape[-3], blocks.shape[-1]
    eye = torch.eye(n, dtype=blocks.dtype, device=blocks.device)
    return torch.einsum("...jac,jk->...jakc", blocks, eye).reshape(*blocks.shape[:-3], n * b, n * b)


class _ComRoPE(Family):
    """What AP and LD share: one learned skew block per (layer, head, block), turned per token by ``turns``."""

    needs_heads = True
    onnx = False  # matrix_exp

    def __init__(
        self,
        dim: int,
        axes: int,
        *,
        block_size: int = 8,
        init_std: float = 1.0,
        per_layer: bool = True,
        cls_at_centre: bool = True,
        **common,
    ) -> None:
        super().__init__(dim, axes, **common)
        if block_size < 2 or block_size % 2 or dim % block_size:
            raise ValueError(f"block_size={block_size} must be even and divide dim={dim} (the paper uses 8)")
        self.prefix_at_centre = bool(cls_at_centre)
        if not (init_std > 0 and math.isfinite(init_std)):
            raise ValueError(f"init_std={init_std} must be positive and finite")
        self.block_size, self.num_blocks = block_size, dim // block_size
        self.lead = self.learned_shape(per_layer)
        std = init_std / max(self.ref_grid) if self.ref_grid else init_std
        self.generators = nn.Parameter(torch.randn(*self.lead, self.num_blocks, block_size, block_size) * std)

    def turns(self, coords: Tensor) -> Tensor:
        """The scalar ``t_j`` of every token and block: ``([B,] [layer,] heads | 1.., N, blocks)``."""
        raise NotImplementedError

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        P = build.precise(self.generators)
        B = P - P.mT  # ([layer,] heads, blocks, b, b)
        t = self.turns(coords.to(P.dtype))  # ([B,] [layer,] heads | 1, N, blocks)
        # torch.export and the meta device take no branch on data (the split's eigenvalue check): the plain
        # exponentials
        plain = torch.compiler.is_exporting() or B.is_meta
        split = None if plain else spectral_split(B)
        if split is None:  # near-equal eigenvalues: the plain exponentials, one a token and block
            generators = t[..., None, None] * B.unsqueeze(-4)  # (..., N, blocks, b, b)
            return RotaryTable.from_generators(generators, build, per_layer=self.per_layer)
        Q, lam = split  # (..., blocks, b, b), (..., blocks, b / 2)
        angles = (t[..., None] * lam.unsqueeze(-3)).flatten(-2)  # (..., N, blocks · b / 2): pair k of block j
        basis = block_diagonal(Q.mT)  # Qᵀ of every block: ([layer,] heads, dim, dim)
        return RotaryTable.from_angles(angles, build, basis=basis, per_layer=self.per_layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}, cls_at_centre={self.prefix_at_centre}"


@register_family
class ComRoPEAP(_ComRoPE):
    """ComRoPE-AP: each block turns with one axis (block j with axis j mod axes)."""

    name = "comrope_ap"

    def __init__(self, dim: int, axes: int, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        owner = torch.arange(self.num_blocks) % axes
        onehot = (owner == torch.arange(axes)[:, None]).float()  # (axes, blocks)
        self.register_buffer("axis_of_block", onehot.expand(*[1] * len(self.lead), -1, -1), persistent=False)

    def turns(self, coords: Tensor) -> Tensor:
        return head_angles(coords, self.axis_of_block.to(coords))


@register_family
class ComRoPELD(_ComRoPE):
    """ComRoPE-LD: every block turns with a learned mix of the axes (θ per layer, head, axis and block)."""

    name = "comrope_ld"
    model_name = "comrope"

    def __init__(self, dim: int, axes: int, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        self.mix = nn.Parameter(torch.randn(*self.lead, axes, self.num_blocks))  # θ ~ N(0, 1), as the authors' code

    def turns(self, coords: Tensor) -> Tensor:
        return head_angles(coords, self.mix.to(coords))
