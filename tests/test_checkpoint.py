"""vit_rope/checkpoint.py: weights from timm's own models (DeiT-III, RoPE-ViT, RoPE-ViT's "+ APE" under the tags
``vit_rope{,_mixed}_*.naver_ape_in1k``, and DINOv3's ViTs under ``vit_rope_*.dinov3{,_qkvb}_lvd1689m``) load with
equal outputs, offline: timm's model with random weights, its state dict through our pretrained path; our own
checkpoints at other sizes and classes, APE resampling, other input channels, and checkpoints of another model refused
naming the keys."""

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

import vit_rope  # registers the models
from tests.helpers import save, tiny


def _randomize(model):
    """Weights of order one everywhere (incl. LayerScale and head) so that logits really test the mapping."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.02 if p.ndim > 1 else 0.5))
        model.head.weight.mul_(20)
    return model


@pytest.mark.parametrize(
    "timm_name,ours,size",
    [
        ("deit3_{}_patch16_224", "vit_ape_{}", "small"),
        ("vit_{}_patch16_rope_224", "vit_rope_{}", "small"),
        ("vit_{}_patch16_rope_mixed_224", "vit_rope_mixed_{}", "small"),
        ("deit3_{}_patch16_224", "vit_ape_{}", "base"),
        ("vit_{}_patch16_rope_224", "vit_rope_{}", "base"),
        ("vit_{}_patch16_rope_mixed_224", "vit_rope_mixed_{}", "base"),
        ("deit3_{}_patch16_224", "vit_ape_{}", "large"),
        ("vit_{}_patch16_rope_224", "vit_rope_{}", "large"),
        ("vit_{}_patch16_rope_mixed_224", "vit_rope_mixed_{}", "large"),
        # RoPE-ViT's "+ APE" weights: our family with abs_pos_embed="ape", which their tag asks
        ("vit_{}_patch16_rope_ape_224", "vit_rope_{}.naver_ape_in1k", "small"),
        ("vit_{}_patch16_rope_mixed_ape_224", "vit_rope_mixed_{}.naver_ape_in1k", "small"),
        ("vit_{}_patch16_rope_mixed_ape_224", "vit_rope_mixed_{}.naver_ape_in1k", "base"),
    ],
)
def test_timm_checkpoints_load_with_equal_outputs(timm_name, ours, size, tmp_path):
    # ViT-S whole at the published 224; B and L with 2 blocks at 64 px (the key mapping depends on neither)
    kw = {} if size == "small" else dict(img_size=64, depth=2)
    img = kw.get("img_size", 224)
    theirs = _randomize(timm.create_model(timm_name.format(size), **kw)).eval()
    path = save(theirs, tmp_path / "w.safetensors")
    model = timm.create_model(ours.format(size), pretrained=True, pretrained_cfg_overlay=dict(file=path), **kw).eval()
    x = torch.randn(2, 3, img, img)
    with torch.no_grad():
        ref, out = theirs(x), model(x)
    assert ref.abs().max() > 1.0
    assert (ref - out).abs().max() < 1e-4
    assert (model.pos_embed is None) == (getattr(theirs, "pos_embed", None) is None)  # an APE where theirs has one


def randomized_dinov3(model: torch.nn.Module) -> torch.nn.Module:
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
    theirs = randomized_dinov3(timm.create_model(f"vit_{size}_patch16_{kind}", **depth)).eval()
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
    theirs = randomized_dinov3(timm.create_model("vit_small_patch16_dinov3", depth=1))
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
    for kind, theirs in (("rope", "rope_ape"), ("rope_mixed", "rope_mixed_ape")):  # RoPE-ViT's "+ APE" weights
        cfg = timm.models.get_pretrained_cfg(f"vit_{kind}_base.naver_ape_in1k")
        assert cfg.hf_hub_id == f"timm/vit_base_patch16_{theirs}_224.naver_in1k"
        model = timm.create_model(f"vit_{kind}_small.naver_ape_in1k", depth=1)
        assert model.abs_pos_embed == "ape" and model.pos_embed_type == kind and plain.pos_embed is None


def test_default_cfgs_point_at_published_weights():
    assert (
        timm.create_model("vit_rope_small").pretrained_cfg["hf_hub_id"] == "timm/vit_small_patch16_rope_224.naver_in1k"
    )
    cfg = timm.create_model("vit_ape_base").pretrained_cfg
    assert cfg["hf_hub_id"] == "timm/deit3_base_patch16_224.fb_in1k"
    assert cfg["mean"] == (0.485, 0.456, 0.406) and cfg["input_size"] == (3, 224, 224) and cfg["crop_pct"] == 0.9


def test_own_checkpoint_loads_with_other_classes_and_size(tmp_path):
    src = tiny("vit_ape_tiny", num_classes=10)
    path = save(src, tmp_path / "ape.safetensors")
    dst = tiny("vit_ape_tiny", num_classes=3, img_size=112, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    assert dst.head.weight.shape == (3, 192)
    torch.testing.assert_close(dst.blocks[1].attn.qkv.weight, src.blocks[1].attn.qkv.weight)
    expected = resample_abs_pos_embed(src.pos_embed, [7, 7], [14, 14], num_prefix_tokens=0, antialias=False)
    torch.testing.assert_close(dst.pos_embed, expected)
    # same classes: the head carries over too (timm's convention: the overlay says how many classes the file has)
    same = tiny("vit_ape_tiny", num_classes=10, pretrained=True, pretrained_cfg_overlay=dict(file=path, num_classes=10))
    torch.testing.assert_close(same.head.weight, src.head.weight)
    # timm's load_checkpoint with our filter: the path train.py's --initial-checkpoint takes
    other = tiny("vit_ape_tiny", num_classes=10, img_size=96)
    timm.models.load_checkpoint(other, path, filter_fn=vit_rope.checkpoint_filter_fn)
    torch.testing.assert_close(other.head.weight, src.head.weight)
    assert other.pos_embed.shape == (1, 36, 192)


def test_mixed_checkpoint_roundtrip_keeps_frequencies(tmp_path):
    src = tiny("vit_rope_mixed_tiny")
    path = save(src, tmp_path / "m.safetensors")
    dst = tiny("vit_rope_mixed_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=path), img_size=96)
    torch.testing.assert_close(dst.position_encoding.family.frequencies, src.position_encoding.family.frequencies)


def test_rope_buffers_are_not_in_checkpoints():
    for name in ("vit_rope_tiny", "vit_rope_mixed_tiny"):
        keys = [k for k in tiny(name).state_dict() if k.startswith("position_encoding")]
        assert keys == ([] if name == "vit_rope_tiny" else ["position_encoding.family.frequencies"])
    model = tiny()
    model(torch.randn(1, 3, 64, 64))  # a table is cached now
    assert all("cos" not in k and "sin" not in k for k in model.state_dict())


SMALL = dict(img_size=32, patch_size=8)


@pytest.mark.parametrize(
    "source,target,message",
    [
        (dict(name="vit_ape_tiny"), dict(name="vit_rope_tiny"), r"it has \['pos_embed'\], which the model lacks"),
        (dict(name="vit_rope_tiny"), dict(name="vit_ape_tiny"), r"it lacks the model's \['pos_embed'\]"),
        (
            dict(name="vit_rope_tiny"),
            dict(name="vit_rope_mixed_tiny"),
            r"lacks the model's \['position_encoding.family.frequencies'\]",
        ),
        (dict(depth=2), dict(depth=1), r"it has \['blocks.1.attn.proj.bias', .*\] and 6 more, which the model lacks"),
        (dict(depth=1), dict(depth=2), r"it lacks the model's \['blocks.1.norm1.weight', .*\] and 6 more"),
        (dict(reg_tokens=4), dict(), r"it has \['reg_token'\]"),
        (dict(), dict(reg_tokens=4), r"lacks the model's \['reg_token'\]"),
    ],
)
def test_checkpoint_of_another_model_is_refused_naming_the_keys(source, target, message, tmp_path):
    """timm loads non-strictly when the classifier changes (num_classes=5 here): our filter refuses any key that
    the model has and the checkpoint lacks, or the other way round, except the classifier's; also through
    load_checkpoint, train.py's --initial-checkpoint."""
    path = save(tiny(**{**SMALL, **source}), tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match=f"the checkpoint does not fit the model: .*{message}"):
        tiny(**{**SMALL, **target}, num_classes=5, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    with pytest.raises(ValueError, match=message):
        timm.models.load_checkpoint(tiny(**{**SMALL, **target}), path, filter_fn=vit_rope.checkpoint_filter_fn)


def test_unrelated_checkpoint_is_refused_and_a_missing_head_is_not(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"fc.weight": torch.zeros(3, 3)}, str(path))
    with pytest.raises(ValueError, match=r"lacks the model's \['cls_token', .*it has \['fc.weight'\]"):
        tiny(**SMALL, num_classes=5, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    # a backbone saved without a classifier starts a classifier of its own: the only part that may be missing
    backbone = tiny(**SMALL, num_classes=0)
    model = tiny(**SMALL, num_classes=5, pretrained=True, pretrained_cfg_overlay=dict(file=save(backbone, path)))
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, backbone.blocks[1].mlp.fc2.weight)
    assert model.head.weight.shape == (5, 192)


