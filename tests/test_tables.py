"""vit_rope/tables.py: a rotary table's rotation against explicit rotation matrices built from the formulas (both
layouts, the real-arithmetic path, gradients, precision under autocast, YaRN's temperature), and the attention biases'
math against double loops over token pairs: LookHere's bias, and the logits PaPE's extended q and k give SDPA (each
pair's sum of parabolas, exactly relative, no ``N × N`` tensor, float32 precision under autocast)."""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from vit_rope import PositionEncoding, RotaryEmbedding
from vit_rope.tables import rotate_pairs, split_heads

F64 = torch.float64
DIM, HEADS, M = 8, 2, 3  # PaPE's tests: head dim, heads, parabolas


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


def test_layout_permutation():
    """interleaved channel 2i ↔ half channel i, 2i+1 ↔ i + dim/2."""
    dim, grid = 12, (3, 5)
    x = torch.randn(2, 15, dim, dtype=F64)
    perm = torch.tensor([2 * i for i in range(dim // 2)] + [2 * i + 1 for i in range(dim // 2)])
    inter = RotaryEmbedding(dim, axes=2, layout="interleaved")(x, grid=grid)
    half = RotaryEmbedding(dim, axes=2, layout="half")(x[..., perm], grid=grid)
    torch.testing.assert_close(half, inter[..., perm], rtol=0, atol=1e-12)


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


def test_lookhere_bias_is_dense_where_it_fits_one_block():
    enc = PositionEncoding(16, 2, "lookhere", num_heads=3, depth=2).eval()
    assert enc.table((4, 4)).dense.shape == (3, 16, 16)  # one (heads, N, N) bias, scaled per layer
    assert enc.table((32, 32)).dense is None  # a larger grid's is built a block of queries at a time (no N × N held)


def pape_encoding(depth=2, prefix=1, **kwargs):
    """PaPE in float64 with every learned parameter drawn at random (not the init)."""
    enc = PositionEncoding(DIM, 2, "pape", num_heads=HEADS, depth=depth, num_prefix_tokens=prefix, parabolas=M)
    torch.manual_seed(0)
    enc = enc.double()
    with torch.no_grad():
        for p in enc.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return enc


def reference_bias(q, p, family, layer, prefix, sign=1.0, curvature=1.0, prefix_free=True):
    """``(B, heads, N, N)``: query i, key j, head h get ``Σ_m [-a (w_m·δ)² + b (w_m·δ)] / √d`` with ``δ = p_j - p_i``,
    ``a = softplus(q_i · curvature)``, ``b = q_i · slope`` (``p`` the tokens' coordinates, prefix rows included:
    placeholders); zero where query or key is a prefix token. ``sign``, ``curvature`` and ``prefix_free`` perturb the
    rule (the perturbed references must disagree)."""
    B, H, N, d = q.shape
    W, A, S = (t[layer] for t in (family.directions, family.curvature, family.slope))
    bias = torch.zeros(B, H, N, N, dtype=F64)
    for b in range(B):
        for h in range(H):
            for i in range(N):
                a_i = F.softplus(q[b, h, i] @ A[h])
                b_i = q[b, h, i] @ S[h]
                for j in range(N):
                    if prefix_free and (i < prefix or j < prefix):
                        continue
                    s = W[h] @ (sign * (p[j] - p[i]))  # (M,): the offset along each parabola's direction
                    bias[b, h, i, j] = (-curvature * a_i * s**2 + b_i * s).sum() / math.sqrt(d)
    return bias


def attend(qkv, table, heads, targets, dropout):
    """The table's attention over a given qkv projection ``(B, N, 3 · heads · dim)``."""
    return table.attend(qkv, torch.nn.Identity(), heads, targets, dropout)


def seen_logits(monkeypatch, q, k, v, table):
    """What SDPA computes its softmax of, from the q, k and scale attention hands it (and its output)."""
    seen = {}
    sdpa = F.scaled_dot_product_attention

    def spy(q, k, v, **kwargs):
        seen.update(q=q, k=k, scale=kwargs["scale"])
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    qkv = torch.stack((q, k, v), dim=2).permute(0, 3, 2, 1, 4).flatten(2)  # (B, N, 3 · heads · dim)
    out = attend(qkv, table, HEADS, "qk", 0.0)
    return seen["q"] @ seen["k"].mT * seen["scale"], out


@pytest.mark.parametrize("layer", [0, 1])
def test_pape_logits_sdpa_sees_are_q_dot_k_plus_the_sum_of_parabolas(monkeypatch, layer):
    """A 3×4 grid and a cls token: SDPA's logits equal ``q·k/√d`` plus the reference bias (raw grid coordinates, not
    the centred ones the table holds), its output the softmax of them times v, and v keeps its width."""
    enc, grid, prefix = pape_encoding(), (3, 4), 1
    table = enc.table(grid, dtype=F64).layer(layer)
    N = prefix + 12
    q, k, v = torch.randn(3, 2, HEADS, N, DIM, dtype=F64)
    p = torch.cat((torch.zeros(prefix, 2), torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)))).to(F64)
    expected = q @ k.mT / math.sqrt(DIM) + reference_bias(q, p, enc.family, layer, prefix)
    logits, out = seen_logits(monkeypatch, q, k, v, table)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(out, expected.softmax(-1) @ v, rtol=0, atol=1e-10)
    assert logits[..., prefix:, prefix:].std() > 1.0  # the bias is there, and large against q·k/√d
    assert out.shape == v.shape


@pytest.mark.parametrize(
    "perturbation", [dict(sign=-1.0), dict(curvature=2.0), dict(curvature=0.0), dict(prefix_free=False)]
)
def test_pape_reference_test_fails_when_the_rule_changes(monkeypatch, perturbation):
    """The slope's sign (offset taken query minus key), the curvature doubled or dropped, the prefix token biased: each
    perturbed reference disagrees with what SDPA sees (so the test above has teeth)."""
    enc, prefix = pape_encoding(), 1
    table = enc.table((3, 4), dtype=F64).layer(0)
    q, k, v = torch.randn(3, 2, HEADS, 13, DIM, dtype=F64)
    p = torch.cat((torch.zeros(prefix, 2), torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)))).to(F64)
    wrong = q @ k.mT / math.sqrt(DIM) + reference_bias(q, p, enc.family, 0, prefix, **perturbation)
    logits, _ = seen_logits(monkeypatch, q, k, v, table)
    assert (logits - wrong).abs().max() > 1e-3


