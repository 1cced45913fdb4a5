"""Task training and the `posenc tasks` command: the model learns, the report is right, files land."""

from __future__ import annotations

import csv
import itertools
import json
import math
import random

import pytest
import torch

import posenc.experiments.tasks.run as tasks_run
from posenc.cli import main as cli_main
from posenc.data.tasks import TASKS, make_batch
from posenc.data.tasks.base import END, decode, encode
from posenc.experiments.config.sections import TaskOptim
from posenc.experiments.evaluation.task_accuracy import accuracy_by_length
from posenc.experiments.tasks.entries import contender_config
from posenc.experiments.tasks.report import bucket, curves, summarize
from posenc.experiments.tasks.run import run_leaderboard
from posenc.experiments.training.loop import lr_at
from posenc.experiments.training.task_model import answer_loss, train_on_task
from posenc.models import GPTConfig

TINY = GPTConfig(n_layer=2, n_head=4, d_model=64, max_seq_len=64, position_embedding_type="rope")


def _optim(steps: int, batch_size: int = 4, lr: float = 3e-3) -> TaskOptim:
    return TaskOptim(max_steps=steps, batch_size=batch_size, lr=lr)


def test_tiny_model_learns_copy_in_distribution():
    """250 steps on sizes 1..4: exact match far above chance (26**-n, under 4% even at size 1).
    Seeds 0-3 all reach a mean of 0.53-0.55 here, so 0.3 leaves room for harmless changes."""
    model = train_on_task(TINY, "copy", max_len=4, optim=_optim(250, batch_size=32, lr=3e-3), seed=0)
    accuracy = accuracy_by_length(model, "copy", range(1, 5), n_samples=32, seed=0)
    assert set(accuracy) == {1, 2, 3, 4}
    assert accuracy[1] >= 0.9
    assert sum(accuracy.values()) / 4 >= 0.3, accuracy


def test_training_is_deterministic_from_seed_and_leaves_global_rng_alone():
    cfg = TINY.replace(d_model=16, n_layer=1)
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    a = train_on_task(cfg, "reverse", max_len=3, optim=_optim(3), seed=1)
    assert torch.rand(1) == before  # the model's init drew from a forked RNG
    b = train_on_task(cfg, TASKS["reverse"], max_len=3, optim=_optim(3), seed=1)
    c = train_on_task(cfg, "reverse", max_len=3, optim=_optim(3), seed=2)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=True))


@pytest.mark.parametrize("label", ["abacus", "rope+randomized"])
def test_training_randomness_follows_the_seed_only(label):
    """Abacus offsets and randomized positions draw from torch's RNG: seeded per run, not global."""
    cfg = contender_config(TINY.replace(d_model=16, n_layer=1), label)
    torch.manual_seed(1)
    a = train_on_task(cfg, "addition", max_len=3, optim=_optim(3), seed=1)
    torch.manual_seed(2)
    b = train_on_task(cfg, "addition", max_len=3, optim=_optim(3), seed=1)
    assert all(torch.equal(pa, pb) for pa, pb in zip(a.parameters(), b.parameters(), strict=True))


def test_randomized_variant_trains_on_positions_up_to_max_seq_len():
    cfg = contender_config(TINY, "learned_absolute+randomized")
    assert cfg.position_embedding_type == "learned_absolute" and cfg.randomized_positions
    assert cfg.random_position_range == TINY.max_seq_len  # the learned table has exactly these rows
    assert contender_config(TINY, "rope") == TINY


@pytest.mark.parametrize(("label", "message"), [
    ("rope+randomzed", r"variant in 'rope\+randomzed'='randomzed' is unknown \(did you mean 'randomized'\?\)"),
    ("ropee+randomized", r"'ropee' is unknown"),
])
def test_bad_entries_name_what_is_wrong(label, message):
    with pytest.raises(ValueError, match=message):
        contender_config(TINY, label)


