"""Paths a user types mean what a shell would make of them, wherever the next command runs (issue 24,
item 10): `~` in out_dir is the home folder, a relative corpus file is found again by `posenc eval` from
another folder; and compare refuses lengths without 1x, the length every judgement is made at."""

from __future__ import annotations

import json

from tests.experiments.cli_helpers import TINY, cli, one_line

RUN = [*TINY, "model.position_embedding_type=alibi", "trainer.max_steps=2", "trainer.checkpoint_interval=2"]
TEXT = "def f(x):\n    return x + 1\n" * 400


def test_a_tilde_in_out_dir_is_the_home_folder(tmp_path, capsys, monkeypatch):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir(), work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert cli(capsys, "train", *RUN, "out_dir=~/runs")[0] == 0
    assert [p.name.split("-")[0] for p in (home / "runs").iterdir()] == ["train"]
    assert not (work / "~").exists()


def test_eval_finds_a_relative_corpus_from_another_folder(tmp_path, capsys, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    (work / "text.txt").write_text(TEXT)
    monkeypatch.chdir(work)
    assert cli(capsys, "train", "--run-dir", tmp_path / "run", *RUN, "data.corpus=text.txt")[0] == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["data"]["corpus"] == \
        str(work / "text.txt")
    monkeypatch.chdir(elsewhere)
    code, _, err = cli(capsys, "eval", tmp_path / "run")
    assert code == 0, err


def test_compare_refuses_lengths_without_the_training_length(tmp_path, capsys):
    code, _, err = cli(capsys, "compare", "--run-dir", tmp_path / "run", "eval.length_multipliers=[2,4]")
    assert code == 2 and "eval.length_multipliers=[2, 4] is not allowed: a list holding 1" in one_line(err)
    assert not (tmp_path / "run").exists()
