"""What RoPE costs: our RoPE ViT against the APE trunk and timm's RoPE ViT, measured in one process.

    uv run python bench/throughput.py                  # CPU: all cores, batch 8, 224 and 384
    uv run python bench/throughput.py --repeats 25 --sizes 224
    uv run python bench/throughput.py --processes 3        # the whole run three times, summarised
    uv run python bench/throughput.py --device cuda --dtype bfloat16 --batch 128 --compile   # a GPU, compiled
    uv run python bench/throughput.py --device cuda --dtype bfloat16 --batch 128 --profile   # kernels of a train step

Models are timed interleaved (one call of each per round, a different one first each round, after warm-up), and
every figure that matters is printed as a ratio measured in this run: the median over rounds of the ratio within a
round, with its interquartile range, so the spread a shared machine adds is visible rather than hidden, and the ratio
of the fastest calls ("best"):

* inference forward and train step (forward + backward + AdamW) of vit_rope_small, timm's deit3_small_patch16_224
  (APE, the same trunk) and timm's vit_small_patch16_rope_224, and our vit_ape_small: our own code with APE, so
  "ours RoPE / ours APE" is what RoPE costs with everything else identical (our blocks add the LayerScale'd branch
  in one pass, which timm's do in two, so our trunk is a little faster than timm's);
* the rotation alone on one layer's q and k (8×6×197×64 each), in place in a qkv projection as the models run it,
  against its memory floor: the bytes it must move (read q, k; write q, k) as a plain copy of the same size, and
  over the machine's large-copy bandwidth, both measured here;
* vit_rope_mixed_small against vit_rope_small, and vit_rope3d_small (8×224² clips, 784 tokens) against the image
  model at 448² (784 tokens);
* activation memory of a training step: the bytes autograd saves for backward (deduplicated by storage);
* where the host is the limit: the four models at ViT-S depth but tiny width and image, so that a call is almost all
  Python and op dispatch; what RoPE adds a block, ours and timm's, in inference and in forward + backward.

``--dtype bfloat16`` runs every model under bfloat16 autocast (float32 weights, as mixed-precision training does);
``--compile`` puts every model, and the apply, through ``torch.compile`` (the same for all, so ratios stay fair): then
q and k turn through the real-arithmetic path that inductor compiles, out of place. On a GPU every timed call ends
with a device synchronisation, and the apply and the copies are timed as replays of a CUDA graph of 50 calls (10 for
the large copy), so that microsecond kernels are not timed as the host's Python; the apply is also timed with the
Triton kernel switched off (the eager PyTorch rotation it replaces).

On Linux the run first tells glibc's malloc to keep the memory it frees (``--malloc keep``, the default): left to
itself, glibc hands large freed blocks back to the kernel now and then, and the next call that needs them pays for
every page again (measured here: 0 to 70,000 page faults per ViT-S forward at 384², worth up to 12 % of its time,
landing on whichever model the heap's state happens to disfavour). That noise is the allocator's, not the models';
``--malloc default`` measures with it. The CPU-training advice is the same: a caching allocator (tcmalloc, jemalloc)
or these settings, for any model.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
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
from vit_rope import RotaryEmbedding, apply_rotary, rope_triton
from vit_rope.rope import rotate_packed

try:
    import resource  # page-fault counts (Unix)
except ImportError:  # pragma: no cover - Windows
    resource = None


def synchronize() -> None:
    """Wait for queued GPU work, so that a timed call includes its kernels (nothing to wait for on a CPU)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed_rounds(fns: dict, repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call, round by round. Each round calls every function once, starting one further along each time,
    so drifts of a shared machine, and whatever one call leaves behind for the next (caches, the allocator's free
    lists), fall on all of them alike."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    synchronize()
    names = list(fns)
    times = {k: [] for k in names}
    PAGE_FAULTS.update(dict.fromkeys(names, 0))
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            f0 = page_faults()
            t0 = time.perf_counter()
            fns[k]()
            synchronize()
            times[k].append(time.perf_counter() - t0)
            PAGE_FAULTS[k] += page_faults() - f0
    for k in names:
        PAGE_FAULTS[k] /= repeats
    return times


def page_faults() -> int:
    """Minor page faults of this process so far (pages touched for the first time; 0 where not counted)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


PAGE_FAULTS: dict[str, float] = {}  # name -> page faults per call in the last timed_rounds (pages touched anew)


def keep_freed_memory() -> str:
    """Ask glibc's malloc to keep freed memory in the process (no trimming of the heap's top; blocks up to 32 MB,
    the most it allows, from the heap rather than fresh mappings), so that repeated calls reuse pages already
    faulted in. Returns what was done, for the header line."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "malloc as is (not glibc)"
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    if mallopt(m_mmap_threshold, 32 * 2**20) and mallopt(m_trim_threshold, 2**30):
        return "glibc malloc keeps freed memory"
    return "malloc as is (mallopt refused)"


