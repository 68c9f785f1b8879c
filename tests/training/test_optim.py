"""vit_rope/training/optim.py: timm's optimizer with layer-wise LR decay, a saved state resumed with this device's
implementation, mixup and cutmix feeding the loss soft targets."""

import pytest
import timm
import torch

import train
from tests.test_train import TINY  # noqa: F401 (shared settings, helpers and fixtures)
from vit_rope.training import optim, resume


def test_a_saved_optimizer_state_resumes_with_this_devices_implementation():
    """Fused AdamW (a CUDA run's) and torch's default (a CPU run's) compute the same update: a state saved by either
    resumes under the other, taking this run's implementation rather than the saved one."""
    model = torch.nn.Linear(3, 2)
    settings, _ = train.parse_config(["--opt", "adamw"])
    optimizer, _ = optim.make_optimizer(model, settings, steps=1)
    assert not any(g.get("fused") for g in optimizer.param_groups)  # the CPU: torch's default
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    saved = optimizer.state_dict()
    for g in saved["param_groups"]:
        g["fused"], g["foreach"] = True, False  # as a CUDA run saves it
    assert resume.optimizer_problem(model, settings, saved) == ""
    resumed, _ = optim.make_optimizer(model, settings, steps=1)
    resumed.load_state_dict(optim.own_implementation(saved, resumed))
    assert [g["fused"] for g in resumed.param_groups] == [g["fused"] for g in optimizer.param_groups]
    assert saved["param_groups"][0]["fused"] is True  # (the saved state itself is left as it was)


@pytest.mark.parametrize("decay", [0.65, 0.75])
def test_layer_decay_scales_each_blocks_lr_by_timms_rule(decay):
    """BEiT's rule as timm applies it: with L the last layer id, a parameter of layer i trains at lr · decay^(L - i);
    the stem (tokens, patch embedding) is layer 0, block b layer b + 1 (the final norm with the last block), the head
    and a learned position encoding (one tensor for every layer) layer L; the same scales as timm gives its own RoPE
    ViT."""
    depth = 3
    model = timm.create_model("vit_rope_mixed_tiny", depth=depth, img_size=32, patch_size=8, num_classes=4)
    settings, _ = train.parse_config(["--layer-decay", str(decay), "--lr", "0.01", "--warmup-epochs", "0"])
    optimizer, scheduler = optim.make_optimizer(model, settings, steps=10)
    last = depth + 1

    def layer(name: str) -> int:
        if name.startswith("blocks."):
            return int(name.split(".")[1]) + 1
        return {"norm": depth, "head": last, "position_encoding": last}.get(name.split(".")[0], 0)

    scale = {id(p): g["lr_scale"] for g in optimizer.param_groups for p in g["params"]}
    ours = {n: scale[id(p)] for n, p in model.named_parameters()}
    for name, s in ours.items():
        assert s == pytest.approx(decay ** (last - layer(name))), name
    scheduler.step_update(0)
    for g in optimizer.param_groups:
        assert g["lr"] == pytest.approx(settings.lr * g["lr_scale"])
    # timm's own RoPE ViT (Eva) under timm's optimizer factory: the same scale for every parameter both have
    eva = timm.create_model("vit_small_patch16_rope_mixed_224", depth=depth, num_classes=4)
    theirs = timm.optim.create_optimizer_v2(eva, "adamw", lr=0.01, layer_decay=decay)
    scale = {id(p): g["lr_scale"] for g in theirs.param_groups for p in g["params"]}
    rename = {"gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma", "rope.freqs": "position_encoding.family.frequencies"}
    shared = 0
    for name, p in eva.named_parameters():
        for old, new in rename.items():
            name = name.replace(old, new)
        if name in ours:
            shared += 1
            assert ours[name] == pytest.approx(scale[id(p)]), name
    assert shared >= len(ours) - 1  # (our APE-free trunk lacks nothing of theirs but its pos_embed)


@pytest.mark.parametrize("value", ["0", "1.5", "-0.7"])
def test_layer_decay_outside_zero_to_one_is_refused(value):
    with pytest.raises(SystemExit, match=r"layer_decay must be in \(0, 1\]"):
        train.parse_config(["--layer-decay", value])


def test_mixup_and_cutmix_feed_soft_targets(tmp_path, monkeypatch):
    """--mixup/--cutmix run timm's Mixup on every batch, and the loss gets its mixed targets."""
    mixed, fed = [], []

    class SpyMixup(optim.Mixup):
        def __call__(self, x, target):
            x, soft = super().__call__(x, target)
            mixed.append(soft)
            return x, soft

    class SpyLoss(optim.SoftTargetCrossEntropy):
        def forward(self, logits, target):
            fed.append(target)
            return super().forward(logits, target)

    monkeypatch.setattr(optim, "Mixup", SpyMixup)
    monkeypatch.setattr(optim, "SoftTargetCrossEntropy", SpyLoss)
    args = [*TINY, "--models", "vit_rope_tiny", "--rope-scaling", "none", "--epochs", "1", "--label-smoothing", "0"]
    train.main([*args, "--mixup", "0.8", "--cutmix", "1.0", "--output", str(tmp_path)])
    assert len(mixed) == 3  # 96 samples / batch 32
    assert all(f is m for f, m in zip(fed, mixed, strict=True))
    for soft in mixed:
        assert soft.shape == (32, 8)
        torch.testing.assert_close(soft.sum(1), torch.ones(32))
        assert (soft.amax(1) < 1).any()  # without label smoothing only mixing makes a row soft (not one-hot)
