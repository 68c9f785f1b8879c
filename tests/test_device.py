"""The models on the device pytest's ``--device`` names (tests/conftest.py; cpu by default, as CI runs them): every
image kind's tiny model trains a step there under bfloat16 autocast, and its float32 logits and gradients there are
the CPU's, for images and for a NaFlex batch with padding. On a GPU this is the fused rotation kernel
(vit_rope/kernels.py), the attention kernels and masks of CUDA against the CPU's PyTorch path:

    TRITON_INTERPRET=0 pytest --device cuda tests/test_device.py

On the CPU the comparisons are of the CPU with itself: they still run every kind's path on it. This module needs
torch, timm and pytest alone (no hypothesis: a GPU image may lack it); train.py's part skips where its packages are
missing."""

import copy

import pytest
import timm
import torch
import torch.nn.functional as F
from timm.data.naflex_transforms import patchify_image

from vit_rope import FAMILIES
from vit_rope.training import optim

KINDS = ["ape", *sorted(n for n, f in FAMILIES.items() if f.min_axes <= 2)]  # every image pos_embed


@pytest.fixture
def exact_float32():
    """float32 convolutions in float32 on a GPU (cuDNN takes TF32 by default, ~1e-3 off; cuBLAS's matmuls keep
    float32 unless torch.set_float32_matmul_precision says otherwise)."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_rope_tiny", pos_embed=kind, depth=2, img_size=32, patch_size=8, num_classes=5)


def close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    """``got`` (any device) within ``tol`` of ``want``'s largest magnitude, everywhere."""
    error = (got.detach().float().cpu() - want.detach().float().cpu()).abs().max().item()
    scale = want.detach().abs().max().item()
    assert error <= tol * max(scale, 1e-6), f"{what}: max error {error:.3g} against a largest value {scale:.3g}"


def naflex_batch(images: torch.Tensor, patch: int = 8) -> dict[str, torch.Tensor]:
    """Images as a NaFlex batch; the second sample's last rows padding (an image of fewer patches)."""
    items = [patchify_image(image, (patch, patch)) for image in images]
    batch = {
        "patches": torch.stack([p for p, _, _ in items]),
        "patch_coord": torch.stack([c for _, c, _ in items]),
        "patch_valid": torch.stack([v for _, _, v in items]),
    }
    n = batch["patch_valid"].shape[1]
    batch["patch_valid"][1, n // 2 :] = False
    batch["patches"][1, n // 2 :] = 0
    return batch


def to(x, device: torch.device):
    if isinstance(x, dict):
        return {k: v.to(device) for k, v in x.items()}
    return x.to(device)


@pytest.mark.parametrize("kind", KINDS)
def test_a_train_step_under_bf16_autocast(kind, device):
    """Forward, backward and an AdamW step under bfloat16 autocast on the device: finite loss and gradients, every
    weight of attention given one, and logits near the float32 ones (bfloat16's rounding, two blocks)."""
    model = tiny(kind).to(device).train()
    x = torch.randn(4, 3, 32, 32, device=device)
    y = torch.arange(4, device=device) % 5
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name
    assert model.blocks[0].attn.qkv.weight.grad is not None and model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    optimizer.step()
    model.eval()
    with torch.no_grad():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            low = model(x)
        full = model(x)
    close(low, full, 0.05, f"{kind}: bfloat16 logits against float32")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("naflex", [False, True], ids=["images", "naflex"])
def test_float32_logits_and_gradients_are_the_cpus(kind, naflex, device, exact_float32):
    """The same weights and input in float32 on the device and on the CPU: the same logits and the same gradients
    of the attention weights (the rotation's backward)."""
    cpu = tiny(kind)
    there = copy.deepcopy(cpu).to(device)
    images = torch.randn(2, 3, 32, 32)
    x = naflex_batch(images) if naflex else images
    outputs = {}
    for where, model in (("cpu", cpu), ("device", there)):
        model.train()  # (no dropout in these models: train mode runs the training path)
        logits = model(to(x, next(model.parameters()).device))
        logits.square().mean().backward()
        outputs[where] = logits, model.blocks[-1].attn.qkv.weight.grad, model.blocks[0].attn.qkv.weight.grad
    (logits, *grads), (want, *wanted) = outputs["device"], outputs["cpu"]
    close(logits, want, 1e-4, f"{kind}: logits")
    for got, want_grad in zip(grads, wanted, strict=True):
        close(got, want_grad, 1e-3, f"{kind}: a qkv gradient")


def test_train_py_fuses_adamw_and_pins_batches_on_cuda(device):
    """train.py's optimizer is torch's fused AdamW where the weights are on a CUDA device (its default elsewhere),
    and updates as the CPU's does; its loaders pin their batches for a CUDA device only."""
    train = pytest.importorskip("train", reason="train.py's packages (timm, pyyaml, safetensors, tqdm) are missing")
    settings, _ = train.parse_config(["--device", str(device), "--opt", "adamw", "--lr", "0.01"])
    models = {"cpu": tiny("axial"), "device": tiny("axial").to(device)}
    optimizers = {k: optim.make_optimizer(m, settings, steps=10)[0] for k, m in models.items()}
    fused = [bool(g.get("fused")) for g in optimizers["device"].param_groups]
    assert fused == [device.type == "cuda"] * len(fused)
    for step in range(3):
        for where, model in models.items():
            for i, p in enumerate(model.parameters()):
                g = torch.Generator().manual_seed(step * 1000 + i)
                p.grad = torch.randn(p.shape, generator=g).to(p.device)
            optimizers[where].step()
    for (name, p), q in zip(models["cpu"].named_parameters(), models["device"].parameters(), strict=True):
        close(q, p, 1e-5, name)
    loader = train.make_loader(torch.utils.data.TensorDataset(torch.zeros(4, 1)), settings, True, 0)
    assert loader.pin_memory == (device.type == "cuda")


def test_the_kernels_reach_samples_past_2_31_elements_on_the_device(device):
    """tests/test_kernels.py's offsets past 2**31 elements, through the compiled kernels of the GPU (an illegal
    memory access there if an offset wrapped in int32)."""
    if device.type != "cuda":
        pytest.skip("the kernels run on CUDA tensors; tests/test_kernels.py runs this check on the CPU's interpreter")
    from tests.test_kernels import check_far_offsets

    check_far_offsets("cuda")
