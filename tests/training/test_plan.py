"""The runs of a config (vit_rope/training/plan.py, through train.py): seeds and recipes (multi-resolution training,
coordinate augmentation) end to end and on --resume, a family against the family + APE, and timm's own models in the
comparison."""

import dataclasses
import shlex
import statistics
from pathlib import Path

import pytest
import torch
import yaml

import train
from tests.test_train import Killed, interrupt, make_imagefolder, read_csv, same_run
from vit_rope.training import models, plan
from vit_rope.training.folder import run_folder
from vit_rope.training.weights import read_record

KWARGS = ["--model-kwargs", "patch_size=8", "depth=1", "embed_dim=32", "num_heads=2"]
SMALL = [
    *KWARGS, "--img-size", "16", "--eval-sizes", "8", "16", "32", "--no-native-eval",
    "--train-samples", "64", "--val-samples", "32", "--epochs", "1", "--batch-size", "16", "--warmup-epochs", "0",
]  # fmt: skip
RECIPES = ["--recipes", "single-res={}", "multi-res={train_sizes: [8, 16, 24]}"]


def spy_on_training_sizes(monkeypatch) -> dict:
    """(spec, recipe's train_sizes, seed) → the input sizes each model built for that run met while training."""
    seen: dict = {}
    build = train.build_model

    def build_model(settings, spec, num_classes):
        model = build(settings, spec, num_classes)
        sizes = seen.setdefault((spec, tuple(settings.train_sizes), settings.seed), [])
        model.register_forward_pre_hook(lambda m, args: sizes.append(args[0].shape[-1]) if m.training else None)
        return model

    monkeypatch.setattr(train, "build_model", build_model)
    return seen


def test_every_model_trains_under_every_recipe_and_seed(tmp_path, monkeypatch):
    seen = spy_on_training_sizes(monkeypatch)
    out = tmp_path / "bench"
    args = ["--models", "vit_ape_tiny", "vit_rope_tiny", *SMALL, "--rope-scaling", "none", "pi", *RECIPES]
    rows = train.main([*args, "--seeds", "0", "1", "--output", str(out)])
    results = read_csv(out / "results.csv")
    assert len(results) == len(rows) == 2 * 2 * 3 * (1 + 2)  # recipes x seeds x eval sizes x (APE's '-', none + pi)
    assert list(results[0])[:3] == ["model", "recipe", "seed"]
    per_point: dict = {}
    for r in results:
        per_point.setdefault((r["model"], r["recipe"], r["eval_size"], r["rope_scaling"]), []).append(r["seed"])
    assert len(per_point) == 2 * 3 * 3 and all(sorted(s) == ["0", "1"] for s in per_point.values())
    for tag in ("vit_ape_tiny@single-res@seed0", "vit_rope_tiny@multi-res@seed1"):
        assert (out / tag / "model.safetensors").exists()
    assert {r["model"] for r in read_csv(out / "log.csv")} == {
        f"{m}@{r}@seed{s}"
        for m in ("vit_ape_tiny", "vit_rope_tiny")
        for r in ("single-res", "multi-res")
        for s in (0, 1)
    }
    # multi-resolution batches really arrive at other sizes; single-resolution ones only at --img-size
    for (spec, train_sizes, seed), sizes in seen.items():
        if train_sizes:
            assert set(sizes) <= {8, 16, 24} and len(set(sizes)) > 1, (spec, seed, sizes)
        elif sizes:
            assert set(sizes) == {16}, (spec, seed, sizes)
    assert {(spec, bool(ts)) for (spec, ts, _), sizes in seen.items() if sizes} == {
        (m, multi) for m in ("vit_ape_tiny", "vit_rope_tiny") for multi in (False, True)
    }
    # results.md: mean ± std over the two seeds, and how many
    md = (out / "results.md").read_text()
    assert "| model | recipe | RoPE scaling | params | seeds |" in md
    top1 = [float(r["top1"]) for r in results if (r["model"], r["recipe"], r["eval_size"], r["rope_scaling"])
            == ("vit_rope_tiny", "multi-res", "32", "pi")]  # fmt: skip
    assert (
        f"{statistics.fmean(top1):.1f} ± {statistics.stdev(top1):.1f} |"
        in md.split("| vit_rope_tiny | multi-res | pi |")[1]
    )
    assert (out / "extrapolation.png").exists() and (out / "accuracy_vs_resolution.png").exists()
    # each seed's run is the run --seed alone makes
    multi_res = RECIPES[-1]
    alone = train.main(["--models", "vit_rope_tiny", *SMALL, "--rope-scaling", "none", "pi", "--recipes", multi_res,
                        "--seed", "1", "--output", str(tmp_path / "alone")])  # fmt: skip
    assert alone == [r for r in rows if (r["model"], r["recipe"], r["seed"]) == ("vit_rope_tiny", "multi-res", 1)]
    assert (tmp_path / "alone" / "vit_rope_tiny@multi-res" / "model.safetensors").exists()


