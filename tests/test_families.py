"""Every family's shared contract, driven by the registry (the built-in families, tests/conftest.py's and any
registered before these tests are collected), in float64 with random (not initial) parameters: exact relativity where
the generators commute, norms kept and rotations undone, token dropping that keeps each kept token's position, and
test-time scaling (every mode at a scale of 1 is none; NTK and YaRN on every fixed ladder). Each family's own rules:
tests/families/test_<name>.py."""

import math
from dataclasses import fields, replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import DIM, HEADS, randomized, rope
from vit_rope import FAMILIES, ParabolicBias, PositionEncoding
from vit_rope.coords import grid_coordinates
from vit_rope.families.base import PairFamily
from vit_rope.position_encoding import SCALING_MODES

F64 = torch.float64
ROTARY = sorted(n for n, f in FAMILIES.items() if f.rotary)
COMMUTING = [n for n in ROTARY if FAMILIES[n].commutes]
FIXED_LADDERS = sorted(n for n, f in FAMILIES.items() if "ntk" in f.scaling_modes)  # what NTK and YaRN rescale


def axes_of(name, data):
    """2 or 3 axes, drawn among those the family declares it takes (a video-only family: 3; the image plane's: 2)."""
    family = FAMILIES[name]
    return data.draw(st.sampled_from([a for a in (2, 3) if family.min_axes <= a <= (family.max_axes or a)]))


def coordinates(axes, n):
    return st.lists(
        st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=axes, max_size=axes), min_size=n, max_size=n
    )


@settings(max_examples=24, deadline=None)
@given(name=st.sampled_from(COMMUTING), data=st.data())
def test_commuting_families_are_exactly_relative(name, data):
    """<R(a) q, R(b) k> is unchanged when every position moves by the same vector."""
    axes = axes_of(name, data)
    layer = rope(name, axes)
    pos = torch.tensor(data.draw(coordinates(axes, 5)), dtype=F64)
    shift = torch.tensor(data.draw(coordinates(axes, 1)), dtype=F64)
    q, k = torch.randn(2, 1, HEADS, 5, DIM, dtype=F64, generator=torch.Generator().manual_seed(0))

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    torch.testing.assert_close(scores(pos + shift), scores(pos), rtol=0, atol=1e-9)


@settings(max_examples=24, deadline=None)
@given(name=st.sampled_from(ROTARY), data=st.data(), inverse=st.booleans())
def test_every_family_preserves_norms_and_turns_back(name, data, inverse):
    axes = axes_of(name, data)
    layer = rope(name, axes)
    pos = torch.tensor(data.draw(coordinates(axes, 4)), dtype=F64)
    x = torch.randn(3, HEADS, 4, DIM, dtype=F64)
    y = layer(x, positions=pos, inverse=inverse)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(layer(y, positions=pos, inverse=not inverse), x, rtol=0, atol=1e-10)
    assert pos.abs().max() < 0.5 or not torch.allclose(y, x)  # it does turn


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_kept_tokens_keep_their_positions(name):
    """The encoding of each sample's kept tokens equals the full grid's, gathered (rotating the whole sequence and
    gathering gives the rotated kept tokens), in every layer of a per-layer family (3 layers, 2 samples: a layer
    picked where a sample was meant, or the other way round, would not broadcast the same)."""
    grid = (4, 5) if FAMILIES[name].min_axes <= 2 else (2, 2, 5)  # 20 patches of an image, or of a clip
    enc = randomized(PositionEncoding(DIM, len(grid), name, num_heads=HEADS, depth=3, num_prefix_tokens=1))
    B, K = 2, 7
    keep = torch.stack([torch.randperm(20)[:K] for _ in range(B)])  # (B, K) patch indices, as timm's PatchDropout
    rows = torch.cat((torch.zeros(B, 1, dtype=torch.long), keep + 1), dim=1)  # the prefix token stays first
    full, part = enc.table(grid, dtype=F64), enc.table(grid, tokens=keep, dtype=F64)
    x = torch.randn(B, HEADS, 21, DIM, dtype=F64)
    pick = rows[:, None, :, None].expand(B, HEADS, K + 1, DIM)
    for layer in range(3):
        whole, kept = full.layer(layer), part.layer(layer)
        if isinstance(whole, ParabolicBias):  # columns appended to q and k: each kept token's are the grid's
            q, k = torch.randn(2, B, HEADS, 21, DIM, dtype=F64)
            index = rows[:, None, :, None]
            gathered = [t.gather(2, index.expand(B, HEADS, K + 1, t.shape[-1])) for t in whole.extend(q, k)]
            for got, want in zip(kept.extend(q.gather(2, pick), k.gather(2, pick)), gathered, strict=True):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            continue
        if not FAMILIES[name].rotary:
            dense = whole.block(0, 21)
            gathered = torch.stack([dense[:, r][:, :, r] for r in rows])
            torch.testing.assert_close(kept.block(0, K + 1), gathered, rtol=0, atol=0)
            torch.testing.assert_close(replace(kept, dense=None).block(0, K + 1), gathered, rtol=0, atol=1e-12)
            continue
        turned = whole.rotate(x)
        torch.testing.assert_close(kept.rotate(x.gather(2, pick)), turned.gather(2, pick), rtol=0, atol=1e-12)
    # explicit positions (a native-resolution batch's) keep their tokens the same way
    positions = grid_coordinates(grid, dtype=F64)
    assert_same_table(enc.table(positions=positions, tokens=keep, dtype=F64), part)