def test_pape_bias_depends_on_offsets_alone(monkeypatch):
    """Per-sample positions moved by one vector give the same logits (centring or not); scaled, they do not."""
    enc = pape_encoding(prefix=2)
    pos = torch.randn(2, 9, 2, dtype=F64) * 5
    shift = torch.tensor([[[13.5, -40.25]], [[-7.0, 3.0]]], dtype=F64)
    q, k, v = torch.randn(3, 2, HEADS, 11, DIM, dtype=F64)

    def logits(p):
        return seen_logits(monkeypatch, q, k, v, enc.table(positions=p, dtype=F64).layer(1))[0]

    torch.testing.assert_close(logits(pos + shift), logits(pos), rtol=0, atol=1e-9)
    assert (logits(pos * 1.5) - logits(pos)).abs().max() > 1e-3


def test_pape_holds_no_n_by_n_tensor_at_a_large_grid(monkeypatch):
    """64×64 tokens, 6 heads: every tensor of the table, and the q and k SDPA gets, grow with N, not N²."""
    heads, dim, grid = 6, 64, (64, 64)
    enc = PositionEncoding(dim, 2, "pape", num_heads=heads, depth=12, num_prefix_tokens=1)
    table = enc.table(grid)
    N = 1 + 64 * 64
    assert table.num_tokens == N
    small = enc.table((2, 2))
    assert table.coords.shape == (N, 2)  # the one tensor that grows with the grid, and linearly
    learned = ("directions", "curvature", "slope")
    assert [getattr(table, n).shape for n in learned] == [getattr(small, n).shape for n in learned]  # the parameters
    assert sum(getattr(table, n).numel() for n in ("coords", *learned)) < heads * N * N / 50
    q, k, v = torch.randn(3, 1, heads, N, dim)
    seen = {}
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.update(q=q, k=k) or v)
    attend(torch.stack((q, k, v), dim=2).permute(0, 3, 2, 1, 4).flatten(2), table.layer(3), heads, "qk", 0.0)
    assert seen["q"].shape == seen["k"].shape == (1, heads, N, 72)  # 64 + 7 columns, padded to a multiple of 8