def test_checkpoint_ape_of_a_grid_that_cannot_be_inferred_errors(tmp_path):
    source = tiny("vit_ape_tiny", img_size=(32, 48), patch_size=8)  # 4x6 = 24 positions: no square
    path = save(source, tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="24 positions: after 0 or 1 prefix rows, neither the model's grid"):
        tiny("vit_ape_tiny", img_size=64, patch_size=8, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    # at the checkpoint's own size it loads, and set_input_size then moves it
    same = tiny(
        "vit_ape_tiny", img_size=(32, 48), patch_size=8, pretrained=True, pretrained_cfg_overlay=dict(file=path)
    )
    torch.testing.assert_close(same.pos_embed, source.pos_embed)


@pytest.mark.parametrize("cls", [True, False])
def test_timm_checkpoint_with_register_rows_in_its_ape_loads(cls, tmp_path):
    """timm's register ViTs keep APE rows for their prefix tokens (cls and registers); they are dropped."""
    kw = dict(img_size=32, patch_size=8, depth=1, reg_tokens=4)
    pool = dict(global_pool="token" if cls else "avg", fc_norm=False)  # a final norm as ours (no fc_norm)
    theirs = timm.create_model("vit_tiny_patch16_224", class_token=cls, init_values=1e-5, **pool, **kw)
    assert theirs.pos_embed.shape[1] == 16 + 4 + cls
    path = save(theirs, tmp_path / "w.safetensors")
    for size in (32, 64):
        ours = timm.create_model(
            "vit_ape_tiny",
            class_token=cls,
            global_pool="token" if cls else "avg",
            pretrained=True,
            pretrained_cfg_overlay=dict(file=path),
            **{**kw, "img_size": size},
        )
        src = theirs.pos_embed[:, 4 + cls :]
        expected = src if size == 32 else resample_abs_pos_embed(src, [8, 8], [4, 4], 0, antialias=False)
        torch.testing.assert_close(ours.pos_embed, expected)


def test_checkpoint_of_other_in_chans_than_rgb_errors(tmp_path):
    path = save(tiny(img_size=32, patch_size=8, in_chans=1), tmp_path / "w.safetensors")
    with pytest.raises(ValueError, match="takes in_chans=1, the model in_chans=3.*create the model with in_chans=1"):
        tiny(img_size=32, patch_size=8, pretrained=True, pretrained_cfg_overlay=dict(file=path))


@pytest.mark.parametrize("in_chans", [1, 4])
def test_pretrained_weights_adapt_to_other_in_chans(in_chans, tmp_path):
    """timm's rule (summed for one channel, tiled and rescaled for more), as timm applies it to DeiT-III."""
    source = tiny(img_size=32, patch_size=8)
    path = save(source, tmp_path / "w.safetensors")
    model = tiny(img_size=32, patch_size=8, in_chans=in_chans, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    expected = timm.models.adapt_input_conv(in_chans, source.patch_embed.proj.weight.detach())
    torch.testing.assert_close(model.patch_embed.proj.weight, expected)
    assert model(torch.randn(1, in_chans, 32, 32)).shape == (1, 1000)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8])
