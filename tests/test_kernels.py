"""The fused rotation (vit_rope/kernels.py): its Triton kernels (pairs, blocks), run on CPU under Triton's
interpreter (conftest.py switches it on; bf16 is loaded, cast to float32 and computed as on a GPU), against explicit
rotation matrices in float64, forward and backward, for every shape of table; and the models through them against
the PyTorch path."""

import os
import subprocess
import sys

import pytest
import timm
import torch

from vit_rope import kernels
from vit_rope.families import FAMILIES

B, N, H, D = 2, 7, 3, 12  # 7 tokens: not a power of two (masked tails); 6 pairs a head


@pytest.fixture
def kernel(monkeypatch):
    """The fused kernel for CPU tensors (the documented switch, as VIT_ROPE_FUSED=triton sets it)."""
    monkeypatch.setattr(kernels, "FUSED", "triton")


def reference(x, angles, turned, layout, inverse):
    """x (S, B, H, N, D) float64 turned by explicit rotation matrices [[c, -s], [s, c]] of each pair's angle
    (B, H, N, D/2) on the slices in ``turned``."""
    angles = -angles if inverse else angles
    c, s = angles.cos(), angles.sin()
    R = torch.stack((torch.stack((c, -s), -1), torch.stack((s, c), -1)), -2)  # (B, H, N, P, 2, 2)
    P = x.shape[-1] // 2
    index = torch.arange(D).view(P, 2) if layout == "interleaved" else torch.arange(D).view(2, P).T  # pair channels
    out = x.clone()
    for i in turned:
        pairs = x[i][..., index]  # (B, H, N, P, 2)
        out[i][..., index] = (R @ pairs.unsqueeze(-1)).squeeze(-1)
    return out


