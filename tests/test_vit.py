"""Image models: timm registry and API, sizes, weights from timm's own models, rope targets, export, errors."""

import os
import sys
from dataclasses import replace

import pytest
import timm
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from timm.optim import create_optimizer_v2

import vit_rope  # registers the models
from vit_rope import FAMILIES, Table
from vit_rope.attention import ROPE_TARGETS

# What the registries hold when the tests are collected: the built-in families and tests/conftest.py's, their models
FAMILY_NAMES = sorted(n for n, f in FAMILIES.items() if f.min_axes <= 2)  # image families (video-only: test_video.py)
ROTARY = [n for n in FAMILY_NAMES if FAMILIES[n].rotary]
KINDS = ["ape", *FAMILY_NAMES]  # pos_embed values: an absolute embedding, and every family
IMAGE_NAMES = sorted(timm.list_models(module="vit"))  # every image model the package registered
VIDEO_NAMES = sorted(timm.list_models(module="video"))


def tiny(name="vit_rope_tiny", **kwargs):
    """A two-block model: the same code paths, fast."""
    return timm.create_model(name, depth=kwargs.pop("depth", 2), **kwargs)


def save(model, path):
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def test_every_family_with_a_model_name_has_models_of_every_size():
    named = {f.model_name for f in FAMILIES.values() if f.model_name}
    assert {"rope", "rope_mixed", "test_gained"} <= named  # a built-in family and tests/conftest.py's
    for model in ["ape", *named]:
        assert {f"vit_{model}_{size}" for size in ("tiny", "small", "base")} <= set(IMAGE_NAMES)
    assert {f"vit_{kind}_large" for kind in ("rope", "rope_mixed", "ape")} <= set(IMAGE_NAMES)  # published weights
    assert VIDEO_NAMES == ["vit_rope3d_base", "vit_rope3d_small", "vit_rope3d_tiny"]


def test_a_family_registered_later_gets_its_models_and_pos_embed():
    """Registering a family after the package was imported registers its timm models; the models' pos_embed asks the
    registry when a model is built."""
    from vit_rope.families.axial import Axial

    @vit_rope.register_family
    class Later(Axial):
        """Axial RoPE under another name."""

        name = "test_later"
        model_name = "test_later"

    assert "vit_test_later_small" in timm.list_models("vit_test_later_*")
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        later = tiny("vit_test_later_tiny").eval()
        axial = tiny("vit_rope_tiny", pos_embed="test_later").eval()
        axial.load_state_dict(later.state_dict())
        torch.testing.assert_close(later(x), axial(x), rtol=0, atol=0)
    assert type(later.position_encoding.family) is Later


def test_a_family_of_three_axes_gets_no_image_models():
    """A family that needs (t, h, w) and names models gets no ``vit_<model_name>_*`` image models (they could not
    build: an image has two axes); its models' name still picks it on the video models."""
    from vit_rope.families.videorope import VideoRoPE

    class VideoOnly(VideoRoPE):
        """VideoRoPE under another name, with a model name."""

        name = "test_video_only"
        model_name = "test_video_only_models"

    try:
        vit_rope.register_family(VideoOnly)
        assert timm.list_models("vit_test_video_only*") == []
        with pytest.raises(ValueError, match="takes 3 coordinate axes, not axes=2"):
            tiny("vit_rope_tiny", pos_embed="test_video_only_models")
        video = timm.create_model("vit_rope3d_tiny", depth=1, pos_embed="test_video_only_models")
        assert type(video.position_encoding.family) is VideoOnly
    finally:
        FAMILIES.pop(VideoOnly.name, None)


@pytest.mark.parametrize("name", IMAGE_NAMES)
def test_every_image_model_builds_runs_forward_backward(name):
    model = timm.create_model(name, img_size=64, num_classes=7)
    x = torch.randn(2, 3, 64, 64)
    out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"


