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


# ----------------------------------------------------------------------------------------- paired differences
def row(model: str, seed: int, top1: float, size: int = 28, mode: str = "none", protocol: str = "resize") -> dict:
    return dict(model=model, recipe="", seed=seed, train_size=14, eval_size=size, protocol=protocol,
                rope_scaling=mode, top1=top1, top5=99.0, loss=1.0, params=10)  # fmt: skip


def test_paired_differences_against_a_hand_computation():
    """Differences 1, 2, 3 (seeds 0, 1, 2): mean 2, sample sd 1, so the interval is 2 ± t(0.975, 2) / sqrt(3) =
    2 ± 4.303 / 1.732 = 2 ± 2.484, i.e. (-0.484, 4.484). Rows come shuffled: the pairing is by seed, not order."""
    rows = [row("vit_rope_tiny", s, t) for s, t in ((0, 70.0), (1, 60.0), (2, 65.0))]
    rows += [row("vit_x_tiny", s, t) for s, t in ((2, 68.0), (0, 71.0), (1, 62.0))]
    rows.append(row("vit_x_tiny", 3, 99.0))  # a seed the baseline lacks pairs with nothing
    paired = report.paired_differences(rows, "vit_rope_tiny")
    d = paired["resize", "vit_x_tiny", "", "none", "none", 28]
    assert d["n"] == 3 and d["diffs"] == [1.0, 2.0, 3.0] and d["mean"] == 2.0
    assert abs(d["low"] - (2 - 4.303 / 3**0.5)) < 1e-9 and abs(d["high"] - (2 + 4.303 / 3**0.5)) < 1e-9
    assert round(d["low"], 3) == -0.484 and round(d["high"], 3) == 4.484
    assert d["every"] == 1  # better in every seed, though the interval holds 0
    assert report.diff_text(d) == "+2.0 (-0.5, +4.5) ▲"


def test_every_seed_is_claimed_only_where_it_holds():
    base = [row("vit_ape_tiny", s, 50.0, mode="-") for s in range(3)]
    cases = {"better": (1.0, 2.0, 0.5), "worse": (-1.0, -2.0, -0.5), "mixed": (1.0, -2.0, 3.0), "tie": (1.0, 0.0, 2.0)}
    for name, diffs in cases.items():
        rows = base + [row(f"vit_{name}_tiny", s, 50.0 + d, mode="pi") for s, d in enumerate(diffs)]
        (d,) = report.paired_differences(rows, "vit_ape_tiny").values()
        assert d["every"] == {"better": 1, "worse": -1, "mixed": 0, "tie": 0}[name], name
    one = report.paired_differences(
        [row("vit_ape_tiny", 0, 50.0, mode="-"), row("vit_y_tiny", 0, 60.0)], "vit_ape_tiny"
    )
    (d,) = one.values()
    assert d["low"] is None and d["every"] == 0 and report.diff_text(d) == "+10.0"  # one seed: no interval, no claim


def test_models_pair_with_the_baseline_under_the_same_mode_and_without_modes_with_each():
    rows = [row("vit_rope_tiny", s, 60.0 + s, mode=m) for s in range(2) for m in ("none", "pi")]
    rows += [row("vit_rope_mixed_tiny", s, 61.0 + 2 * s, mode=m) for s in range(2) for m in ("none", "normalized")]
    rows += [row("vit_ape_tiny", s, 55.0, mode="-") for s in range(2)]
    rows += [row("vit_ape_tiny", s, 80.0, mode="-", protocol="finetune") for s in range(2)]
    keys = set(report.paired_differences(rows, "vit_rope_tiny"))
    assert keys == {
        ("resize", "vit_rope_mixed_tiny", "", "none", "none", 28),  # normalized: axial RoPE has no such row
        ("resize", "vit_ape_tiny", "", "-", "none", 28),
        ("resize", "vit_ape_tiny", "", "-", "pi", 28),
    }
    text = report.paired_tables(rows, report.default_baselines([r["model"] for r in rows]))
    assert "top-1 minus axial RoPE (`vit_rope_tiny`)" in text and "top-1 minus APE (`vit_ape_tiny`)" in text
    # differences 1, 2: 1.5 ± 12.706 · 0.707 / 1.414 = 1.5 ± 6.353; -5, -6 and 5, 6 alike
    assert "| vit_rope_mixed_tiny | none | +1.5 (-4.9, +7.9) ▲ |" in text
    assert "| vit_ape_tiny | - vs pi | -5.5 (-11.9, +0.9) ▼ |" in text
    assert "| vit_rope_tiny | pi vs - | +5.5 (-0.9, +11.9) ▲ |" in text
    assert "protocol `finetune`" not in text  # the baseline has no fine-tuned rows to pair with


