"""bench/paired.py: two run folders compared seed by seed (the convergence check and the recipe comparison of
docs/results.md)."""

import csv
import importlib.util
import statistics
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("paired", Path(__file__).resolve().parents[1] / "bench" / "paired.py")
paired = importlib.util.module_from_spec(spec)
spec.loader.exec_module(paired)

FIELDS = ["model", "recipe", "seed", "train_size", "eval_size", "protocol", "rope_scaling", "top1", "top5", "loss",
          "params"]  # fmt: skip


def write(folder: Path, top1: dict[tuple, float], protocol: dict[tuple, str] | None = None) -> Path:
    folder.mkdir()
    with open(folder / "results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, FIELDS)
        w.writeheader()
        for (model, seed, size, mode), v in top1.items():
            kind = (protocol or {}).get((model, seed, size, mode), "resize")
            w.writerow(dict(model=model, recipe="", seed=seed, train_size=14, eval_size=size, protocol=kind,
                            rope_scaling=mode, top1=v, top5=99, loss=0.5, params=1))  # fmt: skip
    return folder


def test_each_model_is_paired_with_itself_seed_by_seed(tmp_path):
    a = {("vit_rope_tiny", s, 28, "none"): 50.0 + s for s in range(3)} | {("vit_ape_tiny", s, 28, "-"): 40.0 for s in
                                                                           range(3)}  # fmt: skip
    b = {("vit_rope_tiny", s, 28, "none"): 52.0 + 2 * s for s in range(3)} | {("vit_ape_tiny", s, 28, "-"): 39.0 + s
                                                                               for s in range(2)}  # fmt: skip
    table = paired.compare(write(tmp_path / "a", a), write(tmp_path / "b", b))
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if "_tiny" in line}
    diffs = [2.0 + s for s in range(3)]  # B - A of the rotary model, seed by seed
    assert rows["vit_rope_tiny"][4:7] == ["3", "51.0", "54.0"]
    cell = rows["vit_rope_tiny"][7]
    assert cell.startswith(f"{statistics.fmean(diffs):+.1f} (") and cell.endswith("▲ |")
    assert rows["vit_ape_tiny"][4:7] == ["2", "40.0", "39.5"]  # only the seeds both folders hold
    assert "▲" not in rows["vit_ape_tiny"][7] and "▼" not in rows["vit_ape_tiny"][7]  # one worse, one equal


def test_a_folder_without_results_is_one_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "results.csv").write_text(",".join(FIELDS) + "\n")
    with pytest.raises(SystemExit, match="holds no rows"):
        paired.compare(tmp_path / "empty", tmp_path / "empty")


def test_folders_that_pair_nothing_are_one_error_naming_what_each_holds(tmp_path):
    a = write(tmp_path / "a", {("vit_ape_tiny", 0, 28, "-"): 80.0})
    b = write(tmp_path / "b", {("vit_ape_tiny", 1, 28, "-"): 81.0, ("vit_ape_tiny", 2, 28, "-"): 82.0})
    holds = r"A: vit_ape_tiny seeds 0; at 28 px; B: vit_ape_tiny seeds 1, 2; at 28 px"
    with pytest.raises(SystemExit, match=r"share no model.*" + holds):
        paired.compare(a, b)
    c = write(tmp_path / "c", {("vit_rope_tiny", 0, 28, "none"): 80.0})  # another model at the same seed
    with pytest.raises(SystemExit, match="share no model"):
        paired.compare(a, c)


def test_a_folder_that_is_no_run_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="holds no results.csv"):
        paired.compare(tmp_path, tmp_path)


def test_one_folder_pairs_each_size_with_the_training_size(tmp_path):
    top1 = {("vit_rope_tiny", s, 14, "pi"): 70.0 + s for s in range(3)}
    top1 |= {("vit_rope_tiny", s, 16, "pi"): 71.0 + 2 * s for s in range(3)}  # +1, +2, +3 over 14 px
    top1 |= {("vit_rope_tiny", s, 28, "pi"): 60.0 for s in range(3)}
    top1 |= {("vit_rope_tiny", s, 14, "none"): 50.0 for s in range(3)}  # another mode: paired with its own 14 px
    top1 |= {("vit_rope_tiny", s, 16, "none"): 45.0 for s in range(3)}
    top1 |= {("vit_ape_tiny", s, 14, "-"): 80.0 for s in range(3)}
    top1 |= {("vit_ape_tiny", s, 16, "-"): 79.0 for s in range(3)}
    tuned = {("vit_ape_tiny", s, 28, "-"): "finetune" for s in range(3)}  # another protocol: left out
    top1 |= {key: 90.0 for key in tuned}
    table = paired.against_training_size(write(tmp_path / "a", top1, tuned))
    cells = [line.split(" | ") for line in table.splitlines() if "_tiny" in line]
    rows = {(c[0].strip("| "), c[2], c[3]): c[4:] for c in cells}  # (model, mode, size): seeds, A, B, B - A
    # no row at 14 px (the A side), none for the fine-tuned 28 px
    assert set(rows) == {("vit_rope_tiny", "pi", "16"), ("vit_rope_tiny", "pi", "28"), ("vit_rope_tiny", "none", "16"),
                         ("vit_ape_tiny", "-", "16")}  # fmt: skip
    seeds, a, b, diff = rows["vit_rope_tiny", "pi", "16"]
    assert (seeds, a, b) == ("3", "71.0", "73.0") and diff.startswith("+2.0 (") and diff.endswith("▲ |")
    assert rows["vit_rope_tiny", "pi", "28"][3].startswith("-11.0 (")
    assert rows["vit_rope_tiny", "none", "16"] == ["3", "50.0", "45.0", "-5.0 (-5.0, -5.0) ▼ |"]
    assert rows["vit_ape_tiny", "-", "16"][3].startswith("-1.0 (") and rows["vit_ape_tiny", "-", "16"][3].endswith(
        "▼ |"
    )


def test_one_folder_without_its_training_size_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="no row of protocol 'resize' at its training size"):
        paired.against_training_size(write(tmp_path / "a", {("vit_rope_tiny", 0, 28, "pi"): 60.0}))


def test_one_folder_of_its_training_size_only_is_one_error(tmp_path):
    with pytest.raises(SystemExit, match="at its training size only"):
        paired.against_training_size(write(tmp_path / "a", {("vit_rope_tiny", 0, 14, "pi"): 60.0}))


def test_a_forged_row_is_one_error(tmp_path):
    folder = write(tmp_path / "a", {("vit_rope_tiny", 0, 14, "pi"): 70.0, ("vit_rope_tiny", 0, 28, "pi"): 60.0})
    text = (folder / "results.csv").read_text().splitlines()
    text[2] = text[2].replace(",28,", ",twenty-eight,")
    (folder / "results.csv").write_text("\n".join(text[:2] + [text[2]]) + "\n" + "vit_rope_tiny,,0\n")
    with pytest.raises(SystemExit, match="line 3 of .* is not a row train.py writes"):
        paired.against_training_size(folder)
