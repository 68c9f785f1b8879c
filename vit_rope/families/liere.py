"""LieRE (Ostmeier et al., "LieRE: Lie Rotational Positional Encodings", ICML 2025, arXiv 2406.10322).

``R(p) = exp(Σ_a p_a A_a)`` with a learned skew-symmetric generator ``A_a`` per axis, block-diagonal in blocks of
``block_size`` channels (LieRE_8; ``block_size=dim`` is the dense LieRE_64 of a 64-dim head; channels past the last
block stay unturned). The generators need not commute, so attention is only approximately relative. Generators are the
strict upper triangle of a learned matrix minus its transpose, initialised U[0, 2π) as the paper; its coordinates are
``index / (n - 1)`` at the training grid, ours patch indices, so the init is divided by ``n - 1`` of the reference
grid's side. Scaling modes: ``none``, ``pi``, ``normalized`` (on the coordinates); learned generators, so NTK and
YaRN, which rescale a fixed ladder, do not apply.

Which generators are shared, as in the authors' released code (StanfordMIMI/LieRE):

* default, ``per_layer=False, per_head=False``: one set for every layer and head, as its model defaults
  (``models/model_args.py``) and its README's core implementation, in the LieRE_8 blocks of its ImageNet run; one
  exponential a token and block a step;
* ``per_layer=True, per_head=True``: its ``lightning_imagenet.sh`` and ``cifar100.yaml`` setting (the first commit's
  ``imagenet_224.yaml`` shared them), 72 times the exponentials in a ViT-S.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..tables import RotaryTable
from .base import Build, Family, Scaling, head_angles
from .registry import register_family

__all__ = ["LieRE"]


@register_family
class LieRE(Family):
    """LieRE: dense (block-diagonal) learned generators per axis, turned together by matrix exponentials."""

    name = "liere"
    model_name = "liere"
    commutes = False  # generators need not commute: attention is relative only approximately
    onnx = False  # matrix_exp

    def __init__(
        self, dim: int, axes: int, *, block_size: int = 8, per_layer: bool = False, per_head: bool = False, **common
    ) -> None:
        super().__init__(dim, axes, **common)
        if per_head and self.num_heads is None:
            raise ValueError("freqs='liere' learns generators per head: pass num_heads, or per_head=False")
        if not 2 <= block_size <= dim:
            raise ValueError(f"block_size={block_size} must be between 2 and dim={dim} (the paper's best is 8)")
        self.block_size, self.num_blocks = block_size, dim // block_size
        lead = self.learned_shape(per_layer, per_head)
        side = max(self.ref_grid) if self.ref_grid else 2
        raw = torch.rand(*lead, axes, self.num_blocks, block_size, block_size) * 2 * math.pi / max(side - 1, 1)
        self.generators = nn.Parameter(raw)

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        U = build.precise(self.generators).triu(1)
        A = (U - U.mT).flatten(-3)  # ([layer,] heads | 1, axes, blocks · b · b)
        M = head_angles(coords.to(A.dtype), A).unflatten(-1, U.shape[-3:])  # Σ_a p_a A_a: (..., N, blocks, b, b)
        return RotaryTable.from_generators(M, build, per_layer=self.per_layer)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, block_size={self.block_size}"
