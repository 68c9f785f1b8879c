"""Golden-gate RoPE (J. Xiong, "On N-dimensional Rotary Positional Embeddings", blog post, 26 July 2025,
https://jerryxio.ng/posts/nd-rope): every channel pair turns along a direction of its own.

Pair i of a head turns by ``ω_i · <u_i, p>``: a unit direction ``u_i`` in position space and a frequency from the
post's log-spaced ladder ``ω_i = ω_min · (ω_max / ω_min) ** (i / (P - 1))`` over the P turning pairs (ascending, as the
post writes it). The directions spread quasi-uniformly by the golden ratio, numbered across heads (pair i of head h is
number ``h · P + i``, so that the heads look along different directions, as the author's code does):

* 2D: the direction of number n is at angle ``n · 2π / φ`` in (x, y) (x the column): consecutive directions differ by
  the golden angle ``π (3 - √5)`` clockwise, the step over the full turn of the author's code;
* 3D and up: the additive golden sequence of the author's code (Roberts' R_d): ``z_n = frac((n + 1) · (1 / g_d,
  1 / g_d², ..., 1 / g_d^d))`` with ``g_d`` the positive root of ``x^(d+1) = x + 1`` (the golden ratio's
  generalisation), mapped to a Gaussian by the inverse normal CDF and normalised, low-discrepancy points on the sphere;
  component j turns with grid axis j. (The author's code finds g_d by ten fixed-point steps; here it is the root.);
* 1D: u = +1, the plain ladder.

Spiral RoPE (``spiral.py``) is the same idea with K directions evenly spread over the half-turn and shared by groups of
pairs; golden-gate gives every pair (of every head) its own.

The frequency range, our choice: positions here are patch indices (the post's figures use coordinates in [-1, 1];
lucidrains' ``GoldenGateRoPENd`` defaults to ``ω ∈ [1, 10000]`` on indices). So that ``theta`` means what it means
for axial RoPE, ``ω_max = 1`` radian per patch and ``ω_min = theta ** -(1 - 1/P)``: the ladder is then exactly the
1D axial ladder ``theta ** (-2j / 2P)`` of P pairs in ascending order (``ω_i = theta ** (-(P - 1 - i) / P)``; theta
100 → 1 down to about 1/100, as axial RoPE's sections span). Scaling modes: all five; being a fixed geometric ladder,
NTK-aware scaling and YaRN apply to it as to axial RoPE's, with one scale (the largest of the axes' — directions mix
them) and YaRN's length the largest extent of the reference grid, as spiral RoPE's plane. ``rotate_fraction`` turns
fewer pairs (the rest stay unturned); there are no axis sections, so ``axis_dims`` is refused. Fixed (no parameters),
exactly relative.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..tables import Build, RotaryTable
from .axial import frequency_ladder, yarn_temperature
from .base import PairFamily, Scaling, head_angles
from .registry import register_family

__all__ = ["GOLDEN_STEP", "GoldenGate", "generalized_golden_ratio", "golden_directions"]

PHI = (1 + math.sqrt(5)) / 2
GOLDEN_STEP = 2 * math.pi / PHI  # π (√5 - 1): the golden angle π (3 - √5), taken the other way round


def generalized_golden_ratio(d: int) -> float:
    """The positive root of ``x ** (d + 1) = x + 1`` (d = 1: the golden ratio; d = 2: the plastic number), by the
    fixed-point iteration ``x ← (1 + x) ** (1 / (d + 1))`` run until it stops moving (a contraction for x > 1)."""
    x, previous = 2.0, 0.0
    while x != previous:
        previous, x = x, (1.0 + x) ** (1.0 / (d + 1))
    return x


def golden_directions(n: int, axes: int) -> Tensor:
    """The first ``n`` directions of golden-gate RoPE, ``(n, axes)`` float64 unit vectors (see the module docstring;
    in 2D the components are (x, y))."""
    index = torch.arange(n, dtype=torch.float64)
    if axes == 1:
        return torch.ones(n, 1, dtype=torch.float64)
    if axes == 2:
        angle = index * GOLDEN_STEP
        return torch.stack((angle.cos(), angle.sin()), dim=-1)
    g = generalized_golden_ratio(axes)
    alpha = g ** -torch.arange(1, axes + 1, dtype=torch.float64)
    z = torch.remainder((index[:, None] + 1) * alpha, 1.0)  # in (0, 1): the step is irrational
    gaussian = math.sqrt(2) * torch.erfinv(2 * z - 1)  # the inverse normal CDF
    return gaussian / gaussian.norm(dim=-1, keepdim=True)


@register_family
class GoldenGate(PairFamily):
    """Golden-gate RoPE: every pair of every head turns along its own golden-ratio direction (fixed)."""

    name = "goldengate"
    model_name = "goldengate"
    needs_heads = True  # each head has its own directions
    scaling_modes = ("none", "pi", "ntk", "yarn", "normalized")

    def __init__(self, dim: int, axes: int, *, yarn_beta: tuple[float, float] = (32.0, 1.0), **kwargs) -> None:
        if kwargs.get("axis_dims") is not None:
            raise ValueError(
                "freqs='goldengate' turns every pair with every axis: it has no axis sections, so axis_dims means "
                "nothing here (rotate_fraction turns fewer pairs)"
            )
        super().__init__(dim, axes, **kwargs)
        if self.grid_indexing != "xy":
            raise ValueError("freqs='goldengate' mixes every axis in every pair: grid_indexing='ij' means nothing here")
        fraction = kwargs.get("rotate_fraction")
        self.pairs = int(dim * (1.0 if fraction is None else float(fraction))) // 2  # the turning pairs, P
        self.yarn_beta = tuple(yarn_beta)

    def directions(self) -> Tensor:
        """``(heads, P, axes)`` float64: pair i of head h looks along direction number ``h · P + i``, in grid axis
        order (in 2D the sequence's (x, y) become (row, col) = (y, x))."""
        u = golden_directions(self.num_heads * self.pairs, self.axes)
        if self.axes == 2:
            u = u.flip(-1)  # (x, y) → grid order (row = y, col = x)
        return u.view(self.num_heads, self.pairs, self.axes)

    def ladder(self, scaling: Scaling | None = None) -> Tensor:
        """The P frequencies ``ω_i``, ascending (float64): axial RoPE's 1D ladder of P pairs reversed, under NTK or
        YaRN at the largest scale of the axes."""
        ext = scaling or Scaling("none", (1.0,) * self.axes)
        length = max(ext.ref_grid) if ext.ref_grid else 0.0
        ladder = frequency_ladder(2 * self.pairs, self.theta, ext.mode, max(ext.scales), length, self.yarn_beta)
        return ladder.flip(0)

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """The ``(heads, axes, dim // 2)`` float64 frequency matrix ``ω_i · u_i`` (zero for the unturned pairs)."""
        F = torch.zeros(self.num_heads, self.axes, self.dim // 2, dtype=torch.float64)
        F[..., : self.pairs] = (self.directions() * self.ladder(scaling)[:, None]).mT
        return F

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        """Pair i of head h turns by ``coords · F[h, :, i]``."""
        angles = head_angles(coords, self.frequency_matrix(scaling).to(coords))  # ([B,] heads, N, P)
        return RotaryTable.from_angles(angles, build, layout=self.layout)

    def frequency_groups(self) -> list[Tensor]:
        """One ladder for p-RoPE to cut: every pair mixes every axis."""
        return [torch.arange(self.pairs)]

    def temperature(self, scaling: Scaling) -> Tensor | None:
        if scaling.mode != "yarn" or max(scaling.scales) <= 1:
            return None
        m = torch.ones(self.dim // 2, dtype=torch.float64)
        m[: self.pairs] = yarn_temperature(max(scaling.scales))
        return m

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, pairs={self.pairs}"
