"""train.py's results: results.csv (a row per run, eval size, protocol and RoPE scaling mode), results.md (top-1,
mean ± std over seeds), and three figures: accuracy_vs_resolution.png (every curve), extrapolation.png and overview.png
(each model under its best scaling mode, and what fine-tuning recovers: the figure to take in at a glance)."""

import io
import math
import re
import statistics
from pathlib import Path

from .folder import atomic_write, write_csv

SCALING_LABELS = {
    "none": "none",
    "pi": "position interpolation",
    "ntk": "NTK-aware",
    "yarn": "YaRN",
    "normalized": "normalized",
}
# a line style per scaling mode in accuracy_vs_resolution.png, a marker per mode in extrapolation.png
LINE_STYLES = {"-": "-", "none": "-", "pi": "--", "ntk": "-.", "yarn": ":", "normalized": (0, (5, 1, 1, 1, 1, 1))}
MARKERS = {"-": "o", "none": "o", "pi": "s", "ntk": "^", "yarn": "v", "normalized": "D"}
DPI = 120
FINETUNE_PROTOCOL = "finetune"  # train.py's protocol of the rows of a model fine-tuned at the size it is evaluated at

Curve = tuple[str, str, str]  # (model, recipe, RoPE scaling mode)
Summary = dict[str, dict[Curve, dict[int, dict]]]  # protocol → curve → eval size → mean, std, n, params


def write_results(rows: list[dict], out: Path, train_size: int, about: str, chance: float | None = None) -> str:
    """``rows`` (one per run, eval size, protocol and RoPE scaling mode) as the four result files in ``out``;
    ``about`` (the data, training size and epochs) titles the figures, which mark ``chance`` (top-1 of a guess, %).
    With several seeds results.md ends with every model's paired difference from axial RoPE and from APE
    (:func:`paired_tables`), under each scaling mode and under the headline's best modes (:func:`best_mode_rows`).
    Each file is written through :func:`atomic_write`: a kill leaves the old file or the whole new one, and a link
    planted in a file's place while the run went on is replaced, never written through. Returns results.md's text
    (what the caller prints: never read back from the folder, where a link may stand by then)."""
    summary = summarise(rows)
    atomic_write(out / "results.csv", write_csv, rows)
    text = headline_table(summary, train_size) + "\n" + markdown_tables(summary, train_size)
    baselines = default_baselines([r["model"] for r in rows])
    paired = paired_tables(rows, baselines)
    best = ", each under its scaling mode best at 2x (the headline's)"
    if paired:  # (a blank line ends the table above: in GitHub's markdown a line right under a table is a row)
        paired += "\n" + paired_tables(best_mode_rows(rows, train_size), baselines, any_mode=True, what=best)
    text += "\n" + paired if paired else ""
    atomic_write(out / "results.md", lambda t, f: f.write(t.encode()), text)
    plt = pyplot()
    figures = ((accuracy_figure, "accuracy_vs_resolution.png"), (extrapolation_figure, "extrapolation.png"),
               (overview_figure, "overview.png"))  # fmt: skip
    for figure, name in figures:
        fig = figure(summary, train_size, about, chance)
        try:
            atomic_write(out / name, lambda fg, f: f.write(png_bytes(fg)), fig)
        finally:
            plt.close(fig)
    return text


