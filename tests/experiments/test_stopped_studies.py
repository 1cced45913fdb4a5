"""compare and tasks folders that a run left half-way (issue 36, items 3 and 4): `posenc report` renders them as
incomplete (never a one-seed mean, never 'diverged' for a unit that did not run, never complete: true unless it
is), an interruption writes the report of what finished, and every file report or a resume reads is checked
whole before anything is rewritten. Folders are written by hand (or by a stopped command): no training."""

from __future__ import annotations

import json

import pytest

from posenc.errors import Interrupted
from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config import loader
from posenc.experiments.runs import manifest
from posenc.experiments.tasks.config import load_tasks_config
from tests.experiments.cli_helpers import TINY, cli, one_line, snapshot

COMPARE = ["compare.schemes=[alibi,rope]", "compare.seeds=[0,1]", "task.name=copy", *TINY]
TASKS = ["leaderboard.schemes=[rope,alibi]", "leaderboard.tasks=[copy]", "leaderboard.seeds=[0,1]",
         "leaderboard.train_len=2", "leaderboard.samples=2", "trainer.max_steps=2", "model.n_layer=1",
         "model.d_model=16", "leaderboard.jobs=1", "leaderboard.progress=false"]


def _unit(scheme: str, seed: int, ppl: float) -> dict:
    return {"scheme": scheme, "seed": seed, "status": "ok", "final_train_loss": 1.0, "params": 10,
            "ppl": {"1": ppl, "2": ppl * 2}, "bpb": {"1": 1.0, "2": 2.0}, "shift_loss_change": {"0": 0.0, "10": 0.0},
            "shift_dloss": 0.0, "task_accuracy": {str(n): 0.5 for n in range(1, 9)}, "seconds": 1.0}


def _compare_folder(tmp_path, units: list[dict], extra: dict | None = None):
    run = tmp_path / "compare-run"
    run.mkdir()
    cfg = loader.load(CompareConfig, None, COMPARE)
    manifest.write(run, "compare", cfg.to_dict(), None, wall_seconds=1.0)
    (run / "results.json").write_text(json.dumps({"units": units, **(extra or {})}))
    return run


def test_a_stopped_compare_reads_as_incomplete_in_every_table(tmp_path, capsys):
    run = _compare_folder(tmp_path, [_unit("alibi", 0, 5.0), _unit("alibi", 1, 7.0), _unit("rope", 0, 4.0)],
                          {"complete": True})  # a hand-edited claim of completeness is not read
    code, _, err = cli(capsys, "report", run)
    assert code == 0, err
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False and results["not_run"] == ["rope seed 1"]
    rows = {r["scheme"]: r for r in results["leaderboard"]}
    assert rows["rope"]["ppl@1x"] == "4.00 (1 of 2 seeds)"  # never one seed's number as the mean over seeds
    assert rows["alibi"]["ppl@1x"] == "6.00 ± 1.41"
    assert rows["rope"]["rank"] == "not ranked (1 of 2 seeds)"  # ranked on every seed only
    report = (run / "report.md").read_text()
    assert "INTERRUPTED: 3 of 4 models finished" in report


def test_a_compare_scheme_that_never_ran_reads_not_run_in_the_task_table(tmp_path, capsys):
    run = _compare_folder(tmp_path, [_unit("alibi", 0, 5.0)])
    assert cli(capsys, "report", run)[0] == 0
    task_csv = (run / "task.csv").read_text()
    rope = next(line for line in task_csv.splitlines() if line.startswith("rope"))
    assert "not run" in rope and "diverged" not in rope


@pytest.mark.parametrize(("edit", "named"), [
    (lambda u: u[0]["ppl"].update({"1": "abc"}), "results units[0]"),  # a label no evaluation writes
    (lambda u: u[0].update({"shift_dloss": [1]}), "results units[0]"),
    (lambda u: u.append(dict(u[0])), "results units[1]"),  # the same model twice would count as two seeds
    (lambda u: u[0].update({"scheme": "kerple"}), "results units[0]"),  # not a unit of this run
    (lambda u: u[0].update({"seed": 7}), "results units[0]"),
])
def test_a_hand_edited_compare_results_file_is_one_line_and_nothing_is_rewritten(tmp_path, capsys, edit, named):
    units = [_unit("alibi", 0, 5.0)]
    edit(units)
    run = _compare_folder(tmp_path, units)
    before = snapshot(run)
    code, _, err = cli(capsys, "report", run)
    assert code == 2 and one_line(err).startswith(f"posenc report: error: {named}=")
    assert snapshot(run) == before


