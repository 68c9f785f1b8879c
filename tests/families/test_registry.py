"""vit_rope/families/__init__.py: a position-encoding family defined here, in a test file and not in the package, is
a first-class family: registering it registers its timm models, which build, run and train; ``RotaryEmbedding`` takes
it; train.py compares it with the built-in ones, importing this file with ``--imports``."""

import math
import subprocess
import sys
from pathlib import Path

import timm
import torch
from torch import Tensor

from vit_rope import RotaryEmbedding, register_family
from vit_rope.families.axial import frequency_ladder
from vit_rope.families.base import PairFamily, Scaling, axis_sections

ROOT = Path(__file__).resolve().parents[2]


@register_family
class TurnedAxial(PairFamily):
    """Axial RoPE whose two axes are turned by a fixed ``angle`` in the plane (a user's family, for the tests)."""

    name = "user_turned_axial"
    model_name = "user_turned"  # timm's vit_user_turned_{tiny,small,base}
    min_axes = max_axes = 2

    def __init__(self, dim: int, axes: int, *, angle: float = 0.5, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        self.angle = float(angle)

    def frequency_matrix(self, scaling: Scaling | None = None) -> Tensor:
        """Axial RoPE's ladder per section; the column section turns with (cos a, sin a) · (x, y), the row section
        with (-sin a, cos a) · (x, y); (row, col) is the grid's axis order."""
        c, s = math.cos(self.angle), math.sin(self.angle)
        directions = {1: (s, c), 0: (c, -s)}  # axis → its direction as (row, col) weights
        F = torch.zeros(2, self.dim // 2, dtype=torch.float64)
        for axis, pairs in axis_sections(self.axis_dims):
            ladder = frequency_ladder(self.axis_dims[axis], self.theta)
            F[0, pairs], F[1, pairs] = directions[axis][0] * ladder, directions[axis][1] * ladder
        return F


TINY = dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2, num_classes=5)


def test_registering_a_family_registers_its_models_which_build_run_and_train():
    assert {f"vit_user_turned_{s}" for s in ("tiny", "small", "base")} <= set(timm.list_models("vit_user_turned_*"))
    model = timm.create_model("vit_user_turned_tiny", **TINY)
    assert type(model.position_encoding.family) is TurnedAxial
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    assert all(not torch.equal(p, before[n]) for n, p in model.named_parameters()), "one step trains every weight"
    assert model.eval()(torch.randn(1, 3, 48, 40)).shape == (1, 5)  # unseen, rectangular size


def test_the_user_family_is_exactly_relative_and_at_angle_zero_is_axial():
    turned = RotaryEmbedding(16, axes=2, family="user_turned_axial", angle=0.7).double()
    q, k = torch.randn(2, 5, 16, dtype=torch.float64)
    pos = torch.randn(5, 2, dtype=torch.float64) * 4

    def scores(p):
        return turned(q, positions=p) @ turned(k, positions=p).mT

    torch.testing.assert_close(scores(pos + torch.tensor([2.0, -3.0], dtype=torch.float64)), scores(pos))
    axial, zero = RotaryEmbedding(16, axes=2).double(), RotaryEmbedding(16, axes=2, family="user_turned_axial", angle=0)
    torch.testing.assert_close(zero.double()(q, positions=pos), axial(q, positions=pos), rtol=0, atol=1e-12)
    assert not torch.allclose(turned(q, positions=pos), axial(q, positions=pos))


def test_train_py_compares_the_user_family_importing_this_file(tmp_path):
    """From the command line: --imports loads this file (which registers the family) before the models are named."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--imports", __file__, "--models", "vit_rope_tiny",
         "vit_user_turned_tiny", "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2",
         "--img-size", "16", "--eval-sizes", "16", "32", "--rope-scaling", "none", "pi", "--train-samples", "64",
         "--val-samples", "32", "--epochs", "1", "--batch-size", "32", "--no-native-eval",
         "--output", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = (tmp_path / "results.csv").read_text()
    assert results.count("vit_user_turned_tiny") == 2 * 2  # two sizes under two modes
    assert "imports:\n- " in (tmp_path / "config.yaml").read_text()  # recorded; --resume asks for the flag again
    missing = subprocess.run([sys.executable, str(ROOT / "train.py"), "--imports", "no_such_module", "--output",
                              str(tmp_path / "x")], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    assert missing.returncode != 0 and "error: --imports 'no_such_module' cannot be imported" in missing.stderr
