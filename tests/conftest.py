"""A position-encoding family defined here, outside the package, and registered before the tests are collected: every
test that goes over the registry (the models, the families' properties, train.py's comparison) runs it as it runs the
built-in families, with no test naming it. A user's family is as first-class as ours.

Triton's interpreter is switched on first (before any kernel is defined): the tests run the fused kernel
(vit_rope/kernels.py) on CPU tensors under it, choosing it with kernels.FUSED = "triton"; the models take the PyTorch
path unless a test chooses the kernel.

``--device`` (default cpu) names the device of the tests that take the ``device`` fixture (tests/test_device.py):
``TRITON_INTERPRET=0 pytest --device cuda tests/test_device.py`` runs the models on a GPU, the fused kernel compiled
rather than interpreted.

``pytest -n auto`` (pytest-xdist, as README and CI run it) shares the tests out over a worker per core; each worker
then takes its share of the cores for torch's threads."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402

from vit_rope import register_family
from vit_rope.families.axial import frequency_ladder
from vit_rope.families.base import PairFamily, Scaling, axis_sections, head_angles
from vit_rope.tables import Build, RotaryTable


@register_family
class GainedAxial(PairFamily):
    """Axial RoPE whose frequencies a learned gain scales, per head and layer (learned, exactly relative)."""

    name = "test_gained_axial"
    model_name = "test_gained"  # timm's vit_test_gained_{tiny,small,base}
    needs_heads = True

    def __init__(self, dim: int, axes: int, *, per_layer: bool = True, **kwargs) -> None:
        super().__init__(dim, axes, **kwargs)
        F = torch.zeros(axes, dim // 2, dtype=torch.float64)
        for axis, pairs in axis_sections(self.axis_dims):
            F[axis, pairs] = frequency_ladder(self.axis_dims[axis], self.theta)
        self.register_buffer("ladder", F.float(), persistent=False)  # (axes, dim // 2), axial RoPE's
        self.gain = nn.Parameter(torch.ones(*self.learned_shape(per_layer), 1, 1))  # ([layer,] heads, 1, 1)

    def encode(self, coords: Tensor, scaling: Scaling, build: Build) -> RotaryTable:
        F = build.precise(self.gain) * self.ladder  # ([layer,] heads, axes, dim // 2)
        angles = head_angles(coords.to(F.dtype), F)
        return RotaryTable.from_angles(angles, build, layout=self.layout, per_layer=self.per_layer)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--device", default="cpu", help="device of the tests that take it (cpu, cuda, cuda:1, ...)")


def pytest_configure(config: pytest.Config) -> None:
    """A --device this machine lacks stops the run at once (not a run of failures, nor of skips that looks green)."""
    name = config.getoption("--device")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise pytest.UsageError(f"--device {name!r} is not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise pytest.UsageError(f"--device {name}: torch sees {torch.cuda.device_count()} CUDA device(s) here")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # pytest -n N: the cores shared out, not N× them
    if workers > 1 and "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1  # (macOS)
        share = max(1, cores // workers)
        torch.set_num_threads(share)
        os.environ["OMP_NUM_THREADS"] = str(share)  # for train.py's processes, and train.main's preflight keeps it


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> torch.device:
    """The device --device names."""
    return torch.device(request.config.getoption("--device"))
