"""Native-resolution input (timm's NaFlex contract) for every model kind: a sample padded into a batch of other grids
equals the sample alone as an image, token order does not matter, padding never matters, token dropping trains every
parameter, a bad dict is one clear error; timm's own loader feeds the models."""

import pytest
import timm
import torch
from timm.data.naflex_transforms import patchify_image

from tests.helpers import tiny
from vit_rope.families import FAMILIES
from vit_rope.naflex import embed_patches, keep_tokens, read_batch, sample_grids

FAMILY_NAMES = sorted(n for n, f in FAMILIES.items() if f.min_axes <= 2)
KINDS = ["ape", "sincos", "none", *FAMILY_NAMES]
SIZES = [(32, 48), (64, 16), (24, 24)]  # wide, tall, square (and smaller than the model's 32 × 32)


def collate(images, patch=8):
    """The NaFlex dict of ``images`` (C, H, W) as timm's collator writes it: each sample's patches in row-major
    order, then zero padding with coordinate (0, 0)."""
    items = [patchify_image(image, (patch, patch)) for image in images]
    N = max(len(p) for p, _, _ in items)
    patches = torch.zeros(len(items), N, items[0][0].shape[1])
    coord = torch.zeros(len(items), N, 2, dtype=torch.long)
    valid = torch.zeros(len(items), N, dtype=torch.bool)
    for i, (p, c, v) in enumerate(items):
        patches[i, : len(p)], coord[i, : len(p)], valid[i, : len(p)] = p, c, v
    return dict(patches=patches, patch_coord=coord, patch_valid=valid)


def model_of(kind, **kwargs):
    torch.manual_seed(0)
    kwargs = dict(img_size=32, patch_size=8, num_classes=5, global_pool="avg", reg_tokens=1) | kwargs
    model = tiny(pos_embed=kind, **kwargs).eval()
    with torch.no_grad():  # every parameter away from its init (zero heads and LayerScales would hide differences)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def images(seed=1, sizes=SIZES):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g) for h, w in sizes]


@pytest.mark.parametrize("kind", KINDS)
def test_a_sample_in_a_batch_of_other_grids_equals_the_sample_alone(kind):
    model, pictures = model_of(kind), images()
    batch = collate(pictures)
    with torch.no_grad():
        logits, features = model(batch), model.forward_features(batch)
        for i, picture in enumerate(pictures):
            alone = model.forward_features(picture[None])[0]  # (prefix + n, C)
            real = torch.cat((torch.ones(model.num_prefix_tokens, dtype=torch.bool), features["patch_valid"][i]))
            torch.testing.assert_close(features["patches"][i][real], alone, rtol=0, atol=1e-5)
            torch.testing.assert_close(logits[i], model(picture[None])[0], rtol=0, atol=1e-5)
        padding = ~features["patch_valid"]
        assert features["patches"][:, model.num_prefix_tokens :][padding].abs().max() == 0