@pytest.mark.slow
def test_parallel_jobs_give_the_rows_of_one_process():
    """Units run in spawned single-thread processes; each depends on its seed only."""
    kwargs = {"schemes": ["rope", "abacus"], "tasks": ["addition"], "train_len": 2, "test_lengths": [1, 3],
              "seeds": [0], "optim": _optim(4, batch_size=8), "base": TINY.replace(d_model=16, n_layer=1),
              "n_samples": 8, "progress": False}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the workers' setting, so float sums agree to the bit
    try:
        serial = run_leaderboard(**kwargs, jobs=1)
    finally:
        torch.set_num_threads(threads)
    seen = []
    parallel = run_leaderboard(**kwargs, jobs=2, on_unit=lambda unit, rows: seen.append(unit))
    key = lambda r: (r["scheme"], r["length"])
    assert sorted(parallel, key=key) == sorted(serial, key=key) and len(serial) == 4
    assert {u.scheme for u in seen} == {"rope", "abacus"}


def test_loss_reaches_only_answer_tokens():
    """The gradient of the loss w.r.t. the logits is zero wherever the next token is not an answer token."""
    input_ids, loss_mask = make_batch(TASKS["addition"], 3, 2, random.Random(0))
    logits = torch.randn(2, input_ids.shape[1] - 1, 256, requires_grad=True)
    answer_loss(lambda ids: logits, input_ids, loss_mask).backward()
    predicts_answer = loss_mask[:, 1:]  # logits[:, t] predict input_ids[:, t + 1]
    touched = logits.grad.abs().sum(-1) > 0
    assert torch.equal(touched, predicts_answer)


class Oracle(torch.nn.Module):
    """A stand-in model that answers from the task's own solve(): right, or (for the prompts `wrong`
    picks) with one answer byte changed; it records what it was asked, so the test knows the truth
    without the evaluation's private seed formula."""

    def __init__(self, task: str, wrong) -> None:
        super().__init__()
        self.task, self.wrong, self.asked = TASKS[task], wrong, []

    def generate(self, prompts, max_new_tokens, use_cache=False, **_):
        rows = []
        for prompt in prompts.tolist():
            answer = encode(self.task.solve(decode(prompt)[1:-1]) + END)  # BOS problem SEP -> answer END
            assert max_new_tokens == len(answer)
            is_wrong = self.wrong(prompt)
            if is_wrong:
                answer[-1 if is_wrong == "end" else 0] ^= 1
            self.asked.append((not is_wrong, use_cache))
            rows.append(prompt + answer)
        return torch.tensor(rows)


@pytest.mark.parametrize("task", ["copy", "reverse", "addition"])
def test_accuracy_is_the_exact_match_rate_of_the_cached_answer_end_byte_included(task):
    wrong = lambda prompt: {0: "end", 1: False, 2: "first"}[sum(prompt) % 3]  # a third right
    oracle = Oracle(task, wrong).train()
    accuracy = accuracy_by_length(oracle, task, [1, 3, 6], n_samples=30, seed=4)
    assert oracle.training  # put back as it was
    assert len(oracle.asked) == 90 and all(cached for _, cached in oracle.asked)
    per_length = [oracle.asked[i * 30 : (i + 1) * 30] for i in range(3)]
    for (length, value), rows in zip(accuracy.items(), per_length, strict=True):
        expected = sum(ok for ok, _ in rows) / 30  # the rows of one length, asked in order
        assert value == pytest.approx(expected, abs=1e-6) and 0 < expected < 1, (length, value, expected)
    assert accuracy_by_length(Oracle(task, lambda prompt: False), task, [2], n_samples=8) == {2: 1.0}
    assert accuracy_by_length(Oracle(task, lambda prompt: "end"), task, [2], n_samples=8) == {2: 0.0}


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    optim = TaskOptim(max_steps=100, lr=1e-3)  # the task defaults: 5% warm-up, floor lr / 10
    lrs = [lr_at(step, optim) for step in range(100)]
    assert lrs[4] == pytest.approx(1e-3)
    assert all(a < b for a, b in itertools.pairwise(lrs[:5]))
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))
    assert lr_at(100, optim) == pytest.approx(1e-4)


