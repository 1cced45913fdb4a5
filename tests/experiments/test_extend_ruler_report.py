"""RULER-style results on constructed records: a task's score is the mean share of answers found (x100, as
RULER reports it), its interval a Wilson interval over the answers, the average weighs every task the same,
and the tables and the recommendation read them."""

from __future__ import annotations

import pytest

from posenc.experiments.extend.ruler_report import ruler_average, ruler_summary, ruler_tables


def record(method, task, length, score, answers=4):
    return {"method": method, "task": task, "length": length, "trial": 0, "answers": ["a"] * answers,
            "score": score, "output": ""}


def test_score_is_the_mean_share_found_and_the_interval_counts_answers():
    rows = ruler_summary([record("none", "niah_multivalue", 8192, 1.0), record("none", "niah_multivalue", 8192, 0.5)])
    (row,) = rows
    assert (row["score"], row["found"], row["expected"], row["prompts"]) == (75.0, 6, 8, 2)
    assert row["lo"] < 75.0 < row["hi"] and row["lo"] >= 0 and row["hi"] <= 100


def test_the_average_weighs_every_task_the_same():
    records = [record("yarn", "cwe", 16384, 0.1, answers=10), record("yarn", "niah_single", 16384, 1.0, answers=1)]
    assert ruler_average(ruler_summary(records)) == {("yarn", 16384): pytest.approx(55.0)}


def test_tables_put_methods_down_and_lengths_or_tasks_across():
    records = [record(m, t, n, s) for m, s in (("none", 0.0), ("yarn", 0.5)) for t in ("vt", "cwe")
               for n in (8192, 16384)]
    tables = ruler_tables(ruler_summary(records), ["none", "yarn"], [8192, 16384])
    average_rows, cols = next(iter(tables.values()))
    assert cols == ["method", "8192", "16384"] and [r["method"] for r in average_rows] == ["none", "yarn"]
    assert average_rows[1]["16384"] == "50.0"
    per_length = [title for title in tables if "16384 tokens" in title]
    assert len(per_length) == 1 and tables[per_length[0]][1] == ["method", "vt", "cwe"]
    assert ruler_tables([], ["none"], [8192]) == {}


def test_a_method_missing_tasks_at_a_length_gets_no_average_there():
    """A stopped run: dual_chunk ran 1 of 2 tasks at 32768; its one task's score must not stand as its average
    next to methods averaged over both (found on the GPU run: 33.3 over 3 tasks 'beat' 22.9 over 7)."""
    records = [record("self_extend", t, 32768, s) for t, s in (("niah_single", 1.0), ("vt", 0.0))]
    records += [record("dual_chunk", "niah_single", 32768, 1.0), record("dual_chunk", "niah_single", 8192, 1.0)]
    assert ruler_average(ruler_summary(records)) == {("self_extend", 32768): 50.0, ("dual_chunk", 8192): 100.0}
