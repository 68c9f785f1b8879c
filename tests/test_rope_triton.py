"""The fused rotation kernel (``vit_rope.rope_triton``) against float64 references and the eager path.

Where a GPU is present these tests run the kernel on it. Without one, ``test_under_triton_interpreter`` runs them,
and every ``rotate_packed`` and ``rotate_split`` test of test_rope.py, again in a fresh process under Triton's CPU
interpreter (``TRITON_INTERPRET=1``), in which the kernel serves CPU tensors: the same kernel code, checked on any
machine.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch

from vit_rope import RotaryEmbedding, rope_triton
from vit_rope.rope import _packed_view, rotate_packed, rotate_split

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernel = pytest.mark.skipif(
    rope_triton.triton is None or not (torch.cuda.is_available() or rope_triton.INTERPRETED),
    reason="no GPU here: test_under_triton_interpreter runs these under Triton's interpreter",
)
F64 = torch.float64
# odd sizes on purpose: 3 heads of 48 channels (72 pairs a slot, not a power of two), a cls token and a 5 x 6 grid
# (31 tokens: batches of them are no multiple of any block of rows)
HEADS, DIM, GRID = 3, 48, (5, 6)
TOKENS = 1 + 5 * 6


def table(freqs: str, dtype=torch.float32):
    rope = RotaryEmbedding(DIM, axes=2, num_prefix_tokens=1, freqs=freqs, num_heads=HEADS).to(DEVICE)
    return rope, rope.table(GRID, device=DEVICE, dtype=dtype)


def reference(x, cis, first, last, inverse=False):
    """Slots [first, last) of x turned by cis in float64 complex arithmetic, rounded once to x's dtype."""
    pairs = x.double().unflatten(-1, (-1, HEADS, DIM // 2, 2)).clone()
    c = cis.to(torch.complex128)
    z = torch.view_as_complex(pairs[:, :, first:last].contiguous()) * (c.conj() if inverse else c)
    pairs[:, :, first:last] = torch.view_as_real(z)
    return pairs.flatten(2).to(x.dtype)


def assert_near(got, want, tol):
    """‖got − want‖ ≤ tol ‖want‖: for sums of many rounded terms (gradients), where single elements can cancel."""
    assert torch.linalg.vector_norm(got.double() - want.double()) <= tol * torch.linalg.vector_norm(want.double())


def assert_one_rounding(got, want):
    tol = {torch.float64: 1e-12, torch.float32: 1e-6}.get(got.dtype, torch.finfo(got.dtype).eps)
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("freqs", ["axial", "mixed"])
@pytest.mark.parametrize("span", [(0, 2), (1, 3), (2, 3)])
def test_kernel_in_place_turns_only_its_slots(dtype, freqs, span):
    """In place: the turned slots equal the float64 rotation rounded once, every other element keeps its bits."""
    _, t = table(freqs, F64 if dtype == F64 else torch.float32)
    cis = _packed_view(t.cis)
    x = torch.randn(3, TOKENS, 3 * HEADS * DIM, device=DEVICE).to(dtype)
    y = x.clone()
    assert rope_triton.rotate_rows(y, cis, *span, HEADS) is y
    want = reference(x, cis, *span)
    slots = y.unflatten(-1, (3, -1))
    assert_one_rounding(slots[:, :, span[0] : span[1]], want.unflatten(-1, (3, -1))[:, :, span[0] : span[1]])
    untouched = [s for s in range(3) if not span[0] <= s < span[1]]
    assert torch.equal(slots[:, :, untouched], x.unflatten(-1, (3, -1))[:, :, untouched])


@needs_kernel
@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the interpreter computes inf·0, then drops it
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_out_of_place_inverse_writes_every_element(dtype):
    """Out of place (the backward pass): turned slots rotated back, the others copied, no element left unwritten."""
    _, t = table("mixed")
    cis = _packed_view(t.cis)
    x = torch.randn(2, TOKENS, 3 * HEADS * DIM, device=DEVICE).to(dtype)
    v = x.unflatten(-1, (3, -1))[:, :, 2]
    v[0, :, 0], v[0, :, 1] = float("inf"), -0.0  # a copy keeps both (a multiply by 1 and 0 would not)
    out = torch.full_like(x, float("nan"))
    assert rope_triton.rotate_rows(x, cis, 0, 2, HEADS, inverse=True, out=out) is out
    qk = (slice(None), slice(None), slice(0, 2 * HEADS * DIM))
    assert_one_rounding(out[qk], reference(x, cis, 0, 2, inverse=True)[qk])
    bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out.unflatten(-1, (3, -1))[:, :, 2].view(bits), v.view(bits))  # v: the same bits


@pytest.fixture
def kernel_calls(monkeypatch):
    """The kernels' launches in order, as ``(kernel, inverse)``; ``kernel_calls.off()`` sends rotate_packed and
    rotate_split down the eager PyTorch path."""

    class Calls(list):
        def off(self):
            monkeypatch.setenv("VIT_ROPE_TRITON", "0")

    calls = Calls()
    for name in ("rotate_rows", "heads_to_rows"):
        launch = getattr(rope_triton, name)

        def counted(*args, name=name, launch=launch, **kwargs):
            calls.append((name, kwargs.get("inverse", False)))
            return launch(*args, **kwargs)

        monkeypatch.setattr(rope_triton, name, counted)
    return calls


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("freqs", ["axial", "mixed"])
def test_kernel_serves_rotate_packed_with_gradients(dtype, freqs, kernel_calls):
    """rotate_packed on the kernel (forward in place, backward one out-of-place pass) gives the eager path's values
    and gradients, learned frequencies included."""
    x = torch.randn(2, TOKENS, 3 * HEADS * DIM, device=DEVICE).to(dtype).requires_grad_()
    w = torch.randn_like(x)

    def run():
        torch.manual_seed(0)  # the same mixed init on both paths
        rope, t = table(freqs)
        packed = x * 1
        y = rotate_packed(packed, t, HEADS, (True, True, False))
        assert y.data_ptr() == packed.data_ptr()
        grads = torch.autograd.grad((y.float() * w.float()).sum(), [x, *rope.parameters()])
        return y.detach(), grads

    y, grads = run()
    assert kernel_calls == [("rotate_rows", False), ("rotate_rows", True)]  # in place, then back in backward
    kernel_calls.off()
    y_eager, grads_eager = run()
    assert len(kernel_calls) == 2
    assert_one_rounding(y, y_eager)
    for got, want in zip(grads, grads_eager, strict=True):
        assert_near(got, want, 1e-2 if dtype == torch.bfloat16 else 1e-5)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("freqs", ["axial", "mixed"])
@pytest.mark.parametrize("turn", [(True, True, False), (False, True, True), (False, False, True)])
def test_kernel_serves_rotate_split_with_gradients(dtype, freqs, turn, kernel_calls):
    """rotate_split while training (one kernel forward, one a slot backward) gives the eager path's q, k, v and
    gradients, learned frequencies included, for gradients of any strides."""
    # the projection as a transposed (N, B, width) buffer: dense but not contiguous
    x = torch.randn(TOKENS, 2, 3 * HEADS * DIM, device=DEVICE).to(dtype).transpose(0, 1).requires_grad_()
    w = [torch.randn(2, HEADS, TOKENS, DIM, device=DEVICE)]
    w.append(torch.randn(2, TOKENS, HEADS, DIM, device=DEVICE).transpose(1, 2))  # heads and tokens transposed
    w.append(torch.randn(2, HEADS, DIM, TOKENS, device=DEVICE).transpose(2, 3))  # channels not contiguous

    def run():
        torch.manual_seed(0)  # the same mixed init on both paths
        rope, t = table(freqs)
        q, k, v = rotate_split(x * 1, t, HEADS, turn)
        # the gradients of q, k, v arrive with the strides of w, as from strided consumers
        loss = sum((s.float() * ws).sum() for s, ws in zip((q, k, v), w, strict=True))
        return torch.stack([q, k, v]).detach(), torch.autograd.grad(loss, [x, *rope.parameters()])

    qkv, grads = run()
    assert kernel_calls == [("rotate_rows", False)] + [("heads_to_rows", True)] * 3
    kernel_calls.off()
    qkv_eager, grads_eager = run()
    assert_one_rounding(qkv, qkv_eager)
    for got, want in zip(grads, grads_eager, strict=True):
        assert_near(got, want, 1e-2 if dtype == torch.bfloat16 else 1e-5)


@needs_kernel
def test_kernel_in_a_model_matches_eager(kernel_calls):
    """A RoPE ViT's outputs and gradients are the same with the kernel as with the eager rotation."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny", img_size=64, num_classes=5).to(DEVICE)
    x = torch.randn(2, 3, 64, 64, device=DEVICE)

    def run():
        model.zero_grad()
        with torch.autocast(DEVICE, dtype=torch.bfloat16, enabled=DEVICE == "cuda"):
            y = model(x)
        y.float().square().sum().backward()
        return y.detach().float(), [p.grad.clone() for p in model.parameters()]

    y, grads = run()
    depth = len(model.blocks)  # a layer: q, k, v split in one launch, their gradients gathered in one a slot
    assert kernel_calls == [("rotate_rows", False)] * depth + [("heads_to_rows", True)] * 3 * depth
    kernel_calls.off()
    y_eager, grads_eager = run()
    tol = 2e-2 if DEVICE == "cuda" else 1e-5  # bfloat16 under autocast on a GPU, float32 on a CPU
    for got, want in zip([y, *grads], [y_eager, *grads_eager], strict=True):
        assert_near(got, want, tol)


@needs_kernel
def test_kernel_under_gradient_checkpointing(kernel_calls):
    """timm's gradient checkpointing reruns each block's forward in backward: the kernel path gives the gradients of
    an ordinary backward pass."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny", img_size=64, num_classes=5).to(DEVICE)
    x = torch.randn(2, 3, 64, 64, device=DEVICE)

    def grads(checkpointing):
        model.zero_grad()
        model.set_grad_checkpointing(checkpointing)
        model(x).square().sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    plain = grads(False)
    kernel_calls.clear()
    checkpointed = grads(True)
    assert kernel_calls.count(("rotate_rows", False)) == 2 * len(model.blocks)  # forward, then again in backward
    for got, want in zip(checkpointed, plain, strict=True):
        assert_near(got, want, 1e-6 if DEVICE == "cpu" else 1e-4)  # GPU attention backward may sum in another order


