"""VideoRoPE (Wei et al., ICML 2025) against the paper and the authors' code, in float64: which frequencies each axis
gets, the frames' centres on the diagonal (mirror symmetry as time advances), δ scaling time exactly, exact
relativity, NTK and YaRN on its one ladder at each coordinate's scale (by hand), and the video models. Each rule is
checked against a perturbed encoding too, so that the check can fail."""

import math

import pytest
import timm
import torch

from vit_rope import RotaryEmbedding
from vit_rope.coords import grid_coordinates

F64 = torch.float64


def videorope(dim=64, **kwargs):
    return RotaryEmbedding(dim, axes=3, family="videorope", **kwargs).double()


# ------------------------------------------------------------------------------------------ frequency allocation
def authors_allocation(pairs: int, spatial: int, theta: float) -> torch.Tensor:
    """The authors' rule, pair by pair: one ladder ``theta ** (-2j / (2 · pairs))``; pair j < spatial turns with h
    where j is even and with w where it is odd; the pairs from ``spatial`` on (the lowest frequencies) with t."""
    F = torch.zeros(3, pairs, dtype=F64)
    for j in range(pairs):
        axis = (1 if j % 2 == 0 else 2) if j < spatial else 0
        F[axis, j] = theta ** (-2 * j / (2 * pairs))
    return F


def test_time_takes_the_lowest_frequencies_as_the_authors_code():
    """Qwen2-VL's head (128 channels, base 1e6, sections 16/24/24 pairs): the first 48 pairs alternate h, w and the
    last 16, the lowest frequencies, turn with t; our default split of 64 channels is the same proportions."""
    layer = videorope(128, theta=1e6)
    assert layer.family.axis_dims == (32, 48, 48)
    F = layer.family.frequency_matrix()
    torch.testing.assert_close(F, authors_allocation(64, 48, 1e6), rtol=1e-15, atol=0)
    assert F[0].max() < F[1:][F[1:] > 0].min()  # every time frequency lies below every spatial one
    assert videorope(64).family.axis_dims == (16, 24, 24)
    torch.testing.assert_close(videorope(64).family.frequency_matrix(), authors_allocation(32, 24, 100.0))
    # the check has teeth: M-RoPE's (t first, then h, then w; a ladder per axis), h and w swapped, time on top
    mrope = RotaryEmbedding(64, axes=3, axis_dims=(16, 24, 24), grid_indexing="ij").double().family.frequency_matrix()
    reference = authors_allocation(32, 24, 100.0)
    for wrong in (mrope, reference[[0, 2, 1]], reference.flip(-1)):
        assert not torch.allclose(wrong, reference)


def test_a_head_dim_of_24_and_other_splits():
    assert videorope(24).family.axis_dims == (8, 8, 8)
    F = videorope(64, axis_dims=(8, 20, 20)).family.frequency_matrix()  # 24 pairs rotate, 8 stay unturned
    assert (F[:, 24:] == 0).all()
    torch.testing.assert_close(F[:, :24], authors_allocation(24, 20, 100.0))
    with pytest.raises(ValueError, match="interleaves h and w pair by pair"):
        videorope(64, axis_dims=(16, 20, 28))
    with pytest.raises(ValueError, match="must be positive"):
        videorope(64, temporal_spacing=0)
    with pytest.raises(ValueError, match="family 'videorope' takes 3 coordinate axes, not axes=2"):
        RotaryEmbedding(64, axes=2, family="videorope")


# ----------------------------------------------------------------------------------------------- the layout
def reference_angles(grid, F, delta, diagonal=True, centre=None):
    """Each token's angles by the formula: ``(δt, δt + h - c_h, δt + w - c_w) · F``, the centre ``(n - 1) / 2``."""
    T, H, W = grid
    c_h, c_w = centre if centre is not None else ((H - 1) / 2, (W - 1) / 2)
    t, h, w = grid_coordinates(grid).unbind(-1)
    advance = delta * t if diagonal else 0 * t
    coords = torch.stack((delta * t, advance + h - c_h, advance + w - c_w), dim=-1)
    return coords @ F