TABLES = {  # a table's own shape, broadcast to (B, H, N, P) by the kernel's strides
    "shared": (N, D // 2),
    "per head": (H, N, D // 2),
    "per sample": (B, 1, N, D // 2),
    "per sample and head": (B, H, N, D // 2),
}


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("targets", ["qk", "qkv", "v", "k"])
def test_turn_qkv_is_the_rotation_of_each_pair(kernel, table, layout, dtype, targets):
    """q, k, v of a qkv projection split and turned in one call, in the projection's layout and dtype; within the
    input dtype's rounding of the float64 rotation of the same (rounded) input."""
    g = torch.Generator().manual_seed(0)
    qkv = torch.randn(B, N, 3 * H * D, generator=g).to(dtype)
    angles = torch.randn(TABLES[table], generator=g, dtype=torch.float64) * 20  # large angles too
    q, k, v = kernels.turn_qkv(qkv, H, targets, cos=angles.cos().float(), sin=angles.sin().float(), layout=layout)
    x = qkv.double().view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    turned = [i for i, c in enumerate("qkv") if c in targets]
    ref = reference(x, angles.expand(B, H, N, D // 2), turned, layout, inverse=False)
    # bf16: one rounding of the float32 result; within one unit in the last place, since the interpreter truncates
    # where a GPU rounds to nearest
    tol = dict(rtol=0, atol=2e-6) if dtype == torch.float32 else dict(rtol=2**-7, atol=2**-12)
    for got, want in zip((q, k, v), ref, strict=True):
        assert got.dtype == dtype and got.shape == (B, H, N, D) and got.stride() == (N * 3 * H * D, D, 3 * H * D, 1)
        torch.testing.assert_close(got.double(), want, **tol)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_turn_back_undoes_the_turn(kernel, layout):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, H, N, D, generator=g)
    angles = torch.randn(H, N, D // 2, generator=g, dtype=torch.float64)
    ref = reference(x.double().unsqueeze(0), angles.expand(B, H, N, D // 2), [0], layout, inverse=True)[0]
    out = kernels.turn_back(x, cos=angles.cos().float(), sin=angles.sin().float(), layout=layout)
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=2e-6)
    qkv = torch.cat([out.transpose(1, 2).reshape(B, N, H * D)] * 3, dim=-1)
    q, _, _ = kernels.turn_qkv(qkv, H, "q", cos=angles.cos().float(), sin=angles.sin().float(), layout=layout)
    torch.testing.assert_close(q, x, rtol=0, atol=2e-6)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("inverse", [False, True])
def test_gradients_reach_the_input_and_the_table(kernel, table, layout, inverse):
    """Backward against float64 autograd of the explicit rotation: the input's gradient (written in the qkv
    projection's own layout) and the table's, summed over what the table is broadcast over."""
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(B, N, 3 * H * D, generator=g, requires_grad=True)
    angles = torch.randn(TABLES[table], generator=g, dtype=torch.float64)
    cos = angles.cos().float().requires_grad_()
    sin = angles.sin().float().requires_grad_()
    weights = torch.randn(3, B, H, N, D, generator=g)
    x = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    shape = (B, H, N, D // 2)
    out = kernels.turn_pairs(x, cos.expand(shape), sin.expand(shape), 0b011, layout == "interleaved", inverse)
    (out * weights).sum().backward()

    qkv64 = qkv.detach().double().requires_grad_()
    cos64, sin64 = cos.detach().double().requires_grad_(), sin.detach().double().requires_grad_()
    x64 = qkv64.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    s = -sin64 if inverse else sin64
    R = torch.stack((torch.stack((cos64, -s), -1), torch.stack((s, cos64), -1)), -2).expand(*shape, 2, 2)
    P = D // 2
    index = torch.arange(D).view(P, 2) if layout == "interleaved" else torch.arange(D).view(2, P).T
    turned = [(R @ x64[i][..., index].unsqueeze(-1)).squeeze(-1) for i in (0, 1)]
    ref = torch.zeros_like(x64)
    for i in (0, 1):
        ref[i][..., index] = turned[i]
    ref[2] = x64[2]
    (ref * weights.double()).sum().backward()
    torch.testing.assert_close(qkv.grad.double(), qkv64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cos.grad.double(), cos64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sin.grad.double(), sin64.grad, rtol=1e-5, atol=1e-5)


def test_the_pytorch_path_is_the_kernels_arithmetic(kernel, monkeypatch):
    """VIT_ROPE_FUSED=torch (or a device without Triton) computes the same, through the same op."""
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, N, 3 * H * D, generator=g)
    angles = torch.randn(B, H, N, D // 2, generator=g)
    fused = kernels.turn_qkv(qkv, H, "qk", cos=angles.cos(), sin=angles.sin(), layout="half")
    monkeypatch.setattr(kernels, "FUSED", "torch")
    plain = kernels.turn_qkv(qkv, H, "qk", cos=angles.cos(), sin=angles.sin(), layout="half")
    for a, b in zip(fused, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def random_rotations(shape, size, generator):
    """Orthogonal ``(*shape, size, size)`` blocks in float64 (exponentials of random skew matrices)."""
    A = torch.randn(*shape, size, size, generator=generator, dtype=torch.float64)
    return torch.linalg.matrix_exp(A - A.mT)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("size", [4, 5])  # 12 channels: 3 blocks of 4, or 2 of 5 and 2 channels unturned
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("transpose", [False, True])
def test_turn_blocks_is_each_blocks_product(kernel, table, size, dtype, transpose):
    """Each block of channels times its token's matrix (or its transpose), channels past the last block and the
    slices not turned copied; against float64 products of the same (rounded) input."""
    g = torch.Generator().manual_seed(4)
    count = D // size
    R = random_rotations(TABLES[table][:-1] + (count,), size, g)
    qkv = torch.randn(B, N, 3 * H * D, generator=g).to(dtype)
    x = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    out = kernels.turn_blocks(x, R.float().expand(B, H, N, count, size, size), 0b101, transpose)
    x64, Rx = x.double(), R.expand(B, H, N, count, size, size)
    Rx = Rx.mT if transpose else Rx
    tol = dict(rtol=0, atol=5e-6) if dtype == torch.float32 else dict(rtol=2**-7, atol=2**-12)
    for i in range(3):
        want = x64[i].clone()
        if i != 1:
            blocks = x64[i][..., : count * size].unflatten(-1, (count, size)).unsqueeze(-1)
            want[..., : count * size] = (Rx @ blocks).squeeze(-1).flatten(-2)
        assert out[i].dtype == dtype and out[i].stride() == x[i].stride()
        torch.testing.assert_close(out[i].double(), want, **tol)


@pytest.mark.parametrize("table", TABLES)
@pytest.mark.parametrize("transpose", [False, True])
def test_block_gradients_reach_the_input_and_the_blocks(kernel, table, transpose):
    g = torch.Generator().manual_seed(5)
    size, count = 5, 2
    R = random_rotations(TABLES[table][:-1] + (count,), size, g).float().requires_grad_()
    qkv = torch.randn(B, N, 3 * H * D, generator=g, requires_grad=True)
    weights = torch.randn(3, B, H, N, D, generator=g)
    x = qkv.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    out = kernels.turn_blocks(x, R.expand(B, H, N, count, size, size), 0b011, transpose)
    (out * weights).sum().backward()
    qkv64 = qkv.detach().double().requires_grad_()
    R64 = R.detach().double().requires_grad_()
    x64 = qkv64.view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)
    Rx = R64.expand(B, H, N, count, size, size)
    Rx = Rx.mT if transpose else Rx
    parts = []
    for i in range(3):
        if i == 2:
            parts.append(x64[i])
            continue
        turned = (Rx @ x64[i][..., : count * size].unflatten(-1, (count, size)).unsqueeze(-1)).squeeze(-1)
        parts.append(torch.cat((turned.flatten(-2), x64[i][..., count * size :]), dim=-1))
    (torch.stack(parts) * weights.double()).sum().backward()
    torch.testing.assert_close(qkv.grad.double(), qkv64.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(R.grad.double(), R64.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axes, prefix, per_sample", [(2, 1, False), (2, 0, True), (3, 2, False)])
def test_the_pape_kernel_is_its_pytorch_path(kernel, monkeypatch, dtype, axes, prefix, per_sample):
    """q', k', v' of the kernel against the op's PyTorch path (pape_extend, whose math tests/test_tables.py holds
    against a double loop), forward and backward: columns within float32's rounding (bf16: within one unit of the
    value, the remainder carrying the rest), and the gradients of every input."""
    g = torch.Generator().manual_seed(6)
    M, d = 5, 16
    qkv = torch.randn(B, N, 3 * H * d, generator=g).to(dtype).requires_grad_()
    coords = torch.randn((B if per_sample else 1), N, axes, generator=g).mul(4).expand(B, N, axes)
    curvature, gain = torch.randn(H, d, M, generator=g), torch.randn(H, d, axes, generator=g)
    W = torch.randn(H, M, axes, generator=g)
    outer = (W.unsqueeze(-1) * W.unsqueeze(-2)).flatten(-2)
    params = [t.requires_grad_() for t in (curvature, gain, outer)]
    weights = torch.randn(3, B, H, N, kernels.pape_width(d, axes, dtype), generator=g)

    def run():
        x = qkv.view(B, N, 3, H, d).permute(2, 0, 3, 1, 4)
        out = kernels.pape_qkv(x, coords, *params, prefix)
        grads = torch.autograd.grad((out.float() * weights).sum(), [qkv, *params])
        return out, grads

    fused, fused_grads = run()
    monkeypatch.setattr(kernels, "FUSED", "torch")
    plain, plain_grads = run()
    assert fused.dtype == plain.dtype == dtype and fused.shape == plain.shape
    if dtype == torch.float32:
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    else:  # q, k, v within one unit; each column as value + remainder (q: hi, hi, lo; k: hi, lo, hi) to ~2⁻¹⁶
        E = axes * axes + axes + 1
        torch.testing.assert_close(fused[..., :d].float(), plain[..., :d].float(), rtol=2**-7, atol=0)
        torch.testing.assert_close(fused[..., d + 3 * E :], plain[..., d + 3 * E :], rtol=0, atol=0)  # zeros
        for t, (hi, lo) in ((0, (0, 2)), (1, (0, 1))):

            def whole(out, t=t, hi=hi, lo=lo):
                return (
                    out[t, ..., d + hi * E : d + (hi + 1) * E].double()
                    + out[t, ..., d + lo * E : d + (lo + 1) * E].double()
                )

            torch.testing.assert_close(whole(fused), whole(plain), rtol=2**-14, atol=2**-14)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same backward: the PyTorch path's at these inputs


PAIR_MODELS = [  # every rotary family (pairs, a basis folded into q and k, blocks), the rotary variants, and PaPE
    dict(pos_embed=name) for name, f in FAMILIES.items() if f.rotary and f.min_axes <= 2 <= (f.max_axes or 2)
] + [
    dict(pos_embed="rope", rope_targets="vo"),
    dict(pos_embed="rope_mixed", rope_targets="qkvo"),
    dict(pos_embed="rope", rope_layout="half", rope_options=dict(p=0.5)),
    dict(pos_embed="rope", rope_scaling="yarn"),
    dict(pos_embed="rope", patch_drop_rate=0.5),
    dict(pos_embed="liere", rope_targets="vo", rope_options=dict(block_size=5, per_head=True, per_layer=True)),
    dict(pos_embed="liere", patch_drop_rate=0.5),
    dict(pos_embed="pape"),
    dict(pos_embed="pape", patch_drop_rate=0.5, reg_tokens=2),
]


@pytest.mark.parametrize("kwargs", PAIR_MODELS, ids=lambda k: "-".join(str(v) for v in k.values()))
def test_a_model_through_the_kernel_equals_the_pytorch_path(kernel, monkeypatch, kwargs):
    """Logits and every parameter's gradient (learned tables too) agree in float32; under bf16 autocast q, k and v
    reach attention in bfloat16."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny", depth=2, embed_dim=48, num_heads=2, img_size=16, patch_size=4,
                              num_classes=3, **kwargs)  # fmt: skip
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randn(2, 3, 32, 32)  # twice the training size: YaRN's table scales as it turns

    def run():
        torch.manual_seed(1)  # the same tokens dropped
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    fused_out, fused_grads = run()
    monkeypatch.setattr(kernels, "FUSED", "torch")
    ref_out, ref_grads = run()
    torch.testing.assert_close(fused_out, ref_out, rtol=1e-4, atol=1e-5)
    assert fused_grads.keys() == ref_grads.keys()
    for n in ref_grads:
        torch.testing.assert_close(fused_grads[n], ref_grads[n], rtol=1e-3, atol=1e-5, msg=n)


# Each op on q, k, v (S=3, B=3, H=1, N=1, d) in two layouts of one float32 storage of 2**31 + 2**31 / 1024 elements
# (8 GiB reserved, barely touched): samples 2**30 + 32 elements apart (the qkv projection's layout: sample 2 starts
# past 2**31), then q, k and v that far apart (a contiguous (3, B, heads, N, d) tensor's): the kernel against the
# op's PyTorch path, which indexes in int64. A kernel whose offsets wrap in int32 reads or writes another address: a
# segfault under the interpreter, an illegal access on a GPU, hence a subprocess.
FAR_OFFSETS = """
import sys
import torch
from vit_rope import kernels

device, step, d = sys.argv[1], 2**30 + 32, 8
store = torch.empty(2 * step + 3 * d, device=device)
g = torch.Generator().manual_seed(0)
for b in range(3):
    store[b * step : b * step + 3 * d] = torch.randn(3 * d, generator=g)
layouts = {
    "samples": store.as_strided((3, 3, 1, 1, d), (d, step, d, 3 * d, 1)),
    "slices": store.as_strided((3, 3, 1, 1, d), (step, d, d, d, 1)),
}
angles = torch.randn(3, 1, 1, d // 2, generator=g).to(device)
blocks = torch.linalg.matrix_exp(torch.randn(3, 1, 1, d // 2, 2, 2, generator=g)).to(device)
coords = torch.randn(3, 1, 2, generator=g).to(device)
curvature, gain = torch.randn(1, d, 3, generator=g).to(device), torch.randn(1, d, 2, generator=g).to(device)
outer = torch.randn(1, 3, 4, generator=g).to(device)
for layout, x in layouts.items():
    ops = {
        "turn_pairs": lambda: kernels.turn_pairs(x, angles.cos(), angles.sin(), 0b111, True, False),
        "turn_blocks": lambda: kernels.turn_blocks(x, blocks, 0b111, False),
        "pape_qkv": lambda: kernels.pape_qkv(x, coords, curvature, gain, outer, 0),
    }
    for name, op in ops.items():
        kernels.FUSED = "triton" if device == "cpu" else "auto"
        assert kernels._launches_kernel(x), "the kernel is not what runs"
        fused = op()
        kernels.FUSED = "torch"
        plain = op()
        torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4, msg=name)
        print(layout, name, "ok", flush=True)
"""


def check_far_offsets(device: str) -> None:
    """FAR_OFFSETS run in a subprocess on ``device``: it exits cleanly, every op in both layouts equal to its
    PyTorch path."""
    env = {**os.environ, "VIT_ROPE_FUSED": "triton" if device == "cpu" else "auto"}
    env["TRITON_INTERPRET"] = "1" if device == "cpu" else "0"
    run = subprocess.run([sys.executable, "-c", FAR_OFFSETS, device], env=env, capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, f"exit {run.returncode}: {run.stdout}{run.stderr[-2000:]}"
    ops = ("turn_pairs", "turn_blocks", "pape_qkv")
    assert run.stdout.split() == [w for layout in ("samples", "slices") for op in ops for w in (layout, op, "ok")]


def test_the_kernels_reach_samples_past_2_31_elements():
    """Offsets past 2**31 elements (a large video batch: the qkv projection of 4 GiB of bf16) reach each sample's
    own q, k and v in every kernel (their program ids are int64): each op equals its PyTorch path."""
    check_far_offsets("cpu")
