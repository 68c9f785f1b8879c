"""Tests of the nD rotary embedding against independent references: explicit rotation matrices built from the
formulas, timm's own RoPE implementations (as oracles), and properties that any correct RoPE must have."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_rope import RotaryEmbedding, RotaryTable
from vit_rope.coords import grid_coordinates
from vit_rope.tables import rotate_pairs

F64 = torch.float64


# ------------------------------------------------------------------------------------- reference (formulas)
def reference_angles(coord, dim, theta, axis_dims):
    """Angle of every channel pair, straight from the formulas: sections from the last grid axis (x) to the
    first, each section of d channels with pairs j turning by pos / theta**(2j/d); unrotated pairs turn by 0."""
    angles = []
    for axis in reversed(range(len(axis_dims))):
        d = axis_dims[axis]
        angles += [coord[axis] / theta ** (2 * j / d) for j in range(d // 2)]
    return angles + [0.0] * (dim // 2 - len(angles))


def rotation_matrix(angles, dim, layout):
    """Block-diagonal (up to a permutation for 'half') rotation matrix in float64."""
    R = torch.eye(dim, dtype=F64)
    for p, a in enumerate(angles):
        i, j = (2 * p, 2 * p + 1) if layout == "interleaved" else (p, p + dim // 2)
        R[i, i], R[i, j], R[j, i], R[j, j] = math.cos(a), -math.sin(a), math.sin(a), math.cos(a)
    return R


def reference_rotate(x, coords, dim, theta, axis_dims, layout):
    out = torch.empty_like(x)
    for n, coord in enumerate(coords):
        R = rotation_matrix(reference_angles(coord, dim, theta, axis_dims), dim, layout)
        out[..., n, :] = x[..., n, :] @ R.T
    return out


def grid_coords(grid):
    return [tuple(c) for c in torch.cartesian_prod(*[torch.arange(n) for n in grid]).reshape(-1, len(grid)).tolist()]


# ------------------------------------------------------------------------------ exact math vs rotation matrices
CASES = [
    # (dim, axes, grid, axis_dims passed, axis_dims expected)
    (16, 1, (7,), None, (16,)),
    (16, 2, (3, 4), None, (8, 8)),
    (24, 3, (2, 3, 4), None, (8, 8, 8)),
    (64, 3, (2, 2, 3), None, (20, 20, 20)),  # V-JEPA 2 split: 4 channels stay unrotated
    (64, 3, (2, 3, 2), (16, 24, 24), (16, 24, 24)),  # M-RoPE-style sections, (t, h, w)
]


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("theta", [100.0, 10000.0])
@pytest.mark.parametrize("dim,axes,grid,axis_dims,expected_dims", CASES)
def test_matches_explicit_rotation_matrices(dim, axes, grid, axis_dims, expected_dims, theta, layout):
    rope = RotaryEmbedding(dim, axes=axes, theta=theta, layout=layout, axis_dims=axis_dims)
    assert rope.family.axis_dims == expected_dims
    x = torch.randn(2, 3, math.prod(grid), dim, dtype=F64)
    expected = reference_rotate(x, grid_coords(grid), dim, theta, expected_dims, layout)
    torch.testing.assert_close(rope(x, grid=grid), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_real_path_matches_matrices(layout):
    """The reference apply (real arithmetic: it traces, exports and compiles) takes cos/sin tables directly."""
    rope = RotaryEmbedding(16, axes=2, layout=layout)
    x = torch.randn(3, 12, 16, dtype=F64)
    t = rope.table((3, 4), dtype=F64)
    expected = reference_rotate(x, grid_coords((3, 4)), 16, 100.0, (8, 8), layout)
    torch.testing.assert_close(rotate_pairs(x, t.cos, t.sin, layout), expected, rtol=0, atol=1e-12)


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


def test_layout_permutation():
    """interleaved channel 2i ↔ half channel i, 2i+1 ↔ i + dim/2."""
    dim, grid = 12, (3, 5)
    x = torch.randn(2, 15, dim, dtype=F64)
    perm = torch.tensor([2 * i for i in range(dim // 2)] + [2 * i + 1 for i in range(dim // 2)])
    inter = RotaryEmbedding(dim, axes=2, layout="interleaved")(x, grid=grid)
    half = RotaryEmbedding(dim, axes=2, layout="half")(x[..., perm], grid=grid)
    torch.testing.assert_close(half, inter[..., perm], rtol=0, atol=1e-12)


def test_prefix_tokens_and_tail_channels_stay_unrotated():
    rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=2, rotate_fraction=0.5)
    assert rope.family.axis_dims == (4, 4)
    x = torch.randn(2, 2 + 12, 16)
    y = rope(x, grid=(3, 4))
    torch.testing.assert_close(y[:, :2], x[:, :2], rtol=0, atol=0)  # cls/registers
    torch.testing.assert_close(y[..., 8:], x[..., 8:], rtol=0, atol=0)  # unrotated channels
    plain = RotaryEmbedding(16, axes=2, rotate_fraction=0.5)(x[:, 2:], grid=(3, 4))
    torch.testing.assert_close(y[:, 2:], plain, rtol=0, atol=1e-6)
    assert not torch.allclose(y[:, 3, :8], x[:, 3, :8])


def test_explicit_positions_equal_grid_and_batched_positions():
    rope = RotaryEmbedding(16, axes=2)
    x = torch.randn(2, 3, 12, 16, dtype=F64)
    pos = torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)).to(F64)
    torch.testing.assert_close(rope(x, positions=pos), rope(x, grid=(3, 4)), rtol=0, atol=0)
    per_sample = torch.stack([pos, pos.flip(0)])  # (B, N, axes): a different order per sample (patch dropout)
    y = rope(x, positions=per_sample)
    torch.testing.assert_close(y[0], rope(x[0], positions=pos), rtol=0, atol=0)
    torch.testing.assert_close(y[1], rope(x[1], positions=pos.flip(0)), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------- properties
def _positions(axes):
    coord = st.floats(-60, 60, allow_nan=False, width=32)
    return st.lists(coord, min_size=axes, max_size=axes)


@settings(max_examples=40, deadline=None)
@given(
    axes=st.sampled_from([1, 2, 3]),
    data=st.data(),
    layout=st.sampled_from(["interleaved", "half"]),
    theta=st.sampled_from([100.0, 10000.0]),
)
def test_scores_depend_only_on_relative_position(axes, data, layout, theta):
    a, b, c = (data.draw(_positions(axes)) for _ in range(3))
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
    pos = torch.tensor([data.draw(_positions(axes)) for _ in range(4)], dtype=F64)
    rope = RotaryEmbedding(4 * axes + 4, axes=axes)
    x = torch.randn(3, 4, 4 * axes + 4, dtype=F64)
    y = rope(x, positions=pos, inverse=inverse)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)
    torch.testing.assert_close(rope(y, positions=pos, inverse=not inverse), x, rtol=0, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(axes=st.sampled_from([1, 2, 3]), data=st.data(), mixed=st.booleans())
def test_vo_rope_output_invariant_to_shifting_all_positions(axes, data, mixed):
    """o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j−i} v_j: only relative positions matter."""
    n, dim = 5, 4 * axes
    pos = torch.tensor([data.draw(_positions(axes)) for _ in range(n)], dtype=F64)
    shift = torch.tensor(data.draw(_positions(axes)), dtype=F64)
    rope = RotaryEmbedding(dim, axes=axes, family="mixed" if mixed else "axial", num_heads=2).double()
    g = torch.Generator().manual_seed(1)
    v = torch.randn(2, n, dim, dtype=F64, generator=g)
    attn = torch.randn(2, n, n, dtype=F64, generator=g).softmax(-1)

    def vo(p):
        return rope(attn @ rope(v, positions=p), positions=p, inverse=True)

    torch.testing.assert_close(vo(pos + shift), vo(pos), rtol=0, atol=1e-9)
    distinct = torch.arange(n * axes, dtype=F64).reshape(n, axes) * 1.7
    assert not torch.allclose(vo(distinct), attn @ v)  # the rotation does something


# ---------------------------------------------------------------------------------------- timm as an oracle
@pytest.mark.parametrize("grid", [(14, 14), (5, 9)])
def test_axial_equals_timm_rotary_embedding_cat(grid):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, apply_rot_embed_cat

    dim = 64
    timm_rope = RotaryEmbeddingCat(dim, in_pixels=False, temperature=100, grid_indexing="xy", feat_shape=list(grid))
    x = torch.randn(2, 6, math.prod(grid), dim)
    expected = apply_rot_embed_cat(x, timm_rope.get_embed())
    torch.testing.assert_close(RotaryEmbedding(dim, axes=2)(x, grid=grid), expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("grid", [(7, 7), (4, 6)])
def test_mixed_equals_timm_rotary_embedding_mixed(grid):
    from timm.layers.pos_embed_sincos import RotaryEmbeddingMixed, apply_rot_embed_cat

    depth, heads, head_dim = 3, 4, 32
    timm_rope = RotaryEmbeddingMixed(heads * head_dim, depth=depth, num_heads=heads)
    ours = RotaryEmbedding(head_dim, axes=2, family="mixed", num_heads=heads, depth=depth)
    fx, fy = timm_rope.freqs.detach()  # (depth, heads, head_dim // 2) each: x (column) and y (row) frequencies
    with torch.no_grad():
        ours.family.frequencies.copy_(
            torch.stack([fy, fx], dim=-2)
        )  # ours: (depth, heads, axes in grid order (row, col), P)
    x = torch.randn(2, heads, math.prod(grid), head_dim)
    emb = timm_rope.get_embed(list(grid))
    for layer in range(depth):
        expected = apply_rot_embed_cat(x, emb[layer])
        torch.testing.assert_close(ours(x, grid=grid, layer=layer), expected, rtol=0, atol=2e-5)


def test_normalized_half_equals_timm_dinov3():
    from timm.layers.pos_embed_sincos import RotaryEmbeddingDinoV3, apply_rot_embed_cat

    grid, dim = (6, 10), 32
    timm_rope = RotaryEmbeddingDinoV3(dim, temperature=100.0, grid_indexing="xy", feat_shape=list(grid))
    x = torch.randn(2, math.prod(grid), dim)
    expected = apply_rot_embed_cat(x, timm_rope.get_embed(), half=True)
    ours = RotaryEmbedding(dim, axes=2, layout="half", coords="normalized")
    torch.testing.assert_close(ours(x, grid=grid), expected, rtol=0, atol=2e-5)


def test_mixed_init_follows_paper():
    """Magnitudes 1/theta**(4j/dim) (theta 10); group 2's direction is group 1's turned by π/2."""
    rope = RotaryEmbedding(32, axes=2, family="mixed", num_heads=5, depth=2)
    assert rope.family.theta == 10.0
    F = rope.family.frequencies.detach().double()  # (depth, heads, axes=(row, col), 16)
    fy, fx = F[:, :, 0], F[:, :, 1]
    mag = 1 / 10.0 ** (torch.arange(0, 32, 4, dtype=F64) / 32)
    torch.testing.assert_close(torch.hypot(fx, fy), mag.repeat(2).expand_as(fx), rtol=1e-6, atol=0)
    a = torch.atan2(fy[..., 0], fx[..., 0])
    b = torch.atan2(fy[..., 8], fx[..., 8])
    torch.testing.assert_close(torch.remainder(b - a, 2 * math.pi), torch.full_like(a, math.pi / 2), rtol=0, atol=1e-6)
    assert a.unique().numel() == 10  # a random direction per layer and head


# ------------------------------------------------------------------------------- coordinates and scaling
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


# --------------------------------------------------------------------------------------- precision and cache
def test_tables_float32_under_bf16_autocast():
    rope = RotaryEmbedding(64, axes=1)
    x = torch.randn(1, 1024, 64).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        t = rope.table((1024,), dtype=x.dtype)
        y = rope(x, grid=(1024,))
    assert t.cos.dtype == torch.float32 and y.dtype == torch.bfloat16
    f = 100.0 ** (-torch.arange(0, 64, 2, dtype=F64) / 64)
    torch.testing.assert_close(t.cos[1023].double(), (1023 * f).cos(), rtol=0, atol=1e-5)
    torch.testing.assert_close(t.sin[1023].double(), (1023 * f).sin(), rtol=0, atol=1e-5)
    ref = rope(x.double(), grid=(1024,))
    assert (y.double() - ref).abs().max() < 0.05  # bf16 output rounding only


def test_tables_follow_the_parameters_and_are_never_stored():
    """A table is built per call from the parameters as they are now (an edit through .data, which moves no version,
    a load), in inference mode too; checkpoints hold no table."""
    rope = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2).eval()
    with torch.inference_mode():
        a = rope.table((3, 4))
    rope.family.frequencies.data.mul_(2.0)  # as a fused AdamW step
    b = rope.table((3, 4))
    assert not torch.allclose(a.sin, b.sin) and not b.sin.is_inference()
    frozen = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2).requires_grad_(False)
    frozen.load_state_dict(rope.state_dict())
    torch.testing.assert_close(frozen.table((3, 4)).sin, b.sin)
    assert list(RotaryEmbedding(16, axes=2).state_dict()) == []


def test_gradients_reach_input_and_learned_frequencies():
    rope = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2)
    x = torch.randn(3, 2, 12, 16, requires_grad=True)
    rope(x, grid=(3, 4)).square().mul(torch.randn(3, 2, 12, 16)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert rope.family.frequencies.grad is not None and rope.family.frequencies.grad.abs().sum() > 0


@pytest.mark.slow
def test_torch_compile_fullgraph():
    rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=1)

    def f(x):
        return rope(x, grid=(3, 4))

    x = torch.randn(2, 13, 16)
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(x), f(x), rtol=1e-5, atol=1e-5)


def test_export_graph_has_no_complex_ops_or_tensor_split():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=1)

        def forward(self, x):
            return self.rope(x, grid=(3, 4))

    x = torch.randn(2, 13, 16)
    ep = torch.export.export(M(), (x,))
    for node in ep.graph.nodes:
        assert "complex" not in str(node.target) and "split" not in str(node.target), node.target
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            assert not val.is_complex(), node
    torch.testing.assert_close(ep.module()(x), M()(x), rtol=1e-6, atol=1e-6)


# ------------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(dim=7, axes=2), "even whole number"),
        (dict(dim=0, axes=2), "even whole number of at least 2"),
        (dict(dim=2, axes=2), "cannot be split into even sections"),
        (dict(dim=16, axes=2, axis_dims=(6, 5)), "each section must be even"),
        (dict(dim=16, axes=2, axis_dims=(8, 10)), "at most dim"),
        (dict(dim=16, axes=3, axis_dims=(8, 8)), "one each"),
        (dict(dim=16, axes=2, family="mixed"), "num_heads"),
        (dict(dim=16, axes=2, layout="rotated"), "layout"),
        (dict(dim=16, axes=2, scaling="yarn", scale=2.0), "ref_grid"),
        (dict(dim=16, axes=2, scaling="ntk"), "scale factor or ref_grid"),
        (dict(dim=16, axes=2, scaling="linear"), "not a mode of family 'axial'"),
        (dict(dim=16, axes=2, family="mixed", num_heads=2, scaling="yarn", ref_grid=(2, 2)), "learned family"),
        (dict(dim=16, axes=2, family="spline"), "choose one of"),
        (dict(dim=16, axes=2, family="lookhere", num_heads=2), "attention bias, not a rotation"),
        (dict(dim=16, axes=2, block_size=4), "family 'axial' takes no option block_size"),
        (dict(dim=16, axes=2, theta=0.0), "theta=0.0 must be a positive finite number"),
        (dict(dim=16, axes=2, theta=math.inf), "theta=inf must be a positive finite number"),
        (dict(dim=16, axes=2, jitter=0.5), "at least 1"),
        (dict(dim=16, axes=2, jitter=math.inf), "finite"),
        (dict(dim=16, axes=2, shift=math.nan), "finite"),
        (dict(dim=16, axes=2, scaling="pi", scale=math.inf), "positive and finite"),
    ],
)
def test_bad_construction(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RotaryEmbedding(**kwargs)


def test_bad_calls():
    rope = RotaryEmbedding(16, axes=2)
    x = torch.randn(2, 12, 16)
    with pytest.raises(ValueError, match="last dim 8 but the layer was built with dim=16"):
        rope(torch.randn(2, 12, 8), grid=(3, 4))
    with pytest.raises(ValueError, match="has 12 tokens but the table has 15"):
        rope(x, grid=(3, 5))
    with pytest.raises(ValueError, match="has 3 sizes but the layer has axes=2"):
        rope(torch.randn(2, 12, 16), grid=(2, 2, 3))
    with pytest.raises(ValueError, match=r"expected float \(N, 2\) or \(B, N, 2\)"):
        rope(x, positions=torch.zeros(12, 3))
    with pytest.raises(ValueError, match="exactly one of grid"):
        rope(x)
    with pytest.raises(ValueError, match="dtype torch.int64; expected float"):
        rope(x, positions=torch.zeros(12, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="rotations turn float tensors"):
        rope(x.long(), grid=(3, 4))
    mixed = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2, depth=3)
    with pytest.raises(ValueError, match="pass layer=index"):
        mixed(torch.randn(2, 2, 12, 16), grid=(3, 4))
    with pytest.raises(ValueError, match="heads=2"):
        mixed(torch.randn(2, 5, 12, 16), grid=(3, 4), layer=0)


def test_table_type_is_public():
    t = RotaryEmbedding(8, axes=1).table((3,))
    assert isinstance(t, RotaryTable) and t.cos.shape == (3, 4) and t.num_tokens == 3


# ------------------------------------------------------------------------------------ regressions (review)
def test_mixed_frequencies_with_unrotated_channels():
    """64 channels over 3 axes rotate 60: the 4 left over stay unrotated with learned frequencies too."""
    rope = RotaryEmbedding(64, axes=3, family="mixed", num_heads=2)
    x = torch.randn(1, 2, 8, 64)
    y = rope(x, grid=(2, 2, 2))
    torch.testing.assert_close(y[..., 60:], x[..., 60:], rtol=0, atol=0)
    assert not torch.allclose(y[..., :60], x[..., :60])


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


def test_odd_storage_offset_input():
    rope = RotaryEmbedding(16, axes=1)
    base = torch.randn(3, 18)
    x = base[:, 1:17]  # a view at an odd offset
    torch.testing.assert_close(rope(x, grid=(3,)), rope(x.contiguous(), grid=(3,)), rtol=1e-6, atol=1e-6)


def test_rotate_gradcheck():
    """float64 gradcheck of the table's rotation, both ways."""
    table = RotaryEmbedding(8, axes=2).table((2, 3), dtype=F64)
    x = torch.randn(2, 6, 8, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: table.rotate(x), (x,))
    assert torch.autograd.gradcheck(lambda x: table.rotate(x, inverse=True), (x,))


