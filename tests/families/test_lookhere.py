"""vit_rope/families/lookhere.py: LookHere's bias on the paper's worked example, and its head slopes as the released
code's (the bias against a double loop over token pairs: test_tables.py)."""

import math

import torch

from vit_rope import PositionEncoding

F64 = torch.float64


def test_lookhere_worked_example_of_the_paper():
    """3×3 grid, the centre query, the head looking right with a 90° field of view, first of 12 layers (layer slope
    1.5, head slope 1/2): it sees itself, the token to its right (penalty 0.75) and the two right corners on the ±45°
    boundary (0.75·√2)."""
    enc = PositionEncoding(16, 2, "lookhere", num_heads=12, depth=12, fov=90)
    bias = enc.table((3, 3), dtype=F64).layer(0).block(0, 9)[0, 4]  # head 0 looks right; token 4 is the centre
    s2 = 0.75 * math.sqrt(2)
    want = torch.tensor([-math.inf, -math.inf, -s2, -math.inf, 0, -0.75, -math.inf, -math.inf, -s2], dtype=F64)
    torch.testing.assert_close(bias, want)


def test_lookhere_slopes_are_the_released_codes():
    """GreenCUBIC/lookhere (lookhere.py): ``get_slopes(n)`` gives directed heads 2^-1 in the first group of four,
    2^-2 in the next; ``get_none_slopes`` the undirected 4^-1 ... 4^-4 (the first two for two heads); ViT-B has 8
    directed and 4 undirected heads, ViT-S 4 and 2 (its 6-head configuration)."""
    from vit_rope.families.lookhere import head_slopes

    assert head_slopes(8, 4) == [0.5] * 4 + [0.25] * 4 + [0.25, 0.0625, 0.015625, 0.00390625]
    assert head_slopes(4, 2) == [0.5] * 4 + [0.25, 0.0625]
    assert head_slopes(8, 8) == [0.5] * 4 + [0.25] * 4 + [
        0.25,
        0.25,
        0.0625,
        0.0625,
        4.0**-3,
        4.0**-3,
        4.0**-4,
        4.0**-4,
    ]
    enc = PositionEncoding(16, 2, "lookhere", num_heads=6)
    assert enc.family.directed == 4 and enc.table((2, 2)).slopes.tolist() == [0.5] * 4 + [0.25, 0.0625]