def png_bytes(fig) -> bytes:
    """A figure as PNG, drawn in memory: the file is then one plain write (a full disk is one error naming it, not
    matplotlib's or PIL's traceback)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def summarise(rows: list[dict]) -> Summary:
    """Top-1 over the seeds of each (protocol, model, recipe, scaling mode, eval size): its ``mean``, ``std`` (the
    sample standard deviation; 0 for one seed) and ``n`` seeds, with the model's ``params``; in the order of the
    rows. Two rows of one seed in one cell are an error: counted as two seeds they would fake a spread of 0."""
    groups: dict = {}
    for r in rows:
        curve = (r["model"], r["recipe"], r["rope_scaling"])
        cell = groups.setdefault(r["protocol"], {}).setdefault(curve, {}).setdefault(r["eval_size"], [])
        if any(other["seed"] == r["seed"] for other in cell):
            where = f"{curve} at {r['eval_size']} px ({r['protocol']})"
            raise ValueError(f"two result rows for seed {r['seed']} of {where}")
        cell.append(r)
    return {
        p: {c: {s: over_seeds(rs) for s, rs in cells.items()} for c, cells in cs.items()} for p, cs in groups.items()
    }


def over_seeds(rows: list[dict]) -> dict:
    top1 = [float(r["top1"]) for r in rows]
    std = statistics.stdev(top1) if len(top1) > 1 else 0.0
    return dict(mean=statistics.fmean(top1), std=std, n=len(top1), params=int(rows[0]["params"]))


def markdown_tables(summary: Summary, train_size: int) -> str:
    """One top-1 table per protocol: a row per (model, recipe, scaling mode), a column per eval size; with several
    seeds, mean ± std and a column of how many."""
    cells = [c for curves in summary.values() for sizes in curves.values() for c in sizes.values()]
    recipes = any(recipe for curves in summary.values() for _, recipe, _ in curves)
    seeds = max(c["n"] for c in cells) > 1
    lines = []
    for protocol, curves in summary.items():
        sizes = sorted({s for by_size in curves.values() for s in by_size})
        head = ["model", *["recipe"] * recipes, "RoPE scaling", "params", *["seeds"] * seeds, *map(str, sizes)]
        over = " (mean ± std over seeds)" if seeds else ""
        columns = ", a column per token budget an image (native aspect ratio)" if protocol == "naflex" else ""
        lines.append(f"\n**top-1 (%), trained at {train_size}, evaluated with protocol `{protocol}`{columns}{over}**\n")
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for (model, recipe, mode), by_size in curves.items():
            first = next(iter(by_size.values()))
            row = [model, *[recipe] * recipes, mode, f"{first['params'] / 1e6:.2f}M", *[str(first["n"])] * seeds]
            row += [cell_text(by_size[s]) if s in by_size else "" for s in sizes]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines).lstrip() + "\n"


def nearest(sizes, size: int) -> int:
    """The evaluated size nearest to ``size`` (the smaller one on a tie)."""
    return min(sizes, key=lambda s: (abs(s - size), s))


def sides(sizes, train_size: int) -> tuple[int | None, int | None, int | None]:
    """The evaluated sizes that stand for half, once and twice the training size: the nearest to half of it below
    it, the training size itself, the nearest to twice it above it; None where no evaluated size is there (a column
    for a size not evaluated is left out, not filled with another)."""
    below, above = [s for s in sizes if s < train_size], [s for s in sizes if s > train_size]
    low = nearest(below, round(train_size / 2)) if below else None
    high = nearest(above, train_size * 2) if above else None
    return low, (train_size if train_size in sizes else None), high


def best_modes(curves: dict[Curve, dict[int, dict]], size: int | None) -> dict[tuple[str, str], tuple[str, dict]]:
    """Each (model, recipe)'s scaling mode with the best mean top-1 at ``size`` (the first of its modes where none was
    evaluated there), with that mode's cells; in the order of the curves."""
    best: dict[tuple[str, str], tuple[str, dict]] = {}
    for (model, recipe, mode), cells in curves.items():
        mean = cells.get(size, {}).get("mean", -math.inf)
        if (model, recipe) not in best or mean > best[model, recipe][1].get(size, {}).get("mean", -math.inf):
            best[model, recipe] = (mode, cells)
    return best