@pytest.mark.parametrize("delta", [2.0, 0.5, 3.0])
def test_the_table_is_the_diagonal_layout(delta):
    grid = (3, 4, 5)
    layer = videorope(32, temporal_spacing=delta)
    table = layer.table(grid, dtype=F64)
    angles = reference_angles(grid, layer.family.frequency_matrix(), delta)
    torch.testing.assert_close(table.cos, angles.cos(), rtol=0, atol=1e-14)
    torch.testing.assert_close(table.sin, angles.sin(), rtol=0, atol=1e-14)
    assert layer.family.temporal_spacing == delta and videorope().family.temporal_spacing == 2.0  # the authors' δ


def mirror_defect(cos, sin, grid, centre_angles):
    """The largest gap between ``R(a_token) R(a_mirror)`` and ``R(2 · a_centre)``, over every token and its mirror
    image across its frame's centre: zero when they turn symmetrically about the frame's centre."""
    T, H, W = grid
    z = torch.complex(cos, sin).view(T, H, W, -1)
    mirrored = z.flip(1, 2)  # (τ, H-1-h, W-1-w)
    centre = torch.polar(torch.ones_like(centre_angles), 2 * centre_angles)  # (T, pairs)
    return (z * mirrored - centre[:, None, None]).abs().max()


def test_frames_turn_symmetrically_about_their_centre_on_the_diagonal():
    """Spatial symmetry as time advances: in every frame τ, a token and its mirror image across the frame's centre
    turn symmetrically about the centre, and the centre lies on the diagonal t = h = w at δτ, where every pair turns
    as 1D RoPE would, by δτ · f_j (the prefix tokens, unturned, sit at the first frame's centre). An even and an odd
    frame side."""
    grid, delta = (4, 4, 5), 2.0
    layer = videorope(32, temporal_spacing=delta)
    F = layer.family.frequency_matrix()
    centre = delta * torch.arange(4, dtype=F64)[:, None] * F.sum(0)  # 1D RoPE at δτ: the diagonal
    table = layer.table(grid, dtype=F64)
    assert mirror_defect(table.cos, table.sin, grid, centre) < 1e-13
    # it fails where a rule is broken: the authors' integer centre (n - 1) // 2, no centring, frames that stay put,
    # another δ
    for wrong in (
        reference_angles(grid, F, delta, centre=(1, 2)),
        reference_angles(grid, F, delta, centre=(0, 0)),
        reference_angles(grid, F, delta, diagonal=False),
        reference_angles(grid, F, 1.0),
    ):
        assert mirror_defect(wrong.cos(), wrong.sin(), grid, centre) > 1e-2
    # diagonal=False keeps each frame's centre at (δτ, 0, 0): symmetric about time's angles alone
    still = videorope(32, temporal_spacing=delta, diagonal=False).table(grid, dtype=F64)
    time_only = delta * torch.arange(4, dtype=F64)[:, None] * F[0]
    assert mirror_defect(still.cos, still.sin, grid, time_only) < 1e-13


def test_delta_scales_time_exactly():
    """Tokens at (t, h, w) under δ turn exactly as tokens at (δt, h, w) under δ = 1 (time's index scaled, spatial
    indices advancing with the scaled time); time's pairs turn by δ · t · f."""
    pos = torch.randn(2, 9, 3, dtype=F64) * 4
    scaled = pos * torch.tensor([3.0, 1.0, 1.0], dtype=F64)
    x = torch.randn(2, 1, 9, 64, dtype=F64)
    three, one = videorope(temporal_spacing=3.0), videorope(temporal_spacing=1.0)
    torch.testing.assert_close(three(x, positions=pos), one(x, positions=scaled), rtol=0, atol=1e-12)
    assert not torch.allclose(three(x, positions=pos), one(x, positions=pos))  # δ does something
    assert not torch.allclose(three(x, positions=pos), one(x, positions=pos * 3))  # it scales time, not space
    table, F = three.table(positions=pos, dtype=F64), three.family.frequency_matrix()
    time = slice(24, 32)
    torch.testing.assert_close(table.sin[..., time], (3 * pos[..., :1] * F[0, time]).sin().unsqueeze(1), atol=1e-14,
                               rtol=0)  # fmt: skip