def test_weights_of_an_integer_or_bool_dtype_are_refused_not_cast(dtype, tmp_path):
    model = tiny()
    state = {k: (v > 0) if dtype == torch.bool else (v * 100).to(dtype) for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=f"is {dtype} but the model's is torch.float32"):
        tiny().load_state_dict(state)
    path = tmp_path / "int.safetensors"
    save_file({k: v.contiguous() for k, v in state.items()}, str(path))
    with pytest.raises(ValueError, match=f"is {dtype} but the model's is torch.float32"):  # timm's loader: the same
        tiny(pretrained=True, pretrained_cfg_overlay=dict(file=str(path)))
    # float weights of another precision load as before
    halves = {k: v.half() for k, v in model.state_dict().items()}
    other = tiny()
    other.load_state_dict(halves)
    torch.testing.assert_close(other.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight.half().float())


def test_weights_holding_nan_or_inf_are_refused():
    model = tiny()
    for bad in (float("nan"), float("inf")):
        state = model.state_dict()
        key = "blocks.1.mlp.fc1.weight"
        state[key] = state[key].clone().index_fill_(0, torch.tensor([3]), bad)
        with pytest.raises(ValueError, match="weight blocks.1.mlp.fc1.weight holds NaN or inf"):
            tiny().load_state_dict(state)