@pytest.mark.parametrize(("changes", "field"), [
    ({"schemes": ["rope", "ropee"]}, "position_embedding_type"),
    ({"tasks": ["copy", "revrse"]}, "task"),
    ({"seeds": []}, "seeds"),
    ({"train_len": 0}, "train_len"),
    ({"test_lengths": [1, 40]}, "max_seq_len"),  # addition at 40 digits: 125 tokens > 64
])
def test_leaderboard_rejects_bad_input_before_training(monkeypatch, changes, field):
    monkeypatch.setattr(tasks_run, "train_on_task", lambda *a, **k: pytest.fail("trained before checking"))
    kwargs = {"schemes": ["rope"], "tasks": ["copy", "addition"], "train_len": 2, "test_lengths": [1, 2],
              "seeds": [0], "optim": _optim(1), "base": TINY, "progress": False, **changes}
    with pytest.raises(ValueError, match=field):
        run_leaderboard(**kwargs)


def test_buckets_split_at_L_2L_4L():
    names = [bucket(n, 8).split()[0] for n in (1, 8, 9, 16, 17, 32, 33)]
    assert names == ["in-dist", "in-dist", "2x", "2x", "4x", "4x", ">4x"]


def test_summary_is_mean_and_std_over_seeds_of_bucket_means():
    rows = [{"scheme": "rope", "task": "copy", "seed": s, "length": n, "accuracy": acc}
            for s, accs in ((0, (1.0, 0.5, 0.0)), (1, (1.0, 1.0, 0.0))) for n, acc in zip((1, 2, 3), accs, strict=True)]
    summary = {r["bucket"].split()[0]: r for r in summarize(rows, train_len=2)}
    assert summary["in-dist"]["mean"] == pytest.approx((0.75 + 1.0) / 2)
    assert summary["in-dist"]["spread"] == pytest.approx(math.sqrt(2) * 0.125)  # stdev of {0.75, 1.0}
    assert summary["2x"]["mean"] == 0.0 and summary["2x"]["seeds"] == 2
    lengths, mean, low, high = curves(rows, "copy")["rope"]
    assert lengths == [1, 2, 3] and mean == [1.0, 0.75, 0.0] and low == [1.0, 0.5, 0.0] and high == [1.0, 1.0, 0.0]


MICRO = ["tasks", "leaderboard.schemes=[rope]", "leaderboard.tasks=[copy]", "leaderboard.train_len=2",
         "trainer.max_steps=5", "leaderboard.samples=4", "model.n_layer=1", "model.d_model=16",
         "leaderboard.progress=false"]