# ---------------------------------------------------------------------------------------------- relativity
def test_attention_is_exactly_relative_in_float64():
    """Logits between patch tokens are unchanged when every position moves by the same (t, h, w), and change when
    only the queries move (the check can fail)."""
    torch.manual_seed(0)
    layer = videorope(32)
    pos = torch.rand(12, 3, dtype=F64) * torch.tensor([8.0, 6.0, 6.0], dtype=F64)
    q, k = torch.randn(2, 1, 12, 32, dtype=F64)

    def logits(pq, pk):
        return layer(q, positions=pq) @ layer(k, positions=pk).mT

    for shift in torch.randn(5, 3, dtype=F64) * 7:
        torch.testing.assert_close(logits(pos + shift, pos + shift), logits(pos, pos), rtol=0, atol=1e-12)
    moved = pos + torch.tensor([1.0, 0.0, 0.0], dtype=F64)
    assert (logits(moved, pos) - logits(pos, pos)).abs().max() > 1e-3


# ------------------------------------------------------------------------------------------ test-time scaling
def by_hand(mode: str, scales, lengths=None, theta=100.0, pairs=32, spatial=24, beta=(32.0, 1.0)) -> torch.Tensor:
    """The (3, pairs) frequencies of a 64-channel head (16/24/24) written out pair by pair: pair j of the one ladder of
    d = 64 channels, ``theta ** (-2j / d)``, belongs to h (even j < 24), w (odd j < 24) or t (j ≥ 24), and takes its
    axis's scale s: NTK's base ``theta · s ** (d / (d - 2))``, or YaRN's blend of f / s and f by the ramp
    ``(turns - β_slow) / (β_fast - β_slow)`` clamped to [0, 1], turns = length · f / 2π."""
    d = 2 * pairs
    F = torch.zeros(3, pairs, dtype=F64)
    for j in range(pairs):
        axis = (1 if j % 2 == 0 else 2) if j < spatial else 0
        s = scales[axis]
        if mode == "ntk":
            f = (theta * s ** (d / (d - 2))) ** (-2 * j / d)
        else:
            f = theta ** (-2 * j / d)
            ramp = min(max((lengths[axis] * f / (2 * math.pi) - beta[1]) / (beta[0] - beta[1]), 0.0), 1.0)
            f = f / s * (1 - ramp) + f * ramp
        F[axis, j] = f
    return F


def test_ntk_rescales_the_one_ladder_at_each_axis_scale():
    """Per-axis factors without a reference grid: time's pairs at s_t, h's at s_h, w's at s_w, each on the whole
    ladder's NTK base (d = 64, the authors' extrapolation code), not on a ladder per axis."""
    layer = videorope(64, scaling="ntk", scale=(3.0, 2.0, 1.5))
    F = layer.family.frequency_matrix(layer.scaling_for())
    torch.testing.assert_close(F, by_hand("ntk", (3.0, 2.0, 1.5)), rtol=1e-13, atol=0)
    # the check can fail: one scale for every pair, or time's 8 pairs as a ladder of their own (d = 16)
    assert not torch.allclose(F, by_hand("ntk", (2.0, 2.0, 2.0)))
    own = torch.tensor([(100.0 * 3.0 ** (16 / 14)) ** (-2 * j / 16) for j in range(8)], dtype=F64)
    assert not torch.allclose(F[0, 24:], own)


def test_the_scale_of_h_and_w_is_the_growth_of_their_extent_on_the_diagonal():
    """Reference clip (T, H, W) = (4, 6, 6), δ = 2: h and w turn with δt + h, whose extent is δT + H = 14. Frames twice
    as large (8 + 12 = 20): h and w rescale by 20/14, not 2, and time's pairs stay exactly as trained; a clip twice as
    long (16 + 6 = 22): time by 2, h and w by 22/14; without the diagonal, each axis by its own factor (axial's)."""
    ref = (4, 6, 6)
    layer = videorope(64, scaling="ntk", ref_grid=ref)
    for grid, s in (((4, 12, 12), (1.0, 20 / 14, 20 / 14)), ((8, 6, 6), (2.0, 22 / 14, 22 / 14))):
        F = layer.family.frequency_matrix(layer.scaling_for(grid))
        torch.testing.assert_close(F, by_hand("ntk", s), rtol=1e-13, atol=0)
    F = layer.family.frequency_matrix(layer.scaling_for((4, 12, 12)))
    assert torch.equal(F[0], layer.family.frequency_matrix()[0])
    assert not torch.allclose(F, by_hand("ntk", (1.0, 2.0, 2.0)))
    still = videorope(64, scaling="ntk", ref_grid=ref, diagonal=False)
    F = still.family.frequency_matrix(still.scaling_for((8, 12, 6)))
    torch.testing.assert_close(F, by_hand("ntk", (2.0, 2.0, 1.0)), rtol=1e-13, atol=0)