def test_parameter_count_matches_timm_vit_s():
    ours = sum(p.numel() for p in timm.create_model("vit_rope_small").parameters())
    theirs = sum(p.numel() for p in timm.create_model("vit_small_patch16_224").parameters())
    assert abs(ours - 22e6) < 0.2e6
    assert abs(ours - theirs) / theirs < 0.01  # timm's ViT-S adds only a cls-slot pos_embed


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [(224, 224), (96, 96), (64, 160), (176, 48)])
def test_unseen_square_and_rectangular_sizes(kind, size):
    model = tiny(pos_embed=kind).eval()
    out, feats = model.forward_intermediates(torch.randn(1, 3, *size), indices=1)
    assert feats[0].shape == (1, 192, size[0] // 16, size[1] // 16)
    assert torch.isfinite(out).all()


def test_rope_positions_follow_the_grid():
    """A rectangular input uses the (rows, cols) grid: the table equals the layer's own table for that grid."""
    model = tiny().eval()
    seen = {}
    orig = model.position_encoding.table

    def spy(grid, *a, **k):
        seen["grid"] = grid
        return orig(grid, *a, **k)

    model.position_encoding.forward = spy
    model(torch.randn(1, 3, 48, 128))
    assert seen["grid"] == (3, 8)


def test_prefix_tokens_have_identity_rows_in_the_table():
    model = tiny(reg_tokens=2).eval()
    t = model.position_encoding.table((4, 4))
    assert t.num_tokens == 3 + 16
    assert torch.equal(t.cos[:3], torch.ones_like(t.cos[:3])) and torch.equal(t.sin[:3], torch.zeros_like(t.sin[:3]))
    assert not torch.equal(t.sin[3:], torch.zeros_like(t.sin[3:]))


def test_rope_buffers_are_not_in_checkpoints():
    for name in ("vit_rope_tiny", "vit_rope_mixed_tiny"):
        keys = [k for k in tiny(name).state_dict() if k.startswith("position_encoding")]
        assert keys == ([] if name == "vit_rope_tiny" else ["position_encoding.family.frequencies"])
    model = tiny()
    model(torch.randn(1, 3, 64, 64))  # a table is cached now
    assert all("cos" not in k and "sin" not in k for k in model.state_dict())


def test_each_rope_target_changes_the_output():
    torch.manual_seed(0)
    base = tiny(num_classes=10)
    with torch.no_grad():  # large LayerScale so that every block matters
        for n, p in base.named_parameters():
            if "gamma" in n:
                p.fill_(1.0)
    state = base.state_dict()
    x = torch.randn(2, 3, 64, 64)
    outs = {}
    for targets in ROPE_TARGETS:
        model = tiny(num_classes=10, rope_targets=targets).eval()
        model.load_state_dict(state)
        outs[targets] = model(x)
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(outs[a], outs[b], atol=1e-6), (a, b)


@pytest.mark.parametrize("heads", [2, 3, 6])
@pytest.mark.parametrize("family", ROTARY)
@pytest.mark.parametrize("targets", ROPE_TARGETS)
def test_attention_equals_a_hand_written_reference(targets, family, heads):
    """q/k/v turned by the table where chosen, attention, the output turned back where 'o' is chosen; random learned
    parameters (STRING's basis, which attention folds into the q and k projections, is then not the identity)."""
    import torch.nn.functional as F

    from vit_rope.attention import Attention, parse_rope_targets
    from vit_rope.position_encoding import RotaryEmbedding

    letters = parse_rope_targets(targets)  # "none" -> ""
    dim, n = 16 * heads, 1 + 12
    attn = Attention(dim, num_heads=heads, rope_targets=targets).double()
    rope = RotaryEmbedding(16, axes=2, num_prefix_tokens=1, family=family, num_heads=heads).double()
    with torch.no_grad():
        for p in rope.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    table = rope.table((3, 4), dtype=torch.float64)
    x = torch.randn(2, n, dim, dtype=torch.float64)
    q, k, v = attn.qkv(x).reshape(2, n, 3, heads, 16).permute(2, 0, 3, 1, 4)
    turn = {c: (lambda t: rope(t, grid=(3, 4))) if c in letters else (lambda t: t) for c in "qkv"}
    o = F.scaled_dot_product_attention(turn["q"](q), turn["k"](k), turn["v"](v))
    if "o" in letters:
        o = rope(o, grid=(3, 4), inverse=True)
    expected = attn.proj(o.transpose(1, 2).reshape(2, n, dim))
    torch.testing.assert_close(attn(x, table), expected, rtol=0, atol=1e-10)


def test_attention_adds_an_attention_bias_to_its_logits():
    """The bias added to the logits, unscaled; also a block of queries at a time, each block's bias built as it is
    attended (large grids), with the same output."""
    from vit_rope import PositionEncoding
    from vit_rope.attention import Attention

    heads, dim, n = 3, 48, 1 + 12
    attn = Attention(dim, num_heads=heads).double()
    bias = PositionEncoding(16, 2, "lookhere", num_heads=heads, num_prefix_tokens=1).table((3, 4), dtype=torch.float64)
    x = torch.randn(2, n, dim, dtype=torch.float64)
    q, k, v = attn.qkv(x).reshape(2, n, 3, heads, 16).permute(2, 0, 3, 1, 4)
    logits = q @ k.mT / 4 + bias.block(0, n)  # 1/sqrt(16), then the bias, unscaled
    o = logits.softmax(-1) @ v
    expected = attn.proj(o.transpose(1, 2).reshape(2, n, dim))
    torch.testing.assert_close(attn(x, bias), expected, rtol=0, atol=1e-10)
    assert not torch.allclose(attn(x, bias), attn(x, Table()))
    lazy = replace(bias, dense=None, block_bytes=4 * heads * n * 5)  # blocks of 5 queries, each built as it comes
    torch.testing.assert_close(attn(x, lazy), expected, rtol=0, atol=1e-10)


def test_forward_hook_on_qkv_sees_the_projection_unrotated():
    """A forward hook on the qkv Linear sees its output as the Linear made it (the rotation never writes into it)."""
    model = tiny().eval()
    seen = []
    model.blocks[0].attn.qkv.register_forward_hook(lambda mod, args, out: seen.append((args[0], out)))
    with torch.no_grad():
        model(torch.randn(2, 3, 32, 32))
    x, out = seen[0]
    torch.testing.assert_close(out, model.blocks[0].attn.qkv(x), rtol=0, atol=0)


def test_backward_hook_on_qkv_sees_the_projection_and_changes_nothing():
    """A backward hook on the qkv Linear gets its output's gradient, and changes no parameter's gradient."""
    x = torch.randn(2, 3, 32, 32)
    model = tiny()
    model(x).square().sum().backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    calls = []
    model.blocks[0].attn.qkv.register_full_backward_hook(lambda mod, grad_in, grad_out: calls.append(grad_out[0]))
    model(x).square().sum().backward()
    assert len(calls) == 1 and calls[0].shape[-1] == 3 * 192
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[n], rtol=1e-5, atol=1e-6, msg=n)


