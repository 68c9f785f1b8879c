"""What is left of the hostile passes (issues 16, 24) outside the harness modules' own test files: the report's
headline and Spiral's 3D defaults. The run folder, settings, weights and data have their files (tests/test_folder.py,
test_settings.py, test_weights.py, test_data.py)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vit_rope import RotaryEmbedding
from vit_rope.training import report


def test_the_headline_leaves_out_sizes_that_were_not_evaluated():
    rows = [dict(model="m", recipe="", seed=0, train_size=16, eval_size=s, protocol="resize", rope_scaling="none",
                 top1=t, top5=99.0, loss=1.0, params=10) for s, t in ((16, 50.0), (32, 40.0))]  # fmt: skip
    text = report.headline_table(report.summarise(rows), 16)
    assert "| model | recipe | best scaling at 2x | 16 px | 32 px | 32 / 16 |" in text  # no 0.5x column
    assert "| m | - | none | 50.0 | 40.0 | 0.80 |" in text


# ---------------------------------------------------------------------------------------- spiral in 3D
@settings(max_examples=12, deadline=None)
@given(dim=st.sampled_from([16, 32, 40, 48, 64, 96]), data=st.data())
def test_spiral_in_3d_takes_its_default_directions_for_any_head_dim(dim, data):
    """The default picks directions that fit the plane (it failed for 48 channels), and stays exactly relative."""
    layer = RotaryEmbedding(dim, axes=3, freqs="spiral").double()
    assert layer.family.directions >= 2 and layer.family.plane_dims % 8 == 0
    pos = torch.tensor(data.draw(st.lists(st.lists(st.floats(-9, 9), min_size=3, max_size=3), min_size=4,
                                          max_size=4)), dtype=torch.float64)  # fmt: skip
    q, k = torch.randn(2, 4, dim, dtype=torch.float64)

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    torch.testing.assert_close(scores(pos + 3.5), scores(pos), rtol=0, atol=1e-9)
    assert math.isfinite(float(scores(pos).sum()))


def test_spiral_refusals_offer_choices():
    with pytest.raises(ValueError, match=r"choose one of \[2, 4, 8\]"):
        RotaryEmbedding(32, axes=2, freqs="spiral", directions=3)