def test_the_t_quantiles_are_those_of_students_distribution():
    """Each tabulated quantile q has P(|T| <= q) = 0.95: closed forms for 1 and 2 degrees of freedom (Cauchy:
    tan(0.475 pi); t2: (2p - 1) / sqrt(2p(1 - p))), and for every df the density integrated numerically (torch's
    StudentT log_prob, Simpson's rule) up to the table's value."""
    assert abs(report.t_975(1) - np.tan(0.475 * np.pi)) < 5e-4
    assert abs(report.t_975(2) - 0.95 / np.sqrt(2 * 0.975 * 0.025)) < 5e-4
    import torch

    for df in range(1, 31):
        q = report.t_975(df)
        x = torch.linspace(0, q, 20_001, dtype=torch.float64)
        pdf = torch.distributions.StudentT(torch.tensor(float(df), dtype=torch.float64)).log_prob(x).exp()
        h = q / 20_000
        area = h / 3 * (pdf[0] + pdf[-1] + 4 * pdf[1:-1:2].sum() + 2 * pdf[2:-1:2].sum())
        rounding = 2 * float(pdf[-1]) * 5e-4  # what q's three decimals may move the mass by
        assert abs(2 * float(area) - 0.95) < rounding, df
    assert report.t_975(50) == report.t_975(30)  # past the table: df 30's value, a little wider than the truth


def test_results_md_holds_the_paired_tables(tmp_path):
    rows = [r for r in benchmark_rows() if r["recipe"] == "single-res"]
    report.write_results(rows, tmp_path, 28, "fashion_mnist")
    text = (tmp_path / "results.md").read_text()
    assert "top-1 minus axial RoPE (`vit_rope_tiny`)" in text and "top-1 minus APE (`vit_ape_tiny`)" in text
    paired = report.paired_differences(rows, "vit_ape_tiny")
    d = paired["resize", "vit_liere_tiny", "single-res", "pi", "-", 40]
    mine = [r["top1"] for r in rows if (r["model"], r["eval_size"], r["rope_scaling"]) == ("vit_liere_tiny", 40, "pi")]
    ape = [r["top1"] for r in rows if (r["model"], r["eval_size"]) == ("vit_ape_tiny", 40)]
    assert d["diffs"] == [a - b for a, b in zip(mine, ape, strict=True)]
    line = next(
        s
        for s in text.split("top-1 minus APE")[1].splitlines()
        if s.startswith("| vit_liere_tiny | single-res | pi vs - |")
    )
    assert f" {report.diff_text(d)} |" in line


def test_every_table_of_results_md_ends_at_a_blank_line(tmp_path):
    """GitHub's markdown takes a line right under a table's last row into the table as a row: each heading must
    stand after a blank line, or the headline-mode paired tables' title renders as a row of the table above it."""
    rows = [r for r in benchmark_rows() if r["recipe"] == "single-res"]
    report.write_results(rows, tmp_path, 28, "fashion_mnist")
    lines = (tmp_path / "results.md").read_text().splitlines()
    assert sum(s.startswith("**top-1 minus") for s in lines) == 4  # per mode and best mode, against each baseline
    for above, line in zip(lines, lines[1:], strict=False):
        assert not (above.startswith("|") and line and not line.startswith("|")), f"{above!r} then {line!r}"


