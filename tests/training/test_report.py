"""The report (vit_rope/training/report.py): results.md's headline and summaries from result rows."""

import statistics

import numpy as np

from vit_rope.training import report


def test_the_headline_leaves_out_sizes_that_were_not_evaluated():
    rows = [dict(model="m", recipe="", seed=0, train_size=16, eval_size=s, protocol="resize", rope_scaling="none",
                 top1=t, top5=99.0, loss=1.0, params=10) for s, t in ((16, 50.0), (32, 40.0))]  # fmt: skip
    text = report.headline_table(report.summarise(rows), 16)
    assert "| model | recipe | best scaling at 2x | 16 px | 32 px | 32 / 16 |" in text  # no 0.5x column
    assert "| m | - | none | 50.0 | 40.0 | 0.80 |" in text


def benchmark_rows() -> list[dict]:
    """Rows shaped as the Fashion-MNIST benchmark's: 8 models, 2 recipes, 3 seeds, the modes each takes."""
    g = np.random.default_rng(0)
    every, some = ["none", "pi", "ntk", "yarn", "normalized"], ["none", "pi", "normalized"]
    models = {"vit_ape_tiny": ["-"], "vit_rope_tiny": every, "vit_rope_mixed_tiny": some, "vit_comrope_tiny": some,
              "vit_liere_tiny": ["none", "pi"], "vit_string_tiny": some, "vit_spiral_tiny": every,
              "vit_lookhere_tiny": ["none"]}  # fmt: skip
    return [
        dict(model=m, recipe=recipe, seed=seed, train_size=28, eval_size=size, protocol="resize", rope_scaling=mode,
             top1=round(float(g.uniform(10, 90)), 2), top5=99.0, loss=1.0, params=210_000)
        for seed in range(3) for recipe in ("single-res", "multi-res") for m, modes in models.items()
        for size in (16, 20, 24, 28, 32, 40, 48, 56) for mode in modes
    ]  # fmt: skip


def test_both_figures_are_written_with_the_legend_inside(tmp_path):
    rows = benchmark_rows()
    report.write_results(rows, tmp_path, 28, "fashion_mnist")
    for name in ("accuracy_vs_resolution.png", "extrapolation.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    summary = report.summarise(rows)
    for make in (report.accuracy_figure, report.extrapolation_figure):
        fig = make(summary, 28, "fashion_mnist")
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        (legend,) = fig.legends
        box, page = legend.get_window_extent(renderer), fig.bbox
        assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (make, box, page)
        assert not any(ax.get_window_extent(renderer).overlaps(box) for ax in fig.axes)
        assert len(legend.get_texts()) == 8 * 2 + 5  # a colour per (model, recipe), a style per scaling mode
        report.pyplot().close(fig)
    text = (tmp_path / "results.md").read_text()
    cell = [r["top1"] for r in rows if (r["model"], r["recipe"], r["eval_size"], r["rope_scaling"])
            == ("vit_liere_tiny", "multi-res", 56, "pi")]  # fmt: skip
    line = next(s for s in text.splitlines() if s.startswith("| vit_liere_tiny | multi-res | pi | 0.21M | 3 |"))
    assert line.endswith(f" {statistics.fmean(cell):.1f} ± {statistics.stdev(cell):.1f} |")


def test_extrapolation_axes_name_the_sizes_that_stand_in(tmp_path):
    rows = [r for r in benchmark_rows() if r["eval_size"] in (20, 28, 48)]
    fig = report.extrapolation_figure(report.summarise(rows), 28, "fashion_mnist")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels == ["top-1 (%) at 20 px (0.5x the training size, the nearest evaluated to 14 px)",
                      "top-1 (%) at 48 px (2x the training size, the nearest evaluated to 56 px)"]  # fmt: skip
    assert fig.axes[0].get_xlabel() == "top-1 (%) at 28 px (the training size)"
    report.pyplot().close(fig)


def test_headline_names_each_models_best_mode_at_twice_the_training_size():
    rows = benchmark_rows()
    for r in rows:
        if (r["model"], r["recipe"], r["rope_scaling"], r["eval_size"]) == ("vit_rope_tiny", "multi-res", "yarn", 56):
            r["top1"] = 99.0 + r["seed"] * 0.5
    text = report.headline_table(report.summarise(rows), 28)
    assert "| model | recipe | best scaling at 2x | 16 px | 28 px | 56 px | 56 / 28 |" in text
    lines = [s for s in text.splitlines() if s.startswith("| vit_")]
    assert len(lines) == 8 * 2  # a row per (model, recipe)
    line = next(s for s in lines if s.startswith("| vit_rope_tiny | multi-res |"))
    at_28 = statistics.fmean(r["top1"] for r in rows if (r["model"], r["recipe"], r["rope_scaling"], r["eval_size"])
                             == ("vit_rope_tiny", "multi-res", "yarn", 28))  # fmt: skip
    assert line.startswith("| vit_rope_tiny | multi-res | yarn |")
    assert line.endswith(f"| 99.5 ± 0.5 | {99.5 / at_28:.2f} |")
