"""`posenc tasks` on the split tasks end to end: one row per split, the splits table, the CoPE claim with its
rule and a verdict, in the run folder and again from `posenc report`."""

from __future__ import annotations

import csv
import json

import pytest

from posenc.cli import main as cli_main
from posenc.data.tasks import TASKS
from posenc.experiments.tasks.claims import RULE

TINY = ["tasks", "leaderboard.schemes=[rope,cope]", "leaderboard.tasks=[counting,copy]", "leaderboard.seeds=[0,1]",
        "leaderboard.train_len=2", "trainer.max_steps=3", "leaderboard.samples=4", "model.n_layer=1",
        "model.d_model=16", "leaderboard.progress=false", "leaderboard.jobs=1"]


def test_split_tasks_run_end_to_end_with_the_claim_judged_by_its_printed_rule(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_main([*TINY, "--run-dir", str(out)]) == 0
    assert "CoPE solves counting" in capsys.readouterr().out  # the terminal shows the claims table
    result = json.loads((out / "results.json").read_text())
    counting = [r for r in result["rows"] if r["task"] == "counting"]
    splits = list(TASKS["counting"].splits)
    assert sorted((r["scheme"], r["seed"], r["split"]) for r in counting) == sorted(
        (s, seed, split) for s in ("rope", "cope") for seed in (0, 1) for split in splits)
    assert all(r["length"] == TASKS["counting"].size for r in counting)  # train_len=2 does not apply to it
    assert not any("split" in r for r in result["rows"] if r["task"] == "copy")
    board = (out / "leaderboard.md").read_text()
    assert "| task | scheme | in-dist | ood-dense | ood-sparse |" in board and "| counting | cope | " in board
    assert "| task | scheme | in-dist (1-2) |" in board and "counting: size 6;" in board
    # 3 steps learn nothing: CoPE has not learned the task, so the claim cannot be judged at this budget
    claims = [(c["claim"].split(" where")[0], c["verdict"]) for c in result["claims"]]
    assert claims == [("CoPE solves counting", "inconclusive"),
                      ("CoPE solves selective copy, counting and Flip-Flop", "inconclusive")]
    assert RULE in board and "not in this run: selective_copy, flip_flop" in board
    assert (out / "accuracy_copy.png").exists() and not (out / "accuracy_counting.png").exists()
    with open(out / "results.csv", newline="") as f:
        assert {r["split"] for r in csv.DictReader(f) if r["task"] == "counting"} == set(splits)
    first = board
    assert cli_main(["report", str(out)]) == 0
    assert (out / "leaderboard.md").read_text() == first  # rerendered from results.json: the same claims


@pytest.mark.parametrize("name", ["counting", "flip_flop", "selective_copy"])
def test_compare_refuses_a_split_task_naming_the_tasks_it_takes(name, tmp_path, capsys):
    assert cli_main(["compare", f"task.name={name}", f"out_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err
    assert f"task.name={name!r} is not allowed" in err and "copy, reverse, addition" in err
    assert not list(tmp_path.iterdir())
