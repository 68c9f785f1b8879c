"""The runs a train.py command makes: every model under every recipe and seed, each with its settings and folder."""

from dataclasses import dataclass, replace
from pathlib import Path

from .folder import run_folder
from .report import FINETUNE_PROTOCOL
from .settings import Settings

__all__ = ["Run", "eval_jobs", "plan_runs"]


@dataclass(frozen=True)
class Run:
    """One model trained under one recipe with one seed."""

    spec: str  # the --models entry
    model: str  # the name its result rows carry: the spec, numbered where --models names it twice
    recipe: str  # '' for the one recipe of a config without recipes
    seed: int
    tag: str  # its name in log.csv and progress lines, and (made filesystem-safe) its folder's
    settings: Settings  # what it trains with: the recipe's keys and the seed on top of the command's
    folder: Path


def plan_runs(settings: Settings) -> list[Run]:
    """Every model under every recipe and seed, seed by seed (an interrupted benchmark has every model's first seeds
    first). Tags gain ``@recipe`` with recipes and ``@seed<n>`` with --seeds, so that a config without them keeps its
    folders; runs whose folders would coincide are an error."""
    models = settings.models
    out = Path(settings.output).expanduser().resolve()  # once: every folder a child of the folder checked
    names = [m if models.count(m) == 1 else f"{m}_{i}" for i, m in enumerate(models)]
    plan, folders = [], {}
    for seed in settings.seeds or (settings.seed,):
        for recipe in list(settings.recipes) or [""]:
            for spec, model in zip(models, names, strict=True):
                tag = model + (f"@{recipe}" if recipe else "") + (f"@seed{seed}" if settings.seeds else "")
                folder = run_folder(out, tag)
                if folders.setdefault(folder, tag) != tag:
                    raise SystemExit(
                        f"error: runs {folders[folder]} and {tag} would share the folder {folder}; give the models "
                        "(or recipes) names that differ in letters or digits"
                    )
                run_settings = replace(settings.for_recipe(recipe), seed=seed)
                plan.append(Run(spec, model, recipe, seed, tag, run_settings, folder))
    return plan


def eval_jobs(settings: Settings, modes: list[str], tuned: list[str] = ()) -> list[tuple[str, int, str]]:
    """(protocol, eval size, scaling mode) of every result row of one model, in order: zero-shot under ``modes``,
    then each fine-tuning (--finetune-sizes) under ``tuned``."""
    native = settings.native_eval and settings.dataset in ("synthetic", "synthetic_video")
    jobs = [(p, s, m) for p in ["resize"] + ["native"] * native for s in settings.eval_sizes for m in modes]
    # n: tokens an image; NTK and YaRN rescale one frequency ladder for a whole batch, and the images of a NaFlex
    # batch each ask their own scale: the modes of coordinates (per image) alone
    jobs += [("naflex", n, m) for n in settings.eval_seq_lens for m in modes if m not in ("ntk", "yarn")]
    return jobs + [(FINETUNE_PROTOCOL, s, m) for s in settings.finetune_sizes for m in tuned]
