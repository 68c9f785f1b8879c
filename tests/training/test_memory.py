"""The memory estimate of an evaluation (vit_rope/training/memory.py)."""

import pytest
import timm
import torch

from vit_rope.training.memory import check_eval_memory, eval_bytes
from vit_rope.training.settings import Settings


def test_the_estimate_is_the_documented_formula():
    # 4 bytes x (images 2*B*C*S^2 + a dense bias H*N^2 + activations 16*B*N*D)
    assert eval_bytes(2, 3, 16, 4, 32, 2, bias=True) == 4 * (2 * 2 * 3 * 256 + 2 * 16 + 16 * 2 * 4 * 32)
    assert eval_bytes(2, 3, 16, 4, 32, 2, bias=False) == 4 * (2 * 2 * 3 * 256 + 16 * 2 * 4 * 32)


def test_attention_scores_are_not_counted_sdpa_never_holds_them():
    """ViT-S at 1024 px (4,096 tokens), batch 128: about 15 GiB of activations and images; the 96 GiB of scores the
    first estimate counted are never held (SDPA's fused kernels, on the CPU too), so a 64 GiB machine evaluates it."""
    need = eval_bytes(128, 3, 1024, 4096, 384, 6, bias=False)
    assert 10 * 2**30 < need < 20 * 2**30


@pytest.mark.parametrize("key,value,what", [("eval_sizes", (16, 40000), "--eval-sizes 40000"),
                                            ("eval_seq_lens", (16, 2_000_000), "--eval-seq-lens 2000000")])  # fmt: skip
def test_an_evaluation_no_machine_holds_is_one_line(key, value, what):
    model = timm.create_model("vit_rope_tiny", img_size=16, patch_size=8, depth=1, embed_dim=32, num_heads=2)
    settings = Settings(img_size=16, eval_batch_size=128, **{key: value},
                        dataset="imagefolder" if key == "eval_seq_lens" else "synthetic")  # fmt: skip
    with pytest.raises(SystemExit, match=rf"^error: {what}: evaluating vit_rope_tiny there needs about [\d,.]+ GiB"):
        check_eval_memory(settings, "vit_rope_tiny", model, 1000, torch.device("cpu"))
    fits = Settings(img_size=16, eval_sizes=(16, 224), eval_batch_size=8)
    check_eval_memory(fits, "vit_rope_tiny", model, 1000, torch.device("cpu"))
