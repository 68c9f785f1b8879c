"""DINOv3's ViTs (timm's ``vit_*_patch16_dinov3{,_qkvb}``: normalised patch-centre RoPE, base 100, rotate-half, four
registers, LayerScale) load into our trunk under the pretrained tags ``vit_rope_*.dinov3{,_qkvb}_lvd1689m`` with
equal features, offline: timm's model with random weights, its state dict through our pretrained path."""

import pytest
import timm
import torch
from safetensors.torch import save_file

import vit_rope  # noqa: F401  (registers the models)


def randomized(model: torch.nn.Module) -> torch.nn.Module:
    """Weights of order one everywhere (LayerScale, registers and biases included) so that features test the map."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.05 if p.ndim > 1 else 0.5))
    return model


@pytest.mark.parametrize("size", ["small", "base", "large"])
@pytest.mark.parametrize("qkvb", [False, True])
def test_dinov3_weights_load_with_equal_features(size, qkvb, tmp_path):
    """At the pretraining size and at unseen ones (smaller, larger, rectangular): features after the final norm and
    the cls token DINOv3 pools; ViT-B and L with 2 blocks (the key map depends on the depth not at all)."""
    kind = "dinov3_qkvb" if qkvb else "dinov3"
    depth = {} if size == "small" else dict(depth=2)
    theirs = randomized(timm.create_model(f"vit_{size}_patch16_{kind}", **depth)).eval()
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(path))
    ours = timm.create_model(
        f"vit_rope_{size}.{kind}_lvd1689m", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **depth
    ).eval()
    for shape in ((224, 224), (160, 160), (288, 288), (128, 208)):
        x = torch.randn(1, 3, *shape)
        with torch.no_grad():
            ref, out = theirs.forward_features(x), ours.forward_features(x)
        assert ref.abs().max() > 1.0
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4, msg=f"{size} {kind} {shape}")
        torch.testing.assert_close(ours.forward_head(out, pre_logits=True), ref[:, 0], rtol=1e-4, atol=1e-4)


def test_a_loaded_dinov3_model_fine_tunes_under_every_extrapolation_mode(tmp_path):
    theirs = randomized(timm.create_model("vit_small_patch16_dinov3", depth=1))
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(path))
    model = timm.create_model("vit_rope_small.dinov3_lvd1689m", pretrained=True, num_classes=7, depth=1,
                              pretrained_cfg_overlay=dict(file=str(path)))  # fmt: skip
    assert model.head.weight.shape == (7, 384)  # a classifier of its own on the backbone
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    assert model.rope_scaling_modes() == ("none", "pi", "ntk", "yarn", "normalized")
    for mode in model.rope_scaling_modes():
        model.set_rope_scaling(mode)
        with torch.no_grad():
            assert torch.isfinite(model(torch.randn(1, 3, 320, 320))).all(), mode


def test_the_dinov3_tags_say_where_the_weights_are():
    cfg = timm.models.get_pretrained_cfg("vit_rope_base.dinov3_qkvb_lvd1689m")
    assert cfg.hf_hub_id == "timm/vit_base_patch16_dinov3_qkvb.lvd1689m" and cfg.num_classes == 0
    assert timm.models.get_pretrained_cfg("vit_rope_small").hf_hub_id == "timm/vit_small_patch16_rope_224.naver_in1k"
    plain = timm.create_model("vit_rope_small", depth=1)  # the default tag: RoPE-ViT's trunk, no registers
    assert plain.num_prefix_tokens == 1 and plain.norm.eps == 1e-6
