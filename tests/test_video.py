"""Video models: clip lengths and sizes, 3D RoPE layout, starting from image checkpoints, an APE added to every family
(abs_pos_embed), errors."""

import pytest
import timm
import torch
from safetensors.torch import save_file

from vit_rope import FAMILIES

VIDEO_FAMILIES = sorted(n for n, f in FAMILIES.items() if f.max_axes is None or f.max_axes >= 3)
IMAGE_ONLY = sorted(n for n, f in FAMILIES.items() if f.max_axes is not None and f.max_axes < 3)


def tiny_video(**kwargs):
    return timm.create_model("vit_rope3d_tiny", depth=kwargs.pop("depth", 2), num_classes=4, **kwargs)


@pytest.mark.parametrize("name", timm.list_models(module="video"))
def test_every_video_model_builds_runs_forward_backward(name):
    model = timm.create_model(name, num_classes=3, num_frames=4, img_size=32)
    out = model(torch.randn(2, 3, 4, 32, 32))
    assert out.shape == (2, 3)
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("clip", [(2, 64, 64), (8, 48, 80)])
def test_two_clip_lengths_and_sizes(clip):
    model = tiny_video().eval()
    T, H, W = clip
    out, feats = model.forward_intermediates(torch.randn(1, 3, T, H, W), indices=1)
    assert feats[0].shape == (1, 192, T // 2, H // 16, W // 16)
    assert out.shape == (1, 1 + (T // 2) * (H // 16) * (W // 16), 192)


def test_3d_rope_splits_head_dim_per_axis():
    small = timm.create_model("vit_rope3d_small", depth=1)
    assert small.position_encoding.axes == 3 and small.position_encoding.family.axis_dims == (
        20,
        20,
        20,
    )  # head_dim 64, 4 channels unrotated
    mrope = timm.create_model("vit_rope3d_small", depth=1, rope_axis_dims=(16, 24, 24))
    assert mrope.position_encoding.family.axis_dims == (16, 24, 24)
    # time (grid axis 0) turns the last section: channel pairs 24..31 of a (t=1, h=0, w=0) token
    t = mrope.position_encoding.table((2, 1, 1), dtype=torch.float64)
    turned = (t.sin[2] != 0).nonzero().flatten().tolist()
    assert turned == list(range(24, 32))


def test_time_order_matters():
    """Swapping the two tubelets in time changes the prediction (3D RoPE sees time); without positions it is a
    mere token permutation, which the cls output cannot see."""

    def model_with(pos_embed):
        torch.manual_seed(0)
        model = tiny_video(pos_embed=pos_embed).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "gamma" in n:
                    p.fill_(1.0)
        return model

    clip = torch.randn(1, 3, 4, 32, 32)
    swapped = clip[:, :, [2, 3, 0, 1]]  # whole 2-frame tubelets, their inner order kept
    with torch.no_grad():
        rope, none = model_with("rope"), model_with("none")
        scale = rope(clip).abs().max()
        moved = (rope(clip) - rope(swapped)).abs().max()
        still = (none(clip) - none(swapped)).abs().max()
        assert still < 1e-5 * none(clip).abs().max()  # float noise only
        assert moved > 1e-3 * scale and moved > 1000 * still


def test_start_from_image_checkpoint(tmp_path):
    image = timm.create_model("vit_ape_tiny", depth=2, num_classes=10)
    path = tmp_path / "image.safetensors"
    save_file({k: v.contiguous() for k, v in image.state_dict().items()}, str(path))
    video = timm.create_model(
        "vit_rope3d_tiny",
        depth=2,
        num_classes=5,
        pos_embed="ape",
        num_frames=4,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
    ).eval()
    torch.testing.assert_close(video.blocks[1].mlp.fc1.weight, image.blocks[1].mlp.fc1.weight)
    assert video.head.weight.shape == (5, 192)
    # inflated kernel: a still clip embeds exactly like its image
    frame = torch.randn(1, 3, 224, 224)
    clip = frame.unsqueeze(2).repeat(1, 1, 4, 1, 1)
    image_tokens = image.patch_embed(frame).flatten(1, 2)
    video_tokens = video.patch_embed(clip).flatten(1, 3)
    torch.testing.assert_close(video_tokens[:, :196], image_tokens, rtol=1e-4, atol=1e-4)
    # the image APE is repeated over time
    torch.testing.assert_close(video.pos_embed[:, :196], image.pos_embed)
    torch.testing.assert_close(video.pos_embed[:, 196:392], image.pos_embed)


@pytest.mark.parametrize("grid", [(8, 32), (4, 64)])  # (frames, size): another clip length, another frame size
def test_video_ape_checkpoint_resamples_to_another_clip_grid(grid, tmp_path):
    from vit_rope.vit import resample_grid_embed

    kw = dict(patch_size=8, depth=1, pos_embed="ape")
    source = tiny_video(num_frames=4, img_size=32, **kw)  # grid (2, 4, 4)
    path = tmp_path / "video.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    frames, size = grid
    model = tiny_video(
        num_frames=frames, img_size=size, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kw
    )
    new_grid = model.patch_embed.grid_size
    torch.testing.assert_close(model.pos_embed, resample_grid_embed(source.pos_embed, new_grid, (2, 4, 4)))
    # grids that n cannot tell: another clip length and frame size at once (fits neither rule), and 32 rows against
    # (2, 2, 2), which could be 8 time steps of 2x2 frames or 2 of 4x4 (fits both)
    with pytest.raises(ValueError, match="fit neither"):
        tiny_video(num_frames=8, img_size=48, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kw)
    with pytest.raises(ValueError, match=r"fit \(8, 2, 2\) and \(2, 4, 4\)"):
        tiny_video(num_frames=4, img_size=16, pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), **kw)


def test_video_pretrained_weights_adapt_to_one_channel(tmp_path):
    image = timm.create_model("vit_rope_tiny", depth=1, img_size=32, patch_size=8)
    path = tmp_path / "image.safetensors"
    save_file({k: v.contiguous() for k, v in image.state_dict().items()}, str(path))
    video = tiny_video(
        depth=1,
        img_size=32,
        patch_size=8,
        num_frames=4,
        in_chans=1,
        pretrained=True,
        pretrained_cfg_overlay=dict(file=str(path)),
    )
    inflated = image.patch_embed.proj.weight.detach().unsqueeze(2).repeat(1, 1, 2, 1, 1) / 2
    torch.testing.assert_close(video.patch_embed.proj.weight, inflated.sum(1, keepdim=True))


def test_image_weights_that_do_not_fit_a_video_model_are_refused(tmp_path):
    """An image APE does not silently vanish into a RoPE video model, nor learned 2D frequencies into 3D ones."""
    for image, video, message in [
        ("vit_ape_tiny", {}, r"it has \['pos_embed'\], which the model lacks"),
        (
            "vit_rope_mixed_tiny",
            dict(pos_embed="rope_mixed"),
            r"position_encoding.family.frequencies \(1, 3, 2, 32\) does not map onto the video model's \(1, 3, 3, 30\)",
        ),
    ]:
        path = tmp_path / "image.safetensors"
        weights = timm.create_model(image, depth=1, img_size=32, patch_size=8, num_heads=3).state_dict()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(path))
        with pytest.raises(ValueError, match=message):
            tiny_video(depth=1, img_size=32, patch_size=8, num_frames=4, pretrained=True,
                       pretrained_cfg_overlay=dict(file=str(path)), **video)  # fmt: skip


def test_video_errors():
    model = tiny_video()
    with pytest.raises(ValueError, match="the batch is empty"):
        model(torch.randn(0, 3, 4, 32, 32))
    with pytest.raises(ValueError, match="dtype torch.float16 but the model's weights are torch.float32"):
        model(torch.randn(1, 3, 4, 32, 32).half())
    with pytest.raises(ValueError, match=r"take \(B, C, T, H, W\).*image batch"):
        model(torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="clip length 3 is not divisible by the tubelet depth 2"):
        model(torch.randn(1, 3, 3, 32, 32))
    with pytest.raises(ValueError, match="frame size 40x32 is not divisible"):
        model(torch.randn(1, 3, 2, 40, 32))
    with pytest.raises(ValueError, match="in_chans=4"):
        model(torch.randn(1, 4, 2, 32, 32))
    with pytest.raises(
        ValueError, match="axial position encoding over 3 axes: dim=4 .*head_dim=4 is embed_dim 12 / 3 heads"
    ):
        timm.create_model("vit_rope3d_tiny", embed_dim=12, num_heads=3, depth=1)
    with pytest.raises(ValueError, match="sincos"):
        tiny_video(pos_embed="sincos")
    with pytest.raises(ValueError, match="abs_pos_embed='sincos' is 2D only"):
        tiny_video(abs_pos_embed="sincos")
    for bad in (dict(tubelet_size=0), dict(num_frames=0), dict(patch_size=0)):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=0 must be an integer of at least 1"):
            tiny_video(**bad)


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_every_family_of_three_axes_runs_on_clips(family):
    """Over (t, h, w): clips of two lengths and sizes, a gradient on every parameter."""
    model = tiny_video(pos_embed=family)
    for clip in (torch.randn(2, 3, 4, 32, 32), torch.randn(1, 3, 6, 48, 32)):
        out = model(clip)
        assert out.shape == (clip.shape[0], 4) and torch.isfinite(out).all()
    out.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("family", VIDEO_FAMILIES)
def test_abs_pos_embed_adds_a_learned_video_ape_to_every_family(family):
    """abs_pos_embed="ape" on any family of three axes: a learned (1, T·H·W, C) pos_embed without weight decay that
    the tokens add (zeroed, the model is the family alone), resampled on the fly to larger frames as set_input_size
    resamples it."""
    kw = dict(pos_embed=family, num_frames=4, img_size=32, depth=1, global_pool="avg")
    torch.manual_seed(0)
    model, plain = tiny_video(abs_pos_embed="ape", **kw).eval(), tiny_video(**kw).eval()
    plain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "pos_embed"})
    assert model.pos_embed.shape == (1, 2 * 2 * 2, 192) and "pos_embed" in model.no_weight_decay()
    clip = torch.randn(2, 3, 4, 32, 32)
    with torch.no_grad():
        model.pos_embed.normal_()
        assert (model(clip) - plain(clip)).abs().max() > 0.1 * model(clip).abs().max()
        model.pos_embed.zero_()
        torch.testing.assert_close(model(clip), plain(clip), rtol=0, atol=0)
        model.pos_embed.normal_()
        larger = torch.randn(1, 3, 4, 64, 32)
        before = model(larger)  # the APE resampled on the fly to (2, 4, 2)
        assert (before - plain(larger)).abs().max() > 0.1 * before.abs().max()
        model.set_input_size(img_size=(64, 32))
        assert model.pos_embed.shape == (1, 2 * 4 * 2, 192)
        torch.testing.assert_close(model(larger), before, rtol=0, atol=0)