def headline_table(summary: Summary, train_size: int) -> str:
    """A row per (model, recipe) under the scaling mode with the best mean top-1 at about twice the training size
    (protocol 'resize', else the first): top-1 at the sizes that stand for half, once and twice it (:func:`sides`) and
    at the largest evaluated beyond those (4x, where the papers' families separate most), and the ratio of 2x to 1x."""
    protocol = "resize" if "resize" in summary else next(iter(summary))
    curves = summary[protocol]
    sizes = sorted({s for cells in curves.values() for s in cells})
    low, base, high = sides(sizes, train_size)
    judge = high if high is not None else base  # where the best scaling mode is chosen
    best = best_modes(curves, judge)
    columns = [s for s in (low, base, high) if s is not None]
    columns += [sizes[-1]] if sizes[-1] > max(columns) else []
    at = "2x" if high is not None else "the training size"
    head = ["model", "recipe", f"best scaling at {at}", *(f"{s} px" for s in columns)]
    head += [f"{high} / {base}"] if high is not None and base is not None else []
    lines = [
        f"**Headline: top-1 (%) at the evaluated sizes nearest half and twice the training size ({train_size} px), at "
        f"it and at the largest, protocol `{protocol}`, each model and recipe under its scaling mode with the best "
        f"mean at {at}**\n",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for (model, recipe), (mode, cells) in best.items():
        row = [model, recipe or "-", mode, *(cell_text(cells[s]) if s in cells else "" for s in columns)]
        if high is not None and base is not None:
            ratio = (
                cells[high]["mean"] / cells[base]["mean"]
                if cells.get(base, {}).get("mean") and high in cells
                else math.nan
            )
            row.append(f"{ratio:.2f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def cell_text(cell: dict) -> str:
    return f"{cell['mean']:.1f}" + (f" ± {cell['std']:.1f}" if cell["n"] > 1 else "")


# ----------------------------------------------------------------------------------------- paired differences
# The 0.975 quantile of Student's t distribution for 1 to 30 degrees of freedom: the two-sided 95 % interval's factor.
# Source: NIST/SEMATECH e-Handbook of Statistical Methods, section 1.3.6.7.2, "Critical values of the Student's t
# distribution" (column 0.975), to three decimals (torch.distributions.StudentT has no icdf; scipy is no dependency).
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
    2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
BASELINES = {"axial RoPE": r"vit_rope_(tiny|small|base|large)", "APE": r"vit_ape_(tiny|small|base|large)"}


def t_975(df: int) -> float:
    """Student's t 0.975 quantile for ``df`` degrees of freedom (past 30: the value for 30, slightly wider than the
    true interval, which shrinks towards 1.960)."""
    if df < 1:
        raise ValueError(f"a t interval needs at least 1 degree of freedom (2 seeds), not {df}")
    return T_975[min(df, len(T_975)) - 1]


def default_baselines(models: list[str]) -> dict[str, str]:
    """What each model is compared with: the first of the models named as axial RoPE (``vit_rope_<size>``, no
    kwargs) and as APE (``vit_ape_<size>``), by the name their rows carry."""
    found = {}
    for label, pattern in BASELINES.items():
        name = next((m for m in dict.fromkeys(models) if re.fullmatch(pattern, m)), None)
        if name is not None:
            found[label] = name
    return found


def paired_differences(rows: list[dict], baseline: str, any_mode: bool = False) -> dict[tuple, dict]:
    """Every model's top-1 minus ``baseline``'s, paired by seed (same seed: same data order and initial draw), in each
    (protocol, recipe, eval size) and scaling mode: keyed (protocol, model, recipe, mode, baseline's mode, eval size),
    each ``n`` seeds both have, the ``diffs`` by seed, their ``mean``, the 95 % t-interval ``low``..``high`` (None for
    one seed), and ``every`` +1 where the model is better in every seed, -1 where worse in every seed, else 0 (0 for one
    seed). A model is compared under each of its modes with the baseline under the same mode; a model or baseline
    without modes ('-') with each mode of the other; with ``any_mode``, every mode with every mode (rows that hold one
    mode a model: :func:`best_mode_rows`)."""
    cells: dict[tuple, dict[int, float]] = {}
    for r in rows:
        key = (r["protocol"], r["model"], r["recipe"], r["rope_scaling"], int(r["eval_size"]))
        cells.setdefault(key, {})[int(r["seed"])] = float(r["top1"])
    out = {}
    for (protocol, model, recipe, mode, size), top1 in cells.items():
        if model == baseline:
            continue
        for (bp, bm, br, bmode, bsize), base in cells.items():
            paired_modes = any_mode or bmode == mode or "-" in (bmode, mode)
            if (bp, bm, br, bsize) != (protocol, baseline, recipe, size) or not paired_modes:
                continue
            seeds = sorted(top1.keys() & base.keys())
            if not seeds:
                continue
            diffs = [top1[s] - base[s] for s in seeds]
            mean, n = statistics.fmean(diffs), len(diffs)
            low = high = None
            if n > 1:
                half = t_975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
                low, high = mean - half, mean + half
            every = 0 if n < 2 else 1 if min(diffs) > 0 else -1 if max(diffs) < 0 else 0
            out[protocol, model, recipe, mode, bmode, size] = dict(n=n, diffs=diffs, mean=mean, low=low, high=high,
                                                                  every=every)  # fmt: skip
    return out


def best_mode_rows(rows: list[dict], train_size: int) -> list[dict]:
    """The zero-shot rows (protocol 'resize', else the first) of each (model, recipe) under its scaling mode with the
    best mean top-1 at about twice the training size (the headline's choice, :func:`headline_table`)."""
    summary = summarise(rows)
    protocol = "resize" if "resize" in summary else next(iter(summary))
    curves = summary[protocol]
    low, base, high = sides(sorted({s for cells in curves.values() for s in cells}), train_size)
    chosen = {key: mode for key, (mode, _) in best_modes(curves, high if high is not None else base).items()}
    return [r for r in rows if r["protocol"] == protocol and chosen[r["model"], r["recipe"]] == r["rope_scaling"]]


def paired_tables(rows: list[dict], baselines: dict[str, str], any_mode: bool = False, what: str = "") -> str:
    """For each baseline (label → model name), one markdown table per protocol of :func:`paired_differences`: a row per
    (model, recipe, scaling mode), a column per eval size, each cell the mean difference in top-1 points with its 95 %
    t-interval over seeds, marked ▲ where the model is better in every seed and ▼ where worse in every seed. Empty
    where no model has two seeds in common with a baseline. ``any_mode`` pairs modes as :func:`paired_differences`
    does; ``what`` says in each title which rows these are."""
    lines = []
    for label, baseline in baselines.items():
        paired = paired_differences(rows, baseline, any_mode)
        if not any(d["n"] > 1 for d in paired.values()):
            continue
        recipes = any(k[2] for k in paired)
        for protocol in dict.fromkeys(k[0] for k in paired):
            keys = [k for k in paired if k[0] == protocol]
            sizes = sorted({k[5] for k in keys})
            n = max(paired[k]["n"] for k in keys)
            lines.append(f"\n**top-1 minus {label} (`{baseline}`){what}, same seed and data order, protocol "
                         f"`{protocol}`: mean difference (points) and its 95 % t-interval over {n} seeds; ▲ better "
                         f"in every seed, ▼ worse in every seed**\n")  # fmt: skip
            head = ["model", *["recipe"] * recipes, "RoPE scaling", *map(str, sizes)]
            lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            for curve in dict.fromkeys(k[1:5] for k in keys):
                model, recipe, mode, bmode = curve
                shown = mode if mode == bmode else f"{mode} vs {bmode}"
                row = [model, *[recipe] * recipes, shown]
                cells = [paired.get((protocol, *curve, s)) for s in sizes]
                row += [diff_text(c) if c else "" for c in cells]
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines).lstrip() + "\n" if lines else ""


def diff_text(d: dict) -> str:
    """``+2.3 (−0.5, +5.1) ▲``: mean difference, interval, and the mark where every seed agrees."""
    text = f"{d['mean']:+.1f}"
    if d["low"] is not None:
        text += f" ({d['low']:+.1f}, {d['high']:+.1f})"
    return text + {1: " ▲", -1: " ▼", 0: ""}[d["every"]]


# --------------------------------------------------------------------------------------------------- figures
def pyplot():
    import matplotlib  # here, not at the top: model users never import it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def colours(curves: list[Curve]) -> dict[tuple[str, str], tuple]:
    """A colour per (model, recipe): with two recipes a model's two shades of one hue (tab20's pairs), else tab10's
    colours, or turbo's evenly spaced past ten."""
    plt = pyplot()
    pairs = list(dict.fromkeys((model, recipe) for model, recipe, _ in curves))
    models = list(dict.fromkeys(model for model, _ in pairs))
    recipes = list(dict.fromkeys(recipe for _, recipe in pairs))
    if len(recipes) == 2 and len(models) <= 10:
        return {(m, r): plt.cm.tab20(2 * models.index(m) + recipes.index(r)) for m, r in pairs}
    if len(pairs) <= 10:
        return {pair: plt.cm.tab10(i) for i, pair in enumerate(pairs)}
    return {pair: plt.cm.turbo(i / (len(pairs) - 1)) for i, pair in enumerate(pairs)}


def fit(ax, xs: list[float] | None, ys: list[float], chance: float | None) -> None:
    """Each axis scaled to its data (a margin of 5 %, not down to 0); the chance level drawn where it falls inside,
    and said in a corner either way."""
    for values, set_lim, line in ((xs, ax.set_xlim, ax.axvline), (ys, ax.set_ylim, ax.axhline)):
        if not values:
            continue
        low, high = min(values), max(values)
        pad = max(high - low, 1.0) * 0.05
        set_lim(low - pad, high + pad)
        if chance is not None and low - pad <= chance <= high + pad:
            line(chance, color="firebrick", linestyle="--", linewidth=0.8)
    if chance is not None:
        ax.annotate(f"chance: {chance:.3g} %", (0.99, 0.01), xycoords="axes fraction", ha="right", va="bottom",
                    fontsize=7, color="firebrick")  # fmt: skip


def accuracy_figure(summary: Summary, train_size: int, about: str, chance: float | None = None):
    """Top-1 against eval size, a panel per protocol: a colour per (model, recipe), a line style per scaling mode,
    error bars of ± one std over seeds, the training size marked; ``about`` (the data, the training size and epochs)
    titles each panel, and the chance level is marked."""
    plt = pyplot()
    curves = [c for cs in summary.values() for c in cs]
    colour = colours(curves)
    seeds = max(c["n"] for cs in summary.values() for cells in cs.values() for c in cells.values()) > 1
    fig, axes = plt.subplots(
        1, len(summary), figsize=(6.5 * len(summary), 5), squeeze=False, layout="constrained", dpi=DPI
    )
    for ax, (protocol, cs) in zip(axes[0], summary.items(), strict=True):
        ys = []
        for (model, recipe, mode), cells in cs.items():
            sizes = sorted(cells)
            means, stds = [cells[s]["mean"] for s in sizes], [cells[s]["std"] if seeds else 0.0 for s in sizes]
            ys += [m - d for m, d in zip(means, stds, strict=True)] + [m + d for m, d in zip(means, stds, strict=True)]
            ax.errorbar(sizes, means, yerr=stds if seeds else None, color=colour[model, recipe],
                        linestyle=LINE_STYLES.get(mode, "-"), marker="o", markersize=3, capsize=2,
                        linewidth=1.2)  # fmt: skip
        if protocol != "naflex":  # (a NaFlex budget is in tokens, not pixels)
            ax.axvline(train_size, color="gray", linestyle=":", linewidth=1)
            ax.annotate(f"trained at {train_size}", (train_size, 1), xycoords=("data", "axes fraction"),
                        xytext=(3, -12), textcoords="offset points", fontsize=8, color="gray")  # fmt: skip
        ylabel = "top-1 (%)" + (", mean ± std over seeds" if seeds else "")
        xlabel = "token budget an image (native aspect ratio)" if protocol == "naflex" else "evaluation resolution (px)"
        ax.set(title=f"{about}\nevaluated with protocol '{protocol}'", xlabel=xlabel, ylabel=ylabel)
        fit(ax, None, ys, chance)
        ax.grid(alpha=0.3)
    add_legend(fig, colour, [mode for _, _, mode in curves], points=False)
    return fig


def extrapolation_figure(summary: Summary, train_size: int, about: str, chance: float | None = None):
    """Top-1 at about half and twice the training size against top-1 at it, on protocol 'resize' (else the first): a
    point per (model, recipe, scaling mode), ± one std over seeds; the sizes that stand for half and twice are those of
    :func:`sides` (the axis says which), a side without one has no panel; each axis fitted to its points."""
    plt = pyplot()
    protocol = "resize" if "resize" in summary else next(iter(summary))
    curves = summary[protocol]
    low, base, high = sides(sorted({s for cells in curves.values() for s in cells}), train_size)
    base = base if base is not None else nearest(sorted({s for cells in curves.values() for s in cells}), train_size)
    panels = [(f, s) for f, s in ((0.5, low), (2, high)) if s is not None]

    def at(size: int, wanted: int, what: str) -> str:
        stand_in = "" if size == wanted else f", the nearest evaluated to {wanted} px"
        return f"top-1 (%) at {size} px ({what}{stand_in})"

    colour = colours(list(curves))
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(6 * max(len(panels), 1), 5.5), squeeze=False,
                             layout="constrained", dpi=DPI)  # fmt: skip
    for ax, (factor, other) in zip(axes[0], panels, strict=False):
        xs, ys = [], []
        for (model, recipe, mode), cells in curves.items():
            if base in cells and other in cells:
                x, y = cells[base], cells[other]
                xs += [x["mean"] - x["std"], x["mean"] + x["std"]]
                ys += [y["mean"] - y["std"], y["mean"] + y["std"]]
                ax.errorbar(x["mean"], y["mean"], xerr=x["std"] or None, yerr=y["std"] or None, capsize=2,
                            color=colour[model, recipe], marker=MARKERS.get(mode, "o"), linestyle="none")  # fmt: skip
        ax.axline((0, 0), slope=1, color="gray", linestyle=":", linewidth=1)  # as accurate as at the training size
        ax.set_xlabel(at(base, train_size, "the training size"))
        ax.set_ylabel(at(other, round(train_size * factor), f"{factor:g}x the training size"))
        ax.set_title(f"{about}\n{factor:g}x the training size, protocol '{protocol}'")
        fit(ax, xs, ys, chance)
        ax.grid(alpha=0.3)
    add_legend(fig, colour, [mode for _, _, mode in curves], points=True)
    return fig


