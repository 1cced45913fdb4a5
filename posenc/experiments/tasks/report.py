"""What a task leaderboard's rows {scheme, task, seed, length, accuracy} say: per length bucket the
mean and spread over seeds, per size the mean and min..max band; and the Report that shows it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from posenc.data.tasks import SplitTask, get_task
from posenc.experiments import report_writer
from posenc.experiments.report_writer import Plot, Report, Table
from posenc.experiments.tasks.claims import RULE as CLAIM_RULE
from posenc.experiments.tasks.claims import judge_all
from posenc.experiments.tasks.results import not_run, read_rows
from posenc.experiments.tasks.run import diverged, measured

FIELDS = ["scheme", "task", "seed", "split", "length", "accuracy"]  # split: only a split task's rows
NOT_RUN = "not run"  # a unit a stopped run never reached: neither a result nor a divergence


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


def grid(summary: Sequence[dict], seeds_asked: int | None = None) -> tuple[list[str], list[dict]]:
    """(columns, rows): one row per task x scheme, `mean ± std` per length bucket, schemes side by side; a cell
    over fewer seeds than asked (a stopped run) says how many."""
    names = list(dict.fromkeys(row["bucket"] for row in summary))  # in first-seen (length) order
    cells = {(r["task"], r["scheme"], r["bucket"]): _over_seeds(f"{r['mean']:.2f} ± {r['spread']:.2f}", r["seeds"],
                                                                seeds_asked) for r in summary}
    schemes = dict.fromkeys(r["scheme"] for r in summary)
    rows = [{"task": task, "scheme": scheme, **{b: cells.get((task, scheme, b), "-") for b in names}}
            for task in dict.fromkeys(r["task"] for r in summary) for scheme in schemes]
    return ["task", "scheme", *names], rows


def _over_seeds(text: str, done: int, asked: int | None) -> str:
    return text if asked is None or done >= asked else f"{text} ({done} of {asked} seeds)"


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


def grid_table(summary: Sequence[dict], name: str, title: str, tasks: Sequence[str], lost: Sequence[dict],
               config: dict) -> Table:
    """The grid of `tasks` (length tasks by bucket, split tasks by split); a scheme x task with no seed left reads
    `diverged`, one that a stopped run never reached `not run`."""
    b = config["leaderboard"]
    columns, found = grid([r for r in summary if r["task"] in tasks], len(b["seeds"]))
    cells = {(r["task"], r["scheme"]): r for r in found}
    table = []
    for task in tasks:
        for scheme in b["schemes"]:
            diverged = any(d["task"] == task and d["scheme"] == scheme for d in lost)
            empty = "diverged" if diverged else NOT_RUN
            row = cells.get((task, scheme), {"task": task, "scheme": scheme})
            table.append({**row, **{c: row.get(c, empty) for c in columns[2:]}})
    if len(columns) == 2:  # no measured row at all
        columns = [*columns, "accuracy"]
        table = [{**row, "accuracy": row.get("accuracy", NOT_RUN)} for row in table]
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
    missing = not_run([*rows, *lost], config)
    if missing:
        total = len(b["schemes"]) * len(b["tasks"]) * len(b["seeds"])
        intro += (f" INTERRUPTED: {total - len(missing)} of {total} runs finished; '{NOT_RUN}': "
                  f"{diverged_units([u.__dict__ for u in missing])}. Numbers over fewer seeds say so; "
                  "`posenc tasks --run-dir DIR` with the same settings completes the run.")
    split_tasks = [t for t in b["tasks"] if isinstance(get_task(t), SplitTask)]
    if split_tasks:
        intro += (" Split tasks train at one size and are tested at it on every distribution: "
                  + "; ".join(get_task(t).describe() for t in split_tasks) + ".")
    tables = [grid_table(summary, name, title, tasks, lost, config) for name, title, tasks in (
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
                  results | {"claims": claims, "complete": not missing,
                             "not_run": [f"{u.scheme} on {u.task}, seed {u.seed}" for u in missing]})


def results_of(rows: Sequence[dict], config: dict) -> dict:
    """results.json's content for these rows (measured and diverged): the report adds its summary, claims and
    whether the run is complete."""
    b = config["leaderboard"]
    lengths = list(range(1, (b["test_max_len"] or 4 * b["train_len"]) + 1))
    return {"config": config, "test_lengths": lengths, "rows": measured(rows), "diverged": diverged(rows)}


def full_report(rows: Sequence[dict], config: dict) -> Report:
    """The report of every row a run holds, in the order the options name its units."""
    b = config["leaderboard"]
    order = lambda r: (b["schemes"].index(r["scheme"]), b["tasks"].index(r["task"]), b["seeds"].index(r["seed"]),
                       r.get("length", 0))
    rows = sorted(rows, key=order)
    summary = summarize(measured(rows), b["train_len"])
    return leaderboard_report(measured(rows), summary, config, results_of(rows, config) | {"summary": summary})


def rerender(run_dir: Path, stored: dict) -> Path:
    """`posenc report`: the leaderboard again from results.json, checked whole first (its rows; the summary, the
    claims and whether it is complete are worked out again, never read)."""
    rows = read_rows(Path(run_dir), stored["config"])
    return report_writer.write(run_dir, full_report(rows, stored["config"]), markdown="leaderboard.md")[-1]
