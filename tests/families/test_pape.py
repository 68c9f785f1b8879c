"""vit_rope/families/pape.py: a PaPE model trains a step with gradients reaching the parabolas, and under token
dropping each kept token keeps its position (the bias's math against a pair-by-pair reference: test_tables.py)."""

import timm
import torch
import torch.nn.functional as F

from vit_rope import ParabolicBias


def test_the_model_trains_a_step_and_its_gradients_reach_the_parabolas():
    torch.manual_seed(0)
    model = timm.create_model("vit_pape_tiny", depth=2, img_size=32, num_classes=4, global_pool="avg")
    family = model.position_encoding.family
    assert family.per_layer and family.directions.shape == (2, 3, 50, 2)  # ([layer,] heads, parabolas, axes)
    before = [p.detach().clone() for p in family.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e4)  # LayerScale (1e-5) scales their gradients down
    loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.arange(4))
    loss.backward()
    for p in family.parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
    optimizer.step()
    assert all(not torch.equal(p, b) for p, b in zip(family.parameters(), before, strict=True))


def test_token_dropping_keeps_each_kept_tokens_position():
    """With ``patch_drop_rate`` the table of each sample's kept tokens holds their grid coordinates (those of the
    patches the dropout kept, centred as the full grid's), the cls token's placeholder first."""
    torch.manual_seed(0)
    model = timm.create_model("vit_pape_tiny", depth=1, img_size=64, patch_drop_rate=0.5).train()
    tables, kept = [], []
    model.patch_drop.register_forward_hook(lambda mod, args, out: kept.append(out[1]))
    model.blocks[0].attn.register_forward_pre_hook(lambda mod, args: tables.append(args[1]))
    model(torch.randn(2, 3, 64, 64))
    table, keep = tables[0], kept[0]  # keep: (B, 8) indices of the 16 patches
    assert isinstance(table, ParabolicBias) and table.coords.shape == (2, 1 + 8, 2) and table.num_prefix == 1
    assert not torch.equal(keep[0], keep[1])  # each sample its own tokens
    grid = torch.cartesian_prod(torch.arange(4.0), torch.arange(4.0))  # (row, col) of each patch
    torch.testing.assert_close(table.coords[:, 1:], grid[keep] - 1.5, rtol=0, atol=0)
