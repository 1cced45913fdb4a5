"""Runs that fail leave nothing misleading behind: divergence stops with a clear message, Ctrl-C
saves and resumes, a kill's temp folder is swept, unwritable folders and full disks are one-line
errors before (or without losing) any work (issue 14, cases 5, 6 and 11)."""

from __future__ import annotations

import errno
import json
import math
import signal

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from posenc.experiments.runs import checkpoint
from tests.experiments.cli_helpers import TINY, cli, one_line, read_only

RUN = [*TINY, "model.position_embedding_type=alibi", "trainer.max_steps=2", "trainer.checkpoint_interval=2"]


def _strict_json(path):
    """json.loads that refuses NaN/Infinity, as every JSON reader outside Python does."""
    return json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{path}: bare {c}"))


def _count_optimizer_steps(monkeypatch) -> list[int]:
    calls: list[int] = []
    real = torch.optim.AdamW.step
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    return calls


def _signal_in_step(monkeypatch, step: int, signum: int = signal.SIGINT) -> list[int]:
    """Raise `signum` inside optimizer step `step` (1-based, counted over the whole command), as if the user
    pressed Ctrl-C (or a scheduler sent SIGTERM) then; returns the list of steps taken so far."""
    calls: list[int] = []
    real = torch.optim.AdamW.step

    def step_and_signal(self, *a, **k):
        if len(calls) == step - 1:
            signal.raise_signal(signum)
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step_and_signal)
    return calls


def _compare(run_dir, schemes: str, seeds: str) -> list:
    """An in-process compare (compare.jobs=1) of tiny models, 6 steps per unit."""
    return ["compare", "--run-dir", run_dir, f"compare.schemes={schemes}", f"compare.seeds={seeds}",
            "compare.jobs=1", "compare.progress=false", "trainer.progress=false", "trainer.max_steps=6",
            "trainer.eval_interval=3", "model.n_layer=1", "model.d_model=32", "model.n_head=2",
            "model.max_seq_len=64", "data.seq_len=16", "eval.max_windows=2", "eval.shift_offsets=[0,10]"]


def test_divergence_stops_with_a_message_and_saves_no_nan_weights(tmp_path, capsys):
    code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "run", *RUN, "model.init_std=1e30")
    assert code == 1 and "diverged" in one_line(err)
    record = _strict_json(tmp_path / "run" / "train.json")
    assert record["status"] == "diverged" and record["diverged_at_step"] == 1
    for state in (tmp_path / "run").rglob("*.safetensors"):
        assert all(torch.isfinite(t).all() for t in load_file(str(state)).values()), state


def test_compare_labels_diverged_and_longer_than_the_table_apart(tmp_path, capsys):
    common = ["compare", *TINY, "trainer.max_steps=2", "model.max_seq_len=16", "task.name=none",
              "compare.seeds=[0]", "compare.jobs=1", f"out_dir={tmp_path}"]
    assert cli(capsys, *common, "compare.schemes=[learned_absolute]", "eval.length_multipliers=[1,2]")[0] == 0
    code, out, err = cli(capsys, *common, "compare.schemes=[alibi]", "model.init_std=1e30")
    assert code == 1 and "alibi" in one_line(err) and "diverged" in one_line(err)
    ok, bad = sorted(tmp_path.iterdir())
    table = _strict_json(ok / "results.json")["leaderboard"][0]
    assert table["ppl@1x mean"] > 1 and table["ppl@2x"] == "longer than the model's table"
    results = _strict_json(bad / "results.json")
    assert results["units"][0]["status"] == "diverged" and results["leaderboard"][0]["ppl@1x"] == "diverged"
    assert "diverged" in out and "diverged" in (bad / "report.html").read_text()


def test_write_json_is_always_valid_json(tmp_path):
    from posenc.atomic_files import write_json

    path = write_json(tmp_path / "x.json", {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5]})
    assert _strict_json(path) == {"a": None, "b": [None, None, 1.5]}


