"""Every family's shared contract, driven by the registry (the built-in families, tests/conftest.py's and any
registered before these tests are collected), in float64 with random (not initial) parameters: exact relativity where
the generators commute, norms kept and rotations undone, and token dropping that keeps each kept token's position.
Each family's own rules: tests/families/test_<name>.py."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import DIM, HEADS, randomized, rope
from vit_rope import FAMILIES, ParabolicBias, PositionEncoding

F64 = torch.float64
ROTARY = sorted(n for n, f in FAMILIES.items() if f.rotary)
COMMUTING = [n for n in ROTARY if FAMILIES[n].commutes]


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
    with pytest.raises(ValueError, match="tokens picks tokens of a grid"):
        enc.table(positions=torch.zeros(20, len(grid)), tokens=keep)