def test_the_overview_shows_each_models_best_mode_and_what_fine_tuning_recovers(tmp_path):
    """Left panel: a line per model, under the mode best at 2x (here made yarn for axial RoPE); right: the fine-tuned
    models sorted by their fine-tuned mean, each beside its best zero-shot mean at that size."""
    rows = [dict(r, recipe="") for r in benchmark_rows() if r["recipe"] == "single-res"]
    for r in rows:
        if (r["model"], r["rope_scaling"], r["eval_size"]) == ("vit_rope_tiny", "yarn", 56):
            r["top1"] = 99.0
    tuned = {"vit_ape_tiny": ("-", 30.0), "vit_rope_tiny": ("none", 70.0), "vit_liere_tiny": ("none", 50.0)}
    rows += [dict(r, protocol="finetune", rope_scaling=tuned[r["model"]][0], top1=tuned[r["model"]][1] + r["seed"])
             for r in rows if r["model"] in tuned and r["eval_size"] == 56
             and r["rope_scaling"] in ("-", "none")]  # fmt: skip
    report.write_results(rows, tmp_path, 28, "fashion_mnist")
    assert (tmp_path / "overview.png").stat().st_size > 10_000
    fig = report.overview_figure(report.summarise(rows), 28, "fashion_mnist")
    left, right = fig.axes
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert len(labels) == 8 and "vit_rope_tiny (yarn)" in labels and "vit_ape_tiny" in labels
    assert [t.get_text() for t in right.get_yticklabels()] == ["vit_ape_tiny", "vit_liere_tiny", "vit_rope_tiny"]
    assert "at 56 px" in right.get_title()
    points = [c.lines[0] for c in right.containers]  # (each errorbar's data line: its caps are lines too)
    filled = [float(p.get_xdata()[0]) for p in points if p.get_markerfacecolor() != "white"]
    assert sorted(filled) == [31.0, 51.0, 71.0]  # the fine-tuned means over seeds 0-2
    assert len(points) == 6  # and each model's zero-shot point beside it
    report.pyplot().close(fig)


def test_the_overview_has_one_panel_without_fine_tuning():
    fig = report.overview_figure(report.summarise(benchmark_rows()), 28, "fashion_mnist")
    assert len(fig.axes) == 1 and "best scaling at 56 px" in fig.axes[0].get_title()
    report.pyplot().close(fig)


def test_best_modes_pair_each_model_under_its_own_best_with_the_baseline_under_its_own():
    """Mixed is best at 2x under pi, axial RoPE under yarn (made so): the best-mode rows hold those two curves
    alone, and their difference at every size is Mixed-pi minus axial-yarn, seed by seed."""
    rows = [dict(r, recipe="") for r in benchmark_rows() if r["recipe"] == "single-res"]
    for r in rows:
        if r["eval_size"] == 56 and (r["model"], r["rope_scaling"]) in (("vit_rope_mixed_tiny", "pi"),
                                                                          ("vit_rope_tiny", "yarn")):  # fmt: skip
            r["top1"] = 95.0 + r["seed"]
    kept = report.best_mode_rows(rows, 28)
    assert {r["rope_scaling"] for r in kept if r["model"] == "vit_rope_mixed_tiny"} == {"pi"}
    assert {r["rope_scaling"] for r in kept if r["model"] == "vit_rope_tiny"} == {"yarn"}
    assert {r["rope_scaling"] for r in kept if r["model"] == "vit_ape_tiny"} == {"-"}
    d = report.paired_differences(kept, "vit_rope_tiny", any_mode=True)["resize", "vit_rope_mixed_tiny", "", "pi",
                                                                        "yarn", 20]  # fmt: skip
    top1 = {(r["model"], r["rope_scaling"], r["seed"]): r["top1"] for r in rows if r["eval_size"] == 20}
    assert d["diffs"] == [top1["vit_rope_mixed_tiny", "pi", s] - top1["vit_rope_tiny", "yarn", s] for s in range(3)]
    assert not any(k[3] != "pi" for k in report.paired_differences(kept, "vit_rope_tiny", any_mode=True)
                   if k[1] == "vit_rope_mixed_tiny")  # fmt: skip
    text = report.paired_tables(kept, {"axial RoPE": "vit_rope_tiny"}, any_mode=True, what=", under the best")
    assert "top-1 minus axial RoPE (`vit_rope_tiny`), under the best, same seed" in text
    assert any(line.startswith("| vit_rope_mixed_tiny | pi vs yarn |") for line in text.splitlines())


def test_the_headline_ends_with_the_largest_size_beyond_twice():
    sizes = ((8, 30.0), (14, 50.0), (28, 40.0), (56, 35.0))
    rows = [dict(model="m", recipe="", seed=0, train_size=14, eval_size=s, protocol="resize", rope_scaling="none",
                 top1=t, top5=99.0, loss=1.0, params=10) for s, t in sizes]  # fmt: skip
    text = report.headline_table(report.summarise(rows), 14)
    assert "| model | recipe | best scaling at 2x | 8 px | 14 px | 28 px | 56 px | 28 / 14 |" in text
    assert "| m | - | none | 30.0 | 50.0 | 40.0 | 35.0 | 0.80 |" in text
