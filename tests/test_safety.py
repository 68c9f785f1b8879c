"""What train.py loads runs no code, and a run touches nothing but its own files (issue 24): planted pickles through
every loader, garbled and foreign files, links and parent folders in --output, a finished run that a fresh command
must not replace, and data or settings that would train silently wrong. Each case one clear line, every file outside
the run's own byte-identical."""

import gzip
import math
import os
import pathlib
import shutil
import struct

import pytest
import timm
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import train
from tests.test_train import ONE, TINY, make_imagefolder, snapshot
from vit_rope import RotaryEmbedding
from vit_rope.training import report
from vit_rope.training.idx import IdxImages

EPOCH = [*ONE, "--epochs", "1"]


class Planted:
    """A pickled object whose unpickling creates ``marker``: were anything loaded with a full unpickle, it would
    run."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (self.marker,)


def plant(path: pathlib.Path, marker: pathlib.Path, **extra) -> pathlib.Path:
    torch.save(dict(model=Planted(marker), optimizer={}, model_ema=None, epoch=0, rng=[], **extra), path)
    return path


def one_line(stop: pytest.ExceptionInfo) -> str:
    text = str(stop.value)
    assert text.startswith("error: ") and "\n" not in text, text
    return text


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> pathlib.Path:
    """A finished one-model, one-epoch run."""
    out = tmp_path_factory.mktemp("finished") / "run"
    train.main([*EPOCH, "--output", str(out)])
    return out


def copy_of(finished: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    return run


# ------------------------------------------------------------------------------------------------ loaders
def test_a_planted_pickle_in_a_runs_checkpoint_runs_nothing_on_resume(finished, tmp_path):
    run, marker = copy_of(finished, tmp_path), tmp_path / "ran"
    plant(run / "vit_rope_tiny" / "checkpoint.pt", marker)
    before = snapshot(run)
    with pytest.raises(SystemExit) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    text = one_line(stop)
    assert "checkpoint.pt cannot be read as a checkpoint (it holds pickled objects" in text
    assert "model.safetensors" in text  # the weights that may be whole, and what else to do
    assert not marker.exists() and snapshot(run) == before


@pytest.mark.parametrize("where", ["initial-checkpoint", "eval-only", "video", "pretrained"])
def test_a_planted_pickle_runs_nothing_through_any_loader(where, tmp_path):
    marker, path = tmp_path / "ran", plant(tmp_path / "weights.pt", tmp_path / "ran")
    args = {
        "initial-checkpoint": [*EPOCH, "--initial-checkpoint", str(path)],
        "eval-only": [*EPOCH, "--eval-only", "--initial-checkpoint", str(path)],
        "video": ["--dataset", "synthetic_video", "--models", "vit_rope3d_tiny", *TINY[3:8], "--num-frames", "2",
                  "--img-size", "16", "--eval-sizes", "16", "--initial-checkpoint", str(path)],
        "pretrained": [*EPOCH, "--pretrained", "--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32",
                       "num_heads=2", f"pretrained_cfg_overlay={{file: {path}}}"],
    }[where]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        train.main([*args, "--output", str(tmp_path / "out")])
    assert "weights.pt" in one_line(stop) or "pretrained weights of" in one_line(stop)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_timms_pretrained_path_runs_no_pickle_either(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(Exception):  # noqa: B017 (timm's own error: it refuses the file)
        timm.create_model("vit_rope_tiny", pretrained=True, pretrained_cfg_overlay=dict(file=str(plant(
            tmp_path / "w.pt", marker))))  # fmt: skip
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["random bytes", "truncated", "empty", "another model"])
def test_a_broken_checkpoint_is_one_line_and_the_results_stay(damage, finished, tmp_path):
    run = copy_of(finished, tmp_path)
    ckpt = run / "vit_rope_tiny" / "checkpoint.pt"
    if damage == "random bytes":
        ckpt.write_bytes(os.urandom(4096))
    elif damage == "truncated":
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:  # a whole checkpoint of another size: it reads, and does not fit
        other = tmp_path / "other"
        train.main([*EPOCH, "--model-kwargs", "embed_dim=16", "--output", str(other)])
        shutil.copy(other / "vit_rope_tiny" / "checkpoint.pt", ckpt)
    before = snapshot(run)
    with pytest.raises(SystemExit) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    text = one_line(stop)
    assert str(ckpt) in text and ("cannot be read" in text or "weights of another model" in text)
    assert snapshot(run) == before


@pytest.mark.parametrize("damage", ["truncated", "garbled header"])
def test_a_broken_safetensors_file_is_one_line(damage, finished, tmp_path):
    path = tmp_path / "w.safetensors"
    whole = (finished / "vit_rope_tiny" / "model.safetensors").read_bytes()
    path.write_bytes(whole[:100] if damage == "truncated" else b"\xff" * 8 + whole[8:])
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--initial-checkpoint", str(path), "--output", str(tmp_path / "out")])
    assert f"--initial-checkpoint '{path}' cannot be read as weights" in one_line(stop)


# ---------------------------------------------------------------------------------------------- the folder
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


@pytest.mark.parametrize("output,message", [("", "--output is empty"), ("/", "a system folder"),
                                            ("/usr", "a system folder"), ("{file}", "is a file, not a folder"),
                                            ("{readonly}/run", "is not writable")])  # fmt: skip
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


# ------------------------------------------------------------------------------------- data and settings
def test_an_image_folder_of_one_class_is_refused(tmp_path):
    make_imagefolder(tmp_path / "one", classes=1, per_class=2)
    with pytest.raises(SystemExit) as stop:
        train.main([*EPOCH, "--dataset", "imagefolder", "--data-dir", str(tmp_path / "one"), "--output",
                    str(tmp_path / "out")])  # fmt: skip
    assert "1 class folder(s)" in one_line(stop) and "at least two" in str(stop.value)


def write_idx(path: pathlib.Path, code: int, values: list, fmt: str) -> None:
    header = bytes([0, 0, code, 1]) + struct.pack(">I", len(values))
    path.write_bytes(gzip.compress(header + struct.pack(f">{len(values)}{fmt}", *values)))


@pytest.mark.parametrize("labels,message", [((0x08, [0, 12], "B"), "labels outside the 10 classes 0..9"),
                                            ((0x0D, [1.0, 2.0], "f"), "float32 labels, not integers")])  # fmt: skip
def test_idx_labels_outside_the_classes_or_not_integers_are_refused(labels, message, tmp_path):
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">III", 2, 2, 2)
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(header + bytes(8)))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", *labels)
    with pytest.raises(ValueError, match=message):
        IdxImages(str(tmp_path), True, [str(i) for i in range(10)])


@pytest.mark.parametrize("text,message", [
    ("epochs: 1\nepochs: 2\n", "key 'epochs' is given twice"),
    ("lr: !!python/object/apply:os.system ['touch {marker}']\n", "not valid YAML"),
    ("lr: .inf\n", "--lr inf: lr must be finite"),
    ("model_kwargs: {{rope_theta: ../x}}\n", "theta='../x' must be a number"),
])  # fmt: skip
def test_config_files_that_would_train_silently_wrong_are_one_line(text, message, tmp_path):
    marker = tmp_path / "ran"
    config = tmp_path / "c.yaml"
    config.write_text(text.format(marker=marker))
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*EPOCH, "--config", str(config), "--output", str(tmp_path / "out")])
    one_line(stop)
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_runs_saved_config_with_a_key_twice_is_refused_on_resume(finished, tmp_path):
    run = copy_of(finished, tmp_path)
    (run / "config.yaml").write_text((run / "config.yaml").read_text() + "epochs: 7\n")
    with pytest.raises(SystemExit, match="key 'epochs' is given twice") as stop:
        train.main(["--output", str(run), "--resume"])
    one_line(stop)


def test_the_headline_leaves_out_sizes_that_were_not_evaluated():
    rows = [dict(model="m", recipe="", seed=0, train_size=16, eval_size=s, protocol="resize", rope_scaling="none",
                 top1=t, top5=99.0, loss=1.0, params=10) for s, t in ((16, 50.0), (32, 40.0))]  # fmt: skip
    text = report.headline_table(report.summarise(rows), 16)
    assert "| model | recipe | best scaling at 2x | 16 px | 32 px | 32 / 16 |" in text  # no 0.5x column
    assert "| m | - | none | 50.0 | 40.0 | 0.80 |" in text


def test_no_aug_reads_as_english_in_help(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "--aug, --no-aug" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------- spiral in 3D
@settings(max_examples=12, deadline=None)
@given(dim=st.sampled_from([16, 32, 40, 48, 64, 96]), data=st.data())
def test_spiral_in_3d_takes_its_default_directions_for_any_head_dim(dim, data):
    """The default picks directions that fit the plane (it failed for 48 channels), and stays exactly relative."""
    layer = RotaryEmbedding(dim, axes=3, family="spiral").double()
    assert layer.family.directions >= 2 and layer.family.plane_dims % 8 == 0
    pos = torch.tensor(data.draw(st.lists(st.lists(st.floats(-9, 9), min_size=3, max_size=3), min_size=4,
                                          max_size=4)), dtype=torch.float64)  # fmt: skip
    q, k = torch.randn(2, 4, dim, dtype=torch.float64)

    def scores(p):
        return layer(q, positions=p) @ layer(k, positions=p).mT

    torch.testing.assert_close(scores(pos + 3.5), scores(pos), rtol=0, atol=1e-9)
    assert math.isfinite(float(scores(pos).sum()))


def test_spiral_refusals_offer_choices():
    with pytest.raises(ValueError, match=r"choose one of \[2, 4, 8\]"):
        RotaryEmbedding(32, axes=2, family="spiral", directions=3)


def test_the_planted_pickle_would_run_under_a_full_unpickle(tmp_path):
    """The tests above have teeth: loading the same file without weights_only runs it."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "w.pt", marker), weights_only=False)
    assert marker.exists()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "ok.safetensors"))  # (a whole file, for contrast)
