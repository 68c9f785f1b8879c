"""RoPE-Mixed (Heo et al., "Rotary Position Embedding for Vision Transformer", ECCV 2024).

Every channel pair turns by ``coords · F[:, pair]`` with a learned frequency vector over all axes, per head (and per
layer): a pair can turn with any direction of the plane. Scaling modes: ``none``, ``pi``, ``normalized`` (on the
coordinates); learned, so NTK and YaRN, which rescale a fixed ladder, do not apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..tables import RotaryTable
from .base import Build, PairFamily, Scaling, head_angles
from .registry import register_family

__all__ = ["Mixed", "mixed_frequency_init"]


def mixed_frequency_init(
    axis_dims: Sequence[int], num_heads: int, theta: float, depth: int | None = None, generator=None
) -> Tensor:
    """RoPE-Mixed initial frequencies, shape ``([depth,] heads, axes, dim // 2)``.

    Per head a random rotation ``a ~ U[0, 2π)``; the first half of the pairs get the direction ``(cos a, sin a)``, the
    second half ``(cos(a + π/2), sin(a + π/2))``, both with magnitudes ``1 / theta ** (4j / dim)``. For ``n`` axes the
    ``n`` groups of pairs take the columns of a random orthonormal basis (a random rotation by ``a`` in 2D, exactly the
    paper's init).
    """
    axes = len(axis_dims)
    lead = (num_heads,) if depth is None else (depth, num_heads)
    group = axis_dims[0] // 2  # pairs per group (all sections are equal for mixed frequencies)
    mag = theta ** (-torch.arange(group, dtype=torch.float64) * 2 / axis_dims[0])
    if axes == 1:
        basis = torch.ones(*lead, 1, 1, dtype=torch.float64)
    elif axes == 2:
        a = torch.rand(*lead, generator=generator, dtype=torch.float64) * 2 * math.pi
        # basis[axis, group]: directions (cos a, sin a) and (cos(a + π/2), sin(a + π/2)) in (x, y); the axes run in
        # grid order, so row 0 takes the y components (sin) and row 1 the x components (cos)
        y = torch.stack((a.sin(), (a + math.pi / 2).sin()), -1)
        x = torch.stack((a.cos(), (a + math.pi / 2).cos()), -1)
        basis = torch.stack((y, x), -2)
    else:
        basis, _ = torch.linalg.qr(torch.randn(*lead, axes, axes, generator=generator, dtype=torch.float64))
    return (basis.unsqueeze(-1) * mag).flatten(-2).float()  # (..., axes, groups, 1) * (group,) → (..., axes, P)


@register_family
class Mixed(PairFamily):
    """RoPE-Mixed: learned frequencies per head, and per layer when ``depth`` is given and ``per_layer`` is True."""

    name = "mixed"
    model_name = "rope_mixed"
    needs_heads = True
    default_theta = 10.0  # the magnitudes of its init

    def __init__(self, dim: int, axes: int, *, per_layer: bool = True, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        if self.grid_indexing != "xy":
            raise ValueError("freqs='mixed' learns a direction for every pair: it has no axis sections to order")
        if len(set(self.axis_dims)) != 1:
            raise ValueError(f"freqs='mixed' needs equal axis_dims, got {self.axis_dims}")
        depth = self.depth if len(self.learned_shape(per_layer)) == 2 else None
        self.frequencies = nn.Parameter(mixed_frequency_init(self.axis_dims, self.num_heads, self.theta, depth))

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        frequencies = build.precise(self.frequencies)
        F = nn.functional.pad(frequencies, (0, self.dim // 2 - frequencies.shape[-1]))  # unrotated pairs: frequency 0
        angles = head_angles(coords.to(F.dtype), F)  # ([B,] [layer,] heads, N, P)
        return RotaryTable.from_angles(angles, build, layout=self.layout, per_layer=self.per_layer)
