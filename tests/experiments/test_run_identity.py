"""A run folder holds one run: a resume with other settings, a foreign folder, a missing or
escaping `latest` pointer, a changed corpus, a second eval: none of them may relabel, mix or
overwrite results (issue 14, cases 1-4 and 12)."""

from __future__ import annotations

import json

import pytest

from posenc.experiments.runs import checkpoint
from tests.experiments.cli_helpers import TINY, cli, one_line, run_folder, snapshot

ROPE = [*TINY, "model.position_embedding_type=rope", "trainer.max_steps=2", "trainer.checkpoint_interval=2"]


@pytest.fixture
def rope_run(tmp_path, capsys):
    run = tmp_path / "run"
    assert cli(capsys, "train", "--run-dir", run, *ROPE)[0] == 0
    return run


@pytest.mark.parametrize(("change", "field"), [
    ("model.position_embedding_type=alibi", "model.position_embedding_type"),
    ("trainer.seed=1", "trainer.seed"),
    ("trainer.lr=0.01", "trainer.lr"),
    ("data.seq_len=8", "data.seq_len"),
])
def test_resume_with_settings_that_change_the_result_is_refused_naming_them(rope_run, capsys, change, field):
    before = snapshot(rope_run)
    code, _, err = cli(capsys, "train", "--run-dir", rope_run, *ROPE, change)
    assert code == 2
    line = one_line(err)
    assert field in line and "--fork" in line
    assert snapshot(rope_run) == before  # not relabelled, not continued
    # Settings that cannot change the numbers may differ.
    code, _, err = cli(capsys, "train", "--run-dir", rope_run, *ROPE, "trainer.checkpoint_interval=1",
                       "trainer.keep_checkpoints=3", "trainer.progress=true", "eval.max_windows=2")
    assert code == 0, err


def test_fork_continues_in_a_new_folder_and_leaves_the_old_run_alone(rope_run, tmp_path, capsys):
    before = snapshot(rope_run)
    code, out, err = cli(capsys, "train", "--run-dir", rope_run, "--fork", *ROPE, "model.position_embedding_type=alibi",
                         "trainer.max_steps=4", f"out_dir={tmp_path / 'forks'}")
    assert code == 0, err
    fork = run_folder(out)
    assert fork.parent == tmp_path / "forks" and snapshot(rope_run) == before
    record = json.loads((fork / "train.json").read_text())
    assert record["config"]["model"]["position_embedding_type"] == "alibi"
    assert record["forked_from"]["step"] == 2 and record["forked_from"]["run_dir"] == str(rope_run)
    assert [h["step"] for h in record["history"]] == [1, 2, 3, 4]


def test_a_folder_posenc_did_not_write_is_refused(tmp_path, capsys):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train.json").write_text('{"my": "results"}')
    code, _, err = cli(capsys, "train", "--run-dir", folder, *ROPE)
    assert code == 2 and "run_dir" in one_line(err)
    assert (folder / "train.json").read_text() == '{"my": "results"}'


def test_a_missing_latest_pointer_resumes_from_the_newest_checkpoint(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    args = [*ROPE, "trainer.max_steps=4", "trainer.checkpoint_interval=2"]
    assert cli(capsys, "train", "--run-dir", run, *args)[0] == 0
    (run / "checkpoints" / "latest").unlink()
    steps = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    saved = []
    real = checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda run_dir, step, *a, **k: saved.append(step) or real(run_dir, step,
                                                                                                        *a, **k))
    assert cli(capsys, "train", "--run-dir", run, *args)[0] == 0
    assert saved == []  # nothing retrained from step 0
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == steps  # nothing pruned
    assert len(json.loads((run / "train.json").read_text())["history"]) == 4


@pytest.mark.parametrize("pointer", ["../../other/checkpoints/step-00000002", "/etc", "step-00000002/../.."])
def test_a_latest_pointer_that_leaves_the_run_is_refused(tmp_path, capsys, pointer):
    for name in ("run", "other"):
        assert cli(capsys, "train", "--run-dir", tmp_path / name, *ROPE)[0] == 0
    (tmp_path / "run" / "checkpoints" / "latest").write_text(pointer)
    code, _, err = cli(capsys, "eval", tmp_path / "run")
    assert code == 2 and "latest" in one_line(err)
    code, _, err = cli(capsys, "train", "--run-dir", tmp_path / "run", *ROPE)
    assert code == 2 and "latest" in one_line(err)


def test_eval_never_overwrites_earlier_results(rope_run, capsys):
    assert cli(capsys, "eval", rope_run)[0] == 0
    first = (rope_run / "eval.json").read_bytes()
    code, out, _ = cli(capsys, "eval", rope_run, "eval.length_multipliers=[1]")
    assert code == 0
    assert (rope_run / "eval.json").read_bytes() == first
    second = sorted(p for p in rope_run.glob("eval*.json") if p.name != "eval.json")
    assert len(second) == 1 and str(second[0]) in out
    assert set(json.loads(second[0].read_text())["ppl_by_length"]) == {"16"}


def _corpus_run(tmp_path, capsys):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x + 1\n" * 200)
    run = tmp_path / "run"
    assert cli(capsys, "train", "--run-dir", run, *ROPE, f"data.corpus={corpus}")[0] == 0
    corpus.write_text("other words entirely, the file was edited " * 200)
    return run, corpus


def test_eval_refuses_a_corpus_that_changed_since_training(tmp_path, capsys):
    run, _ = _corpus_run(tmp_path, capsys)
    code, _, err = cli(capsys, "eval", run)
    line = one_line(err)
    assert code == 2 and "data.corpus" in line and "changed" in line
    assert not list(run.glob("eval*.json"))


def test_resume_refuses_a_corpus_that_changed_since_training(tmp_path, capsys):
    run, corpus = _corpus_run(tmp_path, capsys)
    code, _, err = cli(capsys, "train", "--run-dir", run, *ROPE, f"data.corpus={corpus}")
    assert code == 2 and "data.corpus" in one_line(err)
