"""What position encodings cost: every figure a ratio of two models timed in the same run.

    uv run python bench/throughput.py                      # CPU: all cores, batch 8, 224² and 384²
    uv run python bench/throughput.py --sizes 224 --repeats 25
    uv run python bench/throughput.py --processes 3        # the whole run three times, each figure summarised
    uv run python bench/throughput.py --sections families --families comrope_ld liere lookhere --batch 16
    uv run python bench/throughput.py --device cuda --dtype bfloat16 --batch 128 --compile   # a GPU, compiled
    uv run python bench/throughput.py --device cuda --dtype bfloat16 --batch 128 --profile   # the kernels

Models are timed interleaved (one call of each per round, a different one first each round, after warm-up); a
figure is the median over rounds of the ratio within a round, with its interquartile range, so the spread a shared
machine adds stays visible, and the ratio of the fastest calls ("best"). Sections:

* our ViT-S with axial RoPE against our own APE model (identical code but the position encoding), timm's DeiT-III
  (the same trunk with APE) and timm's RoPE ViT-S: inference forward and train step (forward, backward, AdamW);
* attention's eager fast path (q and k turned as complex numbers) against the reference apply, same weights;
* every family's ViT-S against axial RoPE (inference forward and the train step);
* what building each family's table costs against a forward (every forward builds its table);
* activation memory of a train step (the bytes autograd saves for backward), RoPE against APE;
* a 3D video model against the image model at equal token counts.

On Linux the run first asks glibc's malloc to keep the memory it frees: left alone it returns large blocks to the
kernel now and then, and the next call pays a page fault per page again, landing on whichever model the heap's state
disfavours (``--malloc default`` measures with that noise).
"""

from __future__ import annotations

import argparse
import ctypes
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

import vit_rope  # noqa: F401  (registers the models)