def test_an_interrupted_compare_writes_the_report_of_what_finished_marked_incomplete(tmp_path, capsys, monkeypatch):
    from posenc.experiments.compare import run as study

    def stopped(cfg, run_dir, on_unit):
        on_unit([_unit("alibi", 0, 5.0) | {"ppl": {1: 5.0, 2: 10.0}}])
        raise Interrupted("stopped by Ctrl-C", signum=2)

    monkeypatch.setattr(study, "compare", stopped)
    run = tmp_path / "run"
    code, _, _ = cli(capsys, "compare", *COMPARE, "--run-dir", run)
    assert code == 130
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False and len(results["not_run"]) == 3
    assert "INTERRUPTED: 1 of 4 models finished" in (run / "report.md").read_text()


def _row(scheme: str, seed: int, length: int, accuracy: float) -> dict:
    return {"scheme": scheme, "task": "copy", "seed": seed, "length": length, "accuracy": accuracy}


def _tasks_folder(tmp_path, rows: list[dict], diverged: list[dict] = (), complete: bool = True):
    run = tmp_path / "tasks-run"
    run.mkdir()
    cfg = load_tasks_config(None, TASKS)
    manifest.write(run, "tasks", cfg.to_dict(), None, wall_seconds=1.0)
    (run / "results.json").write_text(json.dumps({"config": cfg.to_dict(), "test_lengths": list(range(1, 9)),
                                                  "rows": rows, "diverged": list(diverged), "complete": complete}))
    return run


def _rope_seed0() -> list[dict]:
    return [_row("rope", 0, n, 1.0 if n <= 2 else 0.5) for n in range(1, 9)]


def test_a_stopped_tasks_run_reads_as_incomplete_whatever_its_file_says(tmp_path, capsys):
    run = _tasks_folder(tmp_path, _rope_seed0(), complete=True)
    code, _, err = cli(capsys, "report", run)
    assert code == 0, err
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False
    assert results["not_run"] == ["rope on copy, seed 1", "alibi on copy, seed 0", "alibi on copy, seed 1"]
    board = (run / "leaderboard.csv").read_text().splitlines()
    rope = next(line for line in board if ",rope," in line)
    alibi = next(line for line in board if ",alibi," in line)
    assert "(1 of 2 seeds)" in rope  # one seed is never shown as the mean over the run's seeds
    assert "not run" in alibi and "diverged" not in alibi
    assert "INTERRUPTED: 1 of 4 runs finished" in (run / "leaderboard.md").read_text()


@pytest.mark.parametrize(("edit", "named"), [
    (lambda rows, lost: rows[0].update({"accuracy": "abc"}), "results rows[0]"),
    (lambda rows, lost: rows[0].update({"accuracy": 1.5}), "results rows[0]"),
    (lambda rows, lost: rows[0].update({"length": "1"}), "results rows[0]"),
    (lambda rows, lost: rows.append(dict(rows[0])), "results rows[8]"),  # one size twice
    (lambda rows, lost: lost.append({"scheme": "rope", "task": "copy", "seed": 0, "status": "diverged"}),
     "results diverged[0]"),  # measured and diverged at once
    (lambda rows, lost: lost.append({"scheme": "rope", "task": "copy", "seed": 1}), "results diverged[0]"),
])
def test_a_hand_edited_tasks_results_file_is_one_line_for_report_and_resume(tmp_path, capsys, edit, named):
    rows, lost = _rope_seed0(), []
    edit(rows, lost)
    run = _tasks_folder(tmp_path, rows, lost, complete=False)
    before = snapshot(run)
    code, _, err = cli(capsys, "report", run)
    assert code == 2 and one_line(err).startswith(f"posenc report: error: {named}=")
    code, _, err = cli(capsys, "tasks", *TASKS, "--run-dir", run)  # before any unit trains
    assert code == 2 and one_line(err).startswith(f"posenc tasks: error: {named}=")
    after = snapshot(run)
    assert json.loads(after.pop("run.json"))["config"] == json.loads(before.pop("run.json"))["config"]
    assert after == before  # results.json and every report file as they were (run.json: the session's time only)


def test_an_interrupted_tasks_run_writes_the_report_of_what_finished_marked_incomplete(tmp_path, capsys,
                                                                                        monkeypatch):
    from posenc.experiments.tasks import run as study

    def stopped(*args, on_unit, **kwargs):
        on_unit(study.Unit("rope", "copy", 0), _rope_seed0())
        raise Interrupted("stopped by SIGTERM", signum=15)

    monkeypatch.setattr(study, "run_leaderboard", stopped)
    run = tmp_path / "run"
    code, _, _ = cli(capsys, "tasks", *TASKS, "--run-dir", run)
    assert code == 143
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False and len(results["rows"]) == 8 and len(results["not_run"]) == 3
    assert "INTERRUPTED: 1 of 4 runs finished" in (run / "leaderboard.md").read_text()


def test_tasks_help_names_every_task(capsys):
    from posenc.data.tasks import TASKS

    with pytest.raises(SystemExit):
        cli(capsys, "tasks", "--help")
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in TASKS)