@pytest.mark.parametrize("name", sorted(n for n in timm.list_models("vit_*") if n.endswith("_tiny")))
def test_every_model_loads_its_own_weights_through_the_check(name):
    """The load check refuses nothing a fresh model of any family holds (its buffers and parameters are finite)."""
    src = timm.create_model(name, depth=1)
    dst = timm.create_model(name, depth=1)
    dst.load_state_dict(src.state_dict())
    for k, v in dst.state_dict().items():
        torch.testing.assert_close(v, src.state_dict()[k])


def test_a_local_dir_folder_whose_record_names_another_family_is_refused(tmp_path):
    """Weights of LookHere have RoPE's names and shapes: timm's ``local-dir:`` loader would load them into a RoPE model
    (the folder's config.json names it) without a word. The record in model.safetensors's metadata says what they
    are."""
    from vit_rope.training.weights import model_record, save_model_folder, timm_config

    lookhere, rope = tiny("vit_lookhere_tiny", img_size=32), tiny(img_size=32)
    save_model_folder(tmp_path, lookhere, model_record(lookhere, "vit_lookhere_tiny", {}),
                      timm_config(rope, 32, (0.5,) * 3, (0.5,) * 3))  # fmt: skip
    with pytest.raises(ValueError, match="weights of vit_lookhere_tiny .*pos_embed=lookhere.*not of this model"):
        timm.create_model(f"local-dir:{tmp_path}", pretrained=True)
    config = timm_config(rope, 32, (0.5,) * 3, (0.5,) * 3)
    save_model_folder(tmp_path, rope, model_record(rope, "vit_rope_tiny", {}), config)
    loaded = timm.create_model(f"local-dir:{tmp_path}", pretrained=True)
    torch.testing.assert_close(loaded.head.weight, rope.head.weight)


def test_a_new_classifier_is_said_not_silent(tmp_path):
    src = tiny(num_classes=10)
    path = save(src, tmp_path / "m.safetensors")
    with pytest.warns(UserWarning, match="classifier has 10 classes and the model 3: the model's head is newly"):
        tiny(num_classes=3, pretrained=True, pretrained_cfg_overlay=dict(file=path))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the same class count: no word
        tiny(num_classes=10, pretrained=True, pretrained_cfg_overlay=dict(file=path, num_classes=10))