def test_attention_refuses_a_table_of_every_layer():
    from vit_rope.attention import Attention
    from vit_rope.position_encoding import RotaryEmbedding

    rope = RotaryEmbedding(8, axes=2, family="mixed", num_heads=2, depth=2)
    table = rope.table((2, 2))  # (depth, heads, N, dim // 2): one layer must be picked
    for targets in ("qk", "o"):
        with pytest.raises(ValueError, match=r"table.layer\(i\)"):
            Attention(16, 2, rope_targets=targets)(torch.randn(2, 4, 16), table)


def test_vo_rope_refuses_yarn_where_its_temperature_applies():
    model = tiny(rope_targets="vo", rope_scaling="yarn", img_size=32).eval()
    model(torch.randn(1, 3, 32, 32))  # the training grid: YaRN is the identity there
    with pytest.raises(ValueError, match="rope_scaling='yarn' above the training size.*turning v or o"):
        model(torch.randn(1, 3, 64, 64))
    tiny(rope_targets="qk", rope_scaling="yarn", img_size=32).eval()(torch.randn(1, 3, 64, 64))


def test_vo_rope_model_output_is_shift_invariant():
    """With rope_targets='vo' and no q/k rotation, attention output depends only on relative positions."""
    from vit_rope.attention import Attention
    from vit_rope.position_encoding import RotaryEmbedding

    attn = Attention(64, num_heads=2, rope_targets="vo").double()
    rope = RotaryEmbedding(32, axes=2)
    x = torch.randn(2, 12, 64, dtype=torch.float64)
    pos = torch.cartesian_prod(torch.arange(3.0), torch.arange(4.0)).double()
    a = attn(x, rope.table(positions=pos, dtype=torch.float64))
    b = attn(x, rope.table(positions=pos + torch.tensor([5.0, -7.0], dtype=torch.float64), dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    plain = Attention(64, num_heads=2, rope_targets="none").double()
    plain.load_state_dict(attn.state_dict())
    assert not torch.allclose(a, plain(x, rope.table(positions=pos, dtype=torch.float64)))


# --------------------------------------------------------------------------------------- weights from timm
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


def test_rope_scaling_modes_are_the_models_to_say():
    kw = dict(depth=1, img_size=32, patch_size=8)
    assert timm.create_model("vit_ape_tiny", **kw).rope_scaling_modes() == ()
    assert timm.create_model("vit_rope_tiny", **kw).rope_scaling_modes() == ("none", "pi", "ntk", "yarn", "normalized")
    mixed = timm.create_model("vit_rope_mixed_tiny", **kw)
    assert mixed.rope_scaling_modes() == ("none", "pi", "normalized")
    vo = timm.create_model("vit_rope_tiny", rope_targets="vo", **kw)
    assert vo.rope_scaling_modes() == ("none", "pi", "ntk", "normalized")
    with pytest.raises(ValueError, match="'ntk'.*this model.*takes"):
        mixed.set_rope_scaling("ntk")
    vo.set_rope_scaling("pi")
    assert vo.position_encoding.scaling == "pi"


def test_mixed_checkpoint_roundtrip_keeps_frequencies(tmp_path):
    src = tiny("vit_rope_mixed_tiny")
    path = save(src, tmp_path / "m.safetensors")
    dst = tiny("vit_rope_mixed_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=path), img_size=96)
    torch.testing.assert_close(dst.position_encoding.family.frequencies, src.position_encoding.family.frequencies)


# ---------------------------------------------------------------------------------------------- timm API
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_family_follows_the_timm_api(family):
    """Heads, pooling, intermediates and pruning, features_only, and no weight decay on any learned position
    parameter (as the papers train them)."""
    model = tiny(pos_embed=family, num_classes=5, depth=3).eval()
    x = torch.randn(2, 3, 64, 96)
    assert model.forward_head(model.forward_features(x), pre_logits=True).shape == (2, 192)
    learned = {n for n, _ in model.named_parameters() if n.startswith("position_encoding.")}
    assert learned <= model.no_weight_decay()
    final, inter = model.forward_intermediates(x, indices=[0, 2])
    block0 = inter[0]
    assert [t.shape for t in inter] == [(2, 192, 4, 6)] * 2
    model.prune_intermediate_layers(indices=[0])
    torch.testing.assert_close(model.forward_intermediates(x, indices=[0], intermediates_only=True)[0], block0)
    features = timm.create_model("vit_rope_tiny", pos_embed=family, depth=2, features_only=True, out_indices=(1,))
    assert [o.shape for o in features(x)] == [(2, 192, 4, 6)]


@pytest.mark.parametrize("kind", KINDS)
def test_token_dropping_trains_on_kept_tokens_and_is_off_in_eval(kind):
    """patch_drop_rate keeps a random subset of patch tokens in training (each keeps its position: see
    test_families), none in eval, where the model equals one built without it."""
    model = tiny(pos_embed=kind, num_classes=5, patch_drop_rate=0.5).train()
    seen = []
    model.blocks[0].register_forward_hook(lambda mod, args, out: seen.append(out.shape[1]))
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert seen == [1 + 8]  # cls + half of the 16 patches
    assert all(p.grad is not None for p in model.parameters())
    plain = tiny(pos_embed=kind, num_classes=5).eval()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(x), plain(x), rtol=0, atol=0)


def test_timm_api_surface():
    model = tiny(num_classes=5).eval()
    x = torch.randn(2, 3, 64, 96)
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 4 * 6, 192)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 192)
    assert model.get_classifier() is model.head
    model.reset_classifier(11, "avg")
    assert model(x).shape == (2, 11) and model.global_pool == "avg"
    model.reset_classifier(0)
    assert model(x).shape == (2, 192)
    names = dict(model.named_parameters())
    assert model.no_weight_decay() & set(names) == {"cls_token"}
    groups = create_optimizer_v2(model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75)
    assert len(groups.param_groups) > 2
    assert [f["module"] for f in model.feature_info] == ["blocks.0", "blocks.1"]


