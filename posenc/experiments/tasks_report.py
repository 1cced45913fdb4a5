"""Summaries, files and a plot for a task leaderboard: rows {scheme, task, seed, length, accuracy}."""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from posenc.experiments.rundir import atomic_write

FIELDS = ("scheme", "task", "seed", "length", "accuracy")


def bucket(length: int, train_len: int) -> str:
    """In-distribution (<= L), 2x (L < n <= 2L), 4x (2L < n <= 4L), beyond (> 4L)."""
    for factor, name in ((1, "in-dist"), (2, "2x"), (4, "4x")):
        if length <= factor * train_len:
            low = 1 if factor == 1 else factor // 2 * train_len + 1
            return f"{name} ({low}-{factor * train_len})"
    return f">4x ({4 * train_len + 1}+)"


def spread(values: Sequence[float]) -> float:
    """Sample standard deviation across seeds; 0 for a single seed."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def summarize(rows: Sequence[dict], train_len: int) -> list[dict]:
    """Per scheme x task x length bucket: mean and spread across seeds of each seed's bucket mean."""
    per_seed: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        per_seed[(row["scheme"], row["task"], bucket(row["length"], train_len), row["seed"])].append(row["accuracy"])
    per_bucket: dict[tuple, list[float]] = defaultdict(list)
    for (scheme, task, name, _seed), accs in per_seed.items():
        per_bucket[(scheme, task, name)].append(statistics.fmean(accs))
    return [{"scheme": s, "task": t, "bucket": b, "mean": statistics.fmean(v), "spread": spread(v), "seeds": len(v)}
            for (s, t, b), v in per_bucket.items()]


def bucket_names(summary: Sequence[dict]) -> list[str]:
    return list(dict.fromkeys(row["bucket"] for row in summary))  # in first-seen (length) order


def write_csv(path: str | Path, rows: Sequence[dict]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows({k: row[k] for k in FIELDS} for row in rows)

    return atomic_write(path, write)


def grid(summary: Sequence[dict]) -> tuple[list[str], list[tuple[str, str, list[str]]]]:
    """(bucket names, rows of (task, scheme, `mean ± std` per bucket)): schemes side by side per task."""
    names = bucket_names(summary)
    cells = {(r["task"], r["scheme"], r["bucket"]): f"{r['mean']:.2f} ± {r['spread']:.2f}" for r in summary}
    schemes = dict.fromkeys(r["scheme"] for r in summary)
    rows = [(task, scheme, [cells.get((task, scheme, b), "-") for b in names])
            for task in dict.fromkeys(r["task"] for r in summary) for scheme in schemes]
    return names, rows


def print_table(summary: Sequence[dict]) -> None:
    """A rich table: one row per scheme x task, one column per length bucket (mean ± spread)."""
    from rich.console import Console
    from rich.table import Table

    names, rows = grid(summary)
    table = Table(title="exact-match accuracy: mean ± std over seeds")
    for column in ("task", "scheme", *names):
        table.add_column(column, justify="left" if column in ("task", "scheme") else "right")
    for i, (task, scheme, values) in enumerate(rows):
        table.add_row(task, scheme, *values, end_section=i + 1 == len(rows) or rows[i + 1][0] != task)
    Console(width=max(100, 24 * len(names) + 40)).print(table)


def markdown_table(summary: Sequence[dict]) -> str:
    """The leaderboard as a Markdown table: task, scheme, then `mean ± std` per length bucket."""
    names, rows = grid(summary)
    lines = ["| task | scheme | " + " | ".join(names) + " |", "|---|---|" + "---:|" * len(names)]
    lines += [f"| {task} | {scheme} | " + " | ".join(values) + " |" for task, scheme, values in rows]
    return "\n".join(lines) + "\n"


def write_markdown(path: str | Path, summary: Sequence[dict], settings: dict) -> Path:
    """leaderboard.md: the settings that produced it, the table, and the plots beside it."""
    seeds = ", ".join(map(str, settings["seeds"]))
    model = settings["model"]
    text = (f"# Length generalisation on algorithmic tasks\n\n"
            f"Trained on problem sizes 1..{settings['train_len']}, tested on 1..{max(settings['test_lengths'])}; "
            f"{settings['steps']} steps x batch {settings['batch_size']}, lr {settings['lr']}; "
            f"GPT {model['n_layer']} layers, d_model {model['d_model']}, {model['n_head']} heads; "
            f"{settings['samples']} test problems per size; seeds {seeds}. "
            "Exact match of the greedy answer; mean ± std over seeds of each seed's bucket mean.\n\n"
            + markdown_table(summary) + "\n"
            + "".join(f"![{task}](accuracy_{task}.png)\n" for task in settings["tasks"]))
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
