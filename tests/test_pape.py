"""PaPE against a float64 reference built pair by pair: the logits attention's SDPA call sees are ``q·k/√d`` plus
each pair's sum of parabolas, prefix tokens unbiased; exactly relative; no ``N × N`` tensor; trains; token dropping."""

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from vit_rope import ParabolicBias, PositionEncoding

F64 = torch.float64
DIM, HEADS, M = 8, 2, 3


def encoding(depth=2, prefix=1, **kwargs):
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
def test_logits_sdpa_sees_are_q_dot_k_plus_the_sum_of_parabolas(monkeypatch, layer):
    """A 3×4 grid and a cls token: SDPA's logits equal ``q·k/√d`` plus the reference bias (raw grid coordinates, not
    the centred ones the table holds), its output the softmax of them times v, and v keeps its width."""
    enc, grid, prefix = encoding(), (3, 4), 1
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
def test_the_reference_test_fails_when_the_rule_changes(monkeypatch, perturbation):
    """The slope's sign (offset taken query minus key), the curvature doubled or dropped, the prefix token biased: each
    perturbed reference disagrees with what SDPA sees (so the test above has teeth)."""
    enc, prefix = encoding(), 1
    table = enc.table((3, 4), dtype=F64).layer(0)
    q, k, v = torch.randn(3, 2, HEADS, 13, DIM, dtype=F64)
    p = torch.cat((torch.zeros(prefix, 2), torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)))).to(F64)
    wrong = q @ k.mT / math.sqrt(DIM) + reference_bias(q, p, enc.family, 0, prefix, **perturbation)
    logits, _ = seen_logits(monkeypatch, q, k, v, table)
    assert (logits - wrong).abs().max() > 1e-3


def test_the_bias_depends_on_offsets_alone(monkeypatch):
    """Per-sample positions moved by one vector give the same logits (centring or not); scaled, they do not."""
    enc = encoding(prefix=2)
    pos = torch.randn(2, 9, 2, dtype=F64) * 5
    shift = torch.tensor([[[13.5, -40.25]], [[-7.0, 3.0]]], dtype=F64)
    q, k, v = torch.randn(3, 2, HEADS, 11, DIM, dtype=F64)

    def logits(p):
        return seen_logits(monkeypatch, q, k, v, enc.table(positions=p, dtype=F64).layer(1))[0]

    torch.testing.assert_close(logits(pos + shift), logits(pos), rtol=0, atol=1e-9)
    assert (logits(pos * 1.5) - logits(pos)).abs().max() > 1e-3


def test_no_n_by_n_tensor_at_a_large_grid(monkeypatch):
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


def test_the_model_trains_a_step_and_its_gradients_reach_the_parabolas():
    torch.manual_seed(0)
    model = timm.create_model("vit_pape_tiny", depth=2, img_size=32, num_classes=4, global_pool="avg")
    family = model.position_encoding.family
    assert family.per_layer and family.directions.shape == (2, 3, 50, 2)  # ([layer,] heads, parabolas, axes)
    before = [p.detach().clone() for p in family.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e4)  # LayerScale (1e-5) scales their gradients down
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.arange(4))
    loss.backward()
    for p in family.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    optimizer.step()
    assert all(not torch.equal(p, b) for p, b in zip(family.parameters(), before, strict=True))


def test_token_dropping_keeps_each_kept_tokens_position():
    """With ``patch_drop_rate`` the table of each sample's kept tokens holds their grid coordinates (those of the
    patches the dropout kept, centred as the full grid's), the cls token's placeholder first."""
    torch.manual_seed(0)
    model = timm.create_model("vit_pape_tiny", depth=1, img_size=64, patch_drop_rate=0.5).train()
    tables, kept = [], []
    model.patch_drop.register_forward_hook(lambda mod, args, out: kept.append(out[1]))
    model.blocks[0].attn.register_forward_pre_hook(lambda mod, args: tables.append(args[1]))
    model(torch.randn(2, 3, 64, 64))
    table, keep = tables[0], kept[0]  # keep: (B, 8) indices of the 16 patches
    assert isinstance(table, ParabolicBias) and table.coords.shape == (2, 1 + 8, 2) and table.num_prefix == 1
    assert not torch.equal(keep[0], keep[1])  # each sample its own tokens
    grid = torch.cartesian_prod(torch.arange(4.0), torch.arange(4.0))  # (row, col) of each patch
    torch.testing.assert_close(table.coords[:, 1:], grid[keep] - 1.5, rtol=0, atol=0)


def test_under_bfloat16_autocast_the_bias_keeps_float32_precision():
    """A 14×14 grid with the init's parabolas: attention on bfloat16 q, k, v under autocast is the float64 one of the
    same (rounded) inputs up to bfloat16's rounding of the output; with the extended q and k rounded to bfloat16, as
    SDPA under autocast would take them, the bias's cancelling terms move the output far more."""
    torch.manual_seed(0)
    enc, grid, N = PositionEncoding(64, 2, "pape", num_heads=2, num_prefix_tokens=1), (14, 14), 197
    qkv = torch.randn(1, N, 3 * 2 * 64).bfloat16()
    expected = attend(qkv.double(), enc.table(grid, dtype=F64), 2, "qk", 0.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = attend(qkv, enc.table(grid, dtype=torch.bfloat16), 2, "qk", 0.0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=0.02)
    q, k, v = qkv.view(1, N, 3, 2, 64).permute(2, 0, 3, 1, 4)
    q16, k16 = (t.bfloat16().double() for t in enc.table(grid).extend(q, k))
    rounded = F.scaled_dot_product_attention(q16, k16, v.double(), scale=64**-0.5)
    assert (rounded - expected).abs().max() > 0.1
