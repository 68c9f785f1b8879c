"""Golden-gate RoPE against the post (J. Xiong, "On N-dimensional Rotary Positional Embeddings", 2025) in float64:
explicit rotation matrices built here from the post's formulas, the golden-angle step in 2D, coverage of the sphere in
3D, the log-spaced ladder, and copies of the construction with one direction or one frequency moved, which the same
checks reject."""

import math

import pytest
import torch

from vit_rope import RotaryEmbedding

F64 = torch.float64
GOLDEN_ANGLE = math.pi * (3 - math.sqrt(5))


def layer(axes, dim=24, heads=3, **kwargs):
    return RotaryEmbedding(dim, axes=axes, family="goldengate", num_heads=heads, **kwargs).double()


def post_ladder(pairs, theta=100.0):
    """The post's ω_i = ω_min (ω_max / ω_min) ** (i / (P - 1)), our range: ω_max = 1, ω_min = theta ** -(1 - 1/P)."""
    w_min, w_max = theta ** -(1 - 1 / pairs), 1.0
    return torch.tensor([w_min * (w_max / w_min) ** (i / (pairs - 1)) for i in range(pairs)], dtype=F64)


def directions_and_frequencies(F):
    """``F (heads, axes, P)`` → unit directions ``(heads · P, axes)`` by pair number, frequencies ``(heads, P)``."""
    w = F.norm(dim=1)
    u = (F / w[:, None]).transpose(1, 2).reshape(-1, F.shape[1])
    return u, w


def golden_step_error(F):
    """How far consecutive 2D directions (numbered across heads) are from a golden-angle step clockwise."""
    u, _ = directions_and_frequencies(F)
    angle = torch.atan2(u[:, 0], u[:, 1])  # grid order (row = y, col = x)
    step = torch.remainder(angle[1:] - angle[:-1], 2 * math.pi)
    return (step - (2 * math.pi - GOLDEN_ANGLE)).abs().max().item()


def ladder_error(F, theta=100.0):
    _, w = directions_and_frequencies(F)
    return (w - post_ladder(w.shape[-1], theta)).abs().max().item()


def rotation(angles, dim, layout):
    """The explicit ``dim × dim`` rotation turning pair i by ``angles[i]`` (the rest of the channels left alone)."""
    R = torch.eye(dim, dtype=F64)
    for i, a in enumerate(angles.tolist()):
        a0, a1 = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + dim // 2)
        R[a0, a0], R[a0, a1], R[a1, a0], R[a1, a1] = math.cos(a), -math.sin(a), math.sin(a), math.cos(a)
    return R


