"""vit_rope/families/string.py: STRING with the identity basis is axial RoPE, its basis is orthogonal, and it is the
basis change around its inner RoPE, in float64 with random parameters."""

import torch

from tests.helpers import DIM, HEADS, axial, randomized, rope
from vit_rope import RotaryEmbedding

F64 = torch.float64


def test_string_with_identity_basis_is_axial_and_its_basis_is_orthogonal():
    string = RotaryEmbedding(DIM, axes=2, family="string", num_heads=HEADS).double()  # S = 0 at init
    with torch.no_grad():  # its frequencies start as axial's ladder, rounded to float32: here exactly
        string.family.frequencies.copy_(axial().family.frequency_matrix().sum(0).expand_as(string.family.frequencies))
    x, grid = torch.randn(2, HEADS, 20, DIM, dtype=F64), (4, 5)
    torch.testing.assert_close(string(x, grid=grid), axial()(x, grid=grid), rtol=0, atol=1e-12)
    P = randomized(string).family.basis()
    torch.testing.assert_close(P.mT @ P, torch.eye(DIM, dtype=F64).expand_as(P), rtol=0, atol=1e-12)
    assert not torch.allclose(P, torch.eye(DIM, dtype=F64))


def test_string_is_the_basis_change_around_its_inner_rope():
    """R(p) = Pᵀ RoPE(p) P, P applied first (the other order would cancel in q·k and leave plain RoPE)."""
    string = rope("string", 2)
    x, grid = torch.randn(1, HEADS, 20, DIM, dtype=F64), (4, 5)
    P = string.family.basis()
    inner = RotaryEmbedding(DIM, axes=2).double()
    with torch.no_grad():
        string.family.frequencies.copy_(inner.family.frequency_matrix().sum(0).expand_as(string.family.frequencies))
    expected = inner(x @ P.mT, grid=grid) @ P
    torch.testing.assert_close(string(x, grid=grid), expected, rtol=0, atol=1e-12)