def test_a_killed_seeds_and_recipes_run_resumes_to_the_same_results(tmp_path, monkeypatch):
    args = ["--models", "vit_rope_tiny", *SMALL, "--rope-scaling", "none", *RECIPES, "--seeds", "0", "1",
            "--epochs", "2", "--drop-path", "0.1"]  # fmt: skip
    train.main([*args, "--output", str(tmp_path / "full")])
    interrupt(monkeypatch, at=7, before=False)  # after epoch 1 of the last run (seed 1, multi-res)
    with pytest.raises(Killed):
        train.main([*args, "--output", str(tmp_path / "killed")])
    monkeypatch.undo()
    assert not (tmp_path / "killed" / "results.csv").exists()
    train.main(["--output", str(tmp_path / "killed"), "--resume"])
    same_run(tmp_path / "killed", tmp_path / "full")


def test_resume_adds_seeds_and_recipes_and_refuses_changing_a_recipe(tmp_path, capsys):
    run = tmp_path / "run"
    train.main(["--models", "vit_rope_tiny", *SMALL, "--rope-scaling", "none", "--seeds", "0", "--recipes", "a={}",
                "--output", str(run)])  # fmt: skip
    first = (run / "vit_rope_tiny@a@seed0" / "model.safetensors").read_bytes()
    capsys.readouterr()
    rows = train.main(["--output", str(run), "--resume", "--seeds", "0", "1", "--recipes", "b={train_sizes: [8, 16]}"])
    assert "[vit_rope_tiny@a@seed0] finished earlier" in capsys.readouterr().out
    assert {(r["recipe"], r["seed"]) for r in rows} == {("a", 0), ("a", 1), ("b", 0), ("b", 1)}
    assert (run / "vit_rope_tiny@a@seed0" / "model.safetensors").read_bytes() == first
    assert len(read_csv(run / "log.csv")) == 4  # one epoch of each run, the first not trained again
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["seeds"] == [0, 1] and saved["recipes"] == {"a": {}, "b": {"train_sizes": [8, 16]}}
    with pytest.raises(SystemExit, match=r"--resume cannot change recipe 'b' \{'train_sizes': \[8, 16\]\} -> "):
        train.main(["--output", str(run), "--resume", "--recipes", "b={train_sizes: [16]}"])


def test_coordinate_augmentation_and_other_kwargs_come_from_a_config(tmp_path):
    """DINOv3's rope_shift/jitter/rescale from a model spec and a recipe's model_kwargs reach the model, and act:
    two training-mode passes differ only with the augmentation."""
    path = tmp_path / "aug.yaml"
    path.write_text(yaml.safe_dump(dict(
        models=["vit_rope_tiny:rope_shift=0.5"], model_kwargs=dict(patch_size=8, depth=1, embed_dim=32, num_heads=2),
        img_size=16, recipes={"plain": {}, "dinov3": {"model_kwargs": {"rope_jitter": 1.4, "rope_rescale": 2.0}}},
    )))  # fmt: skip
    cfg, _ = train.parse_config(["--config", str(path), "--output", str(tmp_path / "out")])
    x = torch.randn(2, 3, 16, 16)
    for run in plan.plan_runs(cfg):
        model = models.build_model(run.settings, run.spec, num_classes=8).train()
        dinov3 = run.recipe == "dinov3"
        assert (model.position_encoding.shift, model.position_encoding.jitter, model.position_encoding.rescale) == (
            (0.5, 1.4, 2.0) if dinov3 else (0.5, None, None)
        )
        model.position_encoding.shift = (
            None  # the shift alone also moves the coordinates; without it only the recipe's draws do
        )
        torch.manual_seed(0)
        assert torch.equal(model(x), model(x)) != dinov3