def test_pape_attention_under_bfloat16_autocast_is_flash_ready_and_keeps_the_bias(monkeypatch):
    """A 14×14 grid with the init's parabolas: under autocast SDPA gets q, k and v in bfloat16, 88 channels wide (64 +
    3 × 7 columns, padded to a multiple of 8), and its output is the float64 attention of the same (rounded) inputs up
    to bfloat16's rounding of the output; with the columns rounded to bfloat16 once (the authors' way), the bias's
    cancelling terms move the output far more."""
    torch.manual_seed(0)
    enc, grid, N = PositionEncoding(64, 2, "pape", num_heads=2, num_prefix_tokens=1), (14, 14), 197
    qkv = torch.randn(1, N, 3 * 2 * 64).bfloat16()
    expected = attend(qkv.double(), enc.table(grid, dtype=F64), 2, "qk", 0.0)
    seen, sdpa = {}, F.scaled_dot_product_attention
    monkeypatch.setattr(
        F, "scaled_dot_product_attention", lambda q, k, v, **kw: seen.update(q=q, k=k, v=v) or sdpa(q, k, v, **kw)
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(qkv, enc.table(grid), 2, "qk", 0.0)
    assert out.dtype == torch.bfloat16
    assert all(seen[n].dtype == torch.bfloat16 and seen[n].shape[-1] == 88 for n in "qkv")
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=0.02)
    q, k, v = qkv.view(1, N, 3, 2, 64).permute(2, 0, 3, 1, 4)
    q16, k16 = (t.bfloat16().double() for t in enc.table(grid).extend(q.float(), k.float()))
    rounded = sdpa(q16, k16, v.double(), scale=64**-0.5)
    assert (rounded - expected).abs().max() > 0.1


@pytest.mark.parametrize("grid, split_bound, rounded_above", [((14, 14), 0.005, 0.1), ((64, 64), 0.1, 5.0)])
def test_pape_logits_in_bfloat16_stay_within_a_bound_at_large_grids(grid, split_bound, rounded_above):
    """The precision bfloat16 costs: the largest error of a logit ``q'·k'/√d`` against float64, the init's
    parabolas, centred coordinates. Columns as a 16-bit value and remainder stay within the bound (14×14: about
    1e-3; 64×64: about 3e-2, against float32's 2e-3); rounded once, they are off by more than ``rounded_above``."""
    torch.manual_seed(0)
    N = 1 + grid[0] * grid[1]
    enc = PositionEncoding(64, 2, "pape", num_heads=2, num_prefix_tokens=1)
    q, k, _ = split_heads(torch.randn(1, N, 3 * 2 * 64).bfloat16(), 2)
    q64, k64 = enc.table(grid, dtype=F64).extend(q.double(), k.double())
    exact = q64 @ k64.mT / 8
    table = enc.table(grid)

    def error(q_ext, k_ext):
        return ((q_ext.float() @ k_ext.float().mT).double() / 8 - exact).abs().max()

    assert error(*table.extend(q, k)) < split_bound
    assert error(*(t.bfloat16() for t in table.extend(q.float(), k.float()))) > rounded_above
