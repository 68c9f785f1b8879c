"""vit_rope/families/liere.py: LieRE reduces to axial RoPE, its generators do not commute (so the families' shared
relativity test can fail), a table shared by heads turns vectors without a head dim, its defaults are the released
code's, and its exponentials stay rotations at large positions."""

import timm
import torch

from tests.helpers import DIM, HEADS, axial, randomized, rope
from vit_rope import FAMILIES, RotaryEmbedding

F64 = torch.float64


def test_the_relative_property_test_can_fail():
    """LieRE's generators do not commute (it says so): the same shift moves its scores (test_families.py's relativity
    test has teeth)."""
    assert not FAMILIES["liere"].commutes
    layer = rope("liere", 2, block_size=DIM)
    pos = torch.randn(5, 2, dtype=F64) * 3
    q, k = torch.randn(2, 1, HEADS, 5, DIM, dtype=F64)

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    assert (scores(pos + 2.5) - scores(pos)).abs().max() > 1e-3


def test_liere_reduces_to_axial():
    """4×4 blocks whose generators carry axial's frequencies on their 2×2 diagonal (LieRE's skew form turns by -a)."""
    liere = RotaryEmbedding(DIM, axes=2, family="liere", num_heads=HEADS, block_size=4).double()
    F = axial().family.frequency_matrix()  # (axes, pairs)
    with torch.no_grad():
        g = liere.family.generators.zero_()  # (heads, axes, blocks, 4, 4)
        g[..., 0, 1] = -F[:, 0::2]
        g[..., 2, 3] = -F[:, 1::2]
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(liere(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)


def test_a_table_shared_by_heads_turns_vectors_without_a_head_dim():
    liere = randomized(RotaryEmbedding(DIM, axes=2, family="liere", per_head=False))
    x = torch.randn(20, DIM, dtype=F64)
    torch.testing.assert_close(liere(x, grid=(4, 5))[0], liere(x[None, None], grid=(4, 5))[0, 0])


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