def test_a_family_and_the_family_plus_ape_are_two_runs_and_two_kinds(tmp_path):
    """Axial RoPE against axial RoPE + APE (abs_pos_embed, a model argument), as two --models entries or as two
    recipes of model_kwargs: distinct result rows (model or recipe), folders and weight records, and only the second
    has an APE."""
    out = tmp_path / "ape"
    args = ["--models", "vit_rope_tiny", "vit_rope_tiny:abs_pos_embed=ape", *SMALL, "--rope-scaling", "none", "pi"]
    train.main([*args, "--output", str(out)])
    rows = read_csv(out / "results.csv")
    assert {r["model"] for r in rows} == {"vit_rope_tiny", "vit_rope_tiny:abs_pos_embed=ape"}
    kinds = {read_record(out / folder / "model.safetensors")["kind"] for folder in (
        "vit_rope_tiny", "vit_rope_tiny__abs_pos_embed=ape")}  # fmt: skip
    assert kinds == {"vit_rope ViT, pos_embed=rope", "vit_rope ViT, pos_embed=rope, abs_pos_embed=ape"}
    path = tmp_path / "recipes.yaml"
    path.write_text(yaml.safe_dump(dict(
        models=["vit_rope_tiny"], model_kwargs=dict(patch_size=8, depth=1, embed_dim=32, num_heads=2), img_size=16,
        recipes={"rope": {}, "rope_ape": {"model_kwargs": {"abs_pos_embed": "ape"}}},
    )))  # fmt: skip
    cfg, _ = train.parse_config(["--config", str(path), "--output", str(tmp_path / "out")])
    runs = plan.plan_runs(cfg)
    assert [(r.model, r.recipe, r.tag) for r in runs] == [
        ("vit_rope_tiny", "rope", "vit_rope_tiny@rope"),
        ("vit_rope_tiny", "rope_ape", "vit_rope_tiny@rope_ape"),
    ]
    built = [models.build_model(r.settings, r.spec, num_classes=4) for r in runs]
    assert [m.pos_embed is not None for m in built] == [False, True]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--recipes", "long={epochs: 3}"], r"recipe 'long' sets \['epochs'\]: a recipe sets only how models train"),
        (["--recipes", "other={dataset: cifar10}"], r"recipe 'other' sets \['dataset'\]"),
        (["--recipes", "a b={}"], "recipe name 'a b': use letters, digits"),
        (["--recipes", "fast={lr: -1}"], "recipe 'fast': --lr -1: lr must be at least 0"),
        (["--recipes", "odd={train_sizes: [12]}"],
         r"--train-sizes \[12\] are not multiples of the patch size 8x8 of vit_ape_tiny \(recipe odd\)"),
        (["--train-sizes", "16", "20"], r"--train-sizes \[20\] are not multiples of the patch size 8x8"),
        (["--train-sizes", "0"], "train_sizes must be sizes of at least 1"),
        (["--seed", "1", "--seeds", "0", "1"], "the command line gives both seed and seeds"),
        (["--seeds", "0", "0"], "seeds must be distinct seeds"),
        (["--seeds", "-1"], "seeds must be distinct seeds in"),
        (["--val-subset", "-1"], "val_subset must be at least 0"),
        (["--models", "vit_ape_tiny:x=[1]", "vit_ape_tiny:x=(1)"], "would share the folder"),
    ],
)  # fmt: skip
def test_bad_seeds_recipes_and_sizes_stop_before_anything_is_written(args, message, tmp_path):
    out = tmp_path / "out"
    with pytest.raises(SystemExit, match=message) as stop:
        train.main(["--models", "vit_ape_tiny", *SMALL, *args, "--output", str(out)])
    assert str(stop.value).startswith("error: ") and "\n" not in str(stop.value)
    assert not out.exists()


def test_seeds_in_a_config_file_and_seed_on_the_command_line(tmp_path):
    """The command line overrides the file: --seed there means that one seed; a file naming both is refused."""
    path = tmp_path / "c.yaml"
    path.write_text("seeds: [0, 1, 2]\n")
    assert train.parse_config(["--config", str(path)])[0].seeds == (0, 1, 2)
    cfg, _ = train.parse_config(["--config", str(path), "--seed", "5"])
    assert [(r.seed, r.tag) for r in plan.plan_runs(cfg)][:1] == [(5, "vit_ape_tiny")]
    path.write_text("seed: 3\nseeds: [0, 1]\n")
    with pytest.raises(SystemExit, match="c.yaml' gives both seed and seeds"):
        train.parse_config(["--config", str(path)])


