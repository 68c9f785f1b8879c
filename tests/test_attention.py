"""vit_rope/attention.py: Attention against a hand-written reference for every rope_targets and rotary image family,
an attention bias added to the logits, VO-RoPE's relativity, hooks on the qkv projection, and the tables attention
refuses."""

from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import position_lists, tiny
from vit_rope import FAMILIES, RotaryEmbedding, Table
from vit_rope.attention import ROPE_TARGETS

F64 = torch.float64
ROTARY = sorted(n for n, f in FAMILIES.items() if f.min_axes <= 2 and f.rotary)  # the rotary image families


@settings(max_examples=25, deadline=None)
@given(axes=st.sampled_from([1, 2, 3]), data=st.data(), mixed=st.booleans())
def test_vo_rope_output_invariant_to_shifting_all_positions(axes, data, mixed):
    """o_i = R_iᵀ Σ_j a_ij R_j v_j = Σ_j a_ij R_{j−i} v_j: only relative positions matter."""
    n, dim = 5, 4 * axes
    pos = torch.tensor([data.draw(position_lists(axes)) for _ in range(n)], dtype=F64)
    shift = torch.tensor(data.draw(position_lists(axes)), dtype=F64)
    rope = RotaryEmbedding(dim, axes=axes, family="mixed" if mixed else "axial", num_heads=2).double()
    g = torch.Generator().manual_seed(1)
    v = torch.randn(2, n, dim, dtype=F64, generator=g)
    attn = torch.randn(2, n, n, dtype=F64, generator=g).softmax(-1)

    def vo(p):
        return rope(attn @ rope(v, positions=p), positions=p, inverse=True)

    torch.testing.assert_close(vo(pos + shift), vo(pos), rtol=0, atol=1e-9)
    distinct = torch.arange(n * axes, dtype=F64).reshape(n, axes) * 1.7
    assert not torch.allclose(vo(distinct), attn @ v)  # the rotation does something


@pytest.mark.parametrize("heads", [2, 3, 6])
@pytest.mark.parametrize("family", ROTARY)
@pytest.mark.parametrize("targets", ROPE_TARGETS)
def test_attention_equals_a_hand_written_reference(targets, family, heads):
    """q/k/v turned by the table where chosen, attention, the output turned back where 'o' is chosen; random learned
    parameters (STRING's basis, which attention folds into the q and k projections, is then not the identity)."""
    import torch.nn.functional as F

    from vit_rope.attention import Attention, parse_rope_targets
    from vit_rope.position_encoding import RotaryEmbedding

    letters = parse_rope_targets(targets)  # "none" -> ""
    dim, n = 16 * heads, 1 + 12
    attn = Attention(dim, num_heads=heads, rope_targets=targets).double()
    rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=1, family=family, num_heads=heads).double()
    with torch.no_grad():
        for p in rope.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    table = rope.table((3, 4), dtype=torch.float64)
    x = torch.randn(2, n, dim, dtype=torch.float64)
    q, k, v = attn.qkv(x).reshape(2, n, 3, heads, 16).permute(2, 0, 3, 1, 4)
    turn = {c: (lambda t: rope(t, grid=(3, 4))) if c in letters else (lambda t: t) for c in "qkv"}
    o = F.scaled_dot_product_attention(turn["q"](q), turn["k"](k), turn["v"](v))
    if "o" in letters:
        o = rope(o, grid=(3, 4), inverse=True)
    expected = attn.proj(o.transpose(1, 2).reshape(2, n, dim))
    torch.testing.assert_close(attn(x, table), expected, rtol=0, atol=1e-10)


def test_each_rope_target_changes_the_output():
    torch.manual_seed(0)
    base = tiny(num_classes=10)
    with torch.no_grad():  # large LayerScale so that every block matters
        for n, p in base.named_parameters():
            if "gamma" in n:
                p.fill_(1.0)
    state = base.state_dict()
    x = torch.randn(2, 3, 64, 64)
    outs = {}
    for targets in ROPE_TARGETS:
        model = tiny(num_classes=10, rope_targets=targets).eval()
        model.load_state_dict(state)
        outs[targets] = model(x)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b], atol=1e-6), (a, b)


