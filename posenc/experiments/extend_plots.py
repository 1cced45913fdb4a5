"""Plots of an extend run: perplexity and passkey accuracy against length (with their 95% bands),
and one depth x length heat map of passkey accuracy per scaling."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.experiments.rundir import atomic_write


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


def _length_axis(ax: Any, meta: dict[str, Any]) -> None:
    ax.axvline(meta["context_length"], color="grey", linestyle="--", linewidth=1, label="trained context")
    ax.set_xscale("log", base=2)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)


def ppl_plot(path: Path, rows: dict[str, dict[str, Any]], meta: dict[str, Any]) -> Path:
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for name, row in rows.items():
        points = sorted(row["ppl_by_length"].items())
        xs = [n for n, _ in points]
        (line,) = ax.plot(xs, [s["ppl"] for _, s in points], marker="o", markersize=3, label=name)
        if not any(math.isnan(s["lo"]) for _, s in points):
            ax.fill_between(xs, [s["lo"] for _, s in points], [s["hi"] for _, s in points],
                            color=line.get_color(), alpha=0.15, linewidth=0)
    ax.set_yscale("log")
    ax.set(xlabel="evaluation length (tokens)", ylabel="perplexity", title=f"{meta['model']}: perplexity")
    _length_axis(ax, meta)
    return _save(fig, path)


def accuracy_plot(path: Path, summary: Sequence[dict[str, Any]], meta: dict[str, Any]) -> Path:
    fig = _figure(7, 4.5)
    ax = fig.add_subplot()
    for name in dict.fromkeys(r["scaling"] for r in summary):
        rows = sorted((r for r in summary if r["scaling"] == name), key=lambda r: r["length"])
        xs = [r["length"] for r in rows]
        (line,) = ax.plot(xs, [r["accuracy"] for r in rows], marker="o", markersize=3, label=name)
        ax.fill_between(xs, [r["lo"] for r in rows], [r["hi"] for r in rows], color=line.get_color(), alpha=0.12,
                        linewidth=0)
    ax.set(xlabel="prompt length (tokens)", ylabel="passkey accuracy", ylim=(-0.02, 1.02),
           title=f"{meta['model']}: passkey retrieval (95% Wilson bands)")
    _length_axis(ax, meta)
    return _save(fig, path)


def heatmaps(path: Path, by_depth: Sequence[dict[str, Any]], scalings: Sequence[str], meta: dict[str, Any]) -> Path:
    """One panel per scaling: depth (rows) x length (columns), colour = accuracy, text = correct/total."""
    names = [s for s in scalings if any(r["scaling"] == s for r in by_depth)]
    lengths = sorted({r["length"] for r in by_depth})
    depths = sorted({r["depth"] for r in by_depth})
    cols = min(4, len(names))
    rows_n = math.ceil(len(names) / cols)
    fig = _figure(max(6.0, 3.2 * cols + 0.8), 2.4 * rows_n + 0.8)
    cell = {(r["scaling"], r["length"], r["depth"]): r for r in by_depth}
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
        ax.set_xticks(range(len(lengths)), [f"{n // 1024}k" if n >= 1024 else str(n) for n in lengths], fontsize=7)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths], fontsize=7)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("length", fontsize=8)
        ax.set_ylabel("depth", fontsize=8)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, shrink=0.8, label="accuracy")
    fig.suptitle(f"{meta['model']}: passkey accuracy by needle depth and prompt length\n"
                 f"(trained context {meta['context_length']}; text: correct/prompts)", fontsize=9)
    return _save(fig, path)