def test_inverse_rotation_of_an_intermediate_compiles_fullgraph():
    """Dynamo traces the rotation of a tensor made inside the graph (no storage offset to read), inverse too."""
    lin, rope = torch.nn.Linear(8, 8), RotaryEmbedding(8, axes=2)

    def f(x):
        return rope(lin(x), (2, 3), inverse=True)

    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="eager")(x), f(x), rtol=1e-6, atol=1e-6)


def test_yarn_temperature_covers_prefix_rows_and_refuses_turning_back():
    s = 2.0
    rope = RotaryEmbedding(16, axes=2, scaling="yarn", ref_grid=(2, 2), num_prefix_tokens=1)
    t = rope.table((4, 4), dtype=F64)
    temperature = 0.1 * math.log(s) + 1
    # every q·k logit, the cls token's too, is scaled alike
    torch.testing.assert_close(torch.hypot(t.cos, t.sin), torch.full_like(t.cos, temperature))
    assert t.scaled and not rope.table((2, 2)).scaled
    x = torch.randn(17, 16)
    with pytest.raises(ValueError, match="inverse=True under scaling='yarn'"):
        rope(x, (4, 4), inverse=True)
    x = torch.randn(5, 16)  # at the training grid YaRN changes nothing, so turning back is fine
    torch.testing.assert_close(rope(rope(x, (2, 2)), (2, 2), inverse=True), x, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_turns_through_float32_and_rounds_once(dtype):
    """bf16/fp16 inputs (autocast) are turned in the table's float32: values and gradients are the float64 results
    rounded once."""
    rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=1)
    x = torch.randn(2, 2, 13, 16).to(dtype).requires_grad_()
    w = torch.randn(2, 2, 13, 16).to(dtype)
    y = rope(x, grid=(3, 4))
    assert y.dtype == dtype
    (y * w).sum().backward()
    x64 = x.detach().double().requires_grad_()
    y64 = rope(x64, grid=(3, 4))
    (y64 * w.double()).sum().backward()
    one_rounding = dict(rtol=torch.finfo(dtype).eps, atol=1e-6)
    torch.testing.assert_close(y.double(), y64, **one_rounding)
    torch.testing.assert_close(x.grad.double(), x64.grad, **one_rounding)