@pytest.mark.skipif(rope_triton.triton is None or rope_triton.INTERPRETED, reason="needs Triton's compiler")
@pytest.mark.filterwarnings("ignore:TRITON_DEFAULT_FP_FUSION")
@pytest.mark.parametrize("arch", [80, 90])  # Ampere, Hopper
def test_triton_compiles_for_ampere_and_hopper(arch):
    """Both kernels compile to machine code for NVIDIA GPUs (Triton's own ptxas; no GPU needed) for each dtype: what
    the interpreter cannot show (it runs the code; it does not compile it for a GPU)."""
    compiler = pytest.importorskip("triton.compiler")
    target = pytest.importorskip("triton.backends.compiler").GPUTarget("cuda", arch, 32)
    cases = [(rope_triton._rotate_kernel, {"INVERSE": i, "BLOCK_ROWS": 4, "BLOCK_PAIRS": 128}) for i in (False, True)]
    cases += [(rope_triton._heads_to_rows_kernel, {"TURN": t, "INVERSE": True, "BLOCK_ROWS": 16, "BLOCK_DIM": 64})
              for t in (False, True)]  # fmt: skip
    for kernel, constexprs in cases:
        for data, table in (("bf16", "fp32"), ("fp16", "fp32"), ("fp32", "fp32"), ("fp64", "fp64")):
            signature = {"src": f"*{data}", "dst": f"*{data}", "table": f"*{table}"}
            signature |= {n: "constexpr" if n in constexprs else "i32" for n in kernel.arg_names[3:]}
            source = compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
            compiled = compiler.compile(source, target=target, options={"num_warps": rope_triton.TILE["num_warps"]})
            assert compiled.asm["cubin"]