def test_ctrl_c_saves_a_checkpoint_and_the_run_resumes_exactly(tmp_path, capsys, monkeypatch):
    args = [*TINY, "model.position_embedding_type=alibi", "trainer.max_steps=6", "trainer.checkpoint_interval=6"]
    assert cli(capsys, "train", "--run-dir", tmp_path / "clean", *args)[0] == 0
    calls: list[int] = []
    real = torch.optim.AdamW.step

    def interrupt_third(self, *a, **k):
        if len(calls) == 2:
            signal.raise_signal(signal.SIGINT)  # as if the user pressed Ctrl-C inside step 3
        calls.append(1)
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", interrupt_third)
    code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "run", *args)
    assert code == 130 and "interrupted" in one_line(err) and "step 3" in one_line(err)
    assert checkpoint.latest(tmp_path / "run").name == "step-00000003"
    record = json.loads((tmp_path / "run" / "train.json").read_text())
    assert record["status"] == "interrupted" and [h["step"] for h in record["history"]] == [1, 2, 3]
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert cli(capsys, "train", "--run-dir", tmp_path / "run", *args)[0] == 0
    resumed = json.loads((tmp_path / "run" / "train.json").read_text())["history"]
    clean = json.loads((tmp_path / "clean" / "train.json").read_text())["history"]
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in clean], abs=1e-6)


def test_a_killed_checkpoint_write_leaves_no_temp_folder_after_resume(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "train", "--run-dir", run, *RUN)[0] == 0
    stale = run / "checkpoints" / ".tmp-killed"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    assert cli(capsys, "train", "--run-dir", run, *RUN)[0] == 0
    assert not stale.exists()


@pytest.mark.parametrize("bad", ["data.corpus=/no/such/file.txt", "data.seq_len=200"])
def test_a_failed_run_leaves_no_empty_folder(tmp_path, capsys, bad):
    corpus = tmp_path / "small.txt"
    corpus.write_text("x" * 1000)  # the last 100 bytes validate: too few for windows of 200
    code, _, err = cli(capsys, "train", *RUN, f"data.corpus={corpus}", bad, f"out_dir={tmp_path / 'runs'}")
    assert code == 2 and "data." in one_line(err)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_unwritable_run_folder_fails_before_training(tmp_path, capsys, monkeypatch):
    steps = _count_optimizer_steps(monkeypatch)
    with read_only(tmp_path / "ro"):
        code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "ro" / "run", *RUN)
        assert code == 2 and "run_dir" in one_line(err)
        code, _, err = cli(capsys, "train", *RUN, f"out_dir={tmp_path / 'ro'}")
        assert code == 2 and "out_dir" in one_line(err)
    assert steps == []


def test_resuming_a_read_only_run_fails_before_training(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    args = [*RUN[:-2], "trainer.max_steps=4", "trainer.checkpoint_interval=2"]
    assert cli(capsys, "train", "--run-dir", run, *args)[0] == 0
    (run / "checkpoints" / "latest").write_text("step-00000002")  # as if killed after step 2
    steps = _count_optimizer_steps(monkeypatch)
    with read_only(run):
        code, _, err = cli(capsys, "train", "--run-dir", run, *args)
    assert code == 2 and "run_dir" in one_line(err)
    assert steps == []


def test_eval_into_a_read_only_run_fails_before_evaluating(tmp_path, capsys, monkeypatch):
    import posenc.experiments.evaluation.perplexity as evaluate

    run = tmp_path / "run"
    assert cli(capsys, "train", "--run-dir", run, *RUN)[0] == 0
    monkeypatch.setattr(evaluate, "window_nll", lambda *a, **k: pytest.fail("evaluated before checking"))
    with read_only(run):
        code, _, err = cli(capsys, "eval", run)
    assert code == 2 and "run_dir" in one_line(err)


def test_compare_and_tasks_refuse_an_unwritable_out_dir_before_work(tmp_path, capsys, monkeypatch):
    steps = _count_optimizer_steps(monkeypatch)
    with read_only(tmp_path / "ro"):
        code, _, err = cli(capsys, "compare", *TINY, "trainer.max_steps=1", "compare.schemes=[alibi]",
                           f"out_dir={tmp_path / 'ro'}")
        assert code == 2 and "out_dir" in one_line(err)
        code, _, err = cli(capsys, "tasks", "leaderboard.schemes=[rope]", "leaderboard.tasks=[copy]",
                           "trainer.max_steps=1", f"out_dir={tmp_path / 'ro'}")
        assert code == 2 and "out_dir" in one_line(err)
    assert steps == []


@pytest.mark.parametrize("full", [
    OSError(errno.ENOSPC, "No space left on device"),
    SafetensorError("Error while serializing: IoError(No space left on device)"),  # what safetensors raises
])
def test_a_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path, capsys, monkeypatch, full):
    run = tmp_path / "run"
    args = [*TINY, "model.position_embedding_type=alibi", "trainer.max_steps=4", "trainer.checkpoint_interval=2"]
    real = checkpoint.save_file
    saves = []

    def full_on_second(tensors, path, *a, **k):
        saves.append(path)
        if len(saves) > 1:  # the optimizer state of step 2 fits; that of step 4 does not
            raise full
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(checkpoint, "save_file", full_on_second)
    code, _, err = cli(capsys, "train", "--run-dir", run, *args)
    line = one_line(err)
    assert code == 1 and "No space left" in line and "step-00000002" in line and "Traceback" not in err
    good = checkpoint.latest(run)
    assert good.name == "step-00000002" and math.isfinite(json.loads((good / "state.json").read_text())["step"])
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]