def test_forward_intermediates_and_pruning():
    model = tiny(depth=4).eval()
    x = torch.randn(1, 3, 64, 64)
    final, inter = model.forward_intermediates(x, indices=[0, 2])
    assert [t.shape for t in inter] == [(1, 192, 4, 4)] * 2
    torch.testing.assert_close(final, model.forward_features(x))
    nlc = model.forward_intermediates(
        x, indices=2, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True
    )
    assert nlc[0][0].shape == (1, 16, 192) and nlc[0][1].shape == (1, 1, 192)
    block1 = model.forward_intermediates(x, indices=[1], intermediates_only=True)[0]
    kept = model.prune_intermediate_layers(indices=[1])
    assert kept == [1] and len(model.blocks) == 2 and isinstance(model.head, torch.nn.Identity)
    torch.testing.assert_close(model.forward_intermediates(x, indices=[1], intermediates_only=True)[0], block1)


def test_features_only():
    model = timm.create_model("vit_rope_tiny", depth=4, features_only=True, out_indices=(1, 3))
    outs = model(torch.randn(1, 3, 64, 96))
    assert [o.shape for o in outs] == [(1, 192, 4, 6)] * 2
    assert model.feature_info.channels() == [192, 192] and model.feature_info.reduction() == [16, 16]


