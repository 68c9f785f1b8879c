"""bench/merge.py: the parts of one benchmark step, trained in different sessions, joined into one report."""

import csv
import importlib.util
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from vit_rope.training.settings import DEFAULTS, Settings

BENCH = Path(__file__).resolve().parents[1] / "bench"
spec = importlib.util.spec_from_file_location("merge", BENCH / "merge.py")
merge = importlib.util.module_from_spec(spec)
spec.loader.exec_module(merge)

FIELDS = ["model", "recipe", "seed", "train_size", "eval_size", "protocol", "rope_scaling", "top1", "top5", "loss",
          "params"]  # fmt: skip
BASE = Settings(**DEFAULTS)


def part(folder: Path, seeds: list[int], top1, settings: Settings = BASE) -> Path:
    """A run folder as train.py leaves it (config.yaml, results.csv) holding ``seeds`` of APE and axial RoPE at two
    sizes; ``top1(model, seed, size)`` gives each cell."""
    folder.mkdir()
    (folder / "config.yaml").write_text(replace(settings, seeds=tuple(seeds), output=str(folder)).to_yaml())
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for seed in seeds:
            for model in ("vit_ape_tiny", "vit_rope_tiny"):
                for size in (16, 32):
                    w.writerow(dict(model=model, recipe="", seed=seed, train_size=settings.img_size, eval_size=size,
                                    protocol="resize", rope_scaling="none", top1=top1(model, seed, size), top5=99,
                                    loss=0.5, params=1000))  # fmt: skip
    return folder


def cell(model: str, seed: int, size: int) -> float:
    return 50 + 3 * seed + (size == 32) * 7 + (model == "vit_rope_tiny") * (seed % 2)


def test_parts_join_as_one_run_over_all_their_seeds(tmp_path):
    """Seeds 0-2 of one session and 3-4 of another give the rows, means and paired differences of one run of 0-4."""
    a = part(tmp_path / "a", [0, 1, 2], cell)
    b = part(tmp_path / "b", [3, 4], cell)
    text = merge.merge([a, b], tmp_path / "all")
    with open(tmp_path / "all" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["model"], int(r["seed"]), int(r["eval_size"])) for r in rows) == sorted(
        (m, s, size) for m in ("vit_ape_tiny", "vit_rope_tiny") for s in range(5) for size in (16, 32)
    )
    means = [statistics.fmean(cell("vit_rope_tiny", s, size) for s in range(5)) for size in (16, 32)]
    assert f"| vit_rope_tiny | none | 0.00M | 5 | {means[0]:.1f} ± " in text  # (the table of every mode)
    assert f" | {means[1]:.1f} ± " in text
    # axial RoPE - APE, paired by seed: seeds 1 and 3 +1, the others 0
    diff = statistics.fmean(cell("vit_rope_tiny", s, 32) - cell("vit_ape_tiny", s, 32) for s in range(5))
    assert f"| vit_rope_tiny | none | +{diff:.1f} (" in text and "over 5 seeds" in text
    assert {"results.md", "overview.png"} <= {p.name for p in (tmp_path / "all").iterdir()}


def test_parts_of_two_recipes_are_refused(tmp_path):
    a = part(tmp_path / "a", [0], cell)
    b = part(tmp_path / "b", [1], cell, replace(BASE, lr=BASE.lr * 2))
    with pytest.raises(SystemExit, match="differ in lr"):
        merge.merge([a, b], tmp_path / "all")
    assert not (tmp_path / "all").exists()


@pytest.mark.parametrize("later", ["batch", "originals"])
def test_a_part_older_than_a_setting_reads_as_its_default(tmp_path, later):
    """A config.yaml written before train.py had --train-sizes-from joins a later part's that records its default
    (the papers' recipe's seeds 0-2 with its seeds 3-4), and is refused beside one that records another value."""
    a = part(tmp_path / "a", [0], cell)
    config = a / "config.yaml"
    config.write_text("".join(ln for ln in config.read_text().splitlines(True) if not ln.startswith("train_sizes_")))
    assert "train_sizes_from" not in config.read_text()
    b = part(tmp_path / "b", [1], cell, replace(BASE, train_sizes_from=later))
    if later == DEFAULTS["train_sizes_from"]:
        assert "over 2 seeds" in merge.merge([a, b], tmp_path / "all")
    else:
        with pytest.raises(SystemExit, match="differ in train_sizes_from"):
            merge.merge([a, b], tmp_path / "all")


def test_a_seed_two_parts_both_hold_is_refused(tmp_path):
    a = part(tmp_path / "a", [0, 1], cell)
    b = part(tmp_path / "b", [1, 2], cell)
    with pytest.raises(SystemExit, match="both hold seed 1 of vit_ape_tiny at 16 px"):
        merge.merge([a, b], tmp_path / "all")


@pytest.mark.parametrize("where", ["a run", "a part"])
def test_an_output_that_holds_a_run_is_refused(tmp_path, where):
    a = part(tmp_path / "a", [0], cell)
    b = part(tmp_path / "b", [1], cell)
    out = a if where == "a part" else part(tmp_path / "run", [5], cell)
    before = (out / "results.csv").read_bytes()
    with pytest.raises(SystemExit, match="holds a train.py run"):
        merge.merge([a, b], out)
    assert (out / "results.csv").read_bytes() == before


def test_a_folder_without_a_config_is_one_error(tmp_path):
    a = part(tmp_path / "a", [0], cell)
    (a / "config.yaml").unlink()
    with pytest.raises(SystemExit, match="holds no config.yaml"):
        merge.merge([a], tmp_path / "all")


def test_an_output_that_is_a_file_is_one_error(tmp_path):
    a = part(tmp_path / "a", [0], cell)
    (tmp_path / "out").write_text("mine")
    with pytest.raises(SystemExit, match="is a file, not a folder"):
        merge.merge([a], tmp_path / "out")
    assert (tmp_path / "out").read_text() == "mine"