def test_rows_apart_refuses_rows_that_share_memory():
    """The in-place kernel writes rows from many programs at once: only tensors whose elements all have memory of
    their own go to it (rows of any strides; an expanded or overlapping tensor goes the eager way, which refuses it)."""
    x = torch.empty(2, 5, 12)
    assert all(rope_triton.rows_apart(t) for t in (x, x.transpose(0, 1), x[:, ::2], x[..., :6]))
    assert not rope_triton.rows_apart(torch.empty(1, 5, 12).expand(2, -1, -1))
    assert not rope_triton.rows_apart(torch.empty(60).as_strided((2, 5, 12), (12, 6, 1)))  # overlapping rows


def test_environment_switches_the_kernel_off(monkeypatch):
    x = torch.empty(1, device=DEVICE)
    monkeypatch.setenv("VIT_ROPE_TRITON", "1")
    if not rope_triton.INTERPRETED:
        assert not rope_triton.available(torch.empty(1))  # CPU tensors go the eager way
    on = rope_triton.available(x)
    monkeypatch.setenv("VIT_ROPE_TRITON", "0")
    assert not rope_triton.available(x)
    assert on or DEVICE == "cpu" or rope_triton.triton is None or torch.cuda.get_device_capability() < (8, 0)


@pytest.mark.skipif(
    rope_triton.triton is None or rope_triton.INTERPRETED or torch.cuda.is_available(),
    reason="the kernel runs natively here (or Triton is missing)",
)
def test_under_triton_interpreter():
    """Without a GPU: the kernel tests above and test_rope.py's rotate_packed and rotate_split tests, under Triton's
    interpreter."""
    root = Path(__file__).parent
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-k",
            "kernel or rotate_packed or rotate_split or rows_apart",
            str(root / "test_rope_triton.py"),
            str(root / "test_rope.py"),
        ],  # fmt: skip
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and " skipped" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