def test_yarn_ramps_each_axis_over_its_extent_and_scales_by_its_temperature():
    """YaRN at frames three times as large, δ = 2, reference (4, 6, 6): time's pairs kept (s = 1, temperature 1); h
    and w rescaled by (8 + 18) / 14 with the ramp counting turns over their extent 14, and cos, sin of their pairs
    scaled by 0.1 ln s + 1."""
    ref, grid, s = (4, 6, 6), (4, 18, 18), 26 / 14
    layer = videorope(64, scaling="yarn", ref_grid=ref)
    F = layer.family.frequency_matrix(layer.scaling_for(grid))
    expected = by_hand("yarn", (1.0, s, s), (8.0, 14.0, 14.0))
    torch.testing.assert_close(F, expected, rtol=1e-13, atol=0)
    assert not torch.allclose(F, by_hand("yarn", (1.0, s, s), (4.0, 6.0, 6.0)))  # the ramp's lengths matter
    ratio = expected.sum(0) / by_hand("ntk", (1.0, 1.0, 1.0)).sum(0)
    assert (ratio[:24] > 1 / s + 1e-6).any() and (ratio[:24] < 1 - 1e-6).any()  # the ramp's middle is reached
    table = layer.table(grid, dtype=F64)
    size = torch.hypot(table.cos, table.sin)
    torch.testing.assert_close(size[..., :24], torch.full_like(size[..., :24], 0.1 * math.log(s) + 1))
    assert (size[..., 24:] == 1).all()


def test_the_video_model_takes_every_scaling_mode():
    """The video model evaluates a longer clip of larger frames under each mode, each with a table of its own."""
    kw = dict(patch_size=8, depth=1, embed_dim=64, num_heads=2, num_classes=4, num_frames=4, img_size=16)
    model = timm.create_model("vit_rope3d_tiny", pos_embed="videorope", **kw).eval()
    assert model.rope_scaling_modes() == ("none", "pi", "ntk", "yarn", "normalized")
    clip = torch.randn(1, 3, 8, 32, 24)  # twice the frames, frames of 4 x 3 patches against 2 x 2
    tables = []
    for mode in model.rope_scaling_modes():
        model.set_rope_scaling(mode)
        with torch.no_grad():
            assert torch.isfinite(model(clip)).all()
        tables.append(model.position_encoding.table((4, 4, 3), dtype=F64))
    for i, a in enumerate(tables):
        assert all(not torch.allclose(a.sin, b.sin) for b in tables[i + 1 :])


# -------------------------------------------------------------------------------------------------- models
def test_the_video_model_trains_at_its_clip_size_and_runs_on_unseen_ones():
    """vit_rope3d_tiny with pos_embed="videorope" (the benchmark's size): forward and backward at its training clip,
    forward on a longer clip of another frame size, time order seen, δ passed through rope_options."""
    kw = dict(patch_size=8, depth=2, embed_dim=64, num_heads=2, num_classes=8, num_frames=8, img_size=32)
    torch.manual_seed(0)
    model = timm.create_model("vit_rope3d_tiny", pos_embed="videorope", **kw)
    assert model.position_encoding.family.axis_dims == (8, 12, 12)  # head dim 32
    clip = torch.randn(2, 3, 8, 32, 32)
    out = model(clip)
    out.square().mean().backward()
    assert out.shape == (2, 8) and all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        assert torch.isfinite(model(torch.randn(1, 3, 12, 48, 40))).all()
        for n, p in model.named_parameters():
            if "gamma" in n:  # LayerScale at 1, so that the blocks' outputs (and time order) reach the head
                p.fill_(1.0)
        swapped = clip[:, :, [2, 3, 0, 1, 4, 5, 6, 7]]  # two tubelets swapped
        assert (model(clip) - model(swapped)).abs().max() > 1e-4 * model(clip).abs().max()  # float noise: ~1e-9
    spaced = timm.create_model("vit_rope3d_tiny", pos_embed="videorope", rope_options=dict(temporal_spacing=1.0), **kw)
    assert spaced.position_encoding.family.temporal_spacing == 1.0
