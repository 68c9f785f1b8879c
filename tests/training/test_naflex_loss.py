"""train.py's NaFlex helpers (vit_rope/training/naflex.py): the loss scale of uneven batches, as timm's train.py."""

from types import SimpleNamespace

import pytest
import torch

from vit_rope.training.naflex import batch_to, images_in, loss_scale


@pytest.mark.parametrize("mode, want", [("linear", 6 / 8), ("sqrt", (6 / 8) ** 0.5), ("none", 1.0)])
def test_a_batch_of_fewer_images_weighs_less(mode, want):
    settings = SimpleNamespace(naflex_loss_scale=mode, batch_size=8)
    assert loss_scale(6, settings, torch.device("cpu")) == pytest.approx(want)


def test_a_naflex_batch_moves_whole_and_counts_its_images():
    batch = dict(patches=torch.zeros(3, 5, 12), patch_coord=torch.zeros(3, 5, 2, dtype=torch.long), seq_len=5)
    moved = batch_to(batch, torch.device("meta"))
    assert moved["patches"].device.type == "meta" and moved["seq_len"] == 5 and images_in(moved) == 3
    assert images_in(torch.zeros(4, 3, 8, 8)) == 4
