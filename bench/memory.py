"""Peak memory of one inference forward per model and image size: which resolutions fit.

    uv run python bench/memory.py                                      # ViT-S: RoPE, LookHere; 224² to 1024²
    uv run python bench/memory.py --models vit_lookhere_base --sizes 512 768 --batch 4

Each (model, size) runs in a fresh process, so that its peak resident memory (CPU) or peak CUDA allocation is its own.
LookHere adds its bias, (heads, N, N) float32 cached per grid, to the attention logits; where no memory-efficient
kernel takes an additive bias, the logits of a layer are a dense (batch, heads, N, N) tensor as well.
"""

import argparse
import json
import resource
import subprocess
import sys


def measure(name: str, size: int, batch: int, device: str) -> dict:
    """One forward of ``name`` at ``size``² in this process; its peak memory in GB."""
    import timm
    import torch

    import vit_rope  # noqa: F401  (registers the models)

    torch.manual_seed(0)
    model = timm.create_model(name, img_size=224).eval().to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    with torch.inference_mode():
        model(x)
    if device.startswith("cuda"):
        return dict(peak_gb=torch.cuda.max_memory_allocated() / 2**30, kind="peak CUDA allocation")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux → GiB
    return dict(peak_gb=peak, kind=f"peak resident memory ({before:.2f} before the forward)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["vit_rope_small", "vit_lookhere_small"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[224, 512, 1024])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: measure one (model, size) and exit
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.batch, args.device)))
        return
    print(f"batch {args.batch}, {args.device}, float32, inference")
    for size in args.sizes:
        for name in args.models:
            cmd = [sys.executable, __file__, "--one", name, str(size), "--batch", str(args.batch)]
            out = subprocess.run([*cmd, "--device", args.device], capture_output=True, text=True)
            if out.returncode:
                print(f"{size}px  {name}: failed ({out.stderr.strip().splitlines()[-1]})")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{size}px  {name}: {r['peak_gb']:.2f} GB {r['kind']}", flush=True)


if __name__ == "__main__":
    main()
