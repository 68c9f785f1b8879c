"""vit_rope/families/base.py: PairFamily's options, p-RoPE (Barbero et al., "Round and Round We Go! What makes
Rotary Positional Encodings useful?", ICLR 2025) as an option of every pair family, the test's own family included:
which pairs turn against the paper's rule written out here (per ladder, the floor(p · n) highest frequencies), p = 1 as
the family without p, and invalid p."""

import math

import pytest
import torch

from vit_rope import FAMILIES, RotaryEmbedding
from vit_rope.families.base import PairFamily

F64 = torch.float64
DIM, HEADS = 24, 2
PAIR_FAMILIES = sorted(n for n, f in FAMILIES.items() if issubclass(f, PairFamily))


def build(name, axes=2, **kwargs):
    torch.manual_seed(0)
    enc = RotaryEmbedding(DIM, axes=axes, family=name, num_heads=HEADS, **kwargs).double()
    with torch.no_grad():  # random learned parameters: which pairs turn must not rest on their values
        for p in enc.family.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return enc


def table(enc, pos):
    t = enc.table(positions=pos, dtype=F64)
    return t.cos, t.sin


def paper_rule(ladders, p):
    """The paper's pairs that keep turning: for each ladder (pair indices, frequencies), the floor(p · n) of the
    highest frequencies (its Gemma code: ``int(p * head_dim // 2)`` of the top of the ladder; the rest wavelength ∞)."""
    keep = set()
    for pairs, f in ladders:
        order = sorted(range(len(pairs)), key=lambda i: (-f[i], i))
        keep |= {pairs[i] for i in order[: math.floor(p * len(pairs))]}
    return keep


def ladders_of(name, axes):
    """The family's ladders written out here: axial sections (x first) of theta ** (-2j / d) for the axial-layout
    families, the plane as one for spiral (by its frequency matrix), one ascending ladder for goldengate."""
    enc = RotaryEmbedding(DIM, axes=axes, family=name, num_heads=HEADS)
    fam = enc.family
    if name == "goldengate":
        return [(list(range(DIM // 2)), [100.0 ** (-(11 - i) / 12) for i in range(12)])]
    if name == "videorope":  # h and w interleave, time last: each axis's pairs as the frequency matrix says
        F = fam.frequency_matrix()
        return [(F[a].nonzero().flatten().tolist(), F[a][F[a] != 0].tolist()) for a in range(axes)]
    if name == "spiral":
        f = fam.frequency_matrix().norm(dim=0).tolist()
        plane = fam.plane_dims // 2
        rest = list(range(plane, sum(fam.axis_dims) // 2))
        return [(list(range(plane)), f[:plane])] + ([(rest, f[plane:])] if rest else [])
    d, theta, out = fam.axis_dims[0], fam.theta, []
    for a in range(axes):
        out.append((list(range(a * d // 2, (a + 1) * d // 2)), [theta ** (-2 * j / d) for j in range(d // 2)]))
    return out


def takes(name: str, axes: int) -> bool:
    family = FAMILIES[name]
    return family.min_axes <= axes <= (family.max_axes or axes)


@pytest.mark.parametrize(
    "name,axes,p",
    [(n, a, p) for n in PAIR_FAMILIES for a, p in [(2, 0.5), (2, 0.75), (3, 0.25), (3, 0.6)] if takes(n, a)],
)
def test_the_pairs_that_turn_are_the_papers(name, axes, p):
    """Pairs outside the rule are the identity at every position, pairs inside it turn exactly as without p."""
    pos = torch.randn(6, axes, dtype=F64, generator=torch.Generator().manual_seed(1)) * 5
    cos, sin = table(build(name, axes, p=p), pos)
    cos1, sin1 = table(build(name, axes), pos)
    keep = paper_rule(ladders_of(name, axes), p)
    for i in range(DIM // 2):
        if i in keep:
            assert torch.equal(cos[..., i], cos1[..., i]) and torch.equal(sin[..., i], sin1[..., i]), i
            assert sin1[..., i].abs().max() > 0  # a pair that turns
        else:
            assert (cos[..., i] == 1).all() and (sin[..., i] == 0).all(), i


def test_the_rule_can_fail():
    """The check above rejects a rule off by one pair: the family's mask is not the ladder's low end, nor everything."""
    keep = paper_rule(ladders_of("axial", 2), 0.5)
    assert keep == {0, 1, 2, 6, 7, 8}  # x's 3 highest of 6, then y's
    mask = build("axial", 2, p=0.5).family.rotating_pairs()
    assert set(torch.nonzero(mask).flatten().tolist()) == keep
    assert paper_rule(ladders_of("goldengate", 2), 0.5) == set(range(6, 12))  # its ladder ascends


@pytest.mark.parametrize("name", PAIR_FAMILIES)
def test_p_one_is_the_family_without_p(name):
    axes = 2 if takes(name, 2) else FAMILIES[name].min_axes
    pos = torch.randn(5, axes, dtype=F64) * 4
    for a, b in zip(table(build(name, axes, p=1.0), pos), table(build(name, axes), pos), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("p", [0, 0.0, -0.25, 1.01, 2, "0.5", True, float("nan"), [0.5]])
def test_invalid_p_is_one_clear_error(p):
    with pytest.raises(ValueError, match=r"p=.* must be a number in \(0, 1\]"):
        RotaryEmbedding(DIM, axes=2, family="axial", p=p)


def test_models_take_p_in_rope_options():
    import timm

    model = timm.create_model("vit_rope_mixed_tiny", depth=1, img_size=32, rope_options=dict(p=0.75))
    assert model.position_encoding.family.p == 0.75
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 1000)
