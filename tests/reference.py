"""Fixed-seed logits of every model kind under the settings that exercise the position-encoding pipeline (prefix and
register tokens, token dropping, scaling modes at an unseen size, p-RoPE, VO-RoPE, float64), so that a change to the
core can be checked against the outputs of the code before it:

    python tests/reference.py tests/data/reference_logits.safetensors   # written at commit 11c66d5, before the
                                                                         # frozen-table core; test_vit.py compares
"""

import sys

import timm
import torch
from safetensors.torch import save_file

import vit_rope  # noqa: F401  (registers the models)
from vit_rope import FAMILIES
from vit_rope.families.base import PairFamily


def cases() -> dict[str, tuple[str, dict, dict]]:
    """name → (model, model kwargs, what to run: size, mode, train, dtype)."""
    out = {}
    kinds = ["ape", "rope_ape", "sincos", "none"] + [f.model_name for f in FAMILIES.values() if f.model_name]
    for kind in kinds:
        name = f"vit_{kind}_tiny" if kind not in ("rope_ape", "sincos", "none") else "vit_rope_tiny"
        small = dict(img_size=32, patch_size=8, depth=3, num_classes=5, pos_embed=kind)
        if kind == "pape":  # the code of 11c66d5 gave PaPE an APE by mistake ("ape" in "pape"): that model, named now
            small["abs_pos_embed"] = "ape"
        modes = timm.create_model(name, **small).rope_scaling_modes() or ("none",)
        for mode in modes:
            out[f"{kind}/48px/{mode}"] = (name, small, dict(size=48, mode=mode))
        out[f"{kind}/regs"] = (name, dict(small, reg_tokens=2), dict(size=32))
        out[f"{kind}/drop"] = (name, dict(small, patch_drop_rate=0.5), dict(size=40, train=True))
        out[f"{kind}/float64"] = (name, small, dict(size=40, dtype=torch.float64))
        family = FAMILIES.get(next((n for n, f in FAMILIES.items() if f.model_name == kind), ""), None)
        if family is not None and family.rotary:
            out[f"{kind}/vo"] = (name, dict(small, rope_targets="vo", reg_tokens=1), dict(size=40, mode="pi"))
        if family is not None and issubclass(family, PairFamily):
            out[f"{kind}/p-rope"] = (name, dict(small, rope_options=dict(p=0.75)), dict(size=48, mode="none"))
    video = dict(img_size=32, patch_size=8, depth=2, num_classes=5, num_frames=4)
    for pos_embed in ("rope", "videorope", "ape"):
        out[f"video/{pos_embed}"] = ("vit_rope3d_tiny", dict(video, pos_embed=pos_embed), dict(size=40, frames=6))
    return out


def logits(only=None) -> dict[str, torch.Tensor]:
    """The logits of every case (or of the cases named in ``only``)."""
    out = {}
    for key, (name, kwargs, run) in cases().items():
        if only is not None and key not in only:
            continue
        torch.manual_seed(0)
        model = timm.create_model(name, **kwargs).to(run.get("dtype", torch.float32))
        model.train(run.get("train", False))
        if run.get("mode", "none") != "none":
            model.set_rope_scaling(run["mode"])
        torch.manual_seed(1)
        size, frames = run["size"], run.get("frames")
        shape = (2, 3, frames, size, size) if frames else (2, 3, size, size)
        x = torch.randn(shape, dtype=run.get("dtype", torch.float32))
        with torch.no_grad():
            out[key] = model(x).double().contiguous()
    return out


if __name__ == "__main__":
    save_file(logits(), sys.argv[1])