@pytest.mark.parametrize("reentrant", [False, True])
@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_grad_checkpointing_gives_same_output_and_grads(family, reentrant, monkeypatch):
    """Every parameter's gradient, learned frequencies' included, is the same with timm's gradient checkpointing
    (its default, non-reentrant, and the reentrant kind) as without."""
    monkeypatch.setattr(timm.layers.config, "_USE_REENTRANT_CKPT", reentrant)
    model = tiny(pos_embed=family).train()
    x = torch.randn(2, 3, 64, 64)
    torch.manual_seed(0)
    a = model(x)
    a.sum().backward()
    g = {n: p.grad.clone() for n, p in model.named_parameters()}
    assert all(g[n].any() for n in g if n.startswith("position_encoding."))
    model.zero_grad(set_to_none=True)
    model.set_grad_checkpointing(True)
    torch.manual_seed(0)
    b = model(x)
    b.sum().backward()
    torch.testing.assert_close(a, b)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, g[n], msg=n)


def test_set_input_size_resamples_ape_and_moves_rope_reference():
    model = tiny("vit_ape_tiny")
    model.set_input_size(img_size=128)
    assert model.pos_embed.shape == (1, 64, 192)
    rope = tiny("vit_rope_tiny", rope_scaling="pi")
    rope.set_input_size(img_size=128)
    assert rope.position_encoding.ref_grid == (8, 8)


def test_set_input_size_keeps_ape_outputs_at_the_new_size():
    """set_input_size resamples the APE as a forward pass at that size does: outputs there do not change."""
    for size in (64, 16):  # up and down
        model = tiny("vit_ape_tiny", img_size=32, patch_size=8).eval()
        with torch.no_grad():
            model.pos_embed.normal_()  # a far from smooth embedding, where resampling choices show
            x = torch.randn(2, 3, size, size)
            before = model(x)
            model.set_input_size(img_size=size)
            torch.testing.assert_close(model(x), before, rtol=0, atol=0)


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


def test_reset_classifier_token_pool_needs_a_class_token():
    model = tiny(class_token=False, global_pool="avg")
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        model.reset_classifier(10, "token")
    model.reset_classifier(10, "max")
    assert model.global_pool == "max"


def test_dynamic_img_pad_pads_instead():
    model = tiny(dynamic_img_pad=True).eval()
    assert model(torch.randn(1, 3, 70, 50)).shape == (1, 1000)


