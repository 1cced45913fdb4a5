"""Accuracy vs problem size, one line per scheme (mean over seeds, min..max band)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from posenc.experiments.rundir import atomic_write


def curves(rows: Sequence[dict], task: str) -> dict[str, tuple[list[int], list[float], list[float], list[float]]]:
    """scheme -> (lengths, mean, min, max) of accuracy across seeds, for one task."""
    by_point: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        if row["task"] == task:
            by_point[row["scheme"]][row["length"]].append(row["accuracy"])
    out = {}
    for scheme, points in by_point.items():
        lengths = sorted(points)
        out[scheme] = (lengths, [sum(points[n]) / len(points[n]) for n in lengths],
                       [min(points[n]) for n in lengths], [max(points[n]) for n in lengths])
    return out


def plot_task(path: str | Path, rows: Sequence[dict], task: str, train_len: int) -> Path:
    # Figure + Agg canvas, not pyplot: no global backend state, safe beside other plotting code.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4.2), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for scheme, (lengths, mean, low, high) in sorted(curves(rows, task).items()):
        (line,) = ax.plot(lengths, mean, marker="o", markersize=3, label=scheme)
        ax.fill_between(lengths, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    ax.axvline(train_len + 0.5, color="grey", linestyle="--", linewidth=1, label=f"train sizes ≤ {train_len}")
    ax.set(title=f"{task}: exact match vs problem size", xlabel="problem size", ylabel="accuracy",
           ylim=(-0.02, 1.02))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # problem sizes are whole numbers
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