# ------------------------------------------------------------------------------------------ test-time scaling
def grid_of(name: str) -> tuple[int, ...]:
    return (4, 5) if FAMILIES[name].min_axes <= 2 else (2, 4, 5)


def assert_same_table(a, b) -> None:
    """Two tables equal to the bit: every tensor field, and every other field."""
    assert type(a) is type(b)
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and torch.equal(x, y), f.name
        else:
            assert x == y, f.name


def test_every_fixed_ladder_of_the_package_takes_every_scaling_mode():
    """A family of the package whose frequencies are a fixed matrix (it writes frequency_matrix, as axial, spiral,
    golden-gate and VideoRoPE) takes PI, NTK, YaRN and normalized; the others take the coordinate modes."""
    fixed = [
        f for f in FAMILIES.values()
        if f.__module__.startswith("vit_rope.") and issubclass(f, PairFamily)
        and f.frequency_matrix is not PairFamily.frequency_matrix
    ]  # fmt: skip
    assert len(fixed) >= 4
    for family in FAMILIES.values():
        modes = SCALING_MODES if family in fixed else ("none", "pi", "normalized")
        if family.__module__.startswith("vit_rope."):
            assert family.scaling_modes == modes, family.name


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_mode_at_a_scale_of_one_is_none(name):
    """At the training grid, and at a scale of 1 on a larger grid, every mode a family takes gives exactly the table of
    no scaling (normalized has no scale: at the training grid only)."""
    ref = grid_of(name)
    larger = tuple(2 * n for n in ref)
    torch.manual_seed(0)
    plain = randomized(PositionEncoding(DIM, len(ref), name, num_heads=HEADS, ref_grid=ref, num_prefix_tokens=1))
    state = plain.state_dict()
    for mode in FAMILIES[name].scaling_modes:
        scaled = PositionEncoding(DIM, len(ref), name, num_heads=HEADS, ref_grid=ref, num_prefix_tokens=1)
        scaled.double().load_state_dict(state)
        scaled.set_scaling(mode)
        assert_same_table(scaled.table(ref, dtype=F64), plain.table(ref, dtype=F64))
        if mode != "normalized":
            scaled.set_scaling(mode, scale=1.0)
            assert_same_table(scaled.table(larger, dtype=F64), plain.table(larger, dtype=F64))


def frequency_ratios(name: str, mode: str, s: float) -> torch.Tensor:
    """Each turning pair's frequency under ``mode`` at scale s on every axis over its frequency unscaled (the norms of
    their frequency vectors, every head's)."""
    ref = grid_of(name)
    layer = PositionEncoding(DIM, len(ref), name, num_heads=HEADS, ref_grid=ref, scaling=mode, scale=s)
    family = layer.family
    scaled, plain = family.frequency_matrix(layer.scaling_for()), family.frequency_matrix()
    f, g = scaled.norm(dim=-2).flatten(), plain.norm(dim=-2).flatten()
    return f[g > 0] / g[g > 0]


@pytest.mark.parametrize("s", [2.0, 3.5])
@pytest.mark.parametrize("name", FIXED_LADDERS)
def test_ntk_keeps_the_highest_frequency_and_interpolates_the_lowest(name, s):
    """NTK-aware scaling (base theta · s^(d/(d-2))) keeps each ladder's highest frequency (1) exactly, divides its
    lowest by exactly s, and moves every other between the two: ratios in [1/s, 1], both ends reached."""
    r = frequency_ratios(name, "ntk", s)
    assert r.max() == 1.0
    torch.testing.assert_close(r.min(), torch.tensor(1 / s, dtype=F64), rtol=1e-12, atol=0)
    assert (r >= 1 / s - 1e-12).all() and (r <= 1.0).all()
    assert ((r > 1 / s + 1e-6) & (r < 1 - 1e-6)).any()  # a ladder, not two values


@pytest.mark.parametrize("name", FIXED_LADDERS)
def test_yarn_ramps_between_interpolated_and_kept_and_scales_by_its_temperature(name):
    """YaRN: every frequency between interpolated (f / s) and kept (f), and every turning pair's cos and sin scaled by
    the temperature 0.1 ln s + 1 (anchors.md: FiT's YaRN), the prefix row too; unturned pairs stay (1, 0)."""
    s = 3.0
    r = frequency_ratios(name, "yarn", s)
    assert (r >= 1 / s - 1e-12).all() and (r <= 1.0).all()
    ref = grid_of(name)
    layer = PositionEncoding(DIM, len(ref), name, num_heads=HEADS, ref_grid=ref, scaling="yarn", num_prefix_tokens=1)
    table = layer.table(tuple(3 * n for n in ref), dtype=F64)  # s = 3 on every axis, derived from the grid
    size = torch.hypot(table.cos, table.sin)  # (..., 1 + N, pairs)
    F = layer.family.frequency_matrix()  # ([heads,] axes, pairs)
    turning = (F.norm(dim=-2) > 0).reshape(-1, F.shape[-1]).any(0)
    temperature = 0.1 * math.log(s) + 1
    torch.testing.assert_close(size[..., turning], torch.full_like(size[..., turning], temperature))
    assert turning.any() and (size[..., ~turning] == 1).all()