def test_bf16_autocast_close_to_float32():
    model = tiny("vit_rope_mixed_tiny", num_classes=10).eval()
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        ref = model(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
    assert (out.float() - ref).abs().max() < 0.1 * ref.abs().max() + 0.05


@pytest.mark.slow
@pytest.mark.filterwarnings("error::UserWarning")  # Dynamo warns of what it may trace wrongly (a cached function)
@pytest.mark.parametrize("name", ["vit_rope_tiny", "vit_rope_mixed_tiny"])
def test_torch_compile_matches_eager(name):
    """Compiled, q and k turn in inductor's fused real-arithmetic kernel; eagerly, as complex numbers. Both
    give the same logits and gradients in float32 (every parameter, the learned frequencies too) and under bfloat16
    autocast, where each rounds q and k to bfloat16 once; Dynamo warns of nothing on the way."""
    torch._dynamo.reset()
    model = tiny(name, num_classes=5, reg_tokens=1, embed_dim=64, num_heads=2)
    with torch.no_grad():  # weights of order one, so attention is far from uniform and the rotation shows in logits
        for n, p in model.named_parameters():
            if p.ndim > 1 and not n.startswith("position_encoding"):
                p.copy_(torch.randn_like(p) * p[0].numel() ** -0.5)
            elif n.endswith("gamma"):  # LayerScale, 1e-5 at init
                p.fill_(1.0)
    compiled = torch.compile(model, fullgraph=True)
    x = torch.randn(2, 3, 48, 64)

    def logits_and_grads(f):
        model.zero_grad(set_to_none=True)
        out = f(x)
        out.square().sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    ref, ref_grads = logits_and_grads(model)
    out, grads = logits_and_grads(compiled)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-3, atol=1e-5, msg=n)
    model.eval()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = model(x), compiled(x)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out, ref, rtol=1.6e-2, atol=1.6e-2)  # a bfloat16 ulp or two at logits of order one


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_torch_fx_feature_extraction_matches_eager(kind, checkpointing):
    """timm's fx path (graph node names, feature extractor) traces the model, with gradient checkpointing on too;
    outputs equal eager exactly (attention is a leaf, so a basis folds into qkv as in eager)."""
    from timm.models._features_fx import create_feature_extractor, get_graph_node_names

    model = tiny(pos_embed=kind, num_classes=10, reg_tokens=1).eval()
    with torch.no_grad():  # learned encodings away from their init (where a basis is the identity, exactly)
        for p in (model.position_encoding or torch.nn.Module()).parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.set_grad_checkpointing(checkpointing)
    _, eval_nodes = get_graph_node_names(model)
    fx_model = create_feature_extractor(model, return_nodes=[eval_nodes[-1]])
    x = torch.randn(2, 3, 64, 96)
    with torch.no_grad():
        out = list(fx_model(x).values())[0]
        assert torch.equal(out, model(x))


# ------------------------------------------------------------------------------------------ the batch's route
def python_calls_of_a_block(model, x) -> list[str]:
    """The package's Python functions one transformer block calls on a warm eval forward, in order."""
    package = os.path.dirname(vit_rope.__file__)
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            calls.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_code.co_name}")

    with torch.no_grad():
        model(x)  # warm
        tokens, table, _ = model.embed(x)
        sys.setprofile(profile)
        try:
            model.run_block(0, tokens, table)
        finally:
            sys.setprofile(None)
    return calls


@pytest.mark.parametrize("kind", KINDS)
def test_a_block_is_a_few_python_calls(kind):
    """Block → Attention → table.attend → SDPA: ViT-S with axial RoPE at most 10 in-package calls a block (timm's eva
    takes 7), every kind at most 12 (block rotations turn q and k in two more calls each)."""
    model = timm.create_model("vit_rope_small", pos_embed=kind, img_size=64).eval()
    calls = python_calls_of_a_block(model, torch.randn(1, 3, 64, 64))
    print(f"{kind}: {len(calls)} calls a block: {' → '.join(calls)}")
    assert calls[:5] == ["vit.py:run_block", "tables.py:layer", "vit.py:forward", "attention.py:forward",
                         "tables.py:attend"]  # fmt: skip
    assert len(calls) <= (10 if kind in ("rope", "axial", "ape") else 12), calls


def test_logits_equal_the_code_before_the_frozen_table_core():
    """Fixed-seed logits of every model kind under prefix and register tokens, token dropping, each scaling mode at an
    unseen size, p-RoPE, VO-RoPE and float64 equal those of commit 11c66d5, written by tests/reference.py then."""
    from safetensors.torch import load_file

    from tests.reference import logits

    expected = load_file(os.path.join(os.path.dirname(__file__), "data", "reference_logits.safetensors"))
    got = logits(only=set(expected))
    assert set(got) == set(expected)  # every case the reference holds still runs (families added since are not in it)
    for key, value in expected.items():
        torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-5, msg=key)


# -------------------------------------------------------------------------------------------------- export
@pytest.mark.parametrize("kind", KINDS)
def test_torch_export_matches_eager(kind):
    model = tiny(pos_embed=kind, num_classes=10).eval()
    x = torch.randn(2, 3, 64, 96)
    ep = torch.export.export(model, (x,))
    assert not any("complex" in str(n.target) for n in ep.graph.nodes)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ape", *(n for n in FAMILY_NAMES if FAMILIES[n].onnx)])  # what ONNX has ops for
