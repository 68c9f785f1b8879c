"""The run folder (vit_rope/training/folder.py): a run creates, replaces and deletes only its own files inside --output,
whatever a file it did not write says (an earlier run's config, a folder received from someone else), never through a
link or special file planted before or while it runs, and a kill leaves every file whole. Each case one clear line,
every file outside the run's own byte-identical."""

import json
import os
import pathlib
import shutil
import signal

import pytest
import yaml

import train
from tests.test_train import ONE, make_imagefolder, snapshot  # noqa: F401 (make_imagefolder: shared helpers)
from vit_rope.training import folder, report

EPOCH = [*ONE, "--epochs", "1"]


def one_line(stop: pytest.ExceptionInfo) -> str:
    text = str(stop.value)
    assert text.startswith("error: ") and "\n" not in text, text
    return text


def finish(tmp_path_factory) -> pathlib.Path:
    """A finished one-model, one-epoch run (each module's ``finished`` fixture: the tests copy it, never change it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train.main([*EPOCH, "--output", str(out)])
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> pathlib.Path:
    return finish(tmp_path_factory)


@pytest.fixture
def no_hang():
    """Fail, rather than hang, where earlier code blocked for ever (reading a FIFO)."""

    def hung(*_):
        raise TimeoutError("blocked reading a FIFO")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def copy_of(finished: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run, symlinks=True)
    return run


# ---------------------------------------------------------------------------------- deletes: --overwrite
@pytest.mark.parametrize("without", [None, "config.yaml"])
def test_a_fresh_run_into_a_finished_runs_folder_is_refused_and_changes_nothing(without, finished, tmp_path):
    """Refused where a run's config is, and where it is gone but the run's results or weights are."""
    run = copy_of(finished, tmp_path)
    if without:
        (run / without).unlink()
    before = snapshot(run)
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--output", str(run)])
    assert (
        "holds a run already" in one_line(stop) and "--resume" in str(stop.value) and "--overwrite" in str(stop.value)
    )
    assert snapshot(run) == before


def test_overwrite_deletes_the_earlier_runs_files_by_name_and_nothing_else(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    (run / "notes.txt").write_text("mine")
    (run / "vit_rope_tiny" / "plot.png").write_bytes(b"mine")
    (run / "elsewhere").mkdir()
    (run / "elsewhere" / "checkpoint.pt").write_bytes(b"not this run's")
    train.main([*EPOCH, "--models", "vit_ape_tiny", "--output", str(run), "--overwrite"])
    left = set(snapshot(run))
    assert {"notes.txt", "vit_rope_tiny/plot.png", "elsewhere/checkpoint.pt"} <= left  # not files a run makes
    assert not any(p.startswith("vit_rope_tiny/") and p != "vit_rope_tiny/plot.png" for p in left)  # the earlier run's
    assert {"vit_ape_tiny/model.safetensors", "results.csv", "config.yaml"} <= left
    assert "vit_rope_tiny" not in (run / "results.csv").read_text()


@pytest.mark.parametrize("models", [[".."], ["vit_rope_tiny", "..", "."]])
def test_an_earlier_config_naming_folders_outside_the_output_deletes_nothing_there(models, finished, tmp_path):
    """Issue 35, 1: an earlier run's config.yaml is data. Its models name folders, and a name that is not one plain
    folder of --output (``..`` is the parent) names none: --overwrite deletes nothing outside --output."""
    run = copy_of(finished, tmp_path)
    for name in ("checkpoint.pt", "model.safetensors", "results.json"):
        (tmp_path / name).write_bytes(b"precious")  # in the parent of --output
    saved = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**saved, "models": models}))
    outside = {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run/")}
    train.main([*EPOCH, "--models", "vit_ape_tiny", "--output", str(run), "--overwrite"])
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.startswith("run/")} == outside


@pytest.mark.parametrize("tag", ["..", ".", "", ".lock", "x" * 256])
def test_a_run_folder_is_one_plain_folder_of_the_output(tag, tmp_path):
    with pytest.raises(SystemExit) as stop:
        folder.run_folder(tmp_path, tag)
    assert "rename the model or recipe" in one_line(stop)
    assert folder.run_folder(tmp_path, "a/../b:c=1@r@seed1") == tmp_path / "a_.._b__c=1@r@seed1"  # slashes are not


def test_a_run_in_a_parent_folder_deletes_nothing_of_other_experiments(tmp_path):
    runs, other_tree = tmp_path / "runs", tmp_path / "other_tree"
    for path in (runs / "my_other_experiment" / "checkpoint.pt", runs / "paper" / "results.json",
                 other_tree / "results.json"):  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"precious")
    (runs / "linked").symlink_to(other_tree)
    outside = snapshot(other_tree)
    others = {k: v for k, v in snapshot(runs).items() if not k.startswith("linked")}
    train.main([*EPOCH, "--output", str(runs)])
    assert snapshot(other_tree) == outside
    assert {k: v for k, v in snapshot(runs).items() if k in others} == others


# ----------------------------------------------------------------------------------------- links: writes
@pytest.mark.parametrize("link", [".lock", "config.yaml", "log.csv", "vit_rope_tiny/checkpoint.pt",
                                  "vit_rope_tiny/model.safetensors", "config.yaml.tmp",
                                  "vit_rope_tiny/checkpoint.pt.tmp"])  # fmt: skip
def test_a_link_inside_the_output_is_never_written_through(link, tmp_path):
    target, out = tmp_path / "target.txt", tmp_path / "out"
    target.write_text("precious")
    (out / "vit_rope_tiny").mkdir(parents=True)
    (out / link).symlink_to(target)
    command = [*EPOCH, "--output", str(out)]
    try:
        train.main(command)
    except SystemExit as e:  # a lock that is a link: refused, one line; a run's own file: a run is there
        assert str(e).startswith("error: ") and "\n" not in str(e)
        assert ("holds a run already" in str(e)) == (link != ".lock"), str(e)
        if link != ".lock":
            train.main([*command, "--overwrite"])  # the link goes, not what it points to
            assert not (out / link).is_symlink()
    assert target.read_text() == "precious"


def test_a_hard_linked_lock_is_refused_and_the_linked_file_is_untouched(tmp_path):
    """O_NOFOLLOW stops symbolic links only: a lock with a second hard link (a file outside --output) is one line,
    and that file keeps its bytes (before: the run wrote its pid into it and ended with exit 0)."""
    outside, out = tmp_path / "outside.txt", tmp_path / "out"
    outside.write_text("precious")
    out.mkdir()
    os.link(outside, out / ".lock")
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--output", str(out)])
    assert "hard links" in one_line(stop)
    assert outside.read_text() == "precious"


def test_a_hard_linked_file_a_run_reads_back_is_refused(tmp_path):
    path, other = tmp_path / "results.csv", tmp_path / "elsewhere.csv"
    other.write_text("a,b\n")
    os.link(other, path)
    with pytest.raises(SystemExit) as stop:
        folder.read_own(path, "the results", "remove it")
    assert "2 hard links" in one_line(stop)
    assert other.read_text() == "a,b\n"


def test_a_run_folder_that_is_a_link_is_refused_before_anything_is_written(tmp_path):
    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    elsewhere.mkdir()
    (elsewhere / "model.safetensors").write_bytes(b"precious")
    out.mkdir()
    (out / "vit_rope_tiny").symlink_to(elsewhere)
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--output", str(out)])
    assert "is a symbolic link, where run vit_rope_tiny keeps its files" in one_line(stop)
    assert snapshot(elsewhere) == {"model.safetensors": b"precious"} and sorted(os.listdir(out)) == ["vit_rope_tiny"]


def test_result_files_linked_while_the_run_goes_on_are_replaced_not_written_through(tmp_path, monkeypatch):
    """Issue 35, 3: links planted after the run's checks (here: after training, before the results are written) are
    replaced by the run's files; what they point to stays as it was."""
    out, targets = tmp_path / "out", tmp_path / "targets"
    targets.mkdir()
    results = train.model_results

    def plant_then_results(*args, **kwargs):
        rows = results(*args, **kwargs)
        for name in folder.RESULT_FILES:
            (targets / name).write_bytes(b"precious")
            (out / name).symlink_to(targets / name)
        return rows

    monkeypatch.setattr(train, "model_results", plant_then_results)
    train.main([*EPOCH, "--output", str(out)])
    assert all((targets / name).read_bytes() == b"precious" for name in folder.RESULT_FILES)
    assert all((out / name).is_file() and not (out / name).is_symlink() for name in folder.RESULT_FILES)


