"""train.py's settings (vit_rope/training/settings.py): a config file, a run's saved config.yaml or a flag is data.
Nothing in a file runs code (``imports`` only from this command line), hostile YAML is one line, a value twice where
it would be counted twice is refused, and every value is checked before anything in --output changes."""

import string
import sys
from dataclasses import replace

import pytest
import yaml

import train
from tests.test_train import snapshot
from tests.training.test_folder import EPOCH, copy_of, finish, one_line
from vit_rope.training import models, report


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    return finish(tmp_path_factory)


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


def test_no_aug_reads_as_english_in_help(capsys):
    with pytest.raises(SystemExit):
        train.main(["--help"])
    assert "--aug, --no-aug" in capsys.readouterr().out


# ------------------------------------------------------------------------------- imports: code only from argv
def module_that_runs(path, marker) -> str:
    path.write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    return str(path)


def test_imports_in_a_config_file_run_nothing(tmp_path):
    """Issue 35, 2: a config received from someone else names a Python file: it is not imported; one line says how
    to import it on purpose."""
    marker = tmp_path / "ran"
    evil = module_that_runs(tmp_path / "evil.py", marker)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({"imports": [evil]}))
    with pytest.raises(SystemExit, match="names imports .*evil.py.*nothing read from a file runs code") as stop:
        train.main([*EPOCH, "--config", str(config), "--output", str(tmp_path / "out")])
    assert f"--imports {evil}" in one_line(stop)
    assert not marker.exists() and not (tmp_path / "out").exists()
    settings, _ = train.parse_config(["--config", str(config), "--imports", evil])  # named on argv: the user's choice
    assert settings.imports == (evil,) and not marker.exists()


def test_imports_in_a_runs_saved_config_run_nothing_on_resume(finished, tmp_path):
    """Issue 35, 2: a run folder received from someone else, its config.yaml edited to import a file."""
    run, marker = copy_of(finished, tmp_path), tmp_path / "ran"
    evil = module_that_runs(tmp_path / "evil.py", marker)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    (run / "config.yaml").write_text(yaml.safe_dump({**saved, "imports": [evil]}))
    before = snapshot(run)
    with pytest.raises(SystemExit, match="the run's config .* names imports") as stop:
        train.main(["--output", str(run), "--resume"])
    one_line(stop)
    assert not marker.exists() and snapshot(run) == before


def test_a_users_module_named_like_the_standard_librarys_does_not_replace_it(tmp_path):
    """Issue 35, 7: ``--imports string.py`` ran the file as ``string``, and the report (matplotlib imports string)
    crashed after training; the file gets a private module name."""
    marker = tmp_path / "ran"
    path = module_that_runs(tmp_path / "string.py", marker)
    models.import_modules((path,))
    assert marker.exists() and sys.modules["string"] is string and hasattr(sys.modules["string"], "Template")
    with pytest.raises(SystemExit, match="cannot be imported .*no regular file") as stop:
        models.import_modules((str(tmp_path),))  # a folder (or FIFO) is no module, and is not read
    one_line(stop)


# ------------------------------------------------------------------------------------------ values counted twice
@pytest.mark.parametrize("args,message", [
    (["--eval-sizes", "16", "16"], "eval_sizes must be sizes of at least 1, each given once"),
    (["--rope-scaling", "none", "pi", "none"], "rope_scaling must be modes each given once"),
])  # fmt: skip
def test_a_value_given_twice_where_rows_would_be_counted_as_seeds_is_refused(args, message, tmp_path):
    """Issue 35, 6: duplicate eval sizes or scaling modes gave duplicate rows, which results.md counted as seeds
    ("4 seeds, ± 0.0" for one)."""
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*EPOCH, *args, "--output", str(tmp_path / "out")])
    one_line(stop)
    row = dict(model="m", recipe="", seed=0, train_size=16, eval_size=16, protocol="resize", rope_scaling="none",
               top1=50.0, top5=90.0, loss=1.0, params=10)  # fmt: skip
    with pytest.raises(ValueError, match="two result rows for seed 0"):
        report.summarise([row, row])
    assert report.summarise([row, {**row, "seed": 1}])["resize"]["m", "", "none"][16]["n"] == 2


# ----------------------------------------------------------------------------------------------- hostile YAML
@pytest.mark.parametrize("text,message", [
    (b"epochs: 1\nmodels: [vit_rope_tiny\xff]\n", "is not UTF-8 text"),
    (b"models: &a [*a]\n", "an alias refers to a value that holds it"),
    (b"a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     b"c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     b"e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n",
     "aliases expand to more than"),
    (b"? [epochs]\n: 1\n", "a list as a key"),
    (b"1: 2\nepochs: 1\n", r"unknown config key\(s\) \['1'\]"),
    (b"imports: evil.py\n", "names imports 'evil.py'"),
    (b"recipes: {a: {model_kwargs: 3}}\n", "recipe 'a': model_kwargs 3: give a mapping"),
    (b"model_kwargs: {pretrained_cfg_overlay: 3}\n", "pretrained_cfg_overlay '3' is not a mapping"),
    (b"data_dir: \"data/a\\0b\"\n", "no NUL character"),
])  # fmt: skip
def test_hostile_yaml_is_one_line(text, message, tmp_path):
    """Issue 35, 8: a config that is not UTF-8, recursive or exploding aliases, keys that are no setting's name, a
    recipe's model kwargs or a pretrained-config overlay that is not a mapping: one line naming the file or setting,
    nothing written."""
    config = tmp_path / "c.yaml"
    config.write_bytes(text)
    with pytest.raises(SystemExit, match=message) as stop:
        train.main([*EPOCH, "--config", str(config), "--output", str(tmp_path / "out")])
    one_line(stop)
    assert not (tmp_path / "out").exists()


def test_a_recipes_none_model_kwarg_is_refused():
    """timm's create_model drops a None kwarg: a recipe's init_values: null would leave LayerScale on while the
    config records null."""
    from vit_rope.training.settings import Settings

    with pytest.raises(SystemExit, match=r"^error: recipe 'a': --model-kwargs init_values=null: timm's create_model"):
        Settings(recipes={"a": {"model_kwargs": {"init_values": None}}})


@pytest.mark.parametrize("argv", [["--seeds", "3", "4"], ["--seed", "3"], [], ["--overwrite"], ["--resume"]])
def test_a_runs_saved_config_is_a_config_file_that_gives_its_settings_back(argv, tmp_path):
    """A run's config.yaml holds the one of seed and seeds that has effect, so ``--config`` takes it back; one that
    train.py wrote with both (the default seed beside seeds, or empty seeds beside the seed) is read the same way. It
    holds no --resume or --overwrite: those stay the command line's."""
    settings, _ = train.parse_config([*argv, "--epochs", "2", "--output", str(tmp_path / "run")])
    saved = tmp_path / "config.yaml"
    saved.write_text(settings.to_yaml())
    assert not {"resume", "overwrite"} & set(yaml.safe_load(saved.read_text()))
    recipe = replace(settings, resume=False, overwrite=False)
    assert train.parse_config(["--config", str(saved)])[0] == recipe
    both = {**yaml.safe_load(saved.read_text()), "seed": settings.seed, "seeds": list(settings.seeds)}
    saved.write_text(yaml.safe_dump(both))  # as written before
    assert train.parse_config(["--config", str(saved)])[0] == recipe
