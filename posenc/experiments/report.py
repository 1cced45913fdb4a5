"""Results out of a run: terminal table, CSV/JSON, PNG plots, one self-contained HTML page."""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.experiments.rundir import atomic_write, write_text


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return str(value)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    console = Console()
    if not console.is_terminal:  # a pipe or file: rich would assume 80 columns and truncate
        console = Console(width=max(120, 14 * len(columns)))
    for col in columns:
        table.add_column(col, justify="left" if col == columns[0] else "right")
    for row in rows:
        table.add_row(*(fmt(row.get(col, "")) for col in columns))
    console.print(table)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

    return atomic_write(path, write)


def line_plot(path: Path, series: dict[str, dict[int, float]], xlabel: str, ylabel: str, title: str,
              log_y: bool = False, vline: float | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    for name, points in series.items():
        xs = sorted(x for x, y in points.items() if not math.isnan(y))
        ax.plot(xs, [points[x] for x in xs], marker="o", label=name)
    if vline is not None:
        ax.axvline(vline, color="grey", linestyle="--", linewidth=1, label="training length")
    ax.set_xscale("log", base=2)
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    return atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def html_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(fmt(r.get(c, '')))}</td>" for c in columns) + "</tr>"
                   for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def html_report(path: Path, title: str, sections: Sequence[tuple[str, str]], images: Sequence[Path],
                links: Sequence[Path]) -> Path:
    """One file: images are embedded (base64), so the page works when copied anywhere."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    for heading, body in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>{body}")
    for image in images:
        data = base64.b64encode(Path(image).read_bytes()).decode()
        parts.append(f'<figure><img alt="{image.name}" src="data:image/png;base64,{data}">'
                     f"<figcaption>{html.escape(image.name)}</figcaption></figure>")
    parts.append("<h2>Files</h2><ul>" + "".join(f'<li><a href="{html.escape(p.name)}">{html.escape(p.name)}</a></li>'
                                                 for p in links) + "</ul>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}img{max-width:100%}")
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>" \
           f"<style>{style}</style></head><body>{''.join(parts)}</body></html>"
    return write_text(path, page)