FIGURES: dict[str, float] = {}  # name -> value: the headline figures of this run (for --processes)
SECTIONS = ["rope", "apply", "families", "tables", "video"]


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed_rounds(fns: dict, repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Seconds per call, round by round; each round starts one function further along, so drifts of a shared
    machine, and what one call leaves behind for the next, fall on all of them alike."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    synchronize()
    names, times = list(fns), {k: [] for k in fns}
    for r in range(repeats):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            fns[k]()
            synchronize()
            times[k].append(time.perf_counter() - t0)
    return times


def speed_ratio(times: dict[str, list[float]], ours: str, other: str, name: str) -> str:
    """Throughput of ``ours`` over ``other``: median [interquartile range] of the rounds' ratios, and the ratio of
    the fastest calls (a neighbour only ever slows a call down)."""
    ratios = sorted(b / a for a, b in zip(times[ours], times[other], strict=True))
    q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    FIGURES[name] = statistics.median(ratios)
    FIGURES[f"{name} (best)"] = min(times[other]) / min(times[ours])
    return f"{FIGURES[name]:.3f} [{q1:.3f}-{q3:.3f}] best {FIGURES[f'{name} (best)']:.3f}"


def keep_freed_memory() -> str:
    """Ask glibc's malloc to keep freed memory (no trimming; blocks up to 32 MB from the heap): repeated calls then
    reuse pages already faulted in."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "malloc as is (not glibc)"
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    if mallopt(m_mmap_threshold, 32 * 2**20) and mallopt(m_trim_threshold, 2**30):
        return "glibc malloc keeps freed memory"
    return "malloc as is (mallopt refused)"


class Setup:
    """Where and how every model runs: device, autocast dtype (None: float32), torch.compile or not, and a depth
    that replaces every model's own (None: theirs; a shallow model makes a quick dry run of the whole script)."""

    def __init__(self, device: str, dtype: str, compile: bool, depth: int | None = None) -> None:
        self.device = torch.device(device)
        self.dtype = None if dtype == "float32" else getattr(torch, dtype)
        self.compile = compile
        self.depth = depth

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype is not None)

    def model(self, name: str, **kwargs) -> torch.nn.Module:
        depth = {} if self.depth is None else {"depth": self.depth}
        return timm.create_model(name, **depth, **kwargs).to(self.device)

    def forward_fn(self, model, x):
        model.eval()
        run_model = torch.compile(model) if self.compile else model

        def run():
            model.eval()  # each call in its own mode: the train step's fn shares the model (and a compiled graph
            with torch.inference_mode(), self.autocast():  # guards on the mode, so a wrong one recompiles)
                run_model(x)

        return run

    def train_fn(self, model, x):
        model.train()
        run_model = torch.compile(model) if self.compile else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        images = x["patches"] if isinstance(x, dict) else x  # a NaFlex batch (bench/naflex.py) or images
        y = torch.zeros(images.shape[0], dtype=torch.long, device=images.device)

        def run():
            model.train()
            with self.autocast():
                loss = torch.nn.functional.cross_entropy(run_model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return run

    def compare(self, models: dict, x: torch.Tensor, repeats: int) -> tuple[dict, dict]:
        """Forward and train-step times of ``models`` on ``x``, interleaved."""
        forward = timed_rounds({k: self.forward_fn(m, x) for k, m in models.items()}, repeats)
        step = timed_rounds({k: self.train_fn(m, x) for k, m in models.items()}, max(repeats // 2, 3))
        return forward, step


def saved_bytes(model, x, setup: Setup) -> int:
    """Bytes of the tensors autograd keeps for backward in one training forward, each storage counted once (held in
    a list for the forward's length, not returned from the hook: returning an op's saved output would tie it to its
    own graph node and leak the graph)."""
    seen, held = {}, []

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        held.append(t)

    def unpack(_):
        raise RuntimeError("saved_bytes measures a forward; it cannot run backward")

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack), setup.autocast():
        model(x).sum()
    held.clear()
    return sum(seen.values())


def print_times(size: int, forward: dict, step: dict) -> None:
    for what, times in (("forward", forward), ("train step", step)):
        ms = ", ".join(f"{k} {1e3 * statistics.median(v):.1f}" for k, v in times.items())
        print(f"{size}px  {what} ms (median): {ms}")


ROPE_MODELS = {
    "ours RoPE": "vit_rope_small",
    "ours APE": "vit_ape_small",  # identical code but for the position encoding
    "APE trunk": "deit3_small_patch16_224",
    "timm RoPE": "vit_small_patch16_rope_224",
}


def rope_against_ape(setup: Setup, sizes: list[int], batch: int, repeats: int, ours_only: bool = False) -> None:
    names = {k: v for k, v in ROPE_MODELS.items() if k.startswith("ours") or not ours_only}
    for size in sizes:
        models = {k: setup.model(n, img_size=size) for k, n in names.items()}
        x = torch.randn(batch, 3, size, size, device=setup.device)
        forward, step = setup.compare(models, x, repeats)
        print_times(size, forward, step)
        for what, times in (("forward", forward), ("train-step", step)):
            own = speed_ratio(times, "ours RoPE", "ours APE", f"{size}px {what} ours RoPE/ours APE")
            line = f"{size}px  {what} throughput  ours RoPE/ours APE {own}"
            if not ours_only:
                trunk = speed_ratio(times, "ours RoPE", "APE trunk", f"{size}px {what} ours RoPE/timm DeiT-III")
                other = speed_ratio(times, "ours RoPE", "timm RoPE", f"{size}px {what} ours RoPE/timm RoPE")
                line += f"  ours RoPE/timm DeiT-III {trunk}  ours RoPE/timm RoPE {other}"
            print(line)
        mem = {k: saved_bytes(models[k], x, setup) for k in ("ours RoPE", "ours APE")}
        FIGURES[f"{size}px activation memory ours RoPE/ours APE"] = mem["ours RoPE"] / mem["ours APE"]
        print(
            f"{size}px  activations saved for backward MB: " + ", ".join(f"{k} {v / 2**20:.0f}" for k, v in mem.items())
        )


def image_families() -> list[str]:
    """The registered families that encode 2D images (videorope takes 3 axes alone: a video model, the video
    section's)."""
    return [name for name, f in vit_rope.FAMILIES.items() if f.min_axes <= 2 <= (f.max_axes or 2)]


def families_against_axial(setup: Setup, batch: int, repeats: int, families: list[str], size: int = 224) -> None:
    """Each family's ViT-S against axial RoPE's on the same trunk: inference forward and the train step."""
    x = torch.randn(batch, 3, size, size, device=setup.device)
    for family in (name for name in families if name != "axial"):
        other = setup.model("vit_rope_small", img_size=size, pos_embed=family)
        models = {"axial": setup.model("vit_rope_small", img_size=size), family: other}
        forward, step = setup.compare(models, x, repeats)
        fwd = speed_ratio(forward, family, "axial", f"{size}px forward {family}/axial")
        train = speed_ratio(step, family, "axial", f"{size}px train-step {family}/axial")
        print(f"{size}px  {family}/axial throughput  forward {fwd}  train step {train}")


def table_cost(setup: Setup, batch: int, repeats: int, families: list[str], size: int = 224) -> None:
    """What building each family's ViT-S table (every layer's) costs against one inference forward of the model,
    which builds it once."""
    x = torch.randn(batch, 3, size, size, device=setup.device)
    for family in families:
        model = setup.model("vit_rope_small", img_size=size, pos_embed=family).eval()
        encoding, grid = model.position_encoding, model.patch_embed.grid_size

        def build(encoding=encoding, grid=grid):
            with torch.inference_mode():
                encoding._build(grid, None, setup.device, torch.float32)

        times = timed_rounds({"table": build, "forward": setup.forward_fn(model, x)}, repeats)
        table, forward = statistics.median(times["table"]), statistics.median(times["forward"])
        FIGURES[f"{size}px table/forward {family}"] = table / forward
        print(f"{size}px  {family} table {1e3 * table:.1f} ms, forward {1e3 * forward:.0f} ms: {table / forward:.3f}")


class ReferenceApply(torch.nn.Module):
    """``model`` with attention's eager fast path switched off: q and k turn through the reference apply (the
    real-arithmetic rotation that compile and export use), so the fast path's win is measured on the same weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        compiling = torch.compiler.is_compiling
        torch.compiler.is_compiling = lambda: True  # the fast path is never taken while compiling
        try:
            return self.model(x)
        finally:
            torch.compiler.is_compiling = compiling


def fast_path_against_reference(setup: Setup, batch: int, repeats: int, size: int = 224) -> None:
    fast = setup.model("vit_rope_small", img_size=size)
    reference = setup.model("vit_rope_small", img_size=size)
    reference.load_state_dict(fast.state_dict())
    x = torch.randn(batch, 3, size, size, device=setup.device)
    forward, step = setup.compare({"fast": fast, "reference": ReferenceApply(reference)}, x, repeats)
    fwd = speed_ratio(forward, "fast", "reference", f"{size}px forward fast path/reference apply")
    train = speed_ratio(step, "fast", "reference", f"{size}px train-step fast path/reference apply")
    print(f"{size}px  ours RoPE, fast path / reference apply throughput  forward {fwd}  train step {train}")


def video_against_image(setup: Setup, batch: int, repeats: int) -> None:
    """2×8×224² clips (2×16×16 tubelets) against 448² images: 784 tokens each."""
    b = max(batch // 4, 1)
    clip, image = (
        torch.randn(b, 3, 8, 224, 224, device=setup.device),
        torch.randn(b, 3, 448, 448, device=setup.device),
    )
    vid, img = setup.model("vit_rope3d_small", num_frames=8), setup.model("vit_rope_small", img_size=448)
    fwd = timed_rounds({"video": setup.forward_fn(vid, clip), "image": setup.forward_fn(img, image)}, repeats)
    print(f"3D video / 2D image (784 tokens) forward throughput {speed_ratio(fwd, 'video', 'image', 'video/image')}")


def profile_calls(setup: Setup, batch: int, size: int, steps: int = 3) -> None:
    """The kernels that take the most time in a few inference forwards and train steps of our RoPE and APE models."""
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(batch, 3, size, size, device=setup.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.device.type == "cuda" else [])
    sort = "self_cuda_time_total" if setup.device.type == "cuda" else "self_cpu_time_total"
    for name in ("vit_rope_small", "vit_ape_small"):
        model = setup.model(name, img_size=size)
        calls = (("inference forwards", setup.forward_fn(model, x)), ("train steps", setup.train_fn(model, x)))
        for what, call in calls:
            for _ in range(2):
                call()
            synchronize()
            with profile(activities=activities) as prof:
                for _ in range(steps):
                    call()
                synchronize()
            print(f"\n{name}, {size}px, batch {batch}, {steps} {what}{', compiled' if setup.compile else ''}")
            print(prof.key_averages().table(sort_by=sort, row_limit=15, max_name_column_width=90))


def run_processes(n: int, argv: list[str]) -> None:
    """The whole benchmark in ``n`` fresh processes, each figure summarised as median [min-max] over them."""
    runs = []
    for i in range(n):
        print(f"\n=== process {i + 1} of {n} ===", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "figures.json"
            subprocess.run([sys.executable, __file__, *argv, "--figures-json", str(path)], check=True)
            runs.append(json.loads(path.read_text()))
    print(f"\n=== over {n} processes: median [min-max] ===")
    for name in runs[0]:
        values = sorted(r[name] for r in runs)
        print(f"{name:56s} {statistics.median(values):.3f} [{values[0]:.3f}-{values[-1]:.3f}]")


def arguments() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 384], help="image sizes of the rope section; the "
                   "families and tables sections time the first")  # fmt: skip
    p.add_argument("--repeats", type=int, default=15, help="interleaved rounds (train steps: half as many)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile every model")
    p.add_argument("--ours-only", action="store_true", help="the rope section times our two models alone (quicker)")
    p.add_argument("--depth", type=int, help="blocks of every model (default: each model's own; a quick dry run)")
    p.add_argument("--malloc", default="keep", choices=["keep", "default"], help="see the docstring")
    p.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    p.add_argument(
        "--families",
        nargs="+",
        choices=sorted(image_families()),
        help="the families and tables sections' families (default: every registered image family)",
    )
    p.add_argument("--processes", type=int, default=1, help="repeat the whole run in this many fresh processes")
    p.add_argument("--profile", action="store_true", help="only profile forwards and train steps of ours RoPE and APE")
    p.add_argument("--figures-json", help=argparse.SUPPRESS)  # where a child process leaves its figures
    return p


def main() -> None:
    p = arguments()
    args = p.parse_args()
    if args.processes > 1:
        argv = sys.argv[1:]
        i = argv.index("--processes")
        return run_processes(args.processes, argv[:i] + argv[i + 2 :])
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: torch sees no CUDA device here; use --device cpu")
    malloc = keep_freed_memory() if args.malloc == "keep" else "malloc as is"
    setup = Setup(args.device, args.dtype, args.compile, args.depth)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = setup.device
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or platform.machine()
    print(
        f"{where}, {args.threads} CPU threads, torch {torch.__version__}, timm {timm.__version__}, {args.dtype}"
        f"{', compiled' if args.compile else ''}{f', depth {args.depth}' if args.depth else ''}, {malloc}, "
        f"batch {args.batch}, {args.repeats} interleaved rounds; "
        "ratios are throughput, medians of the rounds' paired ratios [interquartile range]"
    )
    if args.profile:
        return profile_calls(setup, args.batch, args.sizes[0])
    if "rope" in args.sections:
        rope_against_ape(setup, args.sizes, args.batch, args.repeats, args.ours_only)
    if "apply" in args.sections:
        fast_path_against_reference(setup, args.batch, args.repeats)
    if "families" in args.sections:
        families_against_axial(setup, args.batch, args.repeats, args.families or image_families(), args.sizes[0])
    if "tables" in args.sections:
        table_cost(setup, args.batch, args.repeats, args.families or image_families(), args.sizes[0])
    if "video" in args.sections:
        video_against_image(setup, args.batch, max(args.repeats // 2, 3))
    if args.figures_json:
        Path(args.figures_json).write_text(json.dumps(FIGURES))


if __name__ == "__main__":
    main()
