"""The position-encoding families against independent references, in float64 with random (not initial) parameters:
exact relativity where the generators commute, norms, each family reduced to axial RoPE by the parameters that make
it so, LookHere's bias against a double loop over token pairs, and token dropping."""

import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_rope import FAMILIES, ParabolicBias, PositionEncoding, RotaryEmbedding

F64 = torch.float64
DIM, HEADS = 24, 2  # 24 channels split into 3 axes of 8, 2 axes of 12, blocks of 8 and 6 spiral directions alike
ROTARY = sorted(n for n, f in FAMILIES.items() if f.rotary)
COMMUTING = [n for n in ROTARY if FAMILIES[n].commutes]


def randomized(encoding, scale=0.3):
    """``encoding`` in float64, every learned parameter drawn at random (the properties must not rest on an init)."""
    torch.manual_seed(1)
    encoding = encoding.double()
    with torch.no_grad():
        for p in encoding.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return encoding


def rope(name, axes, **kwargs):
    return randomized(RotaryEmbedding(DIM, axes=axes, family=name, num_heads=HEADS, **kwargs))


def axes_of(name, data):
    """2 or 3 axes, drawn among those the family declares it takes (a video-only family: 3; the image plane's: 2)."""
    family = FAMILIES[name]
    return data.draw(st.sampled_from([a for a in (2, 3) if family.min_axes <= a <= (family.max_axes or a)]))


def coordinates(axes, n):
    return st.lists(
        st.lists(st.floats(-20, 20, allow_nan=False, width=32), min_size=axes, max_size=axes), min_size=n, max_size=n
    )


# ------------------------------------------------------------------------------------------------ properties
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


def test_the_relative_property_test_can_fail():
    """LieRE's generators do not commute (it says so): the same shift moves its scores (the test above has teeth)."""
    assert not FAMILIES["liere"].commutes
    layer = rope("liere", 2, block_size=DIM)
    pos = torch.randn(5, 2, dtype=F64) * 3
    q, k = torch.randn(2, 1, HEADS, 5, DIM, dtype=F64)

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    assert (scores(pos + 2.5) - scores(pos)).abs().max() > 1e-3


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


# ------------------------------------------------------------------------------------- reductions to axial
def axial(axes=2):
    return RotaryEmbedding(DIM, axes=axes).double()


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


