"""Cayley-STRING (Schenck et al., "Learning the RoPEs: Better 2D and 3D Position Encodings with STRING", ICML 2025,
arXiv 2502.02562).

``R(p) = Pᵀ RoPE(p) P`` with ``P = (I - S)(I + S)⁻¹`` orthogonal, the Cayley transform of a learned skew-symmetric S
per head (and per layer), and RoPE(p) axial RoPE whose frequencies are learned too (the paper learns both). Exactly
relative: ``<R(a) q, R(b) k> = <RoPE(a) P q, RoPE(b) P k>``, so attention folds P into the q and k projections and
runs at axial RoPE's speed. S starts at zero and the frequencies at axial RoPE's ladder (choices of ours: the paper
states neither), so a model starts as axial RoPE. Scaling modes: ``none``, ``pi``, ``normalized`` (on the
coordinates); learned frequencies, so NTK and YaRN, which rescale a fixed ladder, do not apply.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..tables import RotaryTable
from .axial import frequency_ladder
from .base import Build, PairFamily, Scaling, head_angles
from .registry import register_family

__all__ = ["CayleyString", "cayley"]


def cayley(skew: Tensor) -> Tensor:
    """``(I - S)(I + S)⁻¹`` for skew-symmetric ``S (..., d, d)``: orthogonal, never with eigenvalue -1. The two
    factors commute, so it is also the solution X of ``(I + S) X = I - S``."""
    eye = torch.eye(skew.shape[-1], dtype=skew.dtype, device=skew.device)
    return torch.linalg.solve(eye + skew, eye - skew)


@register_family
class CayleyString(PairFamily):
    """Cayley-STRING: a learned orthogonal basis per head around axial RoPE with learned frequencies."""

    name = "string"
    model_name = "string"
    needs_heads = True
    onnx = False  # linalg.solve

    def __init__(self, dim: int, axes: int, *, per_layer: bool = True, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        lead = self.learned_shape(per_layer)
        ladder, pair_axis = torch.zeros(dim // 2, dtype=torch.float64), torch.zeros(axes, dim // 2)
        for axis, pairs in self.sections():  # axial RoPE's layout: each pair turns with one axis
            ladder[pairs] = frequency_ladder(self.axis_dims[axis], self.theta)
            pair_axis[axis, pairs] = 1.0
        self.register_buffer("axis_of_pair", pair_axis, persistent=False)
        self.frequencies = nn.Parameter(ladder.float().expand(*lead, -1).clone())  # ([layer,] heads, dim // 2)
        self.skew = nn.Parameter(torch.zeros(*lead, dim, dim))  # S = A - Aᵀ

    def basis(self, build: Build = Build()) -> Tensor:  # noqa: B008 (a frozen value)
        """P per ([layer,] head): ``([layer,] heads, dim, dim)``, in the table's precision."""
        A = build.precise(self.skew)
        return cayley(A - A.mT)

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        f = build.precise(self.frequencies)
        F = f.unsqueeze(-2) * self.axis_of_pair.to(f)  # ([layer,] heads, axes, dim // 2)
        angles = head_angles(coords.to(f.dtype), F)  # ([B,] [layer,] heads, N, dim // 2)
        basis = self.basis(build)
        return RotaryTable.from_angles(angles, build, layout=self.layout, basis=basis, per_layer=self.per_layer)