def test_command_writes_json_csv_png_and_prints_the_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main([*MICRO, "leaderboard.seeds=[0]", "--run-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "in-dist" in printed
    result = json.loads((out / "results.json").read_text())
    assert result["complete"] and result["test_lengths"] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert {(r["scheme"], r["task"], r["seed"]) for r in result["rows"]} == {("rope", "copy", 0)}
    with open(out / "results.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["length"]) for r in table] == list(range(1, 9))
    assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in table)
    assert (out / "accuracy_copy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    board = (out / "leaderboard.md").read_text()
    assert "| copy | rope | " in board and "seeds 0." in board and "(accuracy_copy.png)" in board
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert not list(out.glob("*.tmp"))  # atomic writes leave no temp files behind


def test_command_resumes_finished_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert cli_main([*MICRO, "leaderboard.seeds=[0]", "--run-dir", str(out)]) == 0
    first = json.loads((out / "results.json").read_text())["rows"]
    calls = []
    real = tasks_run.train_on_task
    monkeypatch.setattr(tasks_run, "train_on_task", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert cli_main([*MICRO, "leaderboard.seeds=[0,1]", "--run-dir", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(calls) == 1 and calls[0][-1] == 1  # only seed 1 was trained
    assert [r for r in rows if r["seed"] == 0] == first and len(rows) == 16
    capsys.readouterr()
    assert cli_main([*MICRO, "leaderboard.seeds=[0,1]", "trainer.max_steps=6", "--run-dir", str(out)]) == 2
    assert "trainer.max_steps: 5 -> 6" in capsys.readouterr().err  # other settings: refused, naming them


@pytest.mark.slow
def test_a_resume_with_a_shorter_list_is_refused_and_deletes_nothing(tmp_path, capsys):
    """Issue 24, item 3: resumed with fewer seeds, `posenc tasks` rewrote results.json and the CSVs with the
    subset. A list may grow (new units), never shrink; the folder is left byte for byte."""
    out = tmp_path / "run"
    assert cli_main([*MICRO, "leaderboard.seeds=[0,1]", "--run-dir", str(out)]) == 0
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.json"}
    capsys.readouterr()
    assert cli_main([*MICRO, "leaderboard.seeds=[0]", "--run-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "leaderboard.seeds drops 1" in err and "never deletes results" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "run.json"} == files
    assert json.loads((out / "run.json").read_text())["config"]["leaderboard"]["seeds"] == [0, 1]


@pytest.mark.parametrize(("override", "message"), [
    ("leaderboard.tasks=[copy,revrse]", "did you mean 'reverse'"),
    ("leaderboard.schemes=[alibbi]", "did you mean 'alibi'"),
    ("leaderboard.train_len=0", "leaderboard.train_len=0"),
    ("leaderboard.seeds=[0,x]", "leaderboard.seeds"),
    ("trainer.max_steps=0", "trainer.max_steps=0"),
    ("trainer.lr=-1", "trainer.lr=-1"),
    ("model.max_seq_len=99", "model.max_seq_len=99 is not allowed: not set here"),
    ("model.n_layr=1", "did you mean 'model.n_layer'"),
])
def test_command_reports_bad_input_in_one_line_and_writes_nothing(tmp_path, capsys, override, message):
    out = tmp_path / "run"
    assert cli_main([*MICRO, "--run-dir", str(out), override]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not out.exists()


def test_a_diverged_unit_is_a_result_kept_on_resume_and_named_in_the_report(tmp_path, monkeypatch, capsys):
    """Issue 24, item 8: one diverging unit made every resume exit 1, and `posenc report` dropped its scheme
    without a word. It is recorded as diverged, the others finish, a resume trains nothing, the reports name it."""
    from posenc.experiments.training.loop import Diverged

    real = tasks_run.train_on_task

    def alibi_diverges(cfg, task, *a, **k):
        if cfg.position_embedding_type == "alibi":
            raise Diverged(3, math.nan)
        return real(cfg, task, *a, **k)

    monkeypatch.setattr(tasks_run, "train_on_task", alibi_diverges)
    out = tmp_path / "run"
    args = [*MICRO, "leaderboard.schemes=[rope,alibi]", "leaderboard.seeds=[0]", "leaderboard.jobs=1",
            "--run-dir", str(out)]
    assert cli_main(args) == 0
    assert "alibi on copy, seed 0" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert [(d["scheme"], d["status"]) for d in results["diverged"]] == [("alibi", "diverged")]
    assert {r["scheme"] for r in results["rows"]} == {"rope"}
    calls = []
    monkeypatch.setattr(tasks_run, "train_on_task", lambda *a, **k: calls.append(a) or real(*a, **k))
    assert cli_main(args) == 0 and calls == []  # the diverged unit is a result: not trained again
    (out / "leaderboard.md").unlink()
    assert cli_main(["report", str(out)]) == 0
    board = (out / "leaderboard.md").read_text()
    assert "alibi on copy, seed 0" in board and "| copy | alibi | diverged" in board
