"""bench/benchmark.sh: parts skipped once recorded, resumed where they stopped, parked outside the repository, shared
out among workers.

The script runs in a copy of its folder layout with a stand-in for Python that logs each train.py call and writes
the record train.py would, so that the shell logic is tested in a second, without training anything."""

import fcntl
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "benchmark.sh"
RECORD = ("config.yaml", "log.csv", "results.csv", "results.md")

# The stand-in: `-c "import elpv_dataset"` succeeds, bench/merge.py makes its output folder, and train.py logs its
# arguments with whether the run folder's checkpoint was there when it started (and its threads in threads.log), takes
# $FAKE_SECONDS to train (the part $FAKE_FAIL fails), then writes the record.
FAKE_PYTHON = """#!/usr/bin/env bash
case "$1" in
    -c) exit 0 ;;
    bench/merge.py) mkdir -p "${@: -1}"; exit 0 ;;
esac
out=""; prev=""
for a in "$@"; do [ "$prev" = --output ] && out=$a; prev=$a; done
had=no; [ -f "$out/m@seed1/checkpoint.pt" ] && had="$(cat "$out/m@seed1/checkpoint.pt")"
echo "$out|$had|$*" >> calls.log
echo "$OMP_NUM_THREADS" >> threads.log
sleep "${FAKE_SECONDS:-0}"
[ "${out#runs/}" = "${FAKE_FAIL:-}" ] && exit 1
mkdir -p "$out"
for f in config.yaml log.csv results.csv results.md; do echo "$f of $out" > "$out/$f"; done
"""


def layout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "bench").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "bench" / "benchmark.sh")
    python = root / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return root


