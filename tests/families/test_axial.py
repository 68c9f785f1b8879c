"""vit_rope/families/axial.py: axial RoPE's frequencies by the formulas (a worked example, x then y), exact relativity
and norms of the default layer, and the NTK and YaRN ladders (YaRN's ramp and temperature, each axis against its own
extent)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import position_lists
from vit_rope import RotaryEmbedding
from vit_rope.families.axial import frequency_ladder

F64 = torch.float64


def test_worked_example_1d():
    """p = 5, dim = 8, theta = 10000: pair i turns by 5 / 10000**(2i/8) = 5, 0.5, 0.05, 0.005."""
    rope = RotaryEmbedding(8, axes=1, theta=10000.0)
    t = rope.table(positions=torch.tensor([[5.0]], dtype=F64), dtype=F64)
    expected = torch.tensor([5.0, 0.5, 0.05, 0.005], dtype=F64)
    torch.testing.assert_close(t.cos[0], expected.cos(), rtol=0, atol=1e-15)
    torch.testing.assert_close(t.sin[0], expected.sin(), rtol=0, atol=1e-15)


def test_2d_halves_follow_column_then_row():
    """First half of the channels turns with the column (x), the second half with the row (y)."""
    rope = RotaryEmbedding(8, axes=2, theta=100.0)
    t = rope.table((2, 3), dtype=F64)
    angles = torch.atan2(t.sin, t.cos)  # token 5 = row 1, column 2
    torch.testing.assert_close(angles[5], torch.tensor([2.0, 2 / 100**0.5, 1.0, 1 / 100**0.5], dtype=F64))


@settings(max_examples=40, deadline=None)
@given(
    axes=st.sampled_from([1, 2, 3]),
    data=st.data(),
    layout=st.sampled_from(["interleaved", "half"]),
    theta=st.sampled_from([100.0, 10000.0]),
)
def test_scores_depend_only_on_relative_position(axes, data, layout, theta):
    a, b, c = (data.draw(position_lists(axes)) for _ in range(3))
    rope = RotaryEmbedding(6 * axes + 2, axes=axes, theta=theta, layout=layout)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 6 * axes + 2, dtype=F64, generator=g)

    def score(pa, pb):
        pos = torch.tensor([pa, pb], dtype=F64)
        rq = rope(q.expand(2, -1), positions=pos)[0]
        rk = rope(k.expand(2, -1), positions=pos)[1]
        return rq @ rk

    shifted = score([p + s for p, s in zip(a, c, strict=True)], [p + s for p, s in zip(b, c, strict=True)])
    assert score(a, b) == pytest.approx(shifted.item(), abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(axes=st.sampled_from([1, 2, 3]), data=st.data(), inverse=st.booleans())
def test_norm_preserved_and_inverse_undoes(axes, data, inverse):
    pos = torch.tensor([data.draw(position_lists(axes)) for _ in range(4)], dtype=F64)
    rope = RotaryEmbedding(4 * axes + 4, axes=axes)
    x = torch.randn(3, 4, 4 * axes + 4, dtype=F64)
    y = rope(x, positions=pos, inverse=inverse)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(rope(y, positions=pos, inverse=not inverse), x, rtol=0, atol=1e-12)


def test_ntk_scaling_formula():
    s, d = 4.0, 16
    rope = RotaryEmbedding(2 * d, axes=2, scaling="ntk", scale=s)
    F = rope.family.frequency_matrix(rope.scaling_for())
    base = 100.0 * s ** (d / (d - 2))
    expected = torch.tensor([base ** (-2 * j / d) for j in range(d // 2)], dtype=F64)
    torch.testing.assert_close(F[1, : d // 2], expected)  # x section
    # highest frequency kept, lowest interpolated exactly by s
    plain = RotaryEmbedding(2 * d, axes=2).family.frequency_matrix()
    assert F[1, 0] == plain[1, 0] and F[1, d // 2 - 1] == pytest.approx(plain[1, d // 2 - 1].item() / s, rel=1e-12)


def test_yarn_ramp_and_temperature():
    s, ref = 2.0, (16, 16)
    rope = RotaryEmbedding(64, axes=2, theta=10000.0, scaling="yarn", ref_grid=ref, yarn_beta=(2.0, 0.5))
    F, plain = (
        rope.family.frequency_matrix(rope.scaling_for((32, 32)))[1, :16],
        RotaryEmbedding(64, axes=2, theta=10000.0).family.frequency_matrix()[1, :16],
    )
    turns = 16 * plain / (2 * math.pi)
    assert torch.equal(F[turns >= 2.0], plain[turns >= 2.0])  # fast frequencies kept
    torch.testing.assert_close(F[turns <= 0.5], plain[turns <= 0.5] / s)  # slow ones interpolated
    mid = (turns > 0.5) & (turns < 2.0)
    assert mid.any() and ((F[mid] < plain[mid]) & (F[mid] > plain[mid] / s)).all()
    t = rope.table((32, 32), dtype=F64)
    mscale = 0.1 * math.log(s) + 1
    torch.testing.assert_close(torch.hypot(t.cos, t.sin), torch.full_like(t.cos, mscale))
    # at the training grid nothing changes
    unscaled = RotaryEmbedding(64, axes=2, theta=10000.0).table((16, 16), dtype=F64)
    torch.testing.assert_close(rope.table((16, 16), dtype=F64).sin, unscaled.sin, rtol=0, atol=0)


def test_yarn_measures_each_axis_against_its_own_extent():
    """A rectangular training grid: each axis's ramp counts turns over its own length."""
    layer = RotaryEmbedding(32, axes=2, scaling="yarn", ref_grid=(4, 16), theta=100.0)
    F = layer.family.frequency_matrix(layer.scaling_for((8, 32)))  # s = 2 on both axes
    torch.testing.assert_close(F[1, :8], frequency_ladder(16, 100.0, "yarn", 2.0, 16))  # x: the column, 16 long
    torch.testing.assert_close(F[0, 8:], frequency_ladder(16, 100.0, "yarn", 2.0, 4))  # y: the row, 4 long
    assert not torch.equal(frequency_ladder(16, 100.0, "yarn", 2.0, 16), frequency_ladder(16, 100.0, "yarn", 2.0, 4))
