"""bench/kernel_ptx.py: the bytes each global load and store of our Triton kernels moves once compiled for an H100
(sm_90), counted from the CPU. A kernel that reads channels two bytes at a time ran at 8 % of a copy's speed on an
H100 (docs/speed.md); these tests keep the rotation kernels' accesses wide."""

import importlib.util
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
spec = importlib.util.spec_from_file_location(
    "kernel_ptx", Path(__file__).resolve().parents[1] / "bench" / "kernel_ptx.py"
)
kernel_ptx = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_ptx)


def test_each_access_is_counted_by_the_bytes_it_moves():
    ptx = """
        @%p1 ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd1 + 0 ];
        ld.global.L1::evict_last.v2.b32 { %r5, %r6 }, [ %rd2 + 0 ];
        @%p2 ld.global.b16 { %rs1 }, [ %rd3 + 0 ];
        ld.global.nc.f32 %f1, [ %rd4 ];
        @%p3 st.global.v4.b32 [ %rd5 + 0 ], { %r1, %r2, %r3, %r4 };
        st.global.b16 [ %rd6 + 0 ], { %rs1 };
        ld.shared.v4.b32 { %r7, %r8, %r9, %r10 }, [ %r11 ];
        ld.param.b64 %rd7, [ param_0 ];
    """
    counts = kernel_ptx.memory_instructions(ptx)
    assert counts == Counter({"ld 16 B": 1, "ld  8 B": 1, "ld  2 B": 1, "ld  4 B": 1, "st 16 B": 1, "st  2 B": 1})
    assert kernel_ptx.bytes_an_access(counts) == pytest.approx((16 + 8 + 2 + 4 + 16 + 2) / 6)


@pytest.mark.slow
def test_the_rotation_kernels_move_wide_accesses_on_an_h100():
    """The script on a train step's launches (the forward's turn and the backward's turn back), compiled for sm_90 as
    Triton's JIT would on the card (in a process of its own: the tests interpret Triton): the pair kernel moves 16
    bytes an access, the block kernel at least 12 (its unturned-channel tail is scalar), where both moved 3.5-3.6
    before their rows were read whole."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"VIT_ROPE_FUSED": "triton"}
    script = Path(kernel_ptx.__file__)
    out = subprocess.run(
        [sys.executable, str(script), "--families", "axial", "liere", "--size", "32"],
        env=env, cwd=script.parents[1], capture_output=True, text=True, timeout=600, check=True,
    ).stdout  # fmt: skip
    widths = {}
    for line in out.splitlines():  # "axial       forward  _turn_pairs_kernel    16.0 B an access  (...)"
        family, when, kernel, width = line.split()[:4]
        widths[family, when, kernel] = float(width)
    pairs, blocks = "_turn_pairs_kernel", "_turn_blocks_kernel"
    want = {("axial", "forward", pairs), ("axial", "backward", pairs), ("liere", "forward", blocks),
            ("liere", "backward", blocks)}  # fmt: skip
    assert set(widths) == want, out
    assert all(width >= (16 if kernel == pairs else 12) for (_, _, kernel), width in widths.items()), out
