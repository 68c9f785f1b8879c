"""The compile contract: every kind of model compiles as one graph (``fullgraph=True``) and, once warm, runs again
without recompiling (``set_stance("fail_on_recompile")``), in train and eval mode, with and without bfloat16 autocast.

Dynamo decides both (graph breaks, guards), so the models compile with the ``aot_eager`` backend: Dynamo and AOT
autograd trace them, forward and backward, as inductor would, without generating code. CI runs this file on the
locked torch and on the oldest torch pyproject admits (.ci/run).
"""

import pytest
import timm
import torch
from test_naflex import collate, images

from vit_rope import kernels
from vit_rope.families import FAMILIES

IMAGE_FAMILIES = [n for n, f in FAMILIES.items() if f.min_axes <= 2 <= (f.max_axes or 2)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    limit = torch._dynamo.config.cache_size_limit
    torch._dynamo.config.cache_size_limit = 64  # one graph per (mode, size, autocast, train) is expected, not a bug
    yield
    torch._dynamo.config.cache_size_limit = limit
    torch._dynamo.reset()


def small(pos_embed="rope", name="vit_rope_tiny", **kwargs):
    torch.manual_seed(0)
    args = dict(depth=1, embed_dim=32, num_heads=2, img_size=16, patch_size=4, num_classes=3, reg_tokens=1)
    return timm.create_model(name, pos_embed=pos_embed, **(args | kwargs))


def compiles_once(model, inputs, training=(False, True), autocast=(False, True), modes=(None,), scale=None):
    """Warm the compiled model on every setting, then run each again under fail_on_recompile; train mode also runs
    backward. Returns the compiled outputs of the last pass, one a setting."""
    backend = "aot_eager" if True in training else "eager"  # eval needs no backward graph
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    outputs = []
    for low in autocast:
        for train in training:
            model.train(train)
            for mode in modes:
                if mode is not None:
                    model.position_encoding.set_scaling(mode, scale)
                for x in inputs:
                    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=low):
                        for stance in ("default", "default", "fail_on_recompile"):
                            with torch.compiler.set_stance(stance):
                                out = compiled(x)
                                if train:
                                    out.float().square().mean().backward()
                    outputs.append(out)
    return outputs


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["ape", "sincos", "none", "rope_ape", *IMAGE_FAMILIES])
def test_every_image_model_compiles_once(pos_embed):
    """Each family at the training size (train and eval, float32 and autocast), then at twice it under each of its
    scaling modes (eval, autocast). The first graph (float32, eval) computes what eager computes."""
    model = small(pos_embed)
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        ref = model.eval()(x)
    compiled = compiles_once(model, [x])[0]
    torch.testing.assert_close(compiled, ref, rtol=1e-5, atol=1e-5)
    modes = tuple(model.rope_scaling_modes()) or (None,)
    compiles_once(model, [torch.randn(2, 3, 32, 32)], training=(False,), autocast=(True,), modes=modes)


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["rope", "rope_mixed", "string", "comrope", "liere", "lookhere", "pape"])
def test_token_dropping_compiles_once(pos_embed):
    compiles_once(small(pos_embed, patch_drop_rate=0.5), [torch.randn(2, 3, 16, 16)], training=(True,))


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["none", *IMAGE_FAMILIES])
def test_a_native_batch_compiles_once(pos_embed):
    """A NaFlex dict (grids of three aspect ratios, padding). Its value checks (no empty sample, no negative index)
    run eagerly; compiled, the shapes and dtypes are checked."""
    compiles_once(small(pos_embed), [collate(images(), patch=4)], autocast=(True,))


@pytest.mark.slow
def test_a_native_batch_compiles_once_under_every_scaling_mode():
    """pi and normalized measure each sample's grid in the graph; ntk and yarn take the batch's one scale as given."""
    model = small("rope")
    batch = collate(images(), patch=4)
    compiles_once(model, [batch], training=(False,), autocast=(True,), modes=model.rope_scaling_modes(), scale=2.0)


def test_a_ladder_mode_with_a_scale_drawn_from_the_batch_is_one_error_when_compiled():
    model = small("rope").eval()
    model.set_rope_scaling("ntk")
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    with pytest.raises(Exception, match="rope_scale"):
        compiled(collate(images(), patch=4))


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["rope", "videorope", "ape"])
def test_video_models_compile_once(pos_embed):
    model = small(pos_embed, name="vit_rope3d_tiny", embed_dim=48, num_frames=4)
    compiles_once(model, [torch.randn(2, 3, 4, 16, 16)], autocast=(True,))


@pytest.mark.slow
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rope_targets="vo"),
        dict(rope_targets="qkvo", pos_embed="rope_mixed"),
        dict(rope_shift=1.0, rope_jitter=1.2, rope_rescale=1.3),
        dict(rope_coords="normalized", rope_layout="half"),
        dict(rope_options=dict(p=0.5)),
        dict(pos_embed="string", rope_targets="vo"),
    ],
)
def test_rope_variants_compile_once(kwargs):
    compiles_once(small(**kwargs), [torch.randn(2, 3, 16, 16)], training=(True,), autocast=(True,))


@pytest.mark.slow
@pytest.mark.parametrize("pos_embed", ["rope", "rope_mixed", "string", "liere", "pape"])
def test_the_fused_ops_compile_once(monkeypatch, pos_embed):
    """Through the fused ops (vit_rope::turn_pairs, turn_blocks, pape_qkv, as CUDA tensors take them): Dynamo and
    AOT autograd trace each op and its backward (on CPU its PyTorch path: the interpreter's kernel cannot be
    traced)."""
    monkeypatch.setattr(kernels, "FUSED", "triton")
    compiles_once(small(pos_embed), [torch.randn(2, 3, 16, 16)], autocast=(True,))