@pytest.mark.parametrize("family", IMAGE_ONLY)
def test_a_family_of_the_image_plane_alone_is_one_clear_error(family):
    with pytest.raises(ValueError, match=f"family '{family}' takes 2 coordinate axes, not axes=3"):
        tiny_video(pos_embed=family)


def test_set_input_size_moves_the_frame_grid_and_resamples_a_video_ape():
    model = tiny_video(pos_embed="ape", num_frames=4, img_size=32).eval()
    clip = torch.randn(1, 3, 4, 64, 64)
    with torch.no_grad():
        model.pos_embed.normal_()
        before = model(clip)  # the APE resampled on the fly to (2, 4, 4)
        model.set_input_size(img_size=64)
        assert model.patch_embed.grid_size == (2, 4, 4) and model.pos_embed.shape == (1, 32, 192)
        torch.testing.assert_close(model(clip), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="keep their patch size"):
        model.set_input_size(patch_size=8)


@pytest.mark.parametrize("frames", [0])
def test_an_empty_clip_is_one_error(frames):
    """(before: a raw error from the convolution)"""
    model = timm.create_model("vit_rope3d_tiny", depth=1, img_size=32, num_frames=4)
    with pytest.raises(ValueError, match="empty axis"):
        model(torch.randn(1, 3, frames, 32, 32))