def overview_figure(summary: Summary, train_size: int, about: str, chance: float | None = None):
    """The results at a glance. Left: top-1 against eval size (protocol 'resize', else the first that is not
    'finetune'), each (model, recipe) under its scaling mode with the best mean at about twice the training size
    (:func:`sides`), ± one std over seeds. Then a panel per fine-tuned size: each model's top-1 fine-tuned there
    (filled) beside its best zero-shot top-1 at that size (hollow), the models sorted by the fine-tuned mean."""
    plt = pyplot()
    zero_shot = "resize" if "resize" in summary else next(p for p in summary if p != FINETUNE_PROTOCOL)
    curves = summary[zero_shot]
    sizes = sorted({s for cells in curves.values() for s in cells})
    low, base, high = sides(sizes, train_size)
    judge = high if high is not None else base
    tuned = summary.get(FINETUNE_PROTOCOL, {})
    tuned_sizes = sorted({s for cells in tuned.values() for s in cells})
    fig, axes = plt.subplots(1, 1 + len(tuned_sizes), figsize=(6.5 * (1 + len(tuned_sizes)), 5.5), squeeze=False,
                             layout="constrained", dpi=DPI)  # fmt: skip
    colour = colours(list(curves))
    ax, ys = axes[0][0], []
    for (model, recipe), (mode, cells) in best_modes(curves, judge).items():
        xs = sorted(cells)
        means, stds = [cells[s]["mean"] for s in xs], [cells[s]["std"] for s in xs]
        ys += [m + sign * d for m, d in zip(means, stds, strict=True) for sign in (-1, 1)]
        label = model + (f", {recipe}" if recipe else "") + ("" if mode == "-" else f" ({mode})")
        ax.errorbar(xs, means, yerr=stds, color=colour.get((model, recipe), "black"), marker="o", markersize=3,
                    capsize=2, linewidth=1.2, label=label)  # fmt: skip
    ax.axvline(train_size, color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.minorticks_off()
    ax.set(title=f"{about}\nzero-shot (protocol '{zero_shot}'), each model under its best scaling at "
                 f"{judge} px", xlabel="evaluation resolution (px, log scale; dotted: trained)",
           ylabel="top-1 (%), mean ± std over seeds")  # fmt: skip
    fit(ax, None, ys, chance)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside lower left", fontsize=7, ncol=2, frameon=False)  # (below: 13 models hide no line)
    for ax, size in zip(axes[0][1:], tuned_sizes, strict=True):
        finetuned_panel(ax, size, best_modes(tuned, size), best_modes(curves, size), colour, about, chance)
    return fig


def finetuned_panel(ax, size: int, after: dict, before: dict, colour: dict, about: str, chance: float | None) -> None:
    """One panel of :func:`overview_figure`: each model's top-1 fine-tuned at ``size`` (filled, ``after``) beside its
    best zero-shot top-1 there (hollow, ``before``), sorted by the fine-tuned mean."""
    order = sorted((k for k in after if size in after[k][1]), key=lambda k: after[k][1][size]["mean"])
    xs = []
    for y, key in enumerate(order):
        cell = after[key][1][size]
        ax.errorbar(cell["mean"], y, xerr=cell["std"], color=colour.get(key, "black"), marker="o", capsize=2)
        xs += [cell["mean"] - cell["std"], cell["mean"] + cell["std"]]
        if size in before.get(key, (None, {}))[1]:
            zs = before[key][1][size]
            ax.errorbar(zs["mean"], y, xerr=zs["std"], color=colour.get(key, "black"), marker="o",
                        markerfacecolor="white", capsize=2, alpha=0.8)  # fmt: skip
            xs += [zs["mean"] - zs["std"], zs["mean"] + zs["std"]]
    names = [m + (f", {r}" if r else "") for m, r in order]
    ax.set_yticks(range(len(order)), names, fontsize=7)
    ax.set(title=f"{about}\nat {size} px: fine-tuned there (filled), zero-shot at best (hollow)",
           xlabel="top-1 (%), mean ± std over seeds")  # fmt: skip
    fit(ax, xs, [], chance)
    ax.grid(alpha=0.3, axis="x")


def add_legend(fig, colour: dict[tuple[str, str], tuple], modes: list[str], points: bool) -> None:
    """One legend below the panels for both codes, the colours' (model, recipe) and the scaling modes' line styles
    (or markers, for ``points``), in as many columns as fit the figure's width; the figure grows to hold it, so
    that it lies wholly inside (constrained layout makes room for it)."""
    from matplotlib.lines import Line2D

    handles = [
        Line2D([], [], color=c, linewidth=2, label=model + (f", {recipe}" if recipe else ""))
        for (model, recipe), c in colour.items()
    ]
    for mode in dict.fromkeys("none" if m == "-" else m for m in modes):  # no RoPE is drawn as none
        code = (
            dict(marker=MARKERS.get(mode, "o"), linestyle="none")
            if points
            else dict(linestyle=LINE_STYLES.get(mode, "-"))
        )
        handles.append(Line2D([], [], color="black", label=f"RoPE scaling: {SCALING_LABELS.get(mode, mode)}", **code))
    renderer = fig.canvas.get_renderer()
    for ncol in range(min(len(handles), 6), 0, -1):
        legend = fig.legend(handles=handles, loc="outside lower center", ncol=ncol, fontsize=8, frameon=False)
        width = legend.get_window_extent(renderer).width / fig.dpi
        if width <= 0.95 * fig.get_figwidth() or ncol == 1:
            break
        legend.remove()
    fig.set_figwidth(max(fig.get_figwidth(), width + 0.5))
    fig.set_figheight(fig.get_figheight() + 0.2 * math.ceil(len(handles) / ncol))
