"""Fine-tuning as timm users do it: layer-wise LR decay by timm's rule over our block layout, and the fine-tuning
config run end to end from published-style weights (a timm RoPE-ViT-S checkpoint, its head re-initialised)."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import train
from tests.test_train import make_imagefolder


@pytest.mark.parametrize("decay", [0.65, 0.75])
def test_layer_decay_scales_each_blocks_lr_by_timms_rule(decay):
    """BEiT's rule as timm applies it: with L the last layer id, a parameter of layer i trains at lr · decay^(L - i);
    the stem (tokens, patch embedding) is layer 0, block b layer b + 1 (the final norm with the last block), the head
    and a learned position encoding (one tensor for every layer) layer L; the same scales as timm gives its own RoPE
    ViT."""
    depth = 3
    model = timm.create_model("vit_rope_mixed_tiny", depth=depth, img_size=32, patch_size=8, num_classes=4)
    settings, _ = train.parse_config(["--layer-decay", str(decay), "--lr", "0.01", "--warmup-epochs", "0"])
    optimizer, scheduler = train.make_optimizer(model, settings, steps=10)
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


def test_the_finetuning_config_trains_from_a_timm_checkpoint(tmp_path):
    """configs/finetune_rope_vit_s.yaml, offline: timm's RoPE-ViT-S weights from a file (random here), a new head
    for three classes, layer decay, the sweep under every extrapolation mode; small sizes to stay fast."""
    timm_model = timm.create_model("vit_small_patch16_rope_224")
    save_file({k: v.contiguous() for k, v in timm_model.state_dict().items()}, str(tmp_path / "w.safetensors"))
    make_imagefolder(tmp_path / "images", classes=3, per_class=2, size=32)
    rows = train.main([
        "--config", "configs/finetune_rope_vit_s.yaml", "--data-dir", str(tmp_path / "images"), "--no-pretrained",
        "--initial-checkpoint", str(tmp_path / "w.safetensors"), "--img-size", "32", "--eval-sizes", "32", "48",
        "--epochs", "1", "--batch-size", "2", "--workers", "0", "--no-amp", "--output", str(tmp_path / "run"),
    ])  # fmt: skip
    assert {r["rope_scaling"] for r in rows} == {"none", "pi", "ntk", "yarn", "normalized"}
    settings, _ = train.parse_config(["--config", "configs/finetune_rope_vit_s.yaml"])
    assert 0.65 <= settings.layer_decay <= 0.75 and settings.pretrained and settings.models == ("vit_rope_small",)
    tuned = torch.load(tmp_path / "run" / "vit_rope_small" / "checkpoint.pt", weights_only=True)["model"]
    assert tuned["head.weight"].shape == (3, 384)  # a new head for three classes, the trunk timm's
