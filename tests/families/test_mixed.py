"""vit_rope/families/mixed.py: RoPE-Mixed's learned frequencies start as the paper's init, and leave the channels a
split over the axes cannot use unrotated."""

import math

import torch

from vit_rope import RotaryEmbedding

F64 = torch.float64


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


def test_mixed_frequencies_with_unrotated_channels():
    """64 channels over 3 axes rotate 60: the 4 left over stay unrotated with learned frequencies too."""
    rope = RotaryEmbedding(64, axes=3, family="mixed", num_heads=2)
    x = torch.randn(1, 2, 8, 64)
    y = rope(x, grid=(2, 2, 2))
    torch.testing.assert_close(y[..., 60:], x[..., 60:], rtol=0, atol=0)
    assert not torch.allclose(y[..., :60], x[..., :60])
