"""vit_rope/families/comrope.py: ComRoPE-LD and -AP reduce to axial RoPE; their fast spectral form against the plain
matrix exponentials (values and gradients, in float64 with random parameters, also folded into a model's q and k);
the split's fallback; the cls token at the centre as in the authors' released code."""

import pytest
import timm
import torch

from tests.helpers import DIM, HEADS, axial, randomized
from vit_rope import Build, PositionEncoding, RotaryEmbedding, RotaryTable
from vit_rope.families.comrope import block_diagonal, spectral_split

F64 = torch.float64


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


def plain_comrope(family, coords: torch.Tensor) -> torch.Tensor:
    """``exp(t_j(p) B_j)`` of every token and block by torch's matrix_exp: ``([layer,] heads, N, blocks, b, b)``."""
    P = family.generators
    return torch.linalg.matrix_exp(family.turns(coords)[..., None, None] * (P - P.mT).unsqueeze(-4))


def turn_blocks(R: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x (..., N, dim) turned by blocks R (..., N, blocks, b, b)."""
    b = R.shape[-1]
    return (R @ x.unflatten(-1, (-1, b)).unsqueeze(-1)).squeeze(-1).flatten(-2)


@pytest.mark.parametrize("name", ["comrope_ld", "comrope_ap"])
@pytest.mark.parametrize("axes", [2, 3])
def test_comropes_spectral_form_equals_the_matrix_exponential_with_its_gradients(name, axes):
    """exp(t B) = Q R(t λ) Qᵀ: the table's rotation of q equals exp of the plain formula, and so do the gradients of
    every generator, every mix weight and the input (float64, random parameters, per layer and head)."""
    enc = randomized(RotaryEmbedding(24, axes=axes, family=name, num_heads=2, depth=2, block_size=8), seed=3)
    coords = torch.randn(11, axes, dtype=F64) * 4
    x = torch.randn(3, 2, 11, 24, dtype=F64, requires_grad=True)
    G = torch.randn(3, 2, 2, 11, 24, dtype=F64)  # (batch, layer, heads, N, dim)

    def loss(turned):
        return (turned * G).sum()

    table = enc.family.encode(coords, None, Build(dtype=F64))
    assert table.blocks is None and table.basis is not None  # the spectral form, not exponentials
    fast = torch.stack([table.layer(i).rotate(x) for i in range(2)], dim=1)
    plain = turn_blocks(plain_comrope(enc.family, coords), x.unsqueeze(1))
    torch.testing.assert_close(fast, plain, rtol=0, atol=1e-11)
    params = [*enc.family.parameters(), x]
    fast_grads = torch.autograd.grad(loss(fast), params)
    plain_grads = torch.autograd.grad(loss(turn_blocks(plain_comrope(enc.family, coords), x.unsqueeze(1))), params)
    for a, b in zip(fast_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_the_split_is_orthogonal_and_falls_back_where_eigenvalues_meet():
    B = torch.randn(5, 8, 8, dtype=F64)
    Q, lam = spectral_split(B - B.mT)
    torch.testing.assert_close(Q.mT @ Q, torch.eye(8, dtype=F64).expand(5, 8, 8), rtol=0, atol=1e-12)
    assert (lam > 0).all() and block_diagonal(Q.mT).shape == (40, 40)
    assert spectral_split(torch.zeros(2, 8, 8, dtype=F64)) is None  # all eigenvalues 0
    enc = RotaryEmbedding(16, axes=2, family="comrope_ld", num_heads=2, block_size=8)
    with torch.no_grad():
        enc.family.generators.zero_()  # degenerate: the plain exponentials, finite gradients
    x = torch.randn(2, 12, 16, requires_grad=True)
    enc(x, grid=(3, 4)).square().sum().backward()
    assert enc.family.encode(torch.zeros(3, 2), None, Build()).blocks is not None
    assert all(torch.isfinite(p.grad).all() for p in enc.family.parameters())


def test_a_comrope_model_trains_with_the_split_folded_into_q_and_k():
    """The basis folds into the q and k projections: the model's logits and every gradient equal a model turning q
    and k by the plain exponentials (rope_targets='qkv' keeps the basis unfolded: v turned too, the same math)."""
    torch.manual_seed(0)
    kw = dict(img_size=32, patch_size=8, depth=2, embed_dim=48, num_heads=2, num_classes=5, init_values=1.0)
    model = timm.create_model("vit_comrope_tiny", **kw).double()
    randomized(model.position_encoding, scale=0.3)
    x = torch.randn(2, 3, 32, 32, dtype=F64)
    model(x).square().sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    family = model.position_encoding.family
    encode = family.encode

    def plain(coords, scaling, build):  # the same table as exponentials of every token, prefix row at the centre
        return RotaryTable(blocks=plain_comrope(family, coords).to(build.dtype), per_layer=family.per_layer)

    family.encode = plain
    try:
        model(x).square().sum().backward()
    finally:
        family.encode = encode
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=1e-8, atol=1e-10, msg=n)


def test_comropes_cls_token_turns_as_at_the_centre():
    """The authors' code (Longin-Yu/ComRoPE model.py, ``cls_position=0.5`` in its (0, 1) patch-centre coordinates)
    places the cls token at the image's centre: its row of the table is the rotation of the grid's centre, (H - 1)/2
    and (W - 1)/2 in patch indices; ``cls_at_centre=False`` leaves it unturned."""
    for name in ("comrope_ld", "comrope_ap"):
        enc = randomized(PositionEncoding(16, 2, name, num_heads=2, num_prefix_tokens=1, block_size=8))
        table = enc.table((3, 4), dtype=F64)
        centre = enc.family.encode(torch.tensor([[1.0, 1.5]], dtype=F64), None, Build(dtype=F64))
        torch.testing.assert_close(table.cos[..., :1, :], centre.cos, rtol=0, atol=1e-12)
        unturned = randomized(PositionEncoding(16, 2, name, num_heads=2, num_prefix_tokens=1, cls_at_centre=False))
        first = unturned.table((3, 4), dtype=F64)
        assert torch.equal(first.sin[..., 0, :], torch.zeros_like(first.sin[..., 0, :]))
