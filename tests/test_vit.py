"""vit_rope/vit.py: the image models: timm's registry and API (heads, pooling, intermediates, features, pruning,
gradient checkpointing, set_input_size), sizes, token dropping, compile, fx, export and ONNX, the Python calls of a
block, logits equal to the code before the frozen-table core, an absolute embedding added to every family
(abs_pos_embed), and model arguments out of range."""

import json
import os
import sys

import pytest
import timm
import torch
from timm.layers import build_sincos2d_pos_embed, resample_abs_pos_embed
from timm.optim import create_optimizer_v2

import vit_rope  # registers the models
from tests.helpers import tiny
from vit_rope import FAMILIES

# What the registries hold when the tests are collected: the built-in families and tests/conftest.py's, their models
FAMILY_NAMES = sorted(n for n, f in FAMILIES.items() if f.min_axes <= 2)  # image families (video-only: test_video.py)
KINDS = ["ape", *FAMILY_NAMES]  # pos_embed values: an absolute embedding, and every family
IMAGE_NAMES = sorted(timm.list_models(module="vit"))  # every image model the package registered
VIDEO_NAMES = sorted(timm.list_models(module="video"))


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


def test_a_pretrained_tags_arguments_go_into_timms_config(tmp_path):
    """A tag such as DINOv3's applies model arguments (4 registers, normalised coordinates, rotate-half, ...); timm's
    save_for_hf names the model without its tag, so the tag's arguments are recorded with the caller's: the saved
    folder rebuilds the same model ("local-dir:"), the caller's arguments still winning over the tag's."""
    torch.manual_seed(0)
    model = tiny("vit_rope_small.dinov3_lvd1689m", embed_dim=32, num_heads=2, patch_size=8, num_classes=3,
                 rope_theta=50.0).eval()  # fmt: skip
    timm.models.save_for_hf(model, str(tmp_path), safe_serialization=True)
    args = json.loads((tmp_path / "config.json").read_text())["model_args"]
    assert {k: args[k] for k in ("reg_tokens", "rope_coords", "rope_layout", "rope_theta")} == dict(
        reg_tokens=4, rope_coords="normalized", rope_layout="half", rope_theta=50.0
    )
    loaded = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    assert loaded.num_reg_tokens == 4 and loaded.position_encoding.family.theta == 50.0
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


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


# ------------------------------------------------------------------------------------------- abs_pos_embed
def far_apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((a - b).abs().max() > 0.1 * a.abs().max())


