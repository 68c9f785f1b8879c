"""vit_rope/position_encoding.py: the PositionEncoding / RotaryEmbedding layer's API (prefix rows and unrotated
channels, grid or explicit positions, tables built per call from the parameters, gradients), timm's own RoPE layers as
oracles (RotaryEmbeddingCat, RotaryEmbeddingMixed, RotaryEmbeddingDinoV3), compile and export of the layer, float64
and half-precision inputs, and construction and call errors."""

import math

import pytest
import torch

from tests.helpers import randomized
from vit_rope import PositionEncoding, RotaryEmbedding, RotaryTable

F64 = torch.float64


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


def test_table_type_is_public():
    t = RotaryEmbedding(8, axes=1).table((3,))
    assert isinstance(t, RotaryTable) and t.cos.shape == (3, 4) and t.num_tokens == 3


def test_tables_follow_the_parameters_and_are_never_stored():
    """A table is built per call from the parameters as they are now: after a step, an edit through .data (which moves
    no version), a load, in inference mode or not; with gradients its graph is new each call. Checkpoints hold no
    table."""
    rope = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2).eval()
    with torch.inference_mode():
        a = rope.table((3, 4))
    rope.family.frequencies.data.mul_(2.0)  # as a fused AdamW step
    b = rope.table((3, 4))
    assert not torch.allclose(a.sin, b.sin) and not b.sin.is_inference()
    frozen = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2).requires_grad_(False)
    frozen.load_state_dict(rope.state_dict())
    torch.testing.assert_close(frozen.table((3, 4)).sin, b.sin)
    assert rope.table((3, 4)) is not rope.table((3, 4))
    assert list(RotaryEmbedding(16, axes=2).state_dict()) == []


def test_gradients_reach_input_and_learned_frequencies():
    rope = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2)
    x = torch.randn(3, 2, 12, 16, requires_grad=True)
    rope(x, grid=(3, 4)).square().mul(torch.randn(3, 2, 12, 16)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    assert rope.family.frequencies.grad is not None and rope.family.frequencies.grad.abs().sum() > 0


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


def test_inverse_rotation_of_an_intermediate_compiles_fullgraph():
    """Dynamo traces the rotation of a tensor made inside the graph (no storage offset to read), inverse too."""
    lin, rope = torch.nn.Linear(8, 8), RotaryEmbedding(8, axes=2)

    def f(x):
        return rope(lin(x), (2, 3), inverse=True)

    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(torch.compile(f, fullgraph=True, backend="eager")(x), f(x), rtol=1e-6, atol=1e-6)


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


@pytest.mark.parametrize("name,options", [("mixed", {}), ("string", {}), ("liere", {"block_size": 8}),
                                          ("comrope_ld", {"block_size": 8})])  # fmt: skip
def test_learned_families_keep_float64_inputs_in_float64(name, options):
    """A float64 input gets a table computed in float64 from float32 parameters: the rotation of tokens at 1e4 agrees
    with the float64 module's to float64 precision, not float32's 1e-3."""
    exact = randomized(RotaryEmbedding(16, axes=2, family=name, num_heads=2, **options))
    enc = RotaryEmbedding(16, axes=2, family=name, num_heads=2, **options)  # float32 parameters
    enc.load_state_dict({k: v.float() for k, v in exact.state_dict().items()})
    exact.load_state_dict(enc.state_dict())  # the same (float32-representable) values in float64
    x = torch.randn(1, 2, 2, 16, dtype=F64)
    pos = torch.tensor([[1e4, 3.0], [2.0, -7e3]], dtype=F64)
    layer = 0 if enc.table(positions=pos).per_layer else None
    got, want = enc(x, positions=pos, layer=layer), exact(x, positions=pos, layer=layer)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


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
    # (before: AttributeError 'list' object has no attribute 'ndim'; IndexError; .item() on a meta tensor)
    with pytest.raises(ValueError, match="positions is a list; pass a float tensor"):
        rope(x, positions=[[0.0, 0.0]] * 12)
    with pytest.raises(ValueError, match=r"x is shape \(16,\); pass a tensor \(..., N, dim\)"):
        rope(torch.randn(16), grid=(1, 1))
    with pytest.raises(ValueError, match="positions are on meta but x is on cpu"):
        rope(x, positions=torch.zeros(12, 2, device="meta"))
    mixed = RotaryEmbedding(16, axes=2, family="mixed", num_heads=2, depth=3)
    with pytest.raises(ValueError, match="pass layer=index"):
        mixed(torch.randn(2, 2, 12, 16), grid=(3, 4))
    with pytest.raises(ValueError, match="heads=2"):
        mixed(torch.randn(2, 5, 12, 16), grid=(3, 4), layer=0)
    for layer in (3, -4, 1.5, True):  # (before: IndexError or TypeError from select())
        with pytest.raises(ValueError, match="this encoding learns 3 layers; pass an index, 0 to 2"):
            mixed(torch.randn(2, 2, 12, 16), grid=(3, 4), layer=layer)


@pytest.mark.parametrize("family", ["axial", "mixed"])
def test_per_sample_positions_turn_each_sample_by_its_own(family):
    """positions (B, N, axes) with x (B, N, dim) (or (B, heads, N, dim)): the same shape back, each sample turned by
    its own positions alone (before: (B, B, N, dim), every sample by every sample's positions)."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, axes=2, family=family, num_heads=2)
    positions = torch.randn(3, 4, 2) * 5
    x = torch.randn(3, 2, 4, 16) if family == "mixed" else torch.randn(3, 4, 16)
    out = rope(x, positions=positions)
    assert out.shape == x.shape
    for b in range(3):
        torch.testing.assert_close(out[b], rope(x[b], positions=positions[b]))


def test_per_sample_positions_for_another_batch_are_one_error():
    rope = RotaryEmbedding(16, axes=2)
    with pytest.raises(ValueError, match="its own positions"):
        rope(torch.randn(2, 4, 16), positions=torch.randn(3, 4, 2))


@pytest.mark.parametrize("grid", [(2, 2.5), (True, 4), ("2", 2)])
def test_a_grid_of_other_than_whole_numbers_is_one_error(grid):
    """(before: int() cut 2.5 to 2 and the layer turned by the wrong grid)"""
    with pytest.raises(ValueError, match="whole numbers"):
        RotaryEmbedding(16)(torch.randn(4, 16), grid=grid)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_positions_that_are_not_finite_are_one_error(bad):
    """(before: every channel of the token came back NaN, silently)"""
    positions = torch.randn(4, 2)
    positions[1, 0] = bad
    with pytest.raises(ValueError, match="finite"):
        RotaryEmbedding(16)(torch.randn(4, 16), positions=positions)


def test_positions_outside_their_samples_grid_are_one_error():
    """``grids`` says each sample's grid: an index past it (or below 0) among the real tokens is refused; padding may
    carry any index."""
    encoding = PositionEncoding(16, 2, "axial")
    positions = torch.tensor([[[0.0, 0.0], [1.0, 2.0]], [[0.0, 0.0], [0.0, 1.0]]])
    grids = torch.tensor([[2, 3], [1, 2]])
    encoding(None, positions, grids=grids)  # every index on its grid
    with pytest.raises(ValueError, match="token 1 of sample 0 is at index 2 on axis 1, outside its grid of 2"):
        encoding(None, positions, grids=torch.tensor([[2, 2], [1, 2]]))
    valid = torch.tensor([[True, False], [True, True]])  # the token past the grid is padding: fine
    encoding(None, positions, grids=torch.tensor([[2, 2], [1, 2]]), valid=valid)
