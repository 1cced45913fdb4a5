"""RULER-style results of an extend run: the score per (method, task, length) as RULER reports it (the mean
over prompts of the share of expected answers found, x100), a 95% Wilson interval over the answers (each
expected answer found or not; answers within one prompt are not independent, so the interval is a floor on
the uncertainty), and the average over tasks per (method, length), RULER's headline number."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from posenc.experiments.evaluation.statistics import wilson


def ruler_summary(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (method, task, length), in first-seen order."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[(r["method"], r["task"], r["length"])].append(r)
    rows = []
    for (method, task, length), prompts in groups.items():
        found = sum(round(r["score"] * len(r["answers"])) for r in prompts)
        expected = sum(len(r["answers"]) for r in prompts)
        lo, hi = wilson(found, expected)
        rows.append({"method": method, "task": task, "length": length, "prompts": len(prompts), "found": found,
                     "expected": expected, "score": 100 * sum(r["score"] for r in prompts) / len(prompts),
                     "lo": 100 * lo, "hi": 100 * hi})
    return rows


def ruler_average(summary: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """(method, length) -> the mean of its task scores (0-100): every task weighs the same, as in RULER. Only for
    a method with every task run at that length (a stopped run's averages over fewer tasks would not compare)."""
    scores: dict[tuple[str, int], list[float]] = defaultdict(list)
    tasks: dict[int, set[str]] = defaultdict(set)
    for row in summary:
        scores[(row["method"], row["length"])].append(row["score"])
        tasks[row["length"]].add(row["task"])
    return {key: sum(values) / len(values) for key, values in scores.items() if len(values) == len(tasks[key[1]])}


def ruler_tables(summary: list[dict[str, Any]], methods: list[str],
                 lengths: list[int]) -> dict[str, tuple[list[dict], list[str]]]:
    """The average table (methods down, lengths across) and one table per length (methods down, tasks across)."""
    if not summary:
        return {}
    average = ruler_average(summary)
    cols = ["method", *map(str, lengths)]
    rows = [{"method": m, **{str(n): f"{average[(m, n)]:.1f}" for n in lengths if (m, n) in average}}
            for m in methods if any((m, n) in average for n in lengths)]
    out = {"RULER-style average over tasks (score 0-100)": (rows, cols)}
    tasks = list(dict.fromkeys(r["task"] for r in summary))
    cell = {(r["method"], r["task"], r["length"]): r for r in summary}
    for n in lengths:
        rows = [{"method": m, **{t: _cell(cell[(m, t, n)]) for t in tasks if (m, t, n) in cell}}
                for m in methods if any((m, t, n) in cell for t in tasks)]
        out[f"RULER-style tasks at {n} tokens: score (95% Wilson interval over answers)"] = (rows, ["method", *tasks])
    return out


def _cell(row: dict[str, Any]) -> str:
    return f"{row['score']:.0f} ({row['lo']:.0f}-{row['hi']:.0f})"
