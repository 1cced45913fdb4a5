"""Plots of an extend run: perplexity and passkey accuracy against length (with their 95% bands),
and one depth x length heat map of passkey accuracy per method."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.atomic_files import atomic_write


def _figure(width: float, height: float) -> Any:
    # Figure + Agg canvas, not pyplot: no global backend state; constrained layout keeps titles,
    # labels and the colour bar inside the image.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def _length_axis(ax: Any, meta: dict[str, Any], lengths: list[int]) -> None:
    ax.axvline(meta["context_length"], color="grey", linestyle="--", linewidth=1, label="trained context")
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [_short(n) for n in lengths])
    ax.minorticks_off()
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)


def _short(n: int) -> str:
    return f"{n / 1024:g}k" if n >= 1024 else str(n)


def _errorbars(ax: Any, series: dict[str, list[tuple[int, float, float, float]]]) -> list[int]:
    """One line per name with 95% error bars; names are nudged apart along the (log) length axis
    so overlapping intervals stay readable. series: name -> [(length, value, lo, hi)]."""
    lengths: set[int] = set()
    for i, (name, points) in enumerate(series.items()):
        nudge = 2 ** (0.035 * (i - (len(series) - 1) / 2))
        xs = [n * nudge for n, *_ in points]
        ys = [y for _, y, _, _ in points]
        # max(0, .): an interval's end can miss its point by a rounding error (Wilson's upper end at n/n)
        below = [0.0 if math.isnan(lo) else max(0.0, y - lo) for _, y, lo, _ in points]
        above = [0.0 if math.isnan(hi) else max(0.0, hi - y) for _, y, _, hi in points]
        ax.errorbar(xs, ys, yerr=[below, above], marker="o", markersize=3, capsize=2, linewidth=1.2,
                    elinewidth=0.8, label=name)
        lengths.update(n for n, *_ in points)
    return sorted(lengths)


def ppl_plot(path: Path, rows: dict[str, dict[str, Any]], meta: dict[str, Any]) -> Path:
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    series = {name: [(n, s["ppl"], s["lo"], s["hi"]) for n, s in sorted(row["ppl_by_length"].items())]
              for name, row in rows.items()}
    lengths = _errorbars(ax, series)
    ax.set_yscale("log")
    ax.set(xlabel="evaluation length (tokens)", ylabel="perplexity",
           title=f"{meta['model']}: perplexity (95% block-bootstrap bars)")
    _length_axis(ax, meta, lengths)
    return _save(fig, path)


def accuracy_plot(path: Path, summary: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    series = {name: [(r["length"], r["accuracy"], r["lo"], r["hi"])
                     for r in sorted((r for r in summary if r["method"] == name), key=lambda r: r["length"])]
              for name in dict.fromkeys(r["method"] for r in summary)}
    lengths = _errorbars(ax, series)
    ax.set(xlabel="prompt length (tokens)", ylabel="passkey accuracy", ylim=(-0.04, 1.04),
           title=f"{meta['model']}: passkey retrieval (95% Wilson bars)")
    _length_axis(ax, meta, lengths)
    return _save(fig, path)


def heatmaps(path: Path, by_depth: Sequence[dict[str, Any]], methods: Sequence[str], meta: dict[str, Any]) -> Path:
    """One panel per method: depth (rows) x length (columns), colour = accuracy, text = correct/total."""
    names = [s for s in methods if any(r["method"] == s for r in by_depth)]
    lengths = sorted({r["length"] for r in by_depth})
    depths = sorted({r["depth"] for r in by_depth})
    cols = min(4, len(names))
    rows_n = math.ceil(len(names) / cols)
    fig = _figure(max(6.0, 3.2 * cols + 0.8), 2.4 * rows_n + 0.8)
    cell = {(r["method"], r["length"], r["depth"]): r for r in by_depth}
    image = None
    for i, name in enumerate(names):
        ax = fig.add_subplot(rows_n, cols, i + 1)
        grid = [[cell[(name, n, d)]["accuracy"] if (name, n, d) in cell else math.nan for n in lengths] for d in depths]
        image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto", origin="upper")
        for y, d in enumerate(depths):
            for x, n in enumerate(lengths):
                if (name, n, d) in cell:
                    r = cell[(name, n, d)]
                    ax.text(x, y, f"{r['correct']}/{r['total']}", ha="center", va="center", fontsize=7)
        ax.set_xticks(range(len(lengths)), [_short(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("length", fontsize=8)
        ax.set_ylabel("depth", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, shrink=0.8, label="accuracy")
    fig.suptitle(f"{meta['model']}: passkey accuracy by needle depth and prompt length\n"
                 f"(trained context {meta['context_length']}; text: correct/prompts)", fontsize=9)
    return _save(fig, path)


def ruler_plot(path: Path, summary: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    """RULER-style average over tasks against length, one line per method (no bars: an average of tasks)."""
    from posenc.experiments.extend.ruler_report import ruler_average

    average = ruler_average(list(summary))
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    series = {name: [(n, score, math.nan, math.nan) for (m, n), score in sorted(average.items()) if m == name]
              for name in dict.fromkeys(r["method"] for r in summary)}
    lengths = _errorbars(ax, series)
    ax.set(xlabel="prompt length (tokens)", ylabel="RULER-style average (0-100)", ylim=(-4, 104),
           title=f"{meta['model']}: RULER-style tasks, average over tasks")
    _length_axis(ax, meta, lengths)
    return _save(fig, path)