def run(root: Path, *args: str, parked: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=str(root / "python"), THREADS="1") | ({"PARKED": str(parked)} if parked else {}) | env
    env = {k: v for k, v in env.items() if v and not k.startswith("OMP_")}  # (THREADS="" unsets it)
    return subprocess.run(["bash", "bench/benchmark.sh", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def calls(root: Path) -> list[list[str]]:
    return [line.split("|") for line in (root / "calls.log").read_text().splitlines()]


def test_every_part_trained_once_and_recorded_then_skipped(tmp_path):
    root = layout(tmp_path)
    first = run(root)
    assert first.returncode == 0, first.stderr
    outs = [out for out, _, _ in calls(root)]
    assert len(outs) == len(set(outs)) > 10 and all(out.startswith("runs/protocol_") for out in outs)
    for out in outs:  # each part's record copied to docs/runs/<part>, started afresh (no --resume)
        name = Path(out).name
        assert [(root / "docs/runs" / name / f).read_text() for f in RECORD] == [f"{f} of {out}\n" for f in RECORD]
    assert all("--resume" not in args.split() for _, _, args in calls(root))
    for step in ("protocol_fashion_papers_8x_s0-2", "protocol_fashion_papers_8x"):  # the 80-epoch step at 3 seeds, 5
        assert (root / "docs/runs" / step).is_dir()
    again = run(root)
    assert again.returncode == 0 and len(calls(root)) == len(outs)  # all recorded: nothing trains again
    assert "recorded in docs/runs/" in again.stdout


def test_a_killed_part_resumes_on_the_same_machine(tmp_path):
    root = layout(tmp_path)
    (root / "runs/protocol_elpv_s0-2").mkdir(parents=True)  # a run folder a killed part left
    assert run(root).returncode == 0
    args = {out: args.split() for out, _, args in calls(root)}
    assert "--resume" in args["runs/protocol_elpv_s0-2"] and "--resume" not in args["runs/protocol_elpv_s3-4"]


def test_park_then_resume_on_another_machine(tmp_path):
    here = layout(tmp_path / "a")
    run_dir = here / "runs/protocol_fashion_papers_8x_ape_s2"
    (run_dir / "m@seed1").mkdir(parents=True)
    (run_dir / "m@seed1/checkpoint.pt").write_text("state after epoch 40")
    (run_dir / "m@seed1/model.safetensors").write_text("weights")  # rewritten every epoch: not parked
    (run_dir / "m@seed0").mkdir()  # a model of the part already trained and tested
    (run_dir / "m@seed0/checkpoint.pt").write_text("state after epoch 80")
    (run_dir / "m@seed0/results.json").write_text("its results")
    (run_dir / "config.yaml").write_text("settings")
    (run_dir / "log.csv").write_text("40 rows")
    done = here / "runs/protocol_elpv_s0-2"  # recorded: nothing to park
    done.mkdir()
    (done / "config.yaml").write_text("settings")
    (here / "docs/runs/protocol_elpv_s0-2").mkdir(parents=True)
    (here / "docs/runs/protocol_elpv_s0-2/results.csv").write_text("record")
    shelf = tmp_path / "shelf"  # storage outside the repository that outlives the machine
    assert "needs PARKED" in run(here, "park").stderr
    inside = run(here, "park", parked=here / "docs/parked")
    assert inside.returncode == 1 and "inside the repository" in inside.stderr
    none = run(here, "park", parked=tmp_path / "nowhere", ONLY="protocol_elpv_s0-2")  # recorded: not parked
    assert none.returncode == 1 and "names no started, unrecorded part" in none.stderr
    assert not (tmp_path / "nowhere/protocol_elpv_s0-2").exists()
    parked = run(here, "park", parked=shelf)
    assert parked.returncode == 0, parked.stderr
    assert not (here / "calls.log").exists()  # park trains nothing
    unfinished = shelf / "protocol_fashion_papers_8x_ape_s2"
    files = sorted(str(p.relative_to(unfinished)) for p in unfinished.rglob("*") if p.is_file())
    assert files == ["config.yaml", "log.csv", "m@seed0/checkpoint.pt", "m@seed0/results.json", "m@seed1/checkpoint.pt"]
    assert not (shelf / "protocol_elpv_s0-2").exists()
    # another machine: a fresh checkout holds docs/ (what git carried) but no runs/
    there = layout(tmp_path / "b")
    shutil.copytree(here / "docs", there / "docs")
    assert run(there, parked=shelf).returncode == 0
    by_out = {out: (had, args.split()) for out, had, args in calls(there)}
    had, args = by_out["runs/protocol_fashion_papers_8x_ape_s2"]
    assert had == "state after epoch 40" and "--resume" in args  # resumed from the parked checkpoint
    assert not unfinished.exists()  # recorded: removed
    assert (there / "docs/runs/protocol_fashion_papers_8x_ape_s2/results.csv").exists()


def test_park_with_only_parks_the_parts_it_names(tmp_path):
    root = layout(tmp_path)
    for name, epoch in (("protocol_fashion_papers_16x_ape_s0", 36), ("protocol_fashion_originals_8x_rope_s0", 6)):
        run_dir = root / "runs" / name
        (run_dir / "m@seed0").mkdir(parents=True)
        (run_dir / "m@seed0/checkpoint.pt").write_text(f"state after epoch {epoch}")
        (run_dir / "config.yaml").write_text("settings")
        (run_dir / "log.csv").write_text(f"{epoch} rows")
    shelf = tmp_path / "shelf"
    parked = run(root, "park", parked=shelf, ONLY="protocol_fashion_papers_16x_*")
    assert parked.returncode == 0, parked.stderr
    assert sorted(p.name for p in shelf.iterdir()) == ["protocol_fashion_papers_16x_ape_s0"]
    assert (shelf / "protocol_fashion_papers_16x_ape_s0/m@seed0/checkpoint.pt").read_text() == "state after epoch 36"


def test_a_parked_part_with_a_link_is_refused(tmp_path):
    for target in ("file", "folder"):
        root = layout(tmp_path / target)
        unfinished = tmp_path / target / "shelf/protocol_elpv_s0-2"
        unfinished.mkdir(parents=True)
        (unfinished / "config.yaml").write_text("settings")
        outside = tmp_path / target / "outside"
        outside.mkdir()
        if target == "file":  # a checkpoint that points elsewhere
            (unfinished / "m@seed1").mkdir()
            (unfinished / "m@seed1/checkpoint.pt").symlink_to(outside / "secret")
        else:  # the whole folder a link (its config.yaml then read through it)
            shutil.move(unfinished, outside / "unfinished")
            unfinished.symlink_to(outside / "unfinished")
        refused = run(root, parked=unfinished.parent)
        assert refused.returncode == 1 and "holds a link or a special file" in refused.stderr
        assert not (root / "calls.log").exists() and not (root / "runs/protocol_elpv_s0-2").exists()


def test_two_workers_share_the_parts_out_and_join_every_whole_step(tmp_path):
    alone, shared = layout(tmp_path / "alone"), layout(tmp_path / "shared")
    assert run(alone).returncode == 0
    both = run(shared, JOBS="2", THREADS="", FAKE_SECONDS="0.3")
    assert both.returncode == 0, both.stderr
    outs = [out for out, _, _ in calls(shared)]
    assert sorted(outs) == sorted(out for out, _, _ in calls(alone))  # every part, each once
    started = [line for line in both.stdout.splitlines() if " train.py " in line]
    assert {line[:4] for line in started} == {"[1] ", "[2] "}  # both workers trained parts
    assert "another worker is training it" in both.stdout
    threads = max(len(os.sched_getaffinity(0)) // 2, 1)  # the cores shared out
    assert (shared / "threads.log").read_text().split() == [str(threads)] * len(outs)
    steps = ("protocol_elpv", "protocol_fashion_families", "protocol_fashion_papers_8x_s0-2",
             "protocol_fashion_papers_8x", "protocol_fashion")  # fmt: skip
    for step in steps:
        assert (shared / "docs/runs" / step).is_dir()
    assert list((shared / "runs").glob(".*.lock"))  # the claims: empty files, in runs/ (not tracked)


def test_a_part_another_process_trains_is_skipped_and_its_step_not_joined(tmp_path):
    root = layout(tmp_path)
    (root / "runs").mkdir()
    with open(root / "runs/.protocol_elpv_s0-2.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another worker, training it
        result = run(root)
    assert result.returncode == 0, result.stderr
    assert "=== protocol_elpv_s0-2: another worker is training it (JOBS); skipped here" in result.stdout
    outs = [out for out, _, _ in calls(root)]
    assert "runs/protocol_elpv_s0-2" not in outs and "runs/protocol_elpv_s3-4" in outs
    assert not (root / "docs/runs/protocol_elpv").exists()  # a part short: not joined
    assert run(root).returncode == 0  # its claim gone: trained, then the step joined
    assert calls(root)[-1][0] == "runs/protocol_elpv_s0-2" and (root / "docs/runs/protocol_elpv").is_dir()


def test_the_papers_recipe_is_joined_at_3_seeds_before_seeds_3_and_4_train(tmp_path):
    root = layout(tmp_path)
    result = run(root, FAKE_FAIL="protocol_fashion_papers_8x_ape_s3")  # the first part of seeds 3-4
    assert result.returncode != 0
    assert (root / "docs/runs/protocol_fashion_papers_8x_s0-2").is_dir()
    assert not (root / "docs/runs/protocol_fashion_papers_8x").exists()


def test_the_crops_alone_train_at_one_size_after_the_papers_three_seeds_and_before_seeds_3_and_4(tmp_path):
    root = layout(tmp_path)
    assert run(root).returncode == 0
    outs = [out for out, _, _ in calls(root)]
    crops = [i for i, out in enumerate(outs) if out.startswith("runs/protocol_fashion_crops_4x_")]
    assert [outs[i] for i in crops] == [f"runs/protocol_fashion_crops_4x_{m}_s0" for m in ("ape", "rope")]
    assert outs.index("runs/protocol_fashion_papers_8x_mixed_s2") < crops[0]
    assert crops[-1] < outs.index("runs/protocol_fashion_papers_8x_ape_s3")
    for i in crops:  # the papers' config with its train_sizes emptied: an empty --train-sizes before the next flag
        args = calls(root)[i][2].split()
        assert args[args.index("--config") + 1] == "configs/protocol_fashion_papers.yaml"
        assert args[args.index("--train-sizes") + 1].startswith("--") and args[args.index("--epochs") + 1] == "40"


def test_the_originals_then_160_epochs_train_after_the_papers_five_seeds_and_before_the_plain_records(tmp_path):
    root = layout(tmp_path)
    assert run(root).returncode == 0
    outs = [out for out, _, _ in calls(root)]
    # (the originals first: a sitting holds one of their parts, not a 160-epoch one; a machine may not outlive it)
    after = [f"runs/protocol_fashion_originals_4x_{m}_s0" for m in ("ape", "rope", "mixed")]
    after += [f"runs/protocol_fashion_papers_16x_{m}_s0" for m in ("ape", "rope")]
    at = [outs.index(out) for out in after]
    assert outs.index("runs/protocol_fashion_papers_8x_mixed_s4") < at[0] and at == sorted(at)
    assert at[-1] < outs.index("runs/protocol_fashion_s0-1")
    mixed = calls(root)[at[2]][2].split()
    assert mixed[mixed.index("--models") + 1] == "vit_rope_mixed_tiny"
    assert (root / "docs/runs/protocol_fashion_originals_4x").is_dir()  # the three joined
    for i, epochs in zip(at, ("40", "40", "40", "160", "160"), strict=True):
        args = calls(root)[i][2].split()
        assert args[args.index("--config") + 1] == "configs/protocol_fashion_papers.yaml"
        assert args[args.index("--epochs") + 1] == epochs and args[args.index("--seeds") + 1] == "0"
        # the originals' batches from the originals at their sizes, and the 160-epoch runs as the 80-epoch ones
        assert ("--train-sizes-from" in args) == (epochs == "40")
        if epochs == "40":
            assert args[args.index("--train-sizes-from") + 1] == "originals" and "--train-sizes" not in args


def test_the_originals_at_80_epochs_and_3_seeds_train_after_160_epochs_and_are_joined(tmp_path):
    root = layout(tmp_path)
    assert run(root).returncode == 0
    outs = [out for out, _, _ in calls(root)]
    models = {"ape": "vit_ape_tiny", "rope": "vit_rope_tiny", "mixed": "vit_rope_mixed_tiny"}
    parts = [(f"protocol_fashion_originals_8x_{m}_s{seed}", m, seed) for seed in (0, 1, 2) for m in models]
    at = [outs.index(f"runs/{part}") for part, _, _ in parts]
    assert outs.index("runs/protocol_fashion_papers_16x_rope_s0") < at[0] and at == sorted(at)
    assert at[-1] < outs.index("runs/protocol_fashion_crops_8x_ape_s0")
    for i, (_, m, seed) in zip(at, parts, strict=True):  # the papers' 80-epoch runs of that seed, from the originals
        args = calls(root)[i][2].split()
        assert args[args.index("--config") + 1] == "configs/protocol_fashion_papers.yaml"
        assert args[args.index("--epochs") + 1] == "80" and args[args.index("--seeds") + 1] == str(seed)
        assert args[args.index("--models") + 1] == models[m]
        assert args[args.index("--train-sizes-from") + 1] == "originals" and "--train-sizes" not in args
    assert (root / "docs/runs/protocol_fashion_originals_8x").is_dir()


def test_the_crops_alone_at_80_epochs_and_3_seeds_train_after_the_originals_and_are_joined(tmp_path):
    root = layout(tmp_path)
    assert run(root).returncode == 0
    outs = [out for out, _, _ in calls(root)]
    parts = [f"protocol_fashion_crops_8x_{m}_s{seed}" for seed in (0, 1, 2) for m in ("ape", "rope")]
    at = [outs.index(f"runs/{part}") for part in parts]
    assert outs.index("runs/protocol_fashion_originals_8x_mixed_s2") < at[0] and at == sorted(at)
    assert at[-1] < outs.index("runs/protocol_fashion_s0-1")
    for i, part in zip(at, parts, strict=True):  # the papers' 80-epoch runs of that seed, every batch at 14 px
        args = calls(root)[i][2].split()
        assert args[args.index("--config") + 1] == "configs/protocol_fashion_papers.yaml"
        assert args[args.index("--epochs") + 1] == "80" and args[args.index("--seeds") + 1] == part[-1]
        assert args[args.index("--train-sizes") + 1].startswith("--")
    assert (root / "docs/runs/protocol_fashion_crops_8x").is_dir()


def test_only_trains_the_parts_its_globs_name_in_order_and_joins_a_whole_step(tmp_path):
    root = layout(tmp_path)
    (root / "protocol_fashion_2x").touch()  # a file here that a glob would match: never expanded against it
    step = "protocol_fashion_originals_4x_*_s0"
    named = run(root, ONLY=f"{step} protocol_fashion_2x")
    assert named.returncode == 0, named.stderr
    assert [out for out, _, _ in calls(root)] == [
        f"runs/protocol_fashion_{p}"
        for p in ("2x", "originals_4x_ape_s0", "originals_4x_rope_s0", "originals_4x_mixed_s0")
    ]
    assert (root / "docs/runs/protocol_fashion_originals_4x").is_dir()  # every part recorded: joined
    again = run(root, ONLY="protocol_fashion_2x")  # named, and recorded: nothing to train, and no error
    assert again.returncode == 0 and "protocol_fashion_2x: recorded" in again.stdout and len(calls(root)) == 4


def test_only_naming_no_part_is_one_error(tmp_path):
    root = layout(tmp_path)
    for only in ("protocol_fashion_2X", "*16x"):
        refused = run(root, ONLY=only)
        assert refused.returncode == 1 and f"ONLY={only} names no part" in refused.stderr
    assert not (root / "calls.log").exists()


def test_jobs_must_be_a_whole_number(tmp_path):
    root = layout(tmp_path)
    for jobs in ("0", "two", "-1", "1.5"):
        refused = run(root, JOBS=jobs)
        assert refused.returncode == 1 and f"JOBS={jobs}: the number of parts" in refused.stderr
    assert not (root / "calls.log").exists()


def test_a_failed_part_stops_its_worker_and_the_exit_status_says_so(tmp_path):
    root = layout(tmp_path)
    result = run(root, JOBS="2", FAKE_FAIL="protocol_elpv_s3-4")
    assert result.returncode == 1
    assert not (root / "docs/runs/protocol_elpv_s3-4").exists() and not (root / "docs/runs/protocol_elpv").exists()
    assert (root / "docs/runs/protocol_elpv_s0-2/results.csv").exists()


def test_ctrl_c_stops_every_worker_and_its_training(tmp_path):
    """A command started with & ignores SIGINT: the workers must not, or Ctrl-C would leave them training."""
    root = layout(tmp_path)
    env = dict(os.environ, PYTHON=str(root / "python"), JOBS="2", FAKE_SECONDS="60")
    script = subprocess.Popen(["bash", "bench/benchmark.sh"], cwd=root, env=env, start_new_session=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not ((root / "calls.log").exists() and len(calls(root)) == 2) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(calls(root)) == 2  # both workers training
    os.killpg(script.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    try:
        script.wait(timeout=15)
        while time.monotonic() < deadline + 15 and group_alive(script.pid):  # the workers and their train.py too
            time.sleep(0.1)
        assert not group_alive(script.pid), "a worker or its training outlived Ctrl-C"
    finally:
        if group_alive(script.pid):
            os.killpg(script.pid, signal.SIGKILL)
    assert script.returncode != 0 and len(calls(root)) == 2  # nothing trained on
    assert not list((root / "docs").rglob("results.csv"))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
