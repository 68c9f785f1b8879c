"""Run folders compared seed by seed: the same models under another recipe or schedule, or at other test sizes.

    uv run python bench/paired.py runs/protocol_fashion runs/protocol_fashion_papers   # the papers' recipe - plain
    uv run python bench/paired.py runs/protocol_fashion runs/protocol_fashion_2x       # the convergence check
    uv run python bench/paired.py runs/protocol_fashion_papers     # one folder: each size against the training size

For every model, protocol, scaling mode and eval size that both folders' results.csv hold, a markdown row: the mean
top-1 of A and of B over the seeds both have, and B - A paired by seed (the same seed: the same initial draw and data
order) with its 95 % t-interval, marked as results.md marks them (▲ B better in every seed, ▼ worse in every seed).
Given one folder, A is each model's top-1 at its training size (``--img-size``, also under multi-resolution training)
and B its top-1 at each other size (resized test images, protocol ``resize``), the same seed and scaling mode: does a
model gain above (or below) the size it trained at?
"""

import argparse
import csv
import statistics
from pathlib import Path

from vit_rope.training.report import diff_text, paired_differences


def read_rows(folder: Path, side: str) -> list[dict]:
    """``folder``'s results.csv, each row relabelled so that report.paired_differences pairs B's with A's: the side
    ("A" or "B") as the model, the model (and its recipe) as the recipe."""
    rows = results_rows(folder)
    return [r | {"model": side, "recipe": r["model"] + (f"@{r['recipe']}" if r["recipe"] else "")} for r in rows]


def results_rows(folder: Path) -> list[dict]:
    """``folder``'s results.csv, each row checked (whole, under its header, numbers where train.py writes them);
    its fields as text. A folder without one, or a row train.py did not write, is one line naming it."""
    if not (folder / "results.csv").is_file():
        raise SystemExit(f"error: {folder} holds no results.csv: give a train.py run folder (--output) that finished")
    with open(folder / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"error: {folder / 'results.csv'} holds no rows")
    columns = {"model", "recipe", "protocol", "rope_scaling"}
    for line, r in enumerate(rows, start=2):  # line 1: the header
        try:
            int(r["seed"]), int(r["train_size"]), int(r["eval_size"]), float(r["top1"])
            whole = columns <= r.keys() and None not in r.values()  # (a short row's missing fields are None)
        except (KeyError, TypeError, ValueError):
            whole = False
        if not whole:
            what = "whole seed and sizes, a top-1, under its header"
            raise SystemExit(f"error: line {line} of {folder / 'results.csv'} is not a row train.py writes ({what}): "
                             "write it again with train.py --resume")  # fmt: skip
    return rows


def compare(a: Path, b: Path) -> str:
    """The markdown table of B - A (see the module's docstring). Folders that pair no row (other models, or the
    same models at other seeds) are one error naming what each holds, not an empty table."""
    rows_a, rows_b = read_rows(a, "A"), read_rows(b, "B")
    paired_keys = {pair_key(r) for r in rows_a} & {pair_key(r) for r in rows_b}
    if not paired_keys:
        raise SystemExit(f"error: {a} and {b} share no model at the same seed, protocol, scaling mode and size to "
                         f"pair (A: {holdings(rows_a)}; B: {holdings(rows_b)}): give run folders of the same models "
                         "and seeds, as the pairing is seed by seed")  # fmt: skip
    return table(rows_a + rows_b, f"B = {b}, A = {a}")


def pair_key(row: dict) -> tuple:
    """What a row of A and one of B must share to pair: model (relabelled as recipe), seed, protocol, mode, size."""
    return row["recipe"], int(row["seed"]), row["protocol"], row["rope_scaling"], int(row["eval_size"])


def holdings(rows: list[dict]) -> str:
    """Each model of ``rows`` with its seeds, then the sizes, for an error: ``vit_x seeds 0, 1; at 14, 28 px``."""
    seeds = {}
    for r in rows:
        seeds.setdefault(r["recipe"], set()).add(int(r["seed"]))
    sizes = ", ".join(map(str, sorted({int(r["eval_size"]) for r in rows})))
    models = "; ".join(f"{m} seeds {', '.join(map(str, sorted(s)))}" for m, s in sorted(seeds.items()))
    return f"{models}; at {sizes} px"


def against_training_size(folder: Path) -> str:
    """The markdown table of each size's top-1 minus the training size's, model by model (see the docstring)."""
    rows = [r for r in read_rows(folder, "B") if r["protocol"] == "resize"]
    if len({int(r["train_size"]) for r in rows}) > 1:
        raise SystemExit(f"error: {folder} holds runs of several training sizes: give a folder train.py wrote")
    sizes = {int(r["eval_size"]) for r in rows}
    at_training_size = [r for r in rows if int(r["eval_size"]) == int(r["train_size"])]
    if not at_training_size:
        raise SystemExit(f"error: {folder} holds no row of protocol 'resize' at its training size: rerun it with "
                         "--resume and the training size among --eval-sizes")  # fmt: skip
    # A: the training size's row, once for every size, so that each size's row pairs with it
    a = [r | {"model": "A", "eval_size": str(s)} for r in at_training_size for s in sizes]
    b = [r for r in rows if int(r["eval_size"]) != int(r["train_size"])]
    if not b:
        raise SystemExit(f"error: {folder} holds protocol 'resize' at its training size only: rerun it with --resume "
                         "and other sizes among --eval-sizes")  # fmt: skip
    return table(a + b, f"B = {folder} at each size, A = the same at its training size")


def table(rows: list[dict], title: str) -> str:
    """B - A, paired by seed, a markdown row per model, protocol, scaling mode and size."""
    paired = paired_differences(rows, "A")
    means = {}
    for r in rows:
        key = (r["model"], r["protocol"], r["recipe"], r["rope_scaling"], int(r["eval_size"]))
        means.setdefault(key, {})[int(r["seed"])] = float(r["top1"])
    lines = [title, "", "| model | protocol | RoPE scaling | size | seeds | A | B | B - A |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    order = sorted(paired, key=lambda k: (k[2], k[0], k[3], k[5]))  # model (as recipe), protocol, mode, size
    for protocol, _, model, mode, a_mode, size in order:
        if mode != a_mode:
            continue
        d = paired[protocol, "B", model, mode, a_mode, size]
        seeds = set(means["B", protocol, model, mode, size]) & set(means["A", protocol, model, a_mode, size])
        a_mean = statistics.fmean(means["A", protocol, model, a_mode, size][s] for s in seeds)
        b_mean = statistics.fmean(means["B", protocol, model, mode, size][s] for s in seeds)
        lines.append(f"| {model} | {protocol} | {mode} | {size} | {d['n']} | {a_mean:.1f} | {b_mean:.1f} | "
                     f"{diff_text(d)} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path, help="run folder A (its results.csv)")
    parser.add_argument("b", type=Path, nargs="?", help="run folder B, compared with A (none: A's sizes against its "
                        "training size)")  # fmt: skip
    args = parser.parse_args()
    print(compare(args.a, args.b) if args.b else against_training_size(args.a))


if __name__ == "__main__":
    main()
