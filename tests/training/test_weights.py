"""Weights a run loads and saves (vit_rope/training/weights.py): nothing loaded runs code, every field of a checkpoint
is checked for its type and range when it is read, and weights load only into the kind of model they record. A
broken, forged or foreign file is one line naming it, and the run's folder stays as it was."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import timm
import torch
import yaml
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import train
from tests.test_train import ROOT, TINY, snapshot
from tests.training.test_folder import EPOCH, copy_of, finish, no_hang, one_line  # noqa: F401 (no_hang: a fixture)
from vit_rope import FAMILIES
from vit_rope.training.models import split_spec
from vit_rope.training.weights import model_record, save_model_folder, timm_config


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> pathlib.Path:
    return finish(tmp_path_factory)


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


def test_the_planted_pickle_would_run_under_a_full_unpickle(tmp_path):
    """The tests above have teeth: loading the same file without weights_only runs it."""
    marker = tmp_path / "ran"
    torch.load(plant(tmp_path / "w.pt", marker), weights_only=False)
    assert marker.exists()
    save_file({"x": torch.zeros(1)}, str(tmp_path / "ok.safetensors"))  # (a whole file, for contrast)


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


# ------------------------------------------------------------------------------- forged checkpoint fields
def garbage_rng(state: dict) -> list:
    one = state["rng"][0]
    return [{**one, "python": (3, (1, 2, 3), None)}]


def wrong_optimizer_shape(state: dict) -> dict:
    opt = {**state["optimizer"], "state": {k: dict(v) for k, v in state["optimizer"]["state"].items()}}
    opt["state"][0]["exp_avg"] = torch.zeros(3)
    return opt


FORGED = {  # field → (its forged value from the real state, the error's words)
    "epoch None": ("epoch", lambda s: None, "epoch 'None' is not a whole number"),
    "epoch a string": ("epoch", lambda s: "1", "epoch '1' is not a whole number"),
    "epoch 0.5": ("epoch", lambda s: 0.5, "epoch '0.5' is not a whole number"),
    "epoch -3": ("epoch", lambda s: -3, "epoch '-3' is not a whole number"),
    "epoch True": ("epoch", lambda s: True, "epoch 'True' is not a whole number"),
    "model a list": ("model", lambda s: [1, 2], "its model is not a mapping of weight names to tensors"),
    "model of numbers": ("model", lambda s: dict.fromkeys(s["model"], 1), "its model is not a mapping"),
    "model_ema a string": ("model_ema", lambda s: "x", "its model_ema is neither"),
    "optimizer a list": ("optimizer", lambda s: [], "its optimizer is not an optimizer's state"),
    "optimizer of another shape": ("optimizer", wrong_optimizer_shape, "optimizer state that does not fit"),
    "optimizer of other groups": ("optimizer", lambda s: {**s["optimizer"], "param_groups": []},
                                  "optimizer state that does not fit"),
    "optimizer lr a string": ("optimizer", lambda s: {**s["optimizer"], "param_groups": [
        {**g, "lr": "fast"} for g in s["optimizer"]["param_groups"]]}, "group setting lr is 'fast'"),
    "rng empty": ("rng", lambda s: [], "random-number states are not a list"),
    "rng garbage": ("rng", garbage_rng, "random-number state of process 0 is not one the generators take"),
    "record garbled": ("record", lambda s: {"model": 1}, "damaged model record"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_checkpoint_field_is_one_line_and_the_run_stays(case, finished, tmp_path):
    """Issue 35, 5: a checkpoint.pt whose fields parse but lie (an epoch of -3 trained epochs -1..2 silently; the
    others gave tracebacks after the results were deleted): every field is checked when it is read, and the refusal
    comes before anything in --output changes."""
    key, forge, message = FORGED[case]
    run = copy_of(finished, tmp_path)
    path = run / "vit_rope_tiny" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, key: forge(state)}, path)
    before = snapshot(run)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "3"])
    assert str(path) in one_line(stop)
    assert snapshot(run) == before


# ------------------------------------------------------------------------------------------ family records
def test_saved_weights_record_what_model_they_are_as_plain_strings(finished):
    weights = finished / "vit_rope_tiny" / "model.safetensors"
    load_file(weights)  # plain safetensors: loads anywhere
    with safe_open(str(weights), "pt") as f:
        record = json.loads(f.metadata()["vit_rope.record"])
    assert record["model"] == "vit_rope_tiny" and record["kind"] == "vit_rope ViT, pos_embed=rope"
    assert json.loads(record["model_args"])["embed_dim"] == 32
    state = torch.load(finished / "vit_rope_tiny" / "checkpoint.pt", weights_only=True)
    assert state["record"] == record


@pytest.mark.parametrize("other", ["vit_lookhere_tiny", "vit_goldengate_tiny", "vit_spiral_tiny",
                                   "vit_rope_tiny:pos_embed=none"])  # fmt: skip
@pytest.mark.parametrize("file", ["model.safetensors", "checkpoint.pt"])
def test_weights_of_one_family_are_refused_by_another(other, file, finished, tmp_path):
    """Issue 35, 4: RoPE's weights have the names and shapes of these models' (their encodings learn nothing), so
    they loaded silently and were evaluated as another encoding; the record names both."""
    weights = finished / "vit_rope_tiny" / file
    args = [*EPOCH, "--models", other, "--eval-only", "--initial-checkpoint", str(weights)]
    with pytest.raises(SystemExit, match="holds the weights of vit_rope_tiny .*pos_embed=rope.*, not of a") as stop:
        train.main([*args, "--output", str(tmp_path / "ev")])
    assert other in one_line(stop) and "--allow-transfer" in str(stop.value)
    assert not (tmp_path / "ev").exists()
    if file == "model.safetensors" and other == "vit_lookhere_tiny":  # a deliberate transfer is one flag away
        rows = train.main([*args, "--allow-transfer", "--output", str(tmp_path / "ev")])
        assert rows and rows[0]["model"] == other


def test_a_run_resumed_as_another_family_is_refused(finished, tmp_path):
    """Issue 35, 4: a RoPE run's folder renamed and its config edited to say LookHere resumed as LookHere."""
    run = copy_of(finished, tmp_path)
    (run / "vit_rope_tiny").rename(run / "vit_lookhere_tiny")
    for name in ("config.yaml", "log.csv"):
        (run / name).write_text((run / name).read_text().replace("vit_rope_tiny", "vit_lookhere_tiny"))
    (run / "vit_lookhere_tiny" / "results.json").unlink()
    before = snapshot(run)
    with pytest.raises(SystemExit, match="holds the weights of vit_rope_tiny .*, not of a vit_lookhere_tiny") as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    one_line(stop)
    assert snapshot(run) == before