def test_written_files_get_the_usual_permissions_not_owner_only(tmp_path):
    import os
    import stat

    from posenc.atomic_files import write_text

    old = os.umask(0o022)
    try:
        path = write_text(tmp_path / "results.md", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_ctrl_c_in_an_in_process_compare_is_an_interruption_not_a_divergence(tmp_path, capsys, monkeypatch):
    """Issue 24, item 1: with units in this process (compare.jobs=1), Ctrl-C inside alibi's unit stops the
    whole command with 130; alibi is not recorded as diverged and rope never starts."""
    calls = _signal_in_step(monkeypatch, 3)
    compare = _compare(tmp_path / "run", "[alibi,rope]", "[0]")
    code, out, err = cli(capsys, *compare)
    assert code == 130, err
    assert "diverged" not in (out + err).lower()
    assert len(calls) == 3  # stopped in alibi's third step: rope never trained
    for path in (tmp_path / "run").rglob("*.json"):
        assert "diverged" not in path.read_text().lower(), path


def test_sigterm_saves_and_records_like_ctrl_c_and_exits_143(tmp_path, capsys, monkeypatch):
    """Issue 24, item 9: SIGTERM (schedulers, `timeout`) inside step 3 finishes the step, saves it, records
    the run as interrupted and exits 128 + 15; the run then resumes."""
    args = [*TINY, "model.position_embedding_type=alibi", "trainer.max_steps=6", "trainer.checkpoint_interval=6"]
    real = torch.optim.AdamW.step
    _signal_in_step(monkeypatch, 3, signal.SIGTERM)
    before = signal.getsignal(signal.SIGTERM)
    code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "run", *args)
    assert code == 143 and "step 3" in one_line(err) and "SIGTERM" in one_line(err), err
    assert checkpoint.latest(tmp_path / "run").name == "step-00000003"
    assert json.loads((tmp_path / "run" / "train.json").read_text())["status"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == before  # the command's handler does not outlive it
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert cli(capsys, "train", "--run-dir", tmp_path / "run", *args)[0] == 0


def test_sigterm_outside_a_training_loop_is_one_line_and_143(tmp_path, capsys, monkeypatch):
    import posenc.experiments.evaluation.perplexity as perplexity

    def terminated(*a, **k):
        signal.raise_signal(signal.SIGTERM)

    assert cli(capsys, "train", "--run-dir", tmp_path / "run", *RUN)[0] == 0
    monkeypatch.setattr(perplexity, "scores_by_length", terminated)  # what eval calls
    code, _, err = cli(capsys, "eval", tmp_path / "run")
    assert code == 143 and "stopped by SIGTERM" in one_line(err) and "Traceback" not in err


def test_the_report_of_an_interrupted_compare_says_what_finished_and_judges_only_complete_schemes(
        tmp_path, capsys, monkeypatch):
    """Issue 24, item 5: `posenc report` on a compare stopped after alibi's first seed labelled rope (never
    started) "diverged", claimed 2 seeds where 1 existed and judged alibi's claim "on every seed" from one."""
    real = torch.optim.AdamW.step
    _signal_in_step(monkeypatch, 9)  # 6 steps per unit: inside alibi seed 1
    run_dir = tmp_path / "run"
    compare = _compare(run_dir, "[alibi,rope]", "[0,1]")
    assert cli(capsys, *compare)[0] == 130
    monkeypatch.setattr(torch.optim.AdamW, "step", real)
    assert cli(capsys, "report", run_dir)[0] == 0
    results = json.loads((run_dir / "results.json").read_text())
    board = {row["scheme"]: row for row in results["leaderboard"]}
    assert board["rope"]["rank"] == "not run" and board["rope"]["ppl@1x"] == "not run"
    assert board["alibi"]["seeds"] == 1 and board["rope"]["seeds"] == 0
    assert all(value != "diverged" for row in results["leaderboard"] for value in row.values())
    assert board["rope"]["diverged"] == 0
    for claim in results["claims"]:
        assert claim["verdict"] == "inconclusive", claim  # no scheme has every seed
    page = (run_dir / "report.md").read_text() if (run_dir / "report.md").exists() else ""
    html = (run_dir / "report.html").read_text()
    assert "INTERRUPTED: 1 of 4 models finished" in html + page
    assert json.loads((run_dir / "run.json").read_text())["wall_seconds"] > 0


@pytest.mark.parametrize("edit", [
    lambda s: {},
    lambda s: {**s, "step": math.nan},
    lambda s: [s],
    lambda s: {k: v for k, v in s.items() if k != "optimizer"},
    lambda s: {**s, "history": s["history"][:-1]},
])
def test_a_hand_edited_checkpoint_state_is_refused_in_one_line_naming_the_file(tmp_path, capsys, edit):
    """Issue 24, item 6: state.json read back on resume is validated as a whole (a NaN step was a TypeError)."""
    assert cli(capsys, "train", "--run-dir", tmp_path / "run", *RUN)[0] == 0
    state = checkpoint.latest(tmp_path / "run") / "state.json"
    state.write_text(json.dumps(edit(json.loads(state.read_text()))))
    code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "run", *RUN)
    assert code == 2 and str(state) in one_line(err) and "Traceback" not in err, err


