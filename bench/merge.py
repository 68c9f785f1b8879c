"""Run folders of one recipe joined into one report: the seeds one session trained beside those another trained.

    uv run python bench/merge.py docs/runs/protocol_elpv runs/protocol_elpv_seed4 --output runs/protocol_elpv_all

A session's runs/ does not outlive it; docs/runs/ keeps each benchmark step's record (bench/benchmark.sh copies it
there). A step that one session cannot finish is split by seeds (``train.py --seeds 4 --output <another folder>``)
and joined here: each folder's results.csv (checked row by row as bench/paired.py checks it) into --output's
results.csv, results.md and figures, as one train.py run over all the seeds writes them. Refused: folders whose
config.yaml differ in anything but the models, seeds and how the run went (device, threads, output), a result row
two folders both hold, and an --output that holds a train.py run (its config.yaml). A setting a part's config.yaml
lacks (written before train.py had it) is read as its default, as train.py --resume reads it.
"""

import argparse
import sys
from dataclasses import fields
from pathlib import Path

from vit_rope.training.report import write_results
from vit_rope.training.settings import APPLIES, DEFAULTS, Settings, read_yaml

sys.path.insert(0, str(Path(__file__).parent))  # bench/paired.py: one reader of results.csv
from paired import results_rows  # noqa: E402

# of the settings --resume lets change (APPLIES), those that change what a row means: the recipes a row names
SAME_MEANING = {"recipes"}
TYPES = dict(seed=int, train_size=int, eval_size=int, top1=float, top5=float, loss=float, params=int)


def recipe(folder: Path) -> dict:
    """``folder``'s config.yaml, less the settings that differ between parts of one benchmark step."""
    if not (folder / "config.yaml").is_file():
        raise SystemExit(f"error: {folder} holds no config.yaml: give a train.py run folder, or its copy in docs/runs")
    saved = read_yaml(folder / "config.yaml", "the run's config", own=True)
    # a setting added since the part was trained: its default, which keeps what train.py did before it had the setting
    # (as YAML holds it: a list, not a tuple)
    saved = {k: list(v) if isinstance(v, tuple) else v for k, v in DEFAULTS.items()} | saved
    free = {f.name for f in fields(Settings) if f.metadata["resume"] == APPLIES}
    return {k: v for k, v in saved.items() if k not in free - SAME_MEANING}


def rows_of(folder: Path) -> list[dict]:
    """``folder``'s results.csv as train.py's rows (numbers as numbers)."""
    return [r | {k: cast(r[k]) for k, cast in TYPES.items()} for r in results_rows(folder)]


def merge(folders: list[Path], out: Path) -> str:
    """The folders' rows written into ``out`` as one run's results; returns its results.md."""
    first = recipe(folders[0])
    for folder in folders[1:]:
        other = recipe(folder)
        differ = sorted(k for k in first.keys() | other.keys() if first.get(k) != other.get(k))
        if differ:
            raise SystemExit(f"error: {folders[0]} and {folder} differ in {', '.join(differ)}: their rows would "
                             "mix two recipes in one table; join only parts of one benchmark step")  # fmt: skip
    if out.exists() and not out.is_dir():
        raise SystemExit(f"error: --output {out} is a file, not a folder: give a new folder")
    if (out / "config.yaml").exists() or any(out.resolve() == f.resolve() for f in folders):
        raise SystemExit(f"error: --output {out} holds a train.py run (its config.yaml) or is one of the folders "
                         "joined: give a new folder")  # fmt: skip
    rows, seen = [], {}
    for folder in folders:
        for r in rows_of(folder):
            cell = (r["model"], r["recipe"], r["seed"], r["eval_size"], r["protocol"], r["rope_scaling"])
            if cell in seen:
                where = f"{r['model']} at {r['eval_size']} px ({r['protocol']}, {r['rope_scaling']})"
                raise SystemExit(f"error: {seen[cell]} and {folder} both hold seed {r['seed']} of {where}: "
                                 "a seed counts once")  # fmt: skip
            seen[cell] = folder
            rows.append(r)
    out.mkdir(parents=True, exist_ok=True)
    about = f"{first['dataset']}, trained at {first['img_size']} px for {first['epochs']} epochs"
    return write_results(rows, out, first["img_size"], about)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", type=Path, nargs="+", help="train.py run folders (or their docs/runs copies)")
    parser.add_argument("--output", type=Path, required=True, help="a new folder for the joined results")
    args = parser.parse_args()
    print(merge(args.folders, args.output))
    print(f"wrote {args.output}/results.csv, results.md and the figures")


if __name__ == "__main__":
    main()
