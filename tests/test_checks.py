"""vit_rope/checks.py: bad input is one clear error naming what to change (dtype, an empty batch, channels, sizes
the patch does not divide, a clip given an image model, a head too small for the encoding, a token pool without a
class token), and a timm too old for the models (at import)."""

import subprocess
import sys

import pytest
import timm
import torch

from tests.helpers import tiny


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


def test_reset_classifier_token_pool_needs_a_class_token():
    model = tiny(class_token=False, global_pool="avg")
    with pytest.raises(ValueError, match="global_pool='token' needs class_token=True"):
        model.reset_classifier(10, "token")
    model.reset_classifier(10, "max")
    assert model.global_pool == "max"


def test_input_on_another_device_or_without_pixels_is_one_clear_error():
    model = tiny().eval()
    with pytest.raises(ValueError, match="input is on meta but the model's weights are on cpu"):
        model(torch.randn(1, 3, 32, 32, device="meta"))
    with pytest.raises(ValueError, match="has no pixels"):  # was the convolution's "padded input size" error
        model(torch.randn(1, 3, 0, 32))
    video = tiny("vit_rope3d_tiny", img_size=32, num_frames=2, tubelet_size=1).eval()
    with pytest.raises(ValueError, match="input is on meta"):
        video(torch.randn(1, 3, 2, 32, 32, device="meta"))


@pytest.mark.parametrize("x", [None, [[0.0]], "image"])
def test_input_that_is_not_a_tensor_is_one_clear_error(x):
    """(before: AttributeError "'list' object has no attribute 'ndim'")"""
    with pytest.raises(ValueError, match="pass a torch tensor"):
        tiny()(x)


def test_a_numpy_array_is_not_mistaken_for_a_tensor_on_another_device():
    """(before: "input is on cpu but the model's weights are on cpu": NumPy 2's arrays have a .device too)"""
    np = pytest.importorskip("numpy")
    with pytest.raises(ValueError, match="numpy.ndarray; pass a torch tensor, e.g. torch.from_numpy"):
        tiny()(np.zeros((1, 3, 32, 32), dtype=np.float32))


@pytest.mark.parametrize("img_size", [0, -32, (32,), (32, 32, 32), 32.0, (32, True)])
def test_an_image_size_that_is_not_one_or_two_whole_numbers_is_one_error(img_size):
    """(before: (32,) was an IndexError inside timm's PatchEmbed; 0 and -32 timm's own words)"""
    with pytest.raises(ValueError, match=r"img_size=.*give a whole number of pixels, or two \(height, width\)"):
        tiny(img_size=img_size)


def test_an_image_size_of_numpy_ints_or_a_torch_size_is_taken():
    np = pytest.importorskip("numpy")
    for img_size in ((np.int64(32), np.int64(32)), torch.Size([32, 32])):  # (a bare np.int64: timm's builder refuses)
        assert tiny(img_size=img_size).patch_embed.grid_size == (2, 2)


@pytest.mark.parametrize("init_values", [float("nan"), float("inf")])
def test_layer_scale_init_values_must_be_finite(init_values):
    """(before: a model whose every output was NaN)"""
    with pytest.raises(ValueError, match="init_values=.* must be a finite number"):
        tiny(init_values=init_values)


def test_pooling_of_an_unknown_kind_is_one_error_not_the_tokens_unpooled():
    model = tiny(img_size=32).eval()
    features = model.forward_features(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="global_pool='map': choose"):
        model.pool(features, "map")
    assert model.pool(features, "avg").shape == (1, 192)


def test_a_timm_older_than_1_0_31_is_one_import_error(monkeypatch):
    """timm 1.0.30 and older record no model arguments for save_for_hf (a saved folder would rebuild another model),
    and below 1.0.21 the trunk does not build: the check names the version to install."""
    from vit_rope.checks import check_timm

    check_timm()  # the installed timm passes
    monkeypatch.delattr(timm.models, "get_model_args")
    monkeypatch.setattr(timm, "__version__", "1.0.30")
    with pytest.raises(ImportError, match=r"this Python has timm 1.0.30, without it: pip install -U 'timm>=1.0.31'"):
        check_timm()


def test_importing_vit_rope_with_an_older_timm_fails_before_any_model_registers():
    """In a fresh process whose timm lacks 1.0.31's recording, ``import vit_rope`` is that ImportError, raised before
    the models register (so nothing half-built is left in timm's registry)."""
    script = (
        "import timm, timm.models; del timm.models.get_model_args\n"
        "try:\n    import vit_rope\nexcept ImportError as e:\n    print('refused:', e)\n"
        "print('registered:', 'vit_rope_small' in timm.list_models())"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "refused: vit-rope needs timm>=1.0.31" in out and "registered: False" in out