def test_ema_weights_are_checked_against_timms_ema_names_on_resume(tmp_path):
    """The EMA state of a checkpoint has timm's names (``module.`` first): a whole one resumes, one of another model
    is refused before anything changes."""
    run = tmp_path / "run"
    train.main([*EPOCH, "--ema", "--output", str(run)])
    path = run / "vit_rope_tiny" / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    torch.save({**state, "model_ema": {k: v[..., :1] for k, v in state["model_ema"].items()}}, path)
    before = snapshot(run)
    with pytest.raises(SystemExit, match="holds the model_ema weights of another model") as stop:
        train.main(["--output", str(run), "--resume", "--epochs", "2"])
    one_line(stop)
    assert snapshot(run) == before
    torch.save(state, path)
    train.main(["--output", str(run), "--resume", "--epochs", "2"])
    assert torch.load(path, weights_only=True)["epoch"] == 1


# ------------------------------------------------------------------------------------------ timm model folders
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SMALL = dict(patch_size=8, depth=1, embed_dim=32, num_heads=2, img_size=16)
# every image model kind the package registers when the tests are collected (tests/conftest.py's family too: the
# registry, not a list), the APE model, rope arguments and family options, and the video model with RoPE, with APE
# and with every video-only family
VIDEO_ONLY = sorted(n for n, f in FAMILIES.items() if f.min_axes >= 3)
FOLDER_MODELS = [
    *sorted(n for n in timm.list_models(module="vit") if n.endswith("_tiny")),
    "vit_rope_tiny:rope_theta=33.0,rope_layout=half,rope_targets=vo",
    "vit_comrope_tiny:rope_options={block_size: 4}",
    *[f"vit_rope3d_tiny:pos_embed={kind}" for kind in ("rope", "ape", *VIDEO_ONLY)],
]


def saved_model(spec: str, folder: pathlib.Path) -> torch.nn.Module:
    """A tiny model of ``spec``, every weight moved off its init (a weight that were not saved, or not loaded, would
    change the logits), saved as a run saves it: model.safetensors with its record, config.json by timm's writer."""
    name, own = split_spec(spec)
    kwargs = {**SMALL, **(dict(num_frames=4) if "3d" in name else {}), **own}
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=5, **kwargs).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder.mkdir(exist_ok=True)
    save_model_folder(folder, model, model_record(model, name, kwargs), timm_config(model, 16, MEAN, STD))
    return model