# ------------------------------------------------------------------------------------------ timm's own models
TIMM_MODELS = ["deit3_small_patch16_224:dynamic_img_size=True", "vit_small_patch16_rope_224:dynamic_img_size=True"]


def test_timm_models_train_and_evaluate_in_the_harness(tmp_path):
    args = [*SMALL, "--rope-scaling", "none", "pi", "--train-sizes", "8", "16", "24"]
    rows = train.main(["--models", *TIMM_MODELS, *args, "--output", str(tmp_path / "run")])
    assert [(r["model"], r["eval_size"], r["rope_scaling"]) for r in rows] == [
        (m, s, "-") for m in TIMM_MODELS for s in (8, 16, 32)
    ]
    # --eval-only of the saved weights (as of a published checkpoint) gives the numbers of the end of training
    eva = TIMM_MODELS[1]
    weights = run_folder(tmp_path / "run", eva) / "model.safetensors"
    again = train.main(["--models", eva, *args, "--eval-only", "--initial-checkpoint", str(weights),
                        "--output", str(tmp_path / "again")])  # fmt: skip
    assert again == [r for r in rows if r["model"] == eva]
    # ... but not on a user's validation folder of other classes: its classifier would be a new, random one
    make_imagefolder(tmp_path / "folder", classes=3, per_class=2, size=16)
    (tmp_path / "folder" / "train").rename(tmp_path / "folder" / "unused")
    user = ["--dataset", "imagefolder", "--data-dir", str(tmp_path / "folder"), "--output", str(tmp_path / "ev")]
    with pytest.raises(SystemExit, match=r"has a classifier of another class count than the 3 classes"):
        train.main(["--models", eva, *args, *user, "--eval-only", "--initial-checkpoint", str(weights)])
    assert not (tmp_path / "ev").exists()