def reference_F(heads, axes, pairs, dim):
    """The construction written out from the post (independently of the family's code)."""
    n = torch.arange(heads * pairs, dtype=F64)
    if axes == 1:
        u = torch.ones(heads * pairs, 1, dtype=F64)
    elif axes == 2:  # step 2π/φ: (x, y) = (cos, sin), grid order (y, x)
        a = n * 2 * math.pi * 2 / (1 + math.sqrt(5))
        u = torch.stack((a.sin(), a.cos()), -1)
    else:
        g = 2.0
        for _ in range(200):
            g = (1 + g) ** (1 / (axes + 1))
        z = ((n[:, None] + 1) * g ** -torch.arange(1, axes + 1, dtype=F64)) % 1.0
        u = torch.special.ndtri(z)
        u = u / u.norm(dim=-1, keepdim=True)
    F = torch.zeros(heads, axes, dim // 2, dtype=F64)
    F[..., :pairs] = (u.view(heads, pairs, axes) * post_ladder(pairs)[:, None]).mT
    return F


@pytest.mark.parametrize("axes", [1, 2, 3])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_rotations_are_the_posts_and_exactly_relative(axes, layout):
    """Each head's rotation equals ``R(Σ_a p_a F[h, a])`` built here pair by pair, and ``R(a)ᵀ R(b) = R(b - a)``: the
    scores of every head depend on the offset alone."""
    dim, heads = 24, 3
    enc = layer(axes, dim, heads, layout=layout)
    F = reference_F(heads, axes, dim // 2, dim)
    gen = torch.Generator().manual_seed(0)
    pos = torch.randn(4, axes, dtype=F64, generator=gen) * 7
    x = torch.randn(heads, 4, dim, dtype=F64, generator=gen)
    y = enc(x, positions=pos)
    for h in range(heads):
        for t in range(4):
            torch.testing.assert_close(y[h, t], rotation(pos[t] @ F[h], dim, layout) @ x[h, t], rtol=0, atol=1e-12)
    q, k = torch.randn(2, heads, 4, dim, dtype=F64, generator=gen)
    shift = torch.randn(1, axes, dtype=F64, generator=gen) * 11
    scores = enc(q, positions=pos) @ enc(k, positions=pos).mT
    torch.testing.assert_close(
        enc(q, positions=pos + shift) @ enc(k, positions=pos + shift).mT, scores, rtol=0, atol=1e-10
    )
    offset = pos[None, :] - pos[:, None]  # offset[i, j] = p_j - p_i: <q_i, R(p_j - p_i) k_j>
    for h in range(heads):
        expect = torch.stack(
            [
                torch.stack([q[h, i] @ rotation(offset[i, j] @ F[h], dim, layout) @ k[h, j] for j in range(4)])
                for i in range(4)
            ]
        )
        torch.testing.assert_close(scores[h], expect, rtol=0, atol=1e-10)


def test_2d_directions_step_by_the_golden_angle():
    F = layer(2, dim=32, heads=4).family.frequency_matrix()
    assert golden_step_error(F) < 1e-12
    u, _ = directions_and_frequencies(F)
    torch.testing.assert_close(u[0], torch.tensor([0.0, 1.0], dtype=F64))  # the first looks along x (the column)


def sphere_grid(m=20000):
    """A Fibonacci lattice of ``m`` test directions (covering radius about 0.02 rad)."""
    k = torch.arange(m, dtype=F64)
    z, a = 1 - (2 * k + 1) / m, k * GOLDEN_ANGLE
    r = (1 - z * z).sqrt()
    return torch.stack((r * a.cos(), r * a.sin(), z), -1)


def coverage(u):
    """(covering radius: the largest angle from a test direction to its nearest direction; the largest over test
    directions w of min_u <u, w>, negative when no closed hemisphere holds them all)."""
    dots = sphere_grid() @ u.T
    return dots.max(-1).values.clamp(-1, 1).acos().max().item(), dots.min(-1).values.max().item()


@pytest.mark.parametrize("heads,dim", [(2, 24), (4, 32), (6, 64), (12, 64)])
def test_3d_directions_cover_the_sphere(heads, dim):
    """The golden sequence is low-discrepancy: every point of the sphere is within 4.5/√n of a direction (independent
    random directions: a median 4.6–5.6/√n for these n) and no closed hemisphere holds them all (every test direction
    has one at an angle above 120°, far more than the test grid's spacing). It promises coverage, not separation: two
    of 384 directions are 0.0037 rad apart, so the separation is not asserted, only that no two coincide."""
    enc = layer(3, dim, heads)
    u, _ = directions_and_frequencies(enc.family.frequency_matrix())
    n = len(u)
    torch.testing.assert_close(u.norm(dim=-1), torch.ones(n, dtype=F64))
    radius, hemisphere = coverage(u)
    assert radius < 4.5 / math.sqrt(n)
    assert hemisphere < -0.5
    dots = u @ u.T
    assert dots.fill_diagonal_(-1).max() < 1 - 1e-6


def test_frequencies_are_the_posts_log_spaced_ladder_and_axials_in_1d():
    for axes in (1, 2, 3):
        assert ladder_error(layer(axes).family.frequency_matrix()) < 1e-14
    assert ladder_error(layer(2, theta=10000.0).family.frequency_matrix(), theta=10000.0) < 1e-14
    axial = RotaryEmbedding(24, axes=1).family.frequency_matrix()[0]
    torch.testing.assert_close(layer(1).family.frequency_matrix()[0, 0], axial.flip(0), rtol=1e-15, atol=0)


def test_the_checks_reject_one_direction_or_one_frequency_moved():
    """The same checks on a copy with ONE direction turned by 0.01 rad, or ONE frequency scaled by 1.01, fail."""
    F = layer(2, dim=32, heads=4).family.frequency_matrix()
    moved = F.clone()
    c, s = math.cos(0.01), math.sin(0.01)
    moved[1, :, 5] = torch.stack((c * F[1, 0, 5] + s * F[1, 1, 5], -s * F[1, 0, 5] + c * F[1, 1, 5]))
    assert golden_step_error(F) < 1e-12 < 1e-3 < golden_step_error(moved)
    assert ladder_error(moved) < 1e-14  # the same frequency
    scaled = F.clone()
    scaled[2, :, 7] *= 1.01
    assert ladder_error(F) < 1e-14 < 1e-4 < ladder_error(scaled)
    # 3D: directions pushed into one hemisphere, then one direction moved onto another
    u, _ = directions_and_frequencies(layer(3, 64, 6).family.frequency_matrix())
    assert coverage(u)[1] < -0.5 < 0 < coverage(torch.where(u[:, 2:] < 0, -u, u))[1]
    clash = u.clone()
    clash[7] = clash[3]
    assert (clash @ clash.T).fill_diagonal_(-1).max() >= 1 - 1e-6
    # the explicit-matrix reference with one frequency moved no longer matches the family
    enc, ref = layer(2), reference_F(3, 2, 12, 24)
    ref[0, :, 4] *= 1.01
    pos, x = torch.tensor([[3.0, 5.0]], dtype=F64), torch.randn(3, 1, 24, dtype=F64)
    assert (enc(x, positions=pos)[0, 0] - rotation(pos[0] @ ref[0], 24, "interleaved") @ x[0, 0]).abs().max() > 1e-3


def test_options_and_video_model():
    import timm

    with pytest.raises(ValueError, match="axis_dims means nothing"):
        layer(2, axis_dims=(12, 12))
    with pytest.raises(ValueError, match="grid_indexing"):
        layer(2, grid_indexing="ij")
    half = layer(2, rotate_fraction=0.5).family
    assert half.pairs == 6 and half.frequency_matrix()[..., 6:].abs().max() == 0
    model = timm.create_model("vit_rope3d_tiny", pos_embed="goldengate", depth=1, img_size=32, num_frames=4)
    assert model.position_encoding.family.name == "goldengate" and model.position_encoding.axes == 3


def test_ntk_rescales_the_ladder_at_the_largest_scale():
    """NTK: the ladder of P = 12 pairs (d = 24) takes base theta · s^(d/(d-2)) at the largest of the axes' scales (every
    pair mixes every axis): s = 2.5 of (1.5, 2.5), the same as golden-gate built on that base (by hand)."""
    scaled = layer(2, scaling="ntk", scale=(1.5, 2.5))
    F = scaled.family.frequency_matrix(scaled.scaling_for())
    torch.testing.assert_close(
        F, layer(2, theta=100.0 * 2.5 ** (24 / 22)).family.frequency_matrix(), rtol=1e-13, atol=0
    )
    assert not torch.allclose(F, layer(2, theta=100.0 * 1.5 ** (24 / 22)).family.frequency_matrix())