def with_and_without(family: str, abs_pos_embed: str, img_size: int = 32):
    """A two-block model of ``family`` with ``abs_pos_embed`` and one without it, holding the same weights (average
    pooling: an absolute embedding reaches the logits directly, not through LayerScale's 1e-5 alone)."""
    kw = dict(pos_embed=family, img_size=img_size, patch_size=8, num_classes=5, global_pool="avg", depth=1)
    torch.manual_seed(0)
    model = tiny(abs_pos_embed=abs_pos_embed, **kw).eval()
    plain = tiny(**kw).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pos_embed"})  # strict
    return model, plain


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_abs_pos_embed_ape_adds_a_learned_embedding_to_every_family(family):
    """abs_pos_embed="ape" on any family: a learned (1, grid, C) pos_embed, without weight decay, that the tokens add
    and nothing else changes (zeroed, the model is the family alone, to the bit); at another size it is resampled as
    timm's resample_abs_pos_embed resamples it (bicubic, no antialias): the model equals one built at that size with
    the embedding resampled by timm."""
    model, plain = with_and_without(family, "ape")
    assert model.abs_pos_embed == "ape" and model.pos_embed.shape == (1, 16, 192)
    assert "pos_embed" in dict(model.named_parameters()) and "pos_embed" in model.no_weight_decay()
    assert plain.abs_pos_embed == "none" and plain.pos_embed is None
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        model.pos_embed.normal_()
        assert far_apart(model(x), plain(x))
        model.pos_embed.zero_()
        torch.testing.assert_close(model(x), plain(x), rtol=0, atol=0)
        model.pos_embed.normal_()
        larger, _ = with_and_without(family, "ape", img_size=48)
        resampled = resample_abs_pos_embed(model.pos_embed, [6, 6], [4, 4], num_prefix_tokens=0, antialias=False)
        larger.load_state_dict({**model.state_dict(), "pos_embed": resampled})
        x = torch.randn(2, 3, 48, 48)
        torch.testing.assert_close(model(x), larger(x), rtol=0, atol=1e-6)
        assert far_apart(model(x), plain(x))


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_abs_pos_embed_sincos_adds_timms_2d_sincos_to_every_family(family):
    """abs_pos_embed="sincos": no parameter; the model equals the same model with an APE set to timm's 2D sin-cos
    embedding of the grid, at the training size and at another one (built again for each grid, not resampled)."""
    model, plain = with_and_without(family, "sincos")
    assert model.abs_pos_embed == "sincos" and model.pos_embed is None
    assert [n for n, _ in model.named_parameters()] == [n for n, _ in plain.named_parameters()]
    for size in (32, 56):
        ape, _ = with_and_without(family, "ape", img_size=size)
        state = {**model.state_dict(), "pos_embed": build_sincos2d_pos_embed([size // 8] * 2, 192).unsqueeze(0)}
        ape.load_state_dict(state)
        x = torch.randn(2, 3, size, size)
        with torch.no_grad():
            torch.testing.assert_close(model(x), ape(x), rtol=0, atol=1e-6)
            assert far_apart(model(x), plain(x))


def test_abs_pos_embed_and_the_pos_embed_values_that_name_one():
    """Only "ape" and "rope_ape" name an APE (PaPE had one by mistake: "ape" in "pape"); rope_ape is axial RoPE with
    abs_pos_embed="ape" (the same weights and outputs), pos_embed="none" with an APE is vit_ape's model; a second,
    other absolute embedding or an unknown value is one clear error."""
    image = [k for k in vit_rope.vit.pos_embed_names() if k not in FAMILIES or FAMILIES[k].min_axes <= 2]
    with_ape = [k for k in image if tiny(pos_embed=k, depth=1, img_size=32).pos_embed is not None]
    assert with_ape == ["ape", "rope_ape"]
    x = torch.randn(2, 3, 32, 32)
    alias, both = tiny(pos_embed="rope_ape", img_size=32), tiny(abs_pos_embed="ape", img_size=32)
    both.load_state_dict(alias.state_dict())
    torch.testing.assert_close(both.eval()(x), alias.eval()(x), rtol=0, atol=0)
    assert alias.abs_pos_embed == both.abs_pos_embed == "ape"
    ape, none_ape = tiny("vit_ape_tiny", img_size=32), tiny(pos_embed="none", abs_pos_embed="ape", img_size=32)
    none_ape.load_state_dict(ape.state_dict())
    torch.testing.assert_close(none_ape.eval()(x), ape.eval()(x), rtol=0, atol=0)
    assert tiny("vit_ape_tiny", abs_pos_embed="ape").abs_pos_embed == "ape"  # the same one, named twice: fine
    assert tiny(pos_embed="sincos").abs_pos_embed == "sincos"
    with pytest.raises(ValueError, match="abs_pos_embed='learned': choose one of"):
        tiny(abs_pos_embed="learned")
    for pos_embed, other in (("ape", "sincos"), ("rope_ape", "sincos"), ("sincos", "ape")):
        with pytest.raises(ValueError, match=f"pos_embed='{pos_embed}' has its own absolute embedding .* a second"):
            tiny(pos_embed=pos_embed, abs_pos_embed=other)


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
        (dict(rope_jitter=0.5), "jitter=0.5 must be finite and at least 1"),
        (dict(rope_jitter=float("inf")), "jitter=inf must be finite and at least 1"),
        (dict(patch_size=0), "patch_size=0 must be an integer of at least 1"),
        (dict(in_chans=0), "in_chans=0 must be an integer of at least 1"),
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


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_runs_on_the_meta_device(kind):
    """Built and run on the meta device (shapes without data, as timm's test_model_default_cfgs_non_std does): no
    encoding may branch on a tensor's value there."""
    model = tiny(pos_embed=kind, num_classes=10, device="meta").eval()
    assert model(torch.empty(2, 3, 64, 96, device="meta")).shape == (2, 10)


@pytest.mark.parametrize("num_classes", [-3, 2.5, True])
def test_a_negative_or_fractional_class_count_is_one_error(num_classes):
    """(before: num_classes=-3 built a model whose logits were its features)"""
    with pytest.raises(ValueError, match="num_classes"):
        tiny(num_classes=num_classes)
    with pytest.raises(ValueError, match="num_classes"):
        tiny().reset_classifier(num_classes)


@pytest.mark.parametrize("img_size", [0, -16, (32, 0), 2.5])
def test_set_input_size_refuses_a_size_of_no_pixels(img_size):
    model = tiny(img_size=32)
    with pytest.raises(ValueError, match="img_size"):
        model.set_input_size(img_size=img_size)
    assert tuple(model.patch_embed.img_size) == (32, 32)  # unchanged