def test_onnx_export_matches_eager(kind, tmp_path):
    import onnxruntime as ort

    model = tiny(pos_embed=kind, num_classes=10).eval()
    x = torch.randn(2, 3, 64, 96)
    path = os.path.join(tmp_path, "m.onnx")
    torch.onnx.export(model, (x,), path, dynamo=True)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-4)


# -------------------------------------------------------------------------------------------------- errors
def test_input_of_another_dtype_or_an_empty_batch_is_one_clear_error():
    model = tiny().eval()
    with pytest.raises(ValueError, match="dtype torch.float64 but the model's weights are torch.float32"):
        model(torch.randn(1, 3, 32, 32, dtype=torch.float64))
    with pytest.raises(ValueError, match="the batch is empty"):
        model(torch.randn(0, 3, 32, 32))
    with pytest.raises(ValueError, match="dtype torch.uint8; convert it to a float tensor"):
        model(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # under autocast any float input is fine
        assert model(torch.randn(1, 3, 32, 32).bfloat16()).dtype == torch.bfloat16
    assert model.double()(torch.randn(1, 3, 32, 32, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(depth=0), "depth=0 must be an integer of at least 1"),
        (dict(num_heads=2.5), "num_heads=2.5 must be an integer"),
        (dict(reg_tokens=-1), "reg_tokens=-1 must be an integer of at least 0"),
        (dict(mlp_ratio=0.0), "mlp_ratio=0.0 must be positive"),
        (dict(drop_path_rate=1.0), r"drop_path_rate=1.0 must be in \[0, 1\)"),
        (dict(patch_drop_rate=-0.1), r"patch_drop_rate=-0.1 must be in \[0, 1\)"),
        (dict(rope_theta=0.0), "theta=0.0 must be a positive finite number"),
        (dict(rope_theta=float("inf")), "theta=inf must be a positive finite number"),
        (dict(rope_scaling="pi", rope_scale=0.0), "scale=0.0 must be positive"),
        (dict(rope_jitter=0.5), "jitter=0.5 must be at least 1"),
        (dict(rope_coords="pixels"), "coords='pixels'"),
        (dict(pos_embed="comrope", rope_options=dict(block_size=5)), "block_size=5 must be even and divide"),
        (dict(pos_embed="spiral", rope_options=dict(directions=3)), "directions=3 does not fit"),
        (dict(pos_embed="lookhere", rope_options=dict(fov=60)), "fov=60: choose 180, 90 or 45"),
        (dict(pos_embed="liere", rope_options=dict(blocksize=4)), "takes no option blocksize; its options: block_size"),
        (dict(pos_embed="lookhere", rope_targets="vo"), "an attention bias and turns nothing"),
    ],
)
def test_model_arguments_out_of_range_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tiny(**kwargs)


def test_bad_input_errors():
    model = tiny()
    with pytest.raises(ValueError, match="in_chans=1"):
        model(torch.randn(1, 1, 64, 64))
    with pytest.raises(ValueError, match="not divisible by the patch size 16x16.*dynamic_img_pad=True"):
        model(torch.randn(1, 3, 70, 64))
    with pytest.raises(ValueError, match="video clip\\? use a vit_rope3d"):
        model(torch.randn(1, 3, 4, 64, 64))
    with pytest.raises(
        ValueError, match="axial position encoding over 2 axes: dim=2 .*head_dim=2 is embed_dim 12 / 6 heads"
    ):
        timm.create_model("vit_rope_tiny", embed_dim=12, num_heads=6, depth=1)
    with pytest.raises(ValueError, match="layout='halves'.*sets <name>\\)$"):  # no head-dim hint
        tiny(rope_layout="halves")
    with pytest.raises(ValueError, match="pos_embed='learned'"):
        tiny(pos_embed="learned")
    with pytest.raises(ValueError, match="rope_targets='qx'"):
        tiny(rope_targets="qx")
    with pytest.raises(ValueError, match="needs a RoPE pos_embed"):
        tiny("vit_ape_tiny", rope_targets="vo")


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_runs_on_the_meta_device(kind):
    """Built and run on the meta device (shapes without data, as timm's test_model_default_cfgs_non_std does): no
    encoding may branch on a tensor's value there."""
    model = tiny(pos_embed=kind, num_classes=10, device="meta").eval()
    assert model(torch.empty(2, 3, 64, 96, device="meta")).shape == (2, 10)
