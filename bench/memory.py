"""Peak memory of one inference forward (or train step) per model and image size: which resolutions fit.

    uv run python bench/memory.py                                      # ViT-S: RoPE, LookHere; 224² to 1024²
    uv run python bench/memory.py --models vit_lookhere_base --sizes 512 768 --batch 4
    python bench/memory.py --device cuda --train --dtype bfloat16 --batch 128 --sizes 224 \
        --models vit_rope_small vit_ape_small                          # a GPU train step: RoPE against APE

Each (model, size) runs in a fresh process, so that its peak resident memory (CPU) or peak CUDA allocation is its own.
LookHere adds its bias, (heads, N, N) float32 cached per grid, to the attention logits; where no memory-efficient
kernel takes an additive bias, the logits of a layer are a dense (batch, heads, N, N) tensor as well.
"""

import argparse
import json
import resource
import subprocess
import sys


def measure(name: str, size: int, batch: int, device: str, train: bool = False, dtype: str = "float32") -> dict:
    """One forward of ``name`` at ``size``² in this process (``train``: a train step, forward, backward and an AdamW
    step, the second one, so that the optimizer's state is counted), under autocast to ``dtype`` unless float32; its
    peak memory in GB."""
    import timm
    import torch

    import vit_rope  # noqa: F401  (registers the models)

    torch.manual_seed(0)
    model = timm.create_model(name, img_size=224).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    cast = torch.autocast(torch.device(device).type, dtype=getattr(torch, dtype), enabled=dtype != "float32")
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if train:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        y = torch.zeros(batch, dtype=torch.long, device=device)
        for _ in range(2):  # (the first step makes the optimizer's state)
            with cast:
                loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    else:
        with torch.inference_mode(), cast:
            model.eval()(x)
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
    parser.add_argument("--train", action="store_true", help="a train step (forward, backward, AdamW) for a forward")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: measure one (model, size) and exit
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.batch, args.device, args.train, args.dtype)))
        return
    print(f"batch {args.batch}, {args.device}, {args.dtype}, {'train step' if args.train else 'inference'}")
    for size in args.sizes:
        peaks = {}
        for name in args.models:
            cmd = [
                sys.executable,
                __file__,
                "--one",
                name,
                str(size),
                "--batch",
                str(args.batch),
                "--dtype",
                args.dtype,
            ]
            cmd += ["--train"] if args.train else []
            out = subprocess.run([*cmd, "--device", args.device], capture_output=True, text=True)
            if out.returncode:
                print(f"{size}px  {name}: failed ({(out.stderr.strip().splitlines() or ['no message'])[-1]})")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            peaks[name] = r["peak_gb"]
            print(f"{size}px  {name}: {r['peak_gb']:.2f} GB {r['kind']}", flush=True)
        first = args.models[0]
        for name in [n for n in peaks if n != first and first in peaks]:
            print(f"{size}px  {name}/{first} peak memory {peaks[name] / peaks[first]:.3f}")


if __name__ == "__main__":
    main()