@pytest.mark.parametrize(
    "kind, extra", [("rope", "ape"), ("rope", "sincos"), ("lookhere", "ape"), ("rope_ape", "none")]
)
def test_a_family_with_an_absolute_embedding_takes_a_native_batch(kind, extra):
    model, pictures = model_of(kind, abs_pos_embed=extra), images(6)
    with torch.no_grad():
        logits = model(collate(pictures))
        for i, picture in enumerate(pictures):
            torch.testing.assert_close(logits[i], model(picture[None])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize("pool", ["token", "max", "avg"])
@pytest.mark.parametrize(
    "kwargs",
    [
        dict(rope_coords="normalized"),  # DINOv3's coordinates, normalised per sample's own grid
        dict(rope_scaling="pi"),  # per sample: s = max(n / n_ref, 1) of its own grid
        dict(rope_scaling="normalized"),
        dict(rope_scaling="ntk", rope_scale=2.0),  # a frequency-ladder mode takes one scale for the batch
    ],
)
def test_coordinate_modes_and_pooling_are_per_sample(kwargs, pool):
    model, pictures = model_of("rope", global_pool=pool, **kwargs), images(sizes=[(32, 64), (16, 24), (48, 40)])
    with torch.no_grad():
        logits = model(collate(pictures))
        for i, picture in enumerate(pictures):
            torch.testing.assert_close(logits[i], model(picture[None])[0], rtol=0, atol=1e-5)


def test_a_frequency_ladder_mode_with_scales_that_differ_per_sample_is_one_error():
    model = model_of("rope", rope_scaling="ntk")  # derived scales: 2 for a 64-px side, 1 for the others
    with pytest.raises(ValueError, match="rescales the frequency ladder of the whole batch.*rope_scale"):
        model(collate(images(sizes=[(64, 32), (32, 32)])))


@pytest.mark.parametrize("kind", KINDS)
def test_tokens_permuted_with_their_coordinates_give_the_permuted_features(kind):
    model, batch = model_of(kind), collate(images(2))
    g = torch.Generator().manual_seed(3)
    order = torch.stack([torch.randperm(batch["patches"].shape[1], generator=g) for _ in range(3)])  # padding too
    shuffled = {k: v.gather(1, order.view(*order.shape, *[1] * (v.dim() - 2)).expand_as(v)) for k, v in batch.items()}
    with torch.no_grad():
        want, got = model.forward_features(batch)["patches"], model.forward_features(shuffled)["patches"]
        p = model.num_prefix_tokens
        torch.testing.assert_close(got[:, :p], want[:, :p], rtol=0, atol=1e-5)
        torch.testing.assert_close(got[:, p:], want[:, p:].gather(1, order[..., None].expand(-1, -1, want.shape[-1])),
                                   rtol=0, atol=1e-5)  # fmt: skip
        torch.testing.assert_close(model(shuffled), model(batch), rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["ape", "rope", "lookhere", "pape", "liere"])
def test_padding_never_changes_a_real_token(kind):
    """Padding's pixels (NaN too) and coordinates (anything) and its amount change no real token's output."""
    model, batch = model_of(kind), collate(images(4))
    hostile = dict(batch)
    pad = ~batch["patch_valid"]
    hostile["patches"] = batch["patches"].masked_fill(pad[..., None], float("nan"))
    hostile["patch_coord"] = batch["patch_coord"].masked_fill(pad[..., None], 999)
    more = {k: torch.cat((v, v[:, :5].clone()), dim=1) for k, v in batch.items()}  # five more padding tokens
    more["patch_valid"][:, -5:] = False
    with torch.no_grad():
        want = model(batch)
        torch.testing.assert_close(model(hostile), want, rtol=0, atol=1e-5)
        torch.testing.assert_close(model(more), want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_token_dropping_in_a_native_batch_trains_every_parameter(kind):
    model = model_of(kind, patch_drop_rate=0.5).train()
    batch = collate(images(5))
    out = model(batch)
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing, f"no gradient for {missing}"
    features = model.forward_features(batch)
    keep = int(batch["patches"].shape[1] * 0.5)
    assert features["patches"].shape[1] == model.num_prefix_tokens + keep
    real = batch["patch_valid"].sum(1).clamp(max=keep)  # real tokens are kept first
    assert features["patch_valid"].sum(1).tolist() == real.tolist()


def test_keep_tokens_keeps_real_tokens_first():
    valid = torch.tensor([[True, False, True, False], [False, False, False, True]])
    kept = keep_tokens(valid, 0.5, prefix=1)  # the prefix row, then two of four patch rows (counted after it)
    assert kept[:, 0].tolist() == [0, 0] and kept.shape == (2, 3)
    assert sorted(kept[0, 1:].tolist()) == [1, 3]
    assert kept[1, 1].item() == 4  # the one real token, then padding


def test_patches_are_embedded_as_the_convolution_embeds_the_image():
    model = model_of("rope")
    picture = images()[0]
    patches, _, _ = patchify_image(picture, (8, 8))
    tokens = embed_patches(patches[None], model.patch_embed.proj)
    conv = model.patch_embed.proj(picture[None]).flatten(2).transpose(1, 2)
    torch.testing.assert_close(tokens, conv, rtol=0, atol=1e-5)


def test_sample_grids_are_the_real_patches_extent():
    coord = torch.tensor([[[0, 0], [2, 5], [9, 9]], [[1, 1], [0, 0], [0, 0]]])
    valid = torch.tensor([[True, True, False], [True, True, False]])
    assert sample_grids(coord, valid).tolist() == [[3, 6], [2, 2]]


def test_forward_intermediates_of_a_native_batch_are_tokens_in_the_batch_order():
    model, pictures = model_of("rope"), images()
    batch = collate(pictures)
    with torch.no_grad():
        final, inter = model.forward_intermediates(batch, indices=[0, 1], output_fmt="NLC")
        alone_final, alone = model.forward_intermediates(pictures[0][None], indices=[0, 1], output_fmt="NLC")
    n = int(batch["patch_valid"][0].sum())
    torch.testing.assert_close(inter[1][0, :n], alone[1][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(final[0, : model.num_prefix_tokens + n], alone_final[0], rtol=0, atol=1e-5)
    assert inter[0][1, int(batch["patch_valid"][1].sum()) :].abs().max() == 0  # padding rows are zero
    with pytest.raises(ValueError, match="output_fmt='NLC'"):
        model.forward_intermediates(batch)


def test_video_models_take_a_native_batch_of_tubelets():
    torch.manual_seed(0)
    video = timm.create_model("vit_rope3d_tiny", depth=2, img_size=16, patch_size=8, num_frames=4, tubelet_size=2,
                              num_classes=3, global_pool="avg").eval()  # fmt: skip
    clips = [torch.randn(3, 4, 16, 24), torch.randn(3, 2, 32, 8)]
    rows, coords = [], []
    for clip in clips:  # tubelets (t, P, P, C) flat, and their (t, y, x) indices
        C, T, H, W = clip.shape
        t = clip.unfold(1, 2, 2).unfold(2, 8, 8).unfold(3, 8, 8)  # (C, T', H', W', 2, 8, 8)
        rows.append(t.permute(1, 2, 3, 4, 5, 6, 0).reshape(-1, 2 * 8 * 8 * C))
        grid = torch.meshgrid(*(torch.arange(n) for n in (T // 2, H // 8, W // 8)), indexing="ij")
        coords.append(torch.stack(grid, -1).reshape(-1, 3))
    N = max(len(r) for r in rows)
    batch = dict(
        patches=torch.stack([torch.cat((r, r.new_zeros(N - len(r), r.shape[1]))) for r in rows]),
        patch_coord=torch.stack([torch.cat((c, c.new_zeros(N - len(c), 3))) for c in coords]),
        patch_valid=torch.stack([torch.arange(N) < len(r) for r in rows]),
    )
    with torch.no_grad():
        logits = video(batch)
        for i, clip in enumerate(clips):
            torch.testing.assert_close(logits[i], video(clip[None])[0], rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda b: b.pop("patch_coord"), "dict with 'patches', 'patch_coord'"),
        (lambda b: b.update(patches=b["patches"][..., :-3]), "8×8 pixels × 3 channels = 192.*get_patch_size"),
        (lambda b: b.update(patches=b["patches"].long()), "expected a float tensor"),
        (lambda b: b.update(patch_coord=b["patch_coord"].float()), "patch_coord is .*expected integer"),
        (lambda b: b.update(patch_coord=b["patch_coord"][:, :-1]), "patch_coord is .*expected integer"),
        (lambda b: b.update(patch_valid=b["patch_valid"].long()), "patch_valid is .*expected bool"),
        (lambda b: b["patch_valid"][1].fill_(False), "no real patch"),
        (lambda b: b["patch_coord"][0, 0].fill_(-1), "negative index"),
        # (before: the batch ran, its patches cast to the weights' dtype, unlike an image batch)
        (lambda b: b.update(patches=b["patches"].double()), "dtype torch.float64 but the model's weights"),
        # (before: a raw "Tensor.item() cannot be called on meta tensors")
        (lambda b: b.update(patch_coord=b["patch_coord"].to("meta")), "patch_coord is on meta but patches are on cpu"),
        # (before: an APE model resampled its embedding to a grid of 10^12 patches: an allocation error, or hours)
        (lambda b: b["patch_coord"][0, 0].fill_(10**6), "a grid of 1e\\+12 patches \\(at most 1048576\\)"),
    ],
)
def test_a_bad_native_batch_is_one_clear_error(change, match):
    model, batch = model_of("rope"), collate(images())
    change(batch)
    with pytest.raises(ValueError, match=match):
        model(batch)


def test_read_batch_takes_a_batch_without_patch_valid_as_all_real():
    batch = collate(images(sizes=[(16, 16), (16, 16)]))
    batch.pop("patch_valid")
    _, _, valid = read_batch(batch, (8, 8), 3, 2)
    assert valid.all() and valid.shape == (2, 4)


def test_timms_naflex_loader_feeds_the_models():
    """timm's own loader (sequence-length schedule, aspect ratio kept), as timm's train.py --naflex-loader builds it."""
    from timm.data import create_naflex_loader

    class Pictures(torch.utils.data.Dataset):  # as timm's datasets: the loader sets ``transform``
        def __init__(self):
            from PIL import Image

            self.transform = None
            g = torch.Generator().manual_seed(0)
            self.items = [(Image.fromarray((torch.rand(h, w, 3, generator=g) * 255).byte().numpy()), i % 5)
                          for i, (h, w) in enumerate([(40, 90), (90, 40), (64, 64), (30, 50)] * 2)]  # fmt: skip

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            image, target = self.items[i]
            return (image if self.transform is None else self.transform(image)), target

    model = model_of("rope").train()
    common = dict(patch_size=model.get_patch_size(), batch_size=4, num_workers=0, use_prefetcher=False,
                  device=torch.device("cpu"), pin_memory=False, persistent_workers=False)  # fmt: skip
    loader = create_naflex_loader(Pictures(), train_seq_lens=(16, 32), max_seq_len=32, is_training=True, **common)
    batches = 0
    for inputs, target in loader:
        loss = torch.nn.functional.cross_entropy(model(inputs), target)
        loss.backward()
        batches += 1
        assert inputs["patches"].shape[1] in (16, 32) and torch.isfinite(loss)
    assert batches > 0
    evaluation = create_naflex_loader(Pictures(), max_seq_len=32, is_training=False, **common)
    model.eval()
    with torch.no_grad():
        for inputs, _ in evaluation:
            assert model(inputs).shape == (inputs["patches"].shape[0], 5)
