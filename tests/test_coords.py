"""vit_rope/coords.py: grid coordinates (patch indices, DINOv3's normalised patch centres), their scaling to the
training grid (position interpolation, per-axis factors, "normalized"), and the training-time augmentation of
coordinates."""

import math

import pytest
import torch

from vit_rope import RotaryEmbedding
from vit_rope.coords import grid_coordinates

F64 = torch.float64


def test_normalized_coordinates_are_resolution_independent():
    """Patch centres (i + 0.5)/n mapped to [-1, 1], times 2π (DINOv3); the corners stay put across grids."""
    rope = RotaryEmbedding(8, axes=2, coords="normalized")
    c = grid_coordinates((4, 8), normalized=True)
    torch.testing.assert_close(c[0], torch.tensor([-0.75, -0.875], dtype=F64))
    torch.testing.assert_close(c[-1], torch.tensor([0.75, 0.875], dtype=F64))
    angle = torch.atan2(rope.table((4, 8), dtype=F64).sin, rope.table((4, 8), dtype=F64).cos)
    torch.testing.assert_close(angle[0, 0], torch.tensor(-0.875 * 2 * math.pi + 2 * math.pi, dtype=F64))


def test_position_interpolation_squeezes_onto_training_grid():
    rope = RotaryEmbedding(16, axes=2, scaling="pi", ref_grid=(7, 7))
    plain = RotaryEmbedding(16, axes=2)
    pos = torch.cartesian_prod(torch.arange(14.0), torch.arange(21.0)).to(F64) / torch.tensor([2.0, 3.0], dtype=F64)
    t, ref = rope.table((14, 21), dtype=F64), plain.table(positions=pos.to(F64), dtype=F64)
    torch.testing.assert_close(t.cos, ref.cos, rtol=0, atol=1e-12)
    # no squeezing for grids no larger than the reference
    torch.testing.assert_close(rope.table((7, 5), dtype=F64).sin, plain.table((7, 5), dtype=F64).sin)


def test_normalized_scaling_maps_any_grid_onto_the_training_extent():
    """Patch centres of a 4x16 grid land at the same fractions of the 8x8 training grid as its own centres."""
    rope = RotaryEmbedding(16, axes=2, scaling="normalized", ref_grid=(8, 8))
    plain = RotaryEmbedding(16, axes=2)
    rows = (torch.arange(4.0, dtype=F64) + 0.5) * 8 / 4 - 0.5
    cols = (torch.arange(16.0, dtype=F64) + 0.5) * 8 / 16 - 0.5
    pos = torch.cartesian_prod(rows, cols)
    torch.testing.assert_close(rope.table((4, 16), dtype=F64).sin, plain.table(positions=pos, dtype=F64).sin)
    torch.testing.assert_close(rope.table((8, 8), dtype=F64).sin, plain.table((8, 8), dtype=F64).sin)  # identity
    with pytest.raises(ValueError, match="a learned family has none of"):
        RotaryEmbedding(16, axes=2, family="mixed", num_heads=2, scaling="ntk", scale=2.0)


def test_per_axis_scale_is_decoupled():
    rope = RotaryEmbedding(16, axes=2, scaling="pi", ref_grid=(4, 4))
    assert rope.scaling_for((8, 4)).scales == (2.0, 1.0)
    assert rope.scaling_for((2, 12)).scales == (1.0, 3.0)


def test_coordinate_augmentation_is_training_only_and_keeps_relative_scores():
    rope = RotaryEmbedding(16, axes=2, shift=3.0)
    x = torch.randn(1, 12, 16, dtype=F64)
    rope.train()
    a, b = rope(x, grid=(3, 4)), rope(x, grid=(3, 4))
    assert not torch.allclose(a, b)  # a new draw per table
    torch.testing.assert_close(a @ a.transpose(-1, -2), b @ b.transpose(-1, -2))  # a shift is relative
    rope.eval()
    torch.testing.assert_close(rope(x, grid=(3, 4)), RotaryEmbedding(16, axes=2)(x, grid=(3, 4)))
    jitter = RotaryEmbedding(16, axes=2, jitter=2.0, rescale=2.0).train()
    assert not torch.allclose(jitter(x, grid=(3, 4)), jitter(x, grid=(3, 4)))


def test_normalized_coords_shift_in_unit_coordinates_and_ignore_scaling():
    """DINOv3 shifts in [-1, 1] units before the 2π factor; grid-size scaling leaves such coordinates alone."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, axes=1, coords="normalized", shift=1.0).train()
    t = rope.table((4,), dtype=F64)
    step = torch.atan2(t.sin[:, 0], t.cos[:, 0]).diff().remainder(2 * math.pi)
    torch.testing.assert_close(step, torch.full((3,), 2 * math.pi * 0.5, dtype=F64))  # the spacing is kept
    plain = RotaryEmbedding(8, axes=2, coords="normalized")
    for mode in ("pi", "ntk", "yarn", "normalized"):
        scaled = RotaryEmbedding(8, axes=2, coords="normalized", scaling=mode, ref_grid=(4, 4))
        torch.testing.assert_close(scaled.table((8, 12), dtype=F64).cos, plain.table((8, 12), dtype=F64).cos)
