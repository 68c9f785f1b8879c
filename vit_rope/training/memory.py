"""Whether an evaluation fits the machine: each eval size's (and token budget's) memory estimated before anything in
--output changes, so that a size no machine could evaluate is one line now rather than an allocation error after the
whole training.

The estimate, in bytes, of one evaluation batch of ``B`` images of ``N`` tokens through a ViT of width ``D`` and
``H`` heads (float32 throughout, 4 bytes a number)::

    4 * (B * C * S**2 * 2        the images (C channels, S px; read and resized)
         + H * N**2              an attention bias's dense (heads, N, N) table, for the families that have one
         + 16 * B * N * D)       the activations of a block (qkv, the MLP's 4 D, the residual stream)

with ``N`` the patches of an S-px image (``(S / P)**2`` for patch size P, times the frames of a clip) or a token
budget of --eval-seq-lens, and ``B`` the --eval-batch-size (at most the validation set's size). Attention's scores are
not counted: SDPA's fused kernels (flash attention on the CPU too, with or without a key mask) never hold them. The
bound is a CUDA device's memory, or the machine's physical memory (``SC_PHYS_PAGES * SC_PAGE_SIZE``). An estimate
above the bound is refused, naming the size, the estimate and the remedy. Models without a ViT's patch embedding
are not estimated.
"""

import os

import torch

__all__ = ["available_memory", "check_eval_memory", "eval_bytes"]

GIB = 1 << 30


def eval_bytes(batch: int, channels: int, pixels: int, tokens: int, width: int, heads: int, bias: bool) -> int:
    """The estimate of the module docstring, in bytes (``pixels``: S, the side of an image; 0 for a token budget;
    ``bias``: the model's position encoding is a dense attention bias)."""
    images = batch * channels * pixels**2 * 2
    attention = heads * tokens**2 if bias else 0
    return 4 * (images + attention + 16 * batch * tokens * width)


def available_memory(device: torch.device) -> int:
    """The memory an evaluation on ``device`` may use: a CUDA device's total, else the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[1]
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no sysconf (Windows): not estimated
        return 0


def model_shape(model: torch.nn.Module) -> tuple[int, int, int, int] | None:
    """(patch size, frames per token, width, heads) of a ViT; None for a model without a patch embedding."""
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None)
    if patch is None:
        return None
    patch = tuple(patch) if isinstance(patch, list | tuple) else (patch,)
    width = getattr(model, "embed_dim", None) or getattr(model, "num_features", 0)
    blocks = getattr(model, "blocks", None)
    attn = getattr(blocks[0], "attn", None) if blocks is not None and len(blocks) else None
    heads = getattr(attn, "num_heads", 1) or 1
    tubelet = patch[0] if len(patch) == 3 else 1
    return patch[-1], tubelet, int(width), int(heads)


def check_eval_memory(settings, spec: str, model: torch.nn.Module, n_val: int, device: torch.device) -> None:
    """Every --eval-sizes size, --finetune-sizes size and --eval-seq-lens budget of ``model`` within the memory of
    ``device`` by :func:`eval_bytes`; one line naming the first that is not."""
    shape, bound = model_shape(model), available_memory(device)
    if shape is None or bound <= 0:
        return
    patch, tubelet, width, heads = shape
    frames = max(getattr(settings, "num_frames", 1) // tubelet, 1) if tubelet > 1 else 1
    batch = max(min(settings.eval_batch_size, n_val), 1)
    family = getattr(getattr(model, "position_encoding", None), "family", None)
    bias = family is not None and not family.rotary  # (LookHere's dense bias; PaPE's columns are less)
    jobs = [
        (f"--eval-sizes {s}", s, frames * (s // patch) ** 2) for s in (*settings.eval_sizes, *settings.finetune_sizes)
    ]
    jobs += [(f"--eval-seq-lens {n}", 0, n) for n in settings.eval_seq_lens]
    for what, pixels, tokens in jobs:
        need = eval_bytes(batch, 3 * frames * tubelet, pixels, tokens, width, heads, bias)
        if need > bound:
            raise SystemExit(
                f"error: {what}: evaluating {spec} there needs about {need / GIB:,.1f} GiB ({tokens:,} tokens an "
                f"image, batches of {batch}), more than the {bound / GIB:,.1f} GiB of {device.type}; give a smaller "
                "--eval-batch-size, or leave that size out"
            )