@pytest.mark.parametrize("spec", FOLDER_MODELS)
def test_a_saved_model_folder_is_a_timm_model_with_equal_logits(spec, tmp_path):
    """timm.create_model("local-dir:<folder>", pretrained=True) rebuilds every kind of model from config.json alone
    (its model_args carry every argument the model was made with) and loads its weights: equal logits, at the
    training size and at another."""
    model = saved_model(spec, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    name, own = split_spec(spec)
    assert config["architecture"] == name and config["num_classes"] == 5
    assert {k: v for k, v in config["model_args"].items() if k in own} == own
    video = "3d" in name
    assert config["pretrained_cfg"]["input_size"] == ([3, 4, 16, 16] if video else [3, 16, 16])
    assert config["pretrained_cfg"]["mean"] == list(MEAN) and config["pretrained_cfg"]["crop_pct"] == 1.0
    loaded = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    fresh = timm.create_model(f"local-dir:{tmp_path}").eval()  # the architecture alone, its own init
    torch.manual_seed(1)
    for size in (16, 24):
        x = torch.randn(2, 3, *((4,) if video else ()), size, size)
        with torch.no_grad():
            assert torch.equal(loaded(x), model(x)), size
            assert not torch.allclose(fresh(x), model(x))  # the test can fail: the weights make the logits equal


def test_a_model_folder_of_ours_needs_vit_rope_imported_first(tmp_path):
    """timm finds the architecture in its registry, which importing vit_rope fills: without the import a folder of
    ours is timm's 'Unknown model'."""
    saved_model("vit_rope_tiny", tmp_path)
    code = (
        "import timm\n"
        "try:\n"
        f"    timm.create_model('local-dir:{tmp_path}')\n"
        "except RuntimeError as e:\n"
        "    print('without:', e)\n"
        "import vit_rope\n"
        f"print('with:', type(timm.create_model('local-dir:{tmp_path}', pretrained=True)).__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "without: Unknown model (vit_rope_tiny)" in out.stdout and "with: vit_rope.vit" in out.stdout


# --initial-checkpoint <folder>: what the eval-only runs below add (no --models: the folder names the model)
FOLDER_EVAL = ["--eval-only", "--eval-sizes", "16", "--rope-scaling", "none", "--train-samples", "32",
               "--val-samples", "16"]  # fmt: skip


def model_folder(finished: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the finished run's vit_rope_tiny folder (a model folder received from someone)."""
    folder = tmp_path / "received"
    shutil.copytree(finished / "vit_rope_tiny", folder)
    return folder


def test_eval_only_builds_the_model_of_a_folders_config(finished, tmp_path):
    """The folder names the model: the eval-only run builds vit_rope_tiny with the run's kwargs (not the default
    config's models and kwargs), at the size it was trained at, and loads its weights."""
    folder = model_folder(finished, tmp_path)
    rows = train.main([*FOLDER_EVAL, "--initial-checkpoint", str(folder), "--output", str(tmp_path / "ev")])
    assert {r["model"] for r in rows} == {"vit_rope_tiny"} and rows[0]["train_size"] == 16
    saved = yaml.safe_load((tmp_path / "ev" / "config.yaml").read_text())
    assert saved["models"] == ["vit_rope_tiny"] and saved["model_kwargs"]["embed_dim"] == 32
    with pytest.raises(SystemExit, match=r"is a model folder, .*and --models say otherwise .*vit_ape_tiny") as stop:
        train.main([*FOLDER_EVAL, "--models", "vit_ape_tiny", "--initial-checkpoint", str(folder),
                    "--output", str(tmp_path / "other")])  # fmt: skip
    assert "model.safetensors" in one_line(stop) and not (tmp_path / "other").exists()


def planted_module(tmp_path: pathlib.Path, monkeypatch) -> pathlib.Path:
    """A module on the import path that creates ``marker`` when imported: a config.json naming it must not run it."""
    marker = tmp_path / "imported"
    (tmp_path / "planted_arch.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return marker


def setting(key: str, value):
    def forge(config: dict) -> dict:
        return {**config, key: value}

    return forge


def in_section(section: str, key: str, value):
    def forge(config: dict) -> dict:
        return {**config, section: {**config[section], key: value}}

    return forge


HOSTILE_CONFIGS = {  # what config.json holds → (bytes, or a change to the run's config; the error's words)
    "not JSON": (b'{"architecture": "vit_rope_tiny"', "cannot be read as JSON"),
    "not UTF-8": (b"\xff\xfe{}", "cannot be read as JSON"),
    "a key twice": (b'{"architecture": "vit_ape_tiny", "architecture": "vit_rope_tiny"}', "'architecture' is given "
                    "twice"),
    "NaN": (b'{"architecture": "vit_rope_tiny", "pretrained_cfg": {"mean": [NaN, 0, 0]}}', "NaN is not a number"),
    "a list": (b"[1, 2]", "holds a JSON list, not an object"),
    "no architecture": (b"{}", "its architecture is 'None', not a model name"),
    "architecture a number": (setting("architecture", 3), "its architecture is '3', not a model name"),
    "unknown architecture": (setting("architecture", "vit_nope_tiny"), "'vit_nope_tiny' is no model registered"),
    "a module": (setting("architecture", "planted_arch"), "'planted_arch' is no model registered"),
    "a dotted name": (setting("architecture", "os.system"), "'os.system' is no model registered"),
    "a hub source": (setting("architecture", "hf-hub:timm/vit_tiny_patch16_224"), "is no model registered"),
    "a pretrained tag": (setting("architecture", "vit_rope_small.dinov3_lvd1689m"), "is no model registered"),
    "num_classes a string": (setting("num_classes", "8"), "its num_classes is '8', not a whole number"),
    "model_args a list": (setting("model_args", [["depth", 1]]), "model_args is a JSON list, not an object"),
    "model_args a string": (setting("model_args", "depth=1"), "model_args is a JSON str, not an object"),
    "a checkpoint path": (in_section("model_args", "checkpoint_path", "/etc/passwd"),
                          "holds 'checkpoint_path', which is not an argument of a model"),
    "a weights overlay": (in_section("model_args", "pretrained_cfg_overlay", {"url": "http://x"}),
                          "holds 'pretrained_cfg_overlay', which is not an argument"),
    "an argument name no model has": (in_section("model_args", "not a name", 1), "holds 'not a name'"),
    "an argument the model refuses": (in_section("model_args", "bogus", 1), "model vit_rope_tiny cannot be built"),
    "pretrained_cfg a list": (setting("pretrained_cfg", []), "its pretrained_cfg is a JSON list"),
    "input_size short": (in_section("pretrained_cfg", "input_size", [3, 16]), r"input_size is \[3, 16\], not 3 or 4"),
    "std zero": (in_section("pretrained_cfg", "std", [0, 0, 0]), r"std is \[0, 0, 0\], not a list of finite numbers"),
    "mean strings": (in_section("pretrained_cfg", "mean", ["a"]), r"mean is \['a'\], not a list of finite numbers"),
    "crop_pct a string": (in_section("pretrained_cfg", "crop_pct", "1"), "crop_pct is '1', not a number"),
    "label_names numbers": (setting("label_names", [1, 2]), "label_names is not a list"),
    "another kind's architecture": (setting("architecture", "vit_lookhere_tiny"),
                                    "holds the weights of vit_rope_tiny .*, not of a vit_lookhere_tiny"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(HOSTILE_CONFIGS))
def test_a_hostile_config_json_is_one_line_and_nothing_runs(case, finished, tmp_path, monkeypatch):
    """A model folder's config.json is data from anyone: parsed as JSON, every field checked, the architecture looked
    up in timm's registry (never imported: a module of that name on the path does not run), model_args of model
    arguments only (never a file or URL to load); the weights still load only into the kind they record. One line
    naming the folder, and nothing written."""
    forged, message = HOSTILE_CONFIGS[case]
    folder, marker = model_folder(finished, tmp_path), planted_module(tmp_path, monkeypatch)
    config = folder / "config.json"
    text = forged if isinstance(forged, bytes) else json.dumps(forged(json.loads(config.read_text()))).encode()
    config.write_bytes(text)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*FOLDER_EVAL, "--initial-checkpoint", str(folder), "--output", str(tmp_path / "ev")])
    assert str(folder) in one_line(stop) or "vit_rope_tiny" in one_line(stop)
    assert not marker.exists() and "planted_arch" not in sys.modules and not (tmp_path / "ev").exists()


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize("where,kind,message", [
    ("config.json", "link", "config.json is a symbolic link, not a regular file"),
    ("config.json", "fifo", "config.json is a FIFO, not a regular file"),
    ("config.json", "dir", "config.json is a folder, not a regular file"),
    ("config.json", "missing", "the folder has no config.json"),
    ("model.safetensors", "link", "its model.safetensors is a symbolic link, not a regular file"),
    ("model.safetensors", "fifo", "its model.safetensors is a FIFO, not a regular file"),
    ("model.safetensors", "missing", "the folder has no model.safetensors"),
])  # fmt: skip
def test_a_model_folders_files_are_regular_files(where, kind, message, finished, tmp_path):
    """A link in a received folder could point anywhere (another user's file, a device), a FIFO would block: both are
    refused, naming the file, before anything is written."""
    folder = model_folder(finished, tmp_path)
    path, other = folder / where, tmp_path / where
    shutil.move(path, other)
    {"link": lambda: path.symlink_to(other), "fifo": lambda: os.mkfifo(path), "dir": path.mkdir,
     "missing": lambda: None}[kind]()  # fmt: skip
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*FOLDER_EVAL, "--initial-checkpoint", str(folder), "--output", str(tmp_path / "ev")])
    assert str(folder) in one_line(stop) and not (tmp_path / "ev").exists()