def test_a_run_folder_swapped_for_a_link_after_an_epoch_is_never_written_through(tmp_path, monkeypatch):
    """Issue 35, 3: the model's folder replaced by a link to another folder after epoch 1: epoch 2's checkpoint is
    refused (one line), not written into the other folder."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    save = train.save_checkpoint

    def save_then_swap(run_folder, *args):
        save(run_folder, *args)
        if not elsewhere.exists():
            run_folder.rename(elsewhere)
            run_folder.symlink_to(elsewhere)

    monkeypatch.setattr(train, "save_checkpoint", save_then_swap)
    with pytest.raises(SystemExit) as stop:
        train.main([*ONE, "--epochs", "2", "--output", str(out)])
    assert "is not a folder of the run's own any more" in one_line(stop)
    assert sorted(os.listdir(elsewhere)) == ["checkpoint.pt", "config.json", "model.safetensors"]
    assert train.torch.load(elsewhere / "checkpoint.pt", weights_only=True)["epoch"] == 0  # epoch 1's, untouched


class Killed(BaseException):
    pass


def test_a_kill_while_a_figure_is_written_leaves_the_old_one_whole(finished, tmp_path, monkeypatch):
    """Issue 35, 3: figures go through the atomic write too: a kill in the middle of one leaves no half-written file
    (a resumed run has removed the old figure first, so that the ones in a folder come from its config)."""
    run = copy_of(finished, tmp_path)
    old = (run / "extrapolation.png").read_bytes()
    figure = report.extrapolation_figure

    def half_written(*args, **kwargs):
        fig = figure(*args, **kwargs)

        def savefig(target, **kw):
            if isinstance(target, str | os.PathLike):  # (earlier code saved to the path itself)
                pathlib.Path(target).write_bytes(b"\x89PNG half")
            else:
                target.write(b"\x89PNG half")
            raise Killed

        fig.savefig = savefig
        return fig

    monkeypatch.setattr(report, "extrapolation_figure", half_written)
    with pytest.raises(Killed):
        train.main(["--output", str(run), "--resume", "--eval-sizes", "16", "24"])
    assert not (run / "extrapolation.png").exists() or (run / "extrapolation.png").read_bytes() == old
    assert not [p for p in os.listdir(run) if p.endswith(".tmp")]


def test_atomic_write_replaces_a_fifo_and_refuses_a_folder(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    folder.atomic_write(tmp_path / "fifo", folder.write_json, [1])
    assert (tmp_path / "fifo").read_text() == "[1]"
    (tmp_path / "dir").mkdir()
    with pytest.raises(SystemExit) as stop:
        folder.atomic_write(tmp_path / "dir", folder.write_json, [1])
    assert "something other than a file of the run stands there" in one_line(stop)
    assert os.listdir(tmp_path / "dir") == [] and sorted(os.listdir(tmp_path)) == ["dir", "fifo"]


# -------------------------------------------------------------------- special files where a run reads or writes
@pytest.mark.parametrize("where,kind,message", [
    ("vit_rope_tiny/checkpoint.pt", "dir", "is a folder, where the run writes its file checkpoint.pt"),
    ("results.md", "dir", "is a folder, where the run writes its file results.md"),
    ("log.csv", "fifo", "log.csv is a FIFO"),
    ("vit_rope_tiny/checkpoint.pt", "fifo", "checkpoint.pt is a FIFO"),
    ("vit_rope_tiny/results.json", "fifo", "results.json is a FIFO"),
    ("config.yaml", "fifo", "the run's config .*config.yaml is a FIFO, not a file the run wrote"),
    ("vit_rope_tiny/checkpoint.pt", "link", "the checkpoint .*checkpoint.pt is a symbolic link"),
    ("config.yaml", "link", "the run's config .*config.yaml is a symbolic link"),
    (".lock", "fifo", "the lock .* is a FIFO"),
])  # fmt: skip
def test_special_files_where_a_run_reads_or_writes_are_one_line_before_anything_changes(
    where, kind, message, finished, tmp_path, no_hang
):
    """Issue 35, 3 and 5: a folder, FIFO (which would block a read) or link (to another run's file) where a resumed
    run reads or writes its own file is refused, and nothing in --output changes."""
    run = copy_of(finished, tmp_path)
    path = run / where
    other = tmp_path / "other"
    shutil.copy(path if path.exists() else run / "config.yaml", other)
    path.unlink(missing_ok=True)
    {"dir": path.mkdir, "fifo": lambda: os.mkfifo(path), "link": lambda: path.symlink_to(other)}[kind]()
    before = snapshot(run)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    one_line(stop)
    assert snapshot(run) == before


# ------------------------------------------------------------------------------- forged files the run reads back
@pytest.mark.parametrize("text,message", [
    (b"\xff\xfe garbage\x00\x01", "cannot be read as CSV"),
    (b"model,epoch\nvit_rope_tiny,1\n", "its columns are"),
    ("model,epoch,train_loss,train_top1,val_loss,val_top1,lr,seconds\nvit_rope_tiny,one,1,1,1,1,1,1\n",
     "epoch 'one' is not a whole number"),
    ("model,epoch,train_loss,train_top1,val_loss,val_top1,lr,seconds\nvit_rope_tiny,1,x,1,1,1,1,1\n",
     "train_loss 'x' is not a finite number"),
])  # fmt: skip
def test_a_damaged_log_is_one_line_and_the_results_stay(text, message, finished, tmp_path):
    """Issue 35, 5: a garbled or forged log.csv on --resume: one line naming it, before the results are touched."""
    run = copy_of(finished, tmp_path)
    (run / "log.csv").write_bytes(text if isinstance(text, bytes) else text.encode())
    before = snapshot(run)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    assert "log.csv" in one_line(stop)
    assert snapshot(run) == before


@pytest.mark.parametrize("forge,message", [
    (lambda rows: [{**rows[0], "top1": "abc"}], "top1 is 'abc', not a number"),
    (lambda rows: [{**rows[0], "top1": float("nan")}], "top1 is 'nan'"),
    (lambda rows: {"rows": rows}, "not a list of result rows"),
    (lambda rows: [{**rows[0], "model": "vit_ape_tiny"}], "model is 'vit_ape_tiny', not this run's"),
    (lambda rows: [{k: v for k, v in rows[0].items() if k != "loss"}], "a row has the fields"),
    (lambda rows: "not json", "cannot be read as JSON"),
])  # fmt: skip
def test_forged_results_are_one_line_and_the_results_stay(forge, message, finished, tmp_path):
    """Issue 35, 5: a results.json whose rows parse but lie is refused on --resume before anything changes."""
    run = copy_of(finished, tmp_path)
    path = run / "vit_rope_tiny" / "results.json"
    forged = forge(json.loads(path.read_text()))
    path.write_text(forged if forged == "not json" else json.dumps(forged))
    before = snapshot(run)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--output", str(run), "--resume"])
    assert "results.json" in one_line(stop)
    assert snapshot(run) == before


# ------------------------------------------------------------------------------------------------ --output
@pytest.mark.parametrize("output,message", [("", "--output is empty"), ("/", "a system folder"),
                                            ("/usr", "a system folder"), ("{file}", "is a file, not a folder"),
                                            ("{readonly}/run", "is not writable"),
                                            ("runs/a\0b", "no NUL character")])  # fmt: skip
def test_an_output_that_cannot_hold_a_run_is_one_line(output, message, tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "readonly").mkdir()
    os.chmod(tmp_path / "readonly", 0o555)
    output = output.format(file=tmp_path / "file", readonly=tmp_path / "readonly")
    try:
        if output.startswith(str(tmp_path / "readonly")) and os.access(tmp_path / "readonly", os.W_OK):
            pytest.skip("root writes into read-only folders: nothing to refuse")
        with pytest.raises(SystemExit, match=message) as stop:
            train.main([*EPOCH, "--output", output])
        one_line(stop)
    finally:
        os.chmod(tmp_path / "readonly", 0o755)
    assert (tmp_path / "file").read_text() == "x"
