"""The learned families' fast forms against their plain formulas, in float64 with random (not initial) parameters, and
their fidelity to the papers and the authors' released code (issue 27)."""

import pytest
import timm
import torch

from vit_rope import Build, PositionEncoding, RotaryEmbedding, RotaryTable
from vit_rope.families.comrope import block_diagonal, spectral_split

F64 = torch.float64


def randomized(encoding, scale=0.3, seed=1):
    torch.manual_seed(seed)
    encoding = encoding.double()
    with torch.no_grad():
        for p in encoding.parameters():
            p.copy_(torch.randn_like(p) * scale)
    return encoding


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


def test_liere_defaults_share_one_set_of_generators():
    """The default is one set of generators for every layer and head, blocks of 8: the released code's defaults
    (StanfordMIMI/LieRE models/model_args.py: rotary_embedding_per_layer/per_head False) and its README's core
    implementation, with the LieRE_8 blocks of its ImageNet run (lightning_imagenet.sh: generator_dim 8);
    per_layer=True, per_head=True is that script's and the CIFAR-100 config's setting."""
    model = timm.create_model("vit_liere_tiny", depth=3)
    assert model.position_encoding.family.generators.shape == (1, 2, 8, 8, 8)  # (heads: shared, axes, blocks, 8, 8)
    assert not model.position_encoding.family.per_layer
    every = timm.create_model("vit_liere_tiny", depth=3, rope_options=dict(per_layer=True, per_head=True))
    assert every.position_encoding.family.generators.shape == (3, 3, 2, 8, 8, 8)


def test_liere_stays_a_rotation_at_large_positions():
    """The exponentials run in float64 and are kept in float32: at positions up to 1e6 every block is orthogonal to
    float32 precision (float32 exponentials drift: norm x1.0065 at 1e4, x3.5 at 1e6)."""
    enc = RotaryEmbedding(16, axes=2, family="liere", block_size=8)
    for p in (1e4, 1e6):
        R = enc.table(positions=torch.tensor([[p, -p / 3]])).blocks  # (1, 2 blocks, 8, 8)
        eye = torch.eye(8).expand_as(R)
        torch.testing.assert_close(R @ R.mT, eye, rtol=0, atol=1e-5)


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