@pytest.mark.parametrize("command, content", [
    ("compare", "{}"), ("compare", '{"units": [{}]}'), ("compare", "[]"), ("compare", "not json"),
    ("compare", '{"units": [{"scheme": "alibi", "seed": 0, "status": "ok", "ppl": {"1": [1]}}]}'),
    ("tasks", "{}"), ("tasks", '{"rows": [{"scheme": "rope"}], "test_lengths": [1]}'), ("tasks", "[]"),
])
def test_posenc_report_refuses_a_hand_edited_results_file_in_one_line(tmp_path, capsys, command, content):
    run_dir = tmp_path / "run"
    args = {"compare": ["compare", "--run-dir", run_dir, "compare.schemes=[alibi]", "compare.seeds=[0]",
                        "compare.jobs=1", "compare.progress=false", *TINY, "trainer.max_steps=2"],
            "tasks": ["tasks", "--run-dir", run_dir, "leaderboard.schemes=[rope]", "leaderboard.tasks=[copy]",
                      "leaderboard.seeds=[0]", "leaderboard.train_len=2", "leaderboard.samples=2",
                      "leaderboard.progress=false", "leaderboard.jobs=1", "trainer.max_steps=2", "model.n_layer=1",
                      "model.d_model=16"]}[command]
    assert cli(capsys, *args)[0] == 0
    (run_dir / "results.json").write_text(content)
    code, _, err = cli(capsys, "report", run_dir)
    assert code == 2 and "results.json" in one_line(err) and "Traceback" not in err, err