def test_string_with_identity_basis_is_axial_and_its_basis_is_orthogonal():
    string = RotaryEmbedding(DIM, axes=2, family="string", num_heads=HEADS).double()  # S = 0 at init
    with torch.no_grad():  # its frequencies start as axial's ladder, rounded to float32: here exactly
        string.family.frequencies.copy_(axial().family.frequency_matrix().sum(0).expand_as(string.family.frequencies))
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(string(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)
    P = randomized(string).family.basis()
    torch.testing.assert_close(P.mT @ P, torch.eye(DIM, dtype=F64).expand_as(P), rtol=0, atol=1e-12)
    assert not torch.allclose(P, torch.eye(DIM, dtype=F64))


def test_string_is_the_basis_change_around_its_inner_rope():
    """R(p) = Pᵀ RoPE(p) P, P applied first (the other order would cancel in q·k and leave plain RoPE)."""
    string = rope("string", 2)
    x, grid = torch.randn(1, HEADS, 20, DIM, dtype=F64), (4, 5)
    P = string.family.basis()
    inner = RotaryEmbedding(DIM, axes=2).double()
    with torch.no_grad():
        string.family.frequencies.copy_(inner.family.frequency_matrix().sum(0).expand_as(string.family.frequencies))
    expected = inner(x @ P.mT, grid=grid) @ P
    torch.testing.assert_close(string(x, grid=grid), expected, rtol=0, atol=1e-12)


def test_comrope_ld_reduces_to_axial():
    """2×2 blocks with P - Pᵀ = J (a quarter turn) and θ = axial's frequency matrix."""
    ld = RotaryEmbedding(DIM, axes=2, family="comrope_ld", num_heads=HEADS, block_size=2).double()
    with torch.no_grad():
        ld.family.generators.zero_()[..., 1, 0] = 1.0
        ld.family.mix.copy_(axial().family.frequency_matrix().expand_as(ld.family.mix))
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(ld(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)


def test_comrope_ap_reduces_to_axial_up_to_its_block_order():
    """AP gives block j to axis j mod 2 (row, col, row, ...); with 2×2 blocks turning at axial's frequencies it is
    axial RoPE with its channel pairs reordered."""
    ap = RotaryEmbedding(DIM, axes=2, family="comrope_ap", num_heads=HEADS, block_size=2).double()
    quarter = DIM // 4
    # axial pair of each AP block: odd blocks take the column pairs in order, even blocks the row pairs
    pair = [quarter + j // 2 if j % 2 == 0 else j // 2 for j in range(DIM // 2)]
    ladder = axial().family.frequency_matrix().sum(0)  # frequency of each axial pair
    with torch.no_grad():
        ap.family.generators.zero_()[..., 1, 0] = ladder[pair]
    channels = torch.tensor([[2 * p, 2 * p + 1] for p in pair]).flatten()
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(
        ap(x[..., channels], grid=grid), axial()(x, grid=grid)[..., channels], rtol=0, atol=1e-12
    )


def test_liere_reduces_to_axial():
    """4×4 blocks whose generators carry axial's frequencies on their 2×2 diagonal (LieRE's skew form turns by -a)."""
    liere = RotaryEmbedding(DIM, axes=2, family="liere", num_heads=HEADS, block_size=4).double()
    F = axial().family.frequency_matrix()  # (axes, pairs)
    with torch.no_grad():
        g = liere.family.generators.zero_()  # (heads, axes, blocks, 4, 4)
        g[..., 0, 1] = -F[:, 0::2]
        g[..., 2, 3] = -F[:, 1::2]
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(liere(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------------------- LookHere
CENTRES = [0, 180, 90, 270, 45, 225, 135, 315]  # the head order: any first few spread evenly


@pytest.mark.parametrize("fov", [180, 90, 45])
def test_lookhere_bias_equals_a_double_loop(fov):
    """Field of view (angle to the head's direction at most fov/2, boundaries included; a token sees itself),
    Euclidean distance penalty with slope 1.5 → 0.5 over layers, 1/2 and 1/4 for the two groups of four directed heads
    and 1/4, 1/16, ... for the undirected, prefix rows and columns free; the bias built a block of queries at a time
    (as attention takes it at large grids) equals the dense one (small grids)."""
    heads, depth, (H, W) = 12, 3, (4, 5)
    enc = PositionEncoding(16, 2, "lookhere", num_heads=heads, depth=depth, num_prefix_tokens=1, fov=fov)
    table = enc.table((H, W), dtype=F64)
    assert table.dense is not None
    for layer, s_layer in enumerate([1.5, 1.0, 0.5]):
        bias = table.layer(layer).block(0, 1 + H * W)
        lazy = replace(table, dense=None).layer(layer)
        torch.testing.assert_close(torch.cat([lazy.block(a, a + 7) for a in range(0, 21, 7)], dim=-2), bias)
        expected = torch.zeros_like(bias)
        for h in range(heads):
            slope = s_layer * (2.0 ** -(1 + h // 4) if h < 8 else 4.0 ** -(1 + h - 8))
            centre = CENTRES[h % 8] + (22.5 if fov == 45 else 0.0)
            for i in range(H * W):
                for j in range(H * W):
                    (ri, ci), (rj, cj) = divmod(i, W), divmod(j, W)
                    dx, dy = cj - ci, -(rj - ri)  # y up: a smaller row is "up"
                    turn = (math.degrees(math.atan2(dy, dx)) - centre + 180) % 360 - 180
                    visible = h >= 8 or i == j or abs(turn) <= fov / 2 + 1e-9
                    expected[h, 1 + i, 1 + j] = -slope * math.hypot(dx, dy) if visible else -math.inf
        torch.testing.assert_close(bias, expected, rtol=0, atol=1e-12)


def test_lookhere_worked_example_of_the_paper():
    """3×3 grid, the centre query, the head looking right with a 90° field of view, first of 12 layers (layer slope
    1.5, head slope 1/2): it sees itself, the token to its right (penalty 0.75) and the two right corners on the ±45°
    boundary (0.75·√2)."""
    enc = PositionEncoding(16, 2, "lookhere", num_heads=12, depth=12, fov=90)
    bias = enc.table((3, 3), dtype=F64).layer(0).block(0, 9)[0, 4]  # head 0 looks right; token 4 is the centre
    s2 = 0.75 * math.sqrt(2)
    want = torch.tensor([-math.inf, -math.inf, -s2, -math.inf, 0, -0.75, -math.inf, -math.inf, -s2], dtype=F64)
    torch.testing.assert_close(bias, want)


def test_lookhere_bias_is_dense_where_it_fits_one_block():
    enc = PositionEncoding(16, 2, "lookhere", num_heads=3, depth=2).eval()
    assert enc.table((4, 4)).dense.shape == (3, 16, 16)  # one (heads, N, N) bias, scaled per layer
    assert enc.table((32, 32)).dense is None  # a larger grid's is built a block of queries at a time (no N × N held)


def test_lookhere_slopes_are_the_released_codes():
    """GreenCUBIC/lookhere (lookhere.py): ``get_slopes(n)`` gives directed heads 2^-1 in the first group of four,
    2^-2 in the next; ``get_none_slopes`` the undirected 4^-1 ... 4^-4 (the first two for two heads); ViT-B has 8
    directed and 4 undirected heads, ViT-S 4 and 2 (its 6-head configuration)."""
    from vit_rope.families.lookhere import head_slopes

    assert head_slopes(8, 4) == [0.5] * 4 + [0.25] * 4 + [0.25, 0.0625, 0.015625, 0.00390625]
    assert head_slopes(4, 2) == [0.5] * 4 + [0.25, 0.0625]
    assert head_slopes(8, 8) == [0.5] * 4 + [0.25] * 4 + [
        0.25,
        0.25,
        0.0625,
        0.0625,
        4.0**-3,
        4.0**-3,
        4.0**-4,
        4.0**-4,
    ]
    enc = PositionEncoding(16, 2, "lookhere", num_heads=6)
    assert enc.family.directed == 4 and enc.table((2, 2)).slopes.tolist() == [0.5] * 4 + [0.25, 0.0625]


# ---------------------------------------------------------------------------------------------- token dropping
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


def test_yarn_measures_each_axis_against_its_own_extent():
    """A rectangular training grid: each axis's ramp counts turns over its own length."""
    from vit_rope.families.axial import frequency_ladder

    layer = RotaryEmbedding(32, axes=2, scaling="yarn", ref_grid=(4, 16), theta=100.0)
    F = layer.family.frequency_matrix(layer.scaling_for((8, 32)))  # s = 2 on both axes
    torch.testing.assert_close(F[1, :8], frequency_ladder(16, 100.0, "yarn", 2.0, 16))  # x: the column, 16 long
    torch.testing.assert_close(F[0, 8:], frequency_ladder(16, 100.0, "yarn", 2.0, 4))  # y: the row, 4 long
    assert not torch.equal(frequency_ladder(16, 100.0, "yarn", 2.0, 16), frequency_ladder(16, 100.0, "yarn", 2.0, 4))


def test_a_table_shared_by_heads_turns_vectors_without_a_head_dim():
    liere = randomized(RotaryEmbedding(DIM, axes=2, family="liere", per_head=False))
    x = torch.randn(20, DIM, dtype=F64)
    torch.testing.assert_close(liere(x, grid=(4, 5))[0], liere(x[None, None], grid=(4, 5))[0, 0])
