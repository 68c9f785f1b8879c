"""The memory estimate of an evaluation (vit_rope/training/memory.py)."""

import pytest
import timm
import torch

from vit_rope.training.memory import check_eval_memory, eval_bytes
from vit_rope.training.settings import Settings


def test_the_estimate_is_the_documented_formula():
    # 4 bytes x (images 2*B*C*S^2 + scores 2*B*H*N^2 + activations 16*B*N*D)
    assert eval_bytes(2, 3, 16, 4, 32, 2, scores=True) == 4 * (2 * 2 * 3 * 256 + 2 * 2 * 2 * 16 + 16 * 2 * 4 * 32)
    assert eval_bytes(2, 3, 16, 4, 32, 2, scores=False) == 4 * (2 * 2 * 3 * 256 + 16 * 2 * 4 * 32)


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