def test_attention_adds_an_attention_bias_to_its_logits():
    """The bias added to the logits, unscaled; also a block of queries at a time, each block's bias built as it is
    attended (large grids), with the same output."""
    from vit_rope import PositionEncoding
    from vit_rope.attention import Attention

    heads, dim, n = 3, 48, 1 + 12
    attn = Attention(dim, num_heads=heads).double()
    bias = PositionEncoding(16, 2, "lookhere", num_heads=heads, num_prefix_tokens=1).table((3, 4), dtype=torch.float64)
    x = torch.randn(2, n, dim, dtype=torch.float64)
    q, k, v = attn.qkv(x).reshape(2, n, 3, heads, 16).permute(2, 0, 3, 1, 4)
    logits = q @ k.mT / 4 + bias.block(0, n)  # 1/sqrt(16), then the bias, unscaled
    o = logits.softmax(-1) @ v
    expected = attn.proj(o.transpose(1, 2).reshape(2, n, dim))
    torch.testing.assert_close(attn(x, bias), expected, rtol=0, atol=1e-10)
    assert not torch.allclose(attn(x, bias), attn(x, Table()))
    lazy = replace(bias, dense=None, block_bytes=4 * heads * n * 5)  # blocks of 5 queries, each built as it comes
    torch.testing.assert_close(attn(x, lazy), expected, rtol=0, atol=1e-10)


def test_vo_rope_model_output_is_shift_invariant():
    """With rope_targets='vo' and no q/k rotation, attention output depends only on relative positions."""
    from vit_rope.attention import Attention
    from vit_rope.position_encoding import RotaryEmbedding

    attn = Attention(64, num_heads=2, rope_targets="vo").double()
    rope = RotaryEmbedding(32, axes=2)
    x = torch.randn(2, 12, 64, dtype=torch.float64)
    pos = torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)).double()
    a = attn(x, rope.table(positions=pos, dtype=torch.float64))
    b = attn(x, rope.table(positions=pos + torch.tensor([5.0, -7.0], dtype=torch.float64), dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    plain = Attention(64, num_heads=2, rope_targets="none").double()
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(a, plain(x, rope.table(positions=pos, dtype=torch.float64)))


def test_vo_rope_refuses_yarn_where_its_temperature_applies():
    model = tiny(rope_targets="vo", rope_scaling="yarn", img_size=32).eval()
    model(torch.randn(1, 3, 32, 32))  # the training grid: YaRN is the identity there
    with pytest.raises(ValueError, match="rope_scaling='yarn' above the training size.*turning v or o"):
        model(torch.randn(1, 3, 64, 64))
    tiny(rope_targets="qk", rope_scaling="yarn", img_size=32).eval()(torch.randn(1, 3, 64, 64))


def test_attention_refuses_a_table_of_every_layer():
    from vit_rope.attention import Attention
    from vit_rope.position_encoding import RotaryEmbedding

    rope = RotaryEmbedding(8, axes=2, family="mixed", num_heads=2, depth=2)
    table = rope.table((2, 2))  # (depth, heads, N, dim // 2): one layer must be picked
    for targets in ("qk", "o"):
        with pytest.raises(ValueError, match=r"table.layer\(i\)"):
            Attention(16, 2, rope_targets=targets)(torch.randn(2, 4, 16), table)


def test_forward_hook_on_qkv_sees_the_projection_unrotated():
    """A forward hook on the qkv Linear sees its output as the Linear made it (the rotation never writes into it)."""
    model = tiny().eval()
    seen = []
    model.blocks[0].attn.qkv.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    x, out = seen[0]
    torch.testing.assert_close(out, model.blocks[0].attn.qkv(x), rtol=0, atol=0)


def test_backward_hook_on_qkv_sees_the_projection_and_changes_nothing():
    """A backward hook on the qkv Linear gets its output's gradient, and changes no parameter's gradient."""
    x = torch.randn(2, 3, 32, 32)
    model = tiny()
    model(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    calls = []
    model.blocks[0].attn.qkv.register_full_backward_hook(lambda mod, grad_in, grad_out: calls.append(grad_out[0]))
    model(x).square().sum().backward()
    assert len(calls) == 1 and calls[0].shape[-1] == 3 * 192
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-5, atol=1e-6, msg=n)
