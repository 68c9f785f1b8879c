"""What RoPE costs: our RoPE ViT against the APE trunk and timm's RoPE ViT, measured in one process.

    uv run python bench/throughput.py                  # CPU: all cores, batch 8, 224 and 384
    uv run python bench/throughput.py --repeats 25 --sizes 224
    uv run python bench/throughput.py --processes 3        # the whole run three times, summarised

Models are timed interleaved (one call of each per round, a different one first each round, after warm-up), and
every figure that matters is printed as a ratio measured in this run: the median over rounds of the ratio within a
round, with its interquartile range, so the spread a shared machine adds is visible rather than hidden:

* inference forward and train step (forward + backward + AdamW) of vit_rope_small, timm's deit3_small_patch16_224
  (APE, the same trunk) and timm's vit_small_patch16_rope_224;
* the rotation alone on one layer's q and k (8×6×197×64 each), in place in a qkv projection as the models run it,
  against its memory floor: the bytes it must move (read q, k; write q, k) as a plain copy of the same size, and
  over the machine's large-copy bandwidth, both measured here;
* vit_rope_mixed_small against vit_rope_small, and vit_rope3d_small (8×224² clips, 784 tokens) against the image
  model at 448² (784 tokens);
* activation memory of a training step: the bytes autograd saves for backward (deduplicated by storage).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import timm
import torch

import vit_rope  # noqa: F401
from vit_rope import RotaryEmbedding, apply_rotary
from vit_rope.rope import rotate_packed


def timed_rounds(fns: dict, repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call, round by round. Each round calls every function once, starting one further along each time,
    so drifts of a shared machine, and whatever one call leaves behind for the next (caches, the allocator's free
    lists), fall on all of them alike."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    names = list(fns)
    times = {k: [] for k in names}
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t0)
    return times


FIGURES: dict[str, float] = {}  # name -> value, the headline figures of this run (for --processes)


def speed_ratio(times: dict[str, list[float]], ours: str, other: str, name: str) -> str:
    """Throughput of ``ours`` over ``other``, from the rounds' paired times: median and interquartile range."""
    ratios = sorted(b / a for a, b in zip(times[ours], times[other], strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    FIGURES[name] = statistics.median(ratios)
    return f"{FIGURES[name]:.3f} [{q1:.3f}-{q3:.3f}]"


def run_processes(n: int, argv: list[str]) -> None:
    """Run the whole benchmark in ``n`` fresh processes, one after another, and summarise each headline figure over
    them: on a shared machine single runs differ by more than their rounds' spread suggests (every process places
    its tensors afresh), so the median over processes is the figure to quote."""
    runs = []
    for i in range(n):
        print(f"\n=== process {i + 1} of {n} ===", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "figures.json"
            subprocess.run(
                [sys.executable, __file__, *argv, "--processes", "1", "--figures-json", str(path)], check=True
            )
            runs.append(json.loads(path.read_text()))
    print(f"\n=== over {n} processes: median [min-max] ===")
    for name in runs[0]:
        values = sorted(r[name] for r in runs)
        print(f"{name:48s} {statistics.median(values):.3f} [{values[0]:.3f}-{values[-1]:.3f}]")


def forward_fn(model, x):
    model.eval()

    def run():
        with torch.inference_mode():
            model(x)

    return run


def train_fn(model, x):
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    y = torch.zeros(x.shape[0], dtype=torch.long)

    def run():
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return run


def saved_bytes(model, x) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward (each storage counted once)."""
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).sum()
    del loss
    return sum(seen.values())


def copy_bandwidth() -> float:
    """Bytes per second of a large copy (read + write), the memory floor's yardstick."""
    src = torch.randn(64 * 2**20 // 4 * 4)  # 256 MB
    dst = torch.empty_like(src)
    t = statistics.median(timed_rounds({"copy": lambda: dst.copy_(src)}, repeats=7)["copy"])
    return 2 * src.numel() * 4 / t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 384])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--processes", type=int, default=1, help="repeat the whole run in this many fresh processes")
    p.add_argument("--figures-json", help=argparse.SUPPRESS)  # where a child process leaves its figures
    args, argv = p.parse_args(), sys.argv[1:]
    if args.processes > 1:
        i = argv.index("--processes")
        return run_processes(args.processes, argv[:i] + argv[i + 2 :])
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"{platform.processor() or platform.machine()}, {args.threads} threads, torch {torch.__version__}, "
          f"timm {timm.__version__}, batch {args.batch}, {args.repeats} interleaved rounds; ratios are medians of "
          "the rounds' paired ratios [interquartile range]")  # fmt: skip

    names = {
        "ours RoPE": "vit_rope_small",
        "APE trunk": "deit3_small_patch16_224",
        "timm RoPE": "vit_small_patch16_rope_224",
    }
    trunk_forward = {}
    for size in args.sizes:
        kw = dict(img_size=size)
        models = {k: timm.create_model(n, **kw) for k, n in names.items()}
        x = torch.randn(args.batch, 3, size, size)
        fwd = timed_rounds({k: forward_fn(m, x) for k, m in models.items()}, args.repeats)
        trunk_forward[size] = statistics.median(fwd["APE trunk"])
        step = timed_rounds({k: train_fn(m, x) for k, m in models.items()}, max(args.repeats // 2, 3))
        print()
        for what, times in (("forward", fwd), ("train step", step)):
            print(
                f"{size}px  {what} ms (median): "
                + ", ".join(f"{k} {1e3 * statistics.median(v):.0f}" for k, v in times.items())
            )
        for what, times in (("forward", fwd), ("train-step", step)):
            ape = speed_ratio(times, "ours RoPE", "APE trunk", f"{size}px {what} ours/APE")
            other = speed_ratio(times, "ours RoPE", "timm RoPE", f"{size}px {what} ours/timm-RoPE")
            print(f"{size}px  {what} throughput  ours/APE {ape}  ours/timm-RoPE {other}")
        mem = {k: saved_bytes(m, x) for k, m in models.items()}
        saved = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in mem.items())
        FIGURES[f"{size}px activation memory ours/APE"] = mem["ours RoPE"] / mem["APE trunk"]
        print(f"{size}px  activations saved for backward MB: {saved}"
              + f"  (ours/APE {mem['ours RoPE'] / mem['APE trunk']:.3f})")  # fmt: skip

    # the rotation alone, q and k of one ViT-S layer, against the memory floor: the same bytes moved by a plain copy
    # (what any kernel must at least do: read q and k, write q and k), and by the machine's large-copy bandwidth
    rope = RotaryEmbedding(64, axes=2, num_prefix_tokens=1)
    table = rope.table((14, 14))
    packed = torch.randn(args.batch, 197, 3 * 6 * 64)  # a qkv Linear's output, as the model turns it (in place)
    qk = packed.view(args.batch, 197, 3, 6, 64).permute(2, 0, 3, 1, 4)[:2]  # q and k as strided views
    src, dst = torch.randn(qk.numel()), torch.empty(qk.numel())
    t = timed_rounds(
        {
            "in place": lambda: rotate_packed(packed, table, 6, (True, True, False)),
            "copy": lambda: dst.copy_(src),
            "out of place": lambda: apply_rotary(qk, table),
        },
        repeats=51,
    )
    dram = 2 * qk.numel() * 4 / copy_bandwidth()
    us = {k: 1e6 * statistics.median(v) for k, v in t.items()}
    floor = FIGURES["apply / same-size copy"] = statistics.median(
        a / b for a, b in zip(t["in place"], t["copy"], strict=True)
    )
    print(f"\napply on q,k ({args.batch}x6x197x64 each), in place in the qkv output as the model runs it: "
          f"{us['in place']:.0f} us; a copy of the same bytes {us['copy']:.0f} us -> {floor:.2f}x that floor; "
          f"the large-copy bandwidth floor {1e6 * dram:.0f} us -> {us['in place'] / (1e6 * dram):.2f}x")  # fmt: skip
    print(f"out of place (apply_rotary on the q, k views into a new tensor): {us['out of place']:.0f} us")
    if 224 in trunk_forward:
        # the same figure with far less noise than whole-model ratios: what the rotation adds to a forward pass
        share = 12 * us["in place"] / (1e6 * trunk_forward[224])
        FIGURES["224px forward ours/APE implied by the apply"] = 1 / (1 + share)
        print(f"12 layers x the apply = {12e-3 * us['in place']:.1f} ms = {100 * share:.1f} % of the APE trunk's "
              f"224px forward ({1e3 * trunk_forward[224]:.0f} ms): a forward throughput ratio of "
              f"{1 / (1 + share):.3f}")  # fmt: skip

    # mixed against axial, video against image at equal token counts
    x = torch.randn(args.batch, 3, 224, 224)
    pair = {"axial": timm.create_model("vit_rope_small"), "mixed": timm.create_model("vit_rope_mixed_small")}
    fwd = timed_rounds({k: forward_fn(m, x) for k, m in pair.items()}, args.repeats)
    step = timed_rounds({k: train_fn(m, x) for k, m in pair.items()}, max(args.repeats // 2, 3))
    print(f"RoPE-Mixed/axial throughput  forward {speed_ratio(fwd, 'mixed', 'axial', 'forward mixed/axial')}  "
          f"train step {speed_ratio(step, 'mixed', 'axial', 'train-step mixed/axial')}")  # fmt: skip
    clip = torch.randn(2, 3, 8, 224, 224)
    image = torch.randn(2, 3, 448, 448)
    vid, img = timm.create_model("vit_rope3d_small", num_frames=8), timm.create_model("vit_rope_small", img_size=448)
    fwd = timed_rounds({"video": forward_fn(vid, clip), "image": forward_fn(img, image)}, max(args.repeats // 2, 3))
    video = speed_ratio(fwd, "video", "image", "forward video/image (784 tokens)")
    print(f"3D video (784 tokens)/2D image (784 tokens) forward throughput {video}")
    if args.figures_json:
        with open(args.figures_json, "w") as f:
            json.dump(FIGURES, f)


if __name__ == "__main__":
    main()
