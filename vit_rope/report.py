"""train.py's results: results.csv, the markdown tables of results.md, and accuracy_vs_resolution.png."""

from __future__ import annotations

import math
from pathlib import Path

from .runs import write_csv

SCALING_LABELS = {
    "none": "none",
    "pi": "position interpolation",
    "ntk": "NTK-aware",
    "yarn": "YaRN",
    "normalized": "normalized",
}


def write_results(rows: list[dict], out: Path, train_size: int, dataset: str) -> None:
    """``rows`` (one per model, eval size, protocol and RoPE scaling mode) as the three result files in ``out``."""
    write_csv(rows, str(out / "results.csv"))
    (out / "results.md").write_text(markdown_tables(rows, train_size))
    plot(rows, out / "accuracy_vs_resolution.png", train_size, dataset)


def curves(rows: list[dict], protocol: str) -> dict[tuple[str, str], dict[int, dict]]:
    """(model, scaling mode) → eval size → row, for one protocol, in the order of the rows."""
    out: dict[tuple[str, str], dict[int, dict]] = {}
    for r in rows:
        if r["protocol"] == protocol:
            out.setdefault((r["model"], r["rope_scaling"]), {})[r["eval_size"]] = r
    return out


def markdown_tables(rows: list[dict], train_size: int) -> str:
    """One top-1 table per protocol: a row per (model, scaling mode), a column per eval size."""
    sizes = sorted({r["eval_size"] for r in rows})
    lines = []
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        lines.append(f"\n**top-1 (%), trained at {train_size}, evaluated with protocol `{protocol}`**\n")
        lines.append("| model | RoPE scaling | params | " + " | ".join(str(s) for s in sizes) + " |")
        lines.append("|---|---|---|" + "---|" * len(sizes))
        for (model, mode), cells in curves(rows, protocol).items():
            params = next(iter(cells.values()))["params"]
            top1 = " | ".join(f"{cells[s]['top1']:.1f}" if s in cells else "" for s in sizes)
            lines.append(f"| {model} | {mode} | {params / 1e6:.2f}M | {top1} |")
    return "\n".join(lines).lstrip() + "\n"


def plot(rows: list[dict], path: Path, train_size: int, dataset: str) -> None:
    """Top-1 against eval size, a panel per protocol; scaling modes other than none are dashed."""
    import matplotlib  # here, not at the top: model users never import it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    protocols = list(dict.fromkeys(r["protocol"] for r in rows))
    fig, axes = plt.subplots(1, len(protocols), figsize=(6 * len(protocols), 5.5), squeeze=False)
    for ax, protocol in zip(axes[0], protocols, strict=True):
        for (model, mode), cells in curves(rows, protocol).items():
            sizes = sorted(cells)
            plain = mode in ("-", "none")
            label = model if plain else f"{model} ({SCALING_LABELS.get(mode, mode)})"
            ax.plot(sizes, [cells[s]["top1"] for s in sizes], marker="o", label=label, linestyle="-" if plain else "--")
        ax.axvline(train_size, color="gray", linestyle=":", linewidth=1)
        ax.set(title=f"{dataset}: eval protocol '{protocol}'", xlabel="evaluation resolution (px)", ylabel="top-1 (%)")
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06 * math.ceil(len(labels) / 3), 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