FIGURES: dict[str, float] = {}  # name -> value, the headline figures of this run (for --processes)


def speed_ratio(times: dict[str, list[float]], ours: str, other: str, name: str) -> str:
    """Throughput of ``ours`` over ``other``, from the rounds' paired times: median and interquartile range, and the
    ratio of the two fastest calls ("best"): a neighbour on a shared machine only ever slows a call down, so the
    fastest call of each is the closest to what the code itself costs."""
    ratios = sorted(b / a for a, b in zip(times[ours], times[other], strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    FIGURES[name] = statistics.median(ratios)
    FIGURES[f"{name} (best)"] = min(times[other]) / min(times[ours])
    return f"{FIGURES[name]:.3f} [{q1:.3f}-{q3:.3f}] best {FIGURES[f'{name} (best)']:.3f}"


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


class Setup:
    """Where and how every model runs: device, autocast dtype (None: float32), torch.compile or not."""

    def __init__(self, device: str, dtype: str, compile: bool) -> None:
        self.device = torch.device(device)
        self.dtype = None if dtype == "float32" else getattr(torch, dtype)
        self.compile = compile

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def model(self, name: str, **kwargs) -> torch.nn.Module:
        return timm.create_model(name, **kwargs).to(self.device)

    def compiled(self, fn):
        return torch.compile(fn) if self.compile else fn

    def forward_fn(self, model, x):
        model.eval()
        run_model = self.compiled(model)

        def run():
            with torch.inference_mode(), self.autocast():
                run_model(x)

        return run

    def train_fn(self, model, x):
        model.train()
        run_model = self.compiled(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        y = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)

        def run():
            with self.autocast():
                loss = torch.nn.functional.cross_entropy(run_model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return run


def saved_bytes(model, x, setup: Setup) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward (each storage counted once).

    The tensors are held in a list for the forward's length (alive, as the graph would hold them, so that no freed
    storage's address is reused and miscounted) and not returned from the pack hook: a hook that returns an op's
    saved *output* makes a reference cycle (output → its node → the saved output) that is never freed, and every
    call would leak its whole graph (on a GPU at batch 128, out of memory after a few models)."""
    seen: dict[int, int] = {}
    held = []

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        held.append(t)

    def unpack(_):
        raise RuntimeError("saved_bytes measures a forward; it cannot run backward")

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), setup.autocast():
        loss = model(x).sum()
    del loss
    held.clear()
    return sum(seen.values())


def graphed(fns: dict, device: torch.device, calls: int) -> tuple[dict, int]:
    """On a GPU, each function's ``calls`` calls captured in one CUDA graph, so that a timed replay divided by
    ``calls`` is the kernels' own time, without the host's Python time or launch gaps (a microsecond-scale kernel
    would otherwise be timed as the host's call); returns the replays and ``calls``. On a CPU: ``fns`` and 1."""
    if device.type != "cuda":
        return fns, 1
    replays = {}
    for name, fn in fns.items():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up (Triton and inductor compile, caches fill) off the capture
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        replays[name] = graph.replay
    return replays, calls


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second of a large copy (read + write), the memory floor's yardstick."""
    src = torch.randn(64 * 2**20, device=device)  # 256 MB
    dst = torch.empty_like(src)
    fns, calls = graphed({"copy": lambda: dst.copy_(src)}, device, 10)
    t = statistics.median(timed_rounds(fns, repeats=7)["copy"]) / calls
    return 2 * src.numel() * 4 / t


def profile_train_steps(setup: Setup, batch: int, size: int, steps: int = 3) -> None:
    """Where a RoPE train step's extra time goes: torch.profiler over a few train steps of our RoPE and our APE model
    (identical code but for the rotation), the kernels that take the most time in each, and the totals."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(batch, 3, size, size, device=setup.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device.type == "cuda" else [])
    sort = "self_cuda_time_total" if setup.device.type == "cuda" else "self_cpu_time_total"
    for name in ("vit_rope_small", "vit_ape_small"):
        step = setup.train_fn(setup.model(name, img_size=size), x)
        for _ in range(2):
            step()
        synchronize()
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            synchronize()
        print(f"\n{name}, {size}px, batch {batch}, {steps} train steps")
        print(prof.key_averages().table(sort_by=sort, row_limit=20))
        del step
        release(setup.device)


def release(device: torch.device) -> None:
    """Between sections on a GPU: free what the last one left, and say how much is still held (a leak would grow)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        print(f"[GPU memory held between sections: {torch.cuda.memory_allocated(device) / 2**30:.2f} GiB]")


def host_bound(setup: Setup, names: dict[str, str], repeats: int, calls: int = 20) -> None:
    """Where the host is the limit (batch 1 inference on a GPU, say): the four models at ViT-S depth (12 blocks) but
    tiny width and image (24 channels, 2 heads, 2x2 patches), so each call costs the Python and dispatch of its
    ops and next to no arithmetic; what RoPE adds is printed per block, against our APE model and, for timm, its
    DeiT-III. Times are of ``calls`` calls in a row (a call is a few ms); inference, and forward + backward."""
    tiny = dict(img_size=32, patch_size=16, embed_dim=24, num_heads=2, num_classes=2)
    models = {k: setup.model(n, **tiny) for k, n in names.items()}
    depth = len(models["ours RoPE"].blocks)
    x = torch.randn(1, 3, 32, 32, device=setup.device)

    def many(fn):
        return lambda: [fn() for _ in range(calls)]

    def forward_backward(model, x):
        model.train()
        run_model = setup.compiled(model)

        def run():
            with setup.autocast():
                run_model(x).sum().backward()

        return run

    for what, make in (("inference", setup.forward_fn), ("forward+backward", forward_backward)):
        times = timed_rounds({k: many(make(m, x)) for k, m in models.items()}, repeats)
        us = {k: 1e6 * statistics.median(v) / calls for k, v in times.items()}
        ours = FIGURES[f"host-bound {what}: ours RoPE - ours APE, us a block"] = (
            us["ours RoPE"] - us["ours APE"]
        ) / depth
        timm_ = FIGURES[f"host-bound {what}: timm RoPE - APE trunk, us a block"] = (
            us["timm RoPE"] - us["APE trunk"]
        ) / depth
        own = speed_ratio(times, "ours RoPE", "ours APE", f"host-bound {what} ours RoPE/ours APE")
        print(f"host-bound {what} (tiny ViT, {depth} blocks) us a call: "
              + ", ".join(f"{k} {v:.0f}" for k, v in us.items())
              + f"; RoPE adds {ours:.1f} us a block to ours (throughput ours RoPE/ours APE {own}), "
              f"{timm_:.1f} to timm's")  # fmt: skip
    del models
    release(setup.device)


def without_kernel(fn):
    """``fn`` run with the fused GPU kernel switched off: the eager PyTorch rotation it replaces."""

    def run():
        before = os.environ.get("VIT_ROPE_TRITON")
        os.environ["VIT_ROPE_TRITON"] = "0"
        try:
            return fn()
        finally:
            if before is None:
                del os.environ["VIT_ROPE_TRITON"]
            else:
                os.environ["VIT_ROPE_TRITON"] = before

    return run


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 384])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile every model and the apply")
    p.add_argument("--malloc", default="keep", choices=["keep", "default"], help="see the docstring")
    p.add_argument("--processes", type=int, default=1, help="repeat the whole run in this many fresh processes")
    p.add_argument("--profile", action="store_true", help="only profile a train step of ours RoPE and ours APE")
    p.add_argument("--figures-json", help=argparse.SUPPRESS)  # where a child process leaves its figures
    args, argv = p.parse_args(), sys.argv[1:]
    if args.processes > 1:
        i = argv.index("--processes")
        return run_processes(args.processes, argv[:i] + argv[i + 2 :])
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    malloc = keep_freed_memory() if args.malloc == "keep" else "malloc as is"
    setup = Setup(args.device, args.dtype, args.compile)
    dev = setup.device
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    print(f"{where}, {args.threads} CPU threads, torch {torch.__version__}, timm {timm.__version__}, {args.dtype}"
          f"{', compiled' if args.compile else ''}, {malloc}, batch {args.batch}, {args.repeats} interleaved rounds; "
          "ratios are medians of the rounds' paired ratios [interquartile range]")  # fmt: skip

    names = {
        "ours RoPE": "vit_rope_small",
        "APE trunk": "deit3_small_patch16_224",
        "timm RoPE": "vit_small_patch16_rope_224",
        "ours APE": "vit_ape_small",  # our own trunk with APE: what RoPE costs on exactly our code
    }
    if args.profile:
        return profile_train_steps(setup, args.batch, args.sizes[0])
    trunk_forward = {}
    for size in args.sizes:
        models = {k: setup.model(n, img_size=size) for k, n in names.items()}
        x = torch.randn(args.batch, 3, size, size, device=dev)
        fwd = timed_rounds({k: setup.forward_fn(m, x) for k, m in models.items()}, args.repeats)
        fwd_faults = dict(PAGE_FAULTS)
        trunk_forward[size] = statistics.median(fwd["APE trunk"])
        step = timed_rounds({k: setup.train_fn(m, x) for k, m in models.items()}, max(args.repeats // 2, 3))
        print()
        for what, times, faults in (("forward", fwd, fwd_faults), ("train step", step, PAGE_FAULTS)):
            print(
                f"{size}px  {what} ms (median; page faults per call): "
                + ", ".join(f"{k} {1e3 * statistics.median(v):.1f} ({faults[k]:.0f})" for k, v in times.items())
            )
        for what, times in (("forward", fwd), ("train-step", step)):
            ape = speed_ratio(times, "ours RoPE", "APE trunk", f"{size}px {what} ours/APE")
            other = speed_ratio(times, "ours RoPE", "timm RoPE", f"{size}px {what} ours/timm-RoPE")
            own = speed_ratio(times, "ours RoPE", "ours APE", f"{size}px {what} ours RoPE/ours APE")
            print(f"{size}px  {what} throughput  ours/APE {ape}  ours/timm-RoPE {other}  ours RoPE/ours APE {own}")
        mem = {k: saved_bytes(m, x, setup) for k, m in models.items()}
        saved = ", ".join(f"{k} {v / 2**20:.0f}" for k, v in mem.items())
        FIGURES[f"{size}px activation memory ours/APE"] = mem["ours RoPE"] / mem["APE trunk"]
        print(f"{size}px  activations saved for backward MB: {saved}"
              + f"  (ours/APE {mem['ours RoPE'] / mem['APE trunk']:.3f})")  # fmt: skip
        del models
        release(dev)

    # the rotation alone, q and k of one ViT-S layer, against the memory floor: the same bytes moved by a plain copy
    # (what any kernel must at least do: read q and k, write q and k), and by the machine's large-copy bandwidth
    act = setup.dtype or torch.float32  # what the qkv Linear writes (under autocast: the autocast dtype)
    rope = RotaryEmbedding(64, axes=2, num_prefix_tokens=1)
    table = rope.table((14, 14), device=dev)
    packed = torch.randn(args.batch, 197, 3 * 6 * 64, device=dev, dtype=act)  # a qkv Linear's output
    qk = packed.view(args.batch, 197, 3, 6, 64).permute(2, 0, 3, 1, 4)[:2]  # q and k as strided views
    src, dst = torch.randn(qk.numel(), device=dev, dtype=act), torch.empty(qk.numel(), device=dev, dtype=act)
    turn = setup.compiled(lambda: rotate_packed(packed, table, 6, (True, True, False)))
    kernel = rope_triton.available(packed) and not args.compile
    how = (
        "compiled (out of place, q, k and v in one kernel)"
        if args.compile
        else "in place in the qkv output" + (", one Triton kernel" if kernel else "")
    )
    fns = {"apply": turn, "copy": lambda: dst.copy_(src), "out of place": lambda: apply_rotary(qk, table)}
    if kernel:
        fns["eager"] = without_kernel(turn)
    fns, calls = graphed(fns, dev, 50)
    t = {k: [s / calls for s in v] for k, v in timed_rounds(fns, repeats=51).items()}
    floor_bytes = 2 * qk.numel() * qk.element_size()
    bandwidth = copy_bandwidth(dev)
    us = {k: 1e6 * statistics.median(v) for k, v in t.items()}
    floor = FIGURES["apply / same-size copy"] = statistics.median(
        a / b for a, b in zip(t["apply"], t["copy"], strict=True)
    )
    share_of_bw = FIGURES["apply: floor bytes / time, share of copy bandwidth"] = floor_bytes / (
        1e-6 * us["apply"] * bandwidth
    )
    print(f"\napply on q,k ({args.batch}x6x197x64 each, {str(act).removeprefix('torch.')}), {how}: "
          f"{us['apply']:.0f} us; a copy of the same bytes {us['copy']:.0f} us -> {floor:.2f}x that floor; "
          f"q,k read + written at {floor_bytes / (1e-6 * us['apply']) / 1e9:.0f} GB/s = {share_of_bw:.0%} of the "
          f"large-copy bandwidth ({bandwidth / 1e9:.0f} GB/s)")  # fmt: skip
    print(f"out of place (apply_rotary on the q, k views into a new tensor, eager): {us['out of place']:.0f} us")
    if kernel:
        FIGURES["apply: eager PyTorch / kernel time"] = us["eager"] / us["apply"]
        print(f"the same in place without the kernel (eager PyTorch): {us['eager']:.0f} us "
              f"({us['eager'] / us['apply']:.2f}x the kernel's time)")  # fmt: skip
    if 224 in trunk_forward:
        # the same figure with far less noise than whole-model ratios: what the rotation adds to a forward pass
        share = 12 * us["apply"] / (1e6 * trunk_forward[224])
        FIGURES["224px forward ours/APE implied by the apply"] = 1 / (1 + share)
        print(f"12 layers x the apply = {12e-3 * us['apply']:.1f} ms = {100 * share:.1f} % of the APE trunk's "
              f"224px forward ({1e3 * trunk_forward[224]:.1f} ms): a forward throughput ratio of "
              f"{1 / (1 + share):.3f}")  # fmt: skip

    host_bound(setup, names, args.repeats)

    # mixed against axial, video against image at equal token counts
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    pair = {"axial": setup.model("vit_rope_small"), "mixed": setup.model("vit_rope_mixed_small")}
    fwd = timed_rounds({k: setup.forward_fn(m, x) for k, m in pair.items()}, args.repeats)
    step = timed_rounds({k: setup.train_fn(m, x) for k, m in pair.items()}, max(args.repeats // 2, 3))
    print(f"RoPE-Mixed/axial throughput  forward {speed_ratio(fwd, 'mixed', 'axial', 'forward mixed/axial')}  "
          f"train step {speed_ratio(step, 'mixed', 'axial', 'train-step mixed/axial')}")  # fmt: skip
    del pair
    release(dev)
    clip = torch.randn(max(args.batch // 4, 1), 3, 8, 224, 224, device=dev)
    image = torch.randn(max(args.batch // 4, 1), 3, 448, 448, device=dev)
    vid, img = setup.model("vit_rope3d_small", num_frames=8), setup.model("vit_rope_small", img_size=448)
    fwd = timed_rounds(
        {"video": setup.forward_fn(vid, clip), "image": setup.forward_fn(img, image)}, max(args.repeats // 2, 3)
    )
    video = speed_ratio(fwd, "video", "image", "forward video/image (784 tokens)")
    print(f"3D video (784 tokens)/2D image (784 tokens) forward throughput {video}")
    if args.figures_json:
        with open(args.figures_json, "w") as f:
            json.dump(FIGURES, f)


if __name__ == "__main__":
    main()