def test_a_timm_model_that_takes_one_size_is_refused_before_training(tmp_path):
    with pytest.raises(SystemExit, match=r"refuses 8-px input .*create it with dynamic_img_size=True"):
        train.main(["--models", "deit3_small_patch16_224", *SMALL, "--output", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------------- the shipped configs
CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_config_parses_and_plans(path, tmp_path):
    """Each config in configs/ (GPU ones included: nothing is built or loaded) gives valid settings and its runs:
    every model under every recipe and seed, each in its own folder."""
    settings, _ = train.parse_config(["--config", str(path), "--output", str(tmp_path / "out")])
    runs = plan.plan_runs(settings)
    assert len(runs) == len(settings.models) * max(len(settings.recipes), 1) * max(len(settings.seeds), 1)
    assert len({r.folder for r in runs}) == len(runs)
    for spec in settings.models:
        models.checked_spec(spec)  # a model timm knows
    if settings.finetune_sizes:
        assert all(train.eval_jobs(r.settings, ["none"], ["none"])[-1][0] == "finetune" for r in runs)


def config(name: str):
    return train.parse_config(["--config", str(CONFIG_DIR / f"{name}.yaml")])[0]


def test_the_protocol_configs_say_what_they_claim():
    """The resolution protocol's configs: trained below the data's native size and evaluated up to it and beyond,
    fine-tuned at a larger size, several seeds (Fashion-MNIST, ELPV); CIFAR-100 at LieRE's 32 px with patch 4 for
    every image family; ImageNet-100 from 224 to 1024; RoPE-ViT's published weights evaluated at its table's sizes."""
    from vit_rope import FAMILIES

    fashion = config("protocol_fashion")  # Fashion-MNIST: 28 px originals
    assert fashion.img_size < 28 < max(fashion.eval_sizes) and max(fashion.eval_sizes) == 4 * fashion.img_size
    assert min(fashion.eval_sizes) < 0.6 * fashion.img_size and fashion.finetune_sizes == (28,)
    assert len(fashion.seeds) >= 5 and {"vit_ape_tiny", "vit_rope_tiny", "vit_rope_mixed_tiny"} <= set(fashion.models)
    cells = config("protocol_elpv")  # ELPV: 300 px originals, all 654 test cells
    assert 2 * cells.img_size in cells.eval_sizes and 2 * cells.img_size < 300 < max(cells.eval_sizes)
    assert 2 * min(cells.eval_sizes) == cells.img_size and cells.finetune_sizes == (2 * cells.img_size,)
    assert cells.val_subset == 0 and len(cells.seeds) >= 5 and set(cells.models) == set(fashion.models)
    cifar = config("cifar100_liere")
    assert (cifar.dataset, cifar.img_size, cifar.model_kwargs["patch_size"]) == ("cifar100", 32, 4)
    ours = [f for f in FAMILIES.values() if f.model_name and f.min_axes <= 2 and f.__module__.startswith("vit_rope.")]
    assert {f"vit_{f.model_name}_tiny" for f in ours} | {"vit_ape_tiny"} == set(cifar.models)
    imagenet = config("imagenet100_224")
    assert (imagenet.img_size, max(imagenet.eval_sizes), imagenet.dataset) == (224, 1024, "imagefolder")
    naver = config("rope_vit_eval")
    assert naver.eval_only and naver.pretrained and naver.eval_sizes == (144, 192, 224, 256, 320, 384, 512)
    assert naver.rope_scaling == ("none",) and {"vit_rope_small", "vit_rope_mixed_small"} <= set(naver.models)


def test_the_trained_benchmarks_configs_share_one_protocol():
    """Issue 43's configs: all 60,000 Fashion-MNIST images and 2,000 test images; the papers' recipe, the other
    families and the GPU's ViT-Ti differ from protocol_fashion.yaml only in what their comments say (the recipe; the
    models, with both baselines to pair them with, and nothing else, so that their runs are the headline's; the trunk,
    batch and seeds), and bench/benchmark.sh runs them all."""
    from vit_rope import FAMILIES

    plain = config("protocol_fashion")
    assert (plain.train_subset, plain.val_subset, plain.aug, plain.train_sizes) == (0, 2000, False, ())
    protocol = ("dataset", "img_size", "eval_sizes", "rope_scaling", "finetune_sizes", "finetune_steps", "train_subset",
                "val_subset", "weight_decay", "label_smoothing", "warmup_epochs")  # fmt: skip
    papers, families, gpu = (
        config("protocol_fashion_papers"),
        config("protocol_fashion_families"),
        config("protocol_fashion_gpu"),
    )
    for other in (papers, families, gpu):
        same = [k for k in protocol if k != "eval_sizes" or other is not papers]
        assert [getattr(other, k) for k in same] == [getattr(plain, k) for k in same]
    # the papers' recipe: the headline's test sizes and sizes between 1x and 2x (where the papers see their gain)
    near = set(papers.eval_sizes) - set(plain.eval_sizes)
    assert set(plain.eval_sizes) < set(papers.eval_sizes) and all(plain.img_size < s < 2 * plain.img_size for s in near)
    recipe = ("epochs", "batch_size", "lr", "model_kwargs", "seeds")
    assert [getattr(papers, k) for k in recipe] == [getattr(plain, k) for k in recipe[:4]] + [(0, 1, 2)]
    assert papers.aug and papers.scale[0] > 0.08 and papers.hflip > 0 and len(papers.train_sizes) > 1
    assert set(papers.models) <= set(plain.models)
    assert {"vit_ape_tiny", "vit_rope_tiny"} <= set(families.models) and len(families.seeds) == 3
    # every other setting the headline's: its APE and axial RoPE runs are the headline's (bench/merge.py joins them)
    differ = [f.name for f in dataclasses.fields(plain) if getattr(plain, f.name) != getattr(families, f.name)]
    assert differ == ["models", "seeds", "output"] and set(families.seeds) <= set(plain.seeds)
    ours = [f for f in FAMILIES.values() if f.model_name and f.min_axes <= 2 and f.__module__.startswith("vit_rope.")]
    assert {f"vit_{f.model_name}_tiny" for f in ours} <= set(plain.models) | set(families.models)  # every family
    assert gpu.model_kwargs == {"patch_size": 2} and gpu.models == plain.models and gpu.amp
    assert not Path(gpu.data_dir).is_absolute()  # inside the working tree, which travels to the GPU machine
    script = (CONFIG_DIR.parent / "bench" / "benchmark.sh").read_text()
    names = ("protocol_fashion", "protocol_fashion_papers", "protocol_fashion_families", "protocol_elpv")
    assert all(f"configs/{name}.yaml" in script for name in names)
    # the families' runs in two parts a seed (a part must finish within one sitting): together the config's models
    parts = [shlex.split(line.split("=(", 1)[1].split(")  #")[0].rstrip(")"))
             for line in script.splitlines() if line.startswith(("families_a=(", "families_b=("))]  # fmt: skip
    assert len(parts) == 2 and parts[0] + parts[1] == list(families.models)
