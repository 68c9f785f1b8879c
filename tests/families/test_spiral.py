"""vit_rope/families/spiral.py: spiral RoPE with two directions is axial RoPE; its directions and frequency chunks
follow the paper, in 2D and in 3D (time axial, the plane spread)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import DIM, axial
from vit_rope import RotaryEmbedding

F64 = torch.float64


def test_spiral_with_two_directions_is_axial():
    x, grid = torch.randn(2, 6, 20, DIM, dtype=F64), (4, 5)
    spiral = RotaryEmbedding(DIM, axes=2, family="spiral", directions=2).double()
    torch.testing.assert_close(spiral(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)


def test_spiral_directions_and_frequencies_follow_the_paper():
    """K = 4 over 16 plane channels: directions 0°, 45°, 90°, 135°; pairs (0°, 90°) and (45°, 135°) share
    frequency chunks dealt round-robin from axial's ladder (the paper's Eq. 13: 0° and 90° get 0, 1, 4, 5 of
    8 when d/4 = 8)."""
    layer = RotaryEmbedding(32, axes=2, family="spiral", directions=4).double()
    F = layer.family.frequency_matrix()  # (axes = (row, col), pairs)
    ladder = 100.0 ** (-torch.arange(8, dtype=F64) * 4 / 32)
    groups = F.view(2, 4, 4)  # (axes, direction, pair)
    magnitude = groups.norm(dim=0)
    for k, chunks in enumerate([[0, 1, 4, 5], [2, 3, 6, 7], [0, 1, 4, 5], [2, 3, 6, 7]]):
        torch.testing.assert_close(magnitude[k], ladder[chunks])
        angle = torch.atan2(groups[0, k], groups[1, k])  # (y = row, x = col)
        torch.testing.assert_close(angle, torch.full_like(angle, k * math.pi / 4))


def test_spiral_in_3d_keeps_time_axial_and_spreads_the_plane():
    """Video: time gets an axial section of a quarter of the channels (64 → 16/24/24), the (row, col) plane six
    directions kπ/6 over its 48 channels; time's pairs see only time, the plane's pairs never see time."""
    layer = RotaryEmbedding(64, axes=3, family="spiral").double()
    assert layer.family.axis_dims == (16, 24, 24) and layer.family.directions == 6
    F = layer.family.frequency_matrix()  # (axes = (t, row, col), 32 pairs)
    torch.testing.assert_close(F[0, 24:], 100.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16))  # axial time ladder
    assert not F[0, :24].any() and not F[1:, 24:].any()
    groups = F[1:, :24].view(2, 6, 4)  # (row, col) x direction x pair
    angle = torch.atan2(groups[0], groups[1])
    torch.testing.assert_close(angle, (torch.arange(6, dtype=F64) * math.pi / 6)[:, None].expand(6, 4))


@settings(max_examples=12, deadline=None)
@given(dim=st.sampled_from([16, 32, 40, 48, 64, 96]), data=st.data())
def test_spiral_in_3d_takes_its_default_directions_for_any_head_dim(dim, data):
    """The default picks directions that fit the plane (it failed for 48 channels), and stays exactly relative."""
    layer = RotaryEmbedding(dim, axes=3, family="spiral").double()
    assert layer.family.directions >= 2 and layer.family.plane_dims % 8 == 0
    pos = torch.tensor(data.draw(st.lists(st.lists(st.floats(-9, 9), min_size=3, max_size=3), min_size=4,
                                          max_size=4)), dtype=torch.float64)  # fmt: skip
    q, k = torch.randn(2, 4, dim, dtype=torch.float64)

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    torch.testing.assert_close(scores(pos + 3.5), scores(pos), rtol=0, atol=1e-9)
    assert math.isfinite(float(scores(pos).sum()))


def test_spiral_refusals_offer_choices():
    with pytest.raises(ValueError, match=r"choose one of \[2, 4, 8\]"):
        RotaryEmbedding(32, axes=2, family="spiral", directions=3)


def test_ntk_rescales_the_planes_ladder_at_the_larger_of_its_scales_and_time_at_its_own():
    """NTK: the plane's ladder (16 channels' worth for a 32-channel plane, d = 16) takes base theta · s^(d/(d-2)) at
    the larger scale of rows and columns (directions mix them), s = 3 of (2, 3), the same as spiral RoPE built on that
    base; in 3D time's axial section (d = 16) takes its own s = 1.5 (by hand)."""
    scaled = RotaryEmbedding(32, axes=2, family="spiral", scaling="ntk", scale=(2.0, 3.0)).double()
    F = scaled.family.frequency_matrix(scaled.scaling_for())
    by_hand = RotaryEmbedding(32, axes=2, family="spiral", theta=100.0 * 3.0 ** (16 / 14)).double()
    torch.testing.assert_close(F, by_hand.family.frequency_matrix(), rtol=1e-13, atol=0)
    at_two = RotaryEmbedding(32, axes=2, family="spiral", theta=100.0 * 2.0 ** (16 / 14)).double()
    assert not torch.allclose(F, at_two.family.frequency_matrix())
    video = RotaryEmbedding(64, axes=3, family="spiral", scaling="ntk", scale=(1.5, 1.0, 1.0)).double()
    F = video.family.frequency_matrix(video.scaling_for())
    time = F[0].nonzero().flatten()
    expected = (100.0 * 1.5 ** (16 / 14)) ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    torch.testing.assert_close(F[0, time], expected, rtol=1e-13, atol=0)
    torch.testing.assert_close(F[1:], video.family.frequency_matrix()[1:], rtol=0, atol=0)  # the plane: s = 1
