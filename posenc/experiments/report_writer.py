"""The one report writer of every command: a `Report` (tables, plots, raw results) becomes the
terminal table, one CSV per table, results.json, one PNG per plot, a Markdown page and a
self-contained HTML page (images embedded), all written atomically into the run folder.

Values that are not numbers are labels and are shown as written ("diverged", "longer than the
model's table"), never as a number or a blank; JSON never holds a bare NaN (posenc.atomic_files.write_json).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from posenc.atomic_files import atomic_write, write_json, write_text


@dataclass
class Table:
    name: str  # file stem of its CSV
    title: str
    columns: list[str]
    rows: list[dict[str, Any]]
    shown: bool = True  # False: CSV only (raw rows too long for a terminal)
    group: str | None = None  # a column whose change starts a new section of the terminal table


@dataclass
class Plot:
    name: str  # file stem of its PNG
    title: str
    xlabel: str
    ylabel: str
    series: dict[str, dict[Any, Any]]  # line label -> {x: y}; points whose y is not a number are left out
    bands: dict[str, dict[Any, tuple[float, float]]] = field(default_factory=dict)  # label -> {x: (low, high)}
    log_x: bool = True
    log_y: bool = False
    integer_x: bool = False
    ylim: tuple[float, float] | None = None
    vline: float | None = None
    vline_label: str = "training length"


@dataclass
class Report:
    title: str
    intro: str  # one paragraph of plain text: settings, what the numbers mean
    tables: list[Table]
    plots: list[Plot] = field(default_factory=list)
    results: Any = None  # written as results.json when not None


def write(run_dir: Path, report: Report, markdown: str = "report.md", page: str = "report.html",
          echo: bool = True) -> list[Path]:
    """Every file of the report (printing the shown tables when echo); returns their paths."""
    run_dir = Path(run_dir)
    files = [write_csv(run_dir / f"{t.name}.csv", t.rows, t.columns) for t in report.tables]
    if report.results is not None:
        files.insert(0, write_json(run_dir / "results.json", report.results))
    images = [render_plot(run_dir / f"{p.name}.png", p) for p in report.plots]
    files += images
    shown = [t for t in report.tables if t.shown]
    if echo:
        for table in shown:
            print_table(table.rows, table.columns, table.title, table.group)
    md = write_text(run_dir / markdown, markdown_page(report, shown, images))
    sections = [("Setup", f"<p>{html.escape(report.intro)}</p>")] + [(t.title, html_table(t.rows, t.columns))
                                                                      for t in shown]
    return [*files, md, html_report(run_dir / page, report.title, sections, images, [*files, md])]


def fmt(value: Any) -> str:
    if isinstance(value, float):
        if not math.isfinite(value):
            return "n/a" if math.isnan(value) else str(value)
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"
    return "n/a" if value is None else str(value)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str], title: str, group: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table as RichTable

    table = RichTable(title=title)
    console = Console()
    if not console.is_terminal:  # a pipe or file: rich would assume 80 columns and truncate
        console = Console(width=max(120, 14 * len(columns)))
    for col in columns:
        table.add_column(col, justify="left" if col == columns[0] or col == group else "right")
    for i, row in enumerate(rows):
        last_of_group = group is not None and (i + 1 == len(rows) or rows[i + 1].get(group) != row.get(group))
        table.add_row(*(fmt(row.get(col, "")) for col in columns), end_section=last_of_group)
    console.print(table)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    def write(tmp: Path) -> None:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(columns), extrasaction="ignore")
            writer.writeheader()
            writer.writerows({c: row.get(c, "") for c in columns} for row in rows)

    return atomic_write(path, write)


def render_plot(path: Path, plot: Plot) -> Path:
    # Figure + Agg canvas, not pyplot: no global backend state, safe beside other plotting code.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(7, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ys = [y for points in plot.series.values() for y in points.values() if is_number(y)]
    for name, points in plot.series.items():
        xs = sorted(x for x, y in points.items() if is_number(y))
        (line,) = ax.plot(xs, [points[x] for x in xs], marker="o", markersize=3, label=name)
        band = plot.bands.get(name, {})
        bx = [x for x in xs if x in band]
        if bx:
            ax.fill_between(bx, [band[x][0] for x in bx], [band[x][1] for x in bx], color=line.get_color(),
                            alpha=0.15, linewidth=0)
    if plot.vline is not None:
        ax.axvline(plot.vline, color="grey", linestyle="--", linewidth=1, label=plot.vline_label)
    xs = [x for points in plot.series.values() for x, y in points.items() if is_number(y)]
    if plot.log_x and xs and min(xs) > 0:  # nothing to plot (every scheme diverged): linear axes
        ax.set_xscale("log", base=2)
    if plot.log_y and ys and min(ys) > 0:
        ax.set_yscale("log")
    if plot.integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel=plot.xlabel, ylabel=plot.ylabel, title=plot.title)
    if plot.ylim is not None:
        ax.set_ylim(*plot.ylim)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return atomic_write(path, lambda tmp: tmp.write_bytes(buffer.getvalue()))


def line_plot(path: Path, series: dict[str, dict[int, float]], xlabel: str, ylabel: str, title: str,
              log_y: bool = False, vline: float | None = None) -> Path:
    """One PNG of y against x per series (log-2 x axis)."""
    return render_plot(Path(path), Plot(Path(path).stem, title, xlabel, ylabel, series, log_y=log_y, vline=vline))


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    cell = lambda v: fmt(v).replace("|", "\\|")
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" if i == 0 else "---:"
                                                          for i in range(len(columns))) + "|"]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def markdown_page(report: Report, tables: Sequence[Table], images: Sequence[Path]) -> str:
    parts = [f"# {report.title}\n\n{report.intro}\n"]
    parts += [f"## {t.title}\n\n{markdown_table(t.rows, t.columns)}" for t in tables]
    parts += [f"![{p.stem}]({p.name})\n" for p in images]
    return "\n".join(parts)


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
