"""What a task leaderboard's rows {scheme, task, seed, length, accuracy} say: per length bucket the
mean and spread over seeds, per size the mean and min..max band; and the Report that shows it."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from posenc.data.tasks import SplitTask, get_task
from posenc.errors import bad_value
from posenc.experiments import report_writer
from posenc.experiments.report_writer import Plot, Report, Table
from posenc.experiments.tasks.claims import RULE as CLAIM_RULE
from posenc.experiments.tasks.claims import judge_all

FIELDS = ["scheme", "task", "seed", "split", "length", "accuracy"]  # split: only a split task's rows


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
    """Per scheme x task x length bucket (a split task: x split): mean and spread across seeds of each seed's
    bucket mean."""
    per_seed: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        name = row.get("split") or bucket(row["length"], train_len)
        per_seed[(row["scheme"], row["task"], name, row["seed"])].append(row["accuracy"])
    per_bucket: dict[tuple, list[float]] = defaultdict(list)
    for (scheme, task, name, _seed), accs in per_seed.items():
        per_bucket[(scheme, task, name)].append(statistics.fmean(accs))
    return [{"scheme": s, "task": t, "bucket": b, "mean": statistics.fmean(v), "spread": spread(v), "seeds": len(v)}
            for (s, t, b), v in per_bucket.items()]


def grid(summary: Sequence[dict]) -> tuple[list[str], list[dict]]:
    """(columns, rows): one row per task x scheme, `mean ± std` per length bucket, schemes side by side."""
    names = list(dict.fromkeys(row["bucket"] for row in summary))  # in first-seen (length) order
    cells = {(r["task"], r["scheme"], r["bucket"]): f"{r['mean']:.2f} ± {r['spread']:.2f}" for r in summary}
    schemes = dict.fromkeys(r["scheme"] for r in summary)
    rows = [{"task": task, "scheme": scheme, **{b: cells.get((task, scheme, b), "-") for b in names}}
            for task in dict.fromkeys(r["task"] for r in summary) for scheme in schemes]
    return ["task", "scheme", *names], rows


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


def accuracy_plot(rows: Sequence[dict], task: str, train_len: int) -> Plot:
    lines = sorted(curves(rows, task).items())
    return Plot(f"accuracy_{task}", f"{task}: exact match vs problem size", "problem size", "accuracy",
                series={s: dict(zip(n, mean, strict=True)) for s, (n, mean, _, _) in lines},
                bands={s: {x: (lo, hi) for x, lo, hi in zip(n, low, high, strict=True)}
                       for s, (n, _, low, high) in lines},
                log_x=False, integer_x=True, ylim=(-0.02, 1.02), vline=train_len + 0.5,
                vline_label=f"train sizes ≤ {train_len}")


def diverged_units(diverged: Sequence[dict]) -> str:
    return "; ".join(f"{d['scheme']} on {d['task']}, seed {d['seed']}" for d in diverged)


def grid_table(summary: Sequence[dict], name: str, title: str, tasks: Sequence[str], lost: Sequence[dict]) -> Table:
    """The grid of `tasks` (length tasks by bucket, split tasks by split); a scheme x task with no seed left reads
    `diverged`."""
    columns, table = grid([r for r in summary if r["task"] in tasks])
    for d in lost:
        if d["task"] in tasks and not any(r["task"] == d["task"] and r["scheme"] == d["scheme"] for r in table):
            table.append({"task": d["task"], "scheme": d["scheme"], **{c: "diverged" for c in columns[2:]}})
    return Table(name, title, columns, table, group="task")


def leaderboard_report(rows: Sequence[dict], summary: Sequence[dict], config: dict, results: dict) -> Report:
    """Terminal table, leaderboard.csv, results.csv (every row), plots, leaderboard.md and report.html. Units
    that diverged (results["diverged"]) are named, and a scheme x task with no seed left reads `diverged`."""
    b, t, m = config["leaderboard"], config["trainer"], config["model"]
    lengths, lost = results["test_lengths"], results.get("diverged", [])
    intro = (f"Trained on problem sizes 1..{b['train_len']}, tested on 1..{max(lengths)}; {t['max_steps']} steps x "
             f"batch {t['batch_size']}, lr {t['lr']}; GPT {m['n_layer']} layers, d_model {m['d_model']}, "
             f"{m['n_head']} heads; {b['samples']} test problems per size; seeds {', '.join(map(str, b['seeds']))}. "
             "Exact match of the greedy answer; mean ± std over seeds of each seed's bucket mean.")
    if lost:
        intro += f" Diverged, so not in the means: {diverged_units(lost)}."
    split_tasks = [t for t in b["tasks"] if isinstance(get_task(t), SplitTask)]
    if split_tasks:
        intro += (" Split tasks train at one size and are tested at it on every distribution: "
                  + "; ".join(get_task(t).describe() for t in split_tasks) + ".")
    tables = [grid_table(summary, name, title, tasks, lost) for name, title, tasks in (
        ("leaderboard", "exact-match accuracy by problem size: mean ± std over seeds",
         [t for t in b["tasks"] if t not in split_tasks]),
        ("splits", "split tasks (Golovneva et al. 2024), exact match at one size per distribution: mean ± std over "
                   "seeds", split_tasks)) if tasks]
    claims = [v.__dict__ for v in judge_all(rows, b["tasks"], b["seeds"])]  # a scheme on every seed, or left out
    if claims:
        intro += f" {CLAIM_RULE}"
        tables.append(Table("claims", "What this run shows: published claims, judged by the rule beside each",
                            ["source", "claim", "rule", "verdict", "evidence"], claims))
    tables.append(Table("results", "every test size", FIELDS, list(rows), shown=False))
    return Report("Length generalisation on algorithmic tasks", intro, tables,
                  [accuracy_plot(rows, task, b["train_len"]) for task in b["tasks"] if task not in split_tasks],
                  results | {"claims": claims})


def rerender(run_dir: Path, stored: dict) -> Path:
    """`posenc report`: the leaderboard again from results.json (its rows, and its summary when complete)."""
    path = Path(run_dir) / "results.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise bad_value("results", str(path), f"a readable results.json of `posenc tasks` ({err})") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and isinstance(r.get("scheme"), str)
                                             and isinstance(r.get("task"), str) and isinstance(r.get("seed"), int)
                                             and isinstance(r.get("length"), int)
                                             and isinstance(r.get("accuracy"), (int, float)) for r in rows):
        raise bad_value("results", str(path), "a JSON object whose 'rows' are {scheme, task, seed, length, "
                                              "accuracy} records")
    if not isinstance(data.get("test_lengths"), list) or not data["test_lengths"]:
        raise bad_value("results", str(path), "a JSON object with its test_lengths")
    summary = summarize(rows, stored["config"]["leaderboard"]["train_len"])  # from the rows: never a stale copy
    data.setdefault("diverged", [])
    return report_writer.write(run_dir, leaderboard_report(data["rows"], summary, stored["config"], data),
                               markdown="leaderboard.md")[-1]
