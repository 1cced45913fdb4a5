"""The main job on a micro setting: units per scheme and seed, the numbers of the leaderboard derived
from them (means, spreads, ratios, ranks, convergence), the claims table, and the files."""

from __future__ import annotations

import json
import statistics

import pytest

from posenc.cli import main

MICRO = ["trainer.max_steps=6", "trainer.eval_interval=3", "trainer.progress=false", "compare.progress=false",
         "model.n_layer=1", "model.d_model=32", "model.n_head=2", "model.max_seq_len=64", "data.seq_len=16",
         "eval.max_windows=2", "eval.shift_offsets=[0,10,100]"]


def run(tmp_path, *extra: str) -> tuple:
    code = main(["compare", *MICRO, *extra, f"out_dir={tmp_path}"])
    assert code == 0
    run_dir = next(p for p in tmp_path.iterdir() if p.name.startswith("compare-"))
    return run_dir, json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    return run(tmp, "compare.schemes=[alibi,learned_absolute]", "compare.seeds=[0,1]", "compare.jobs=2")


def test_every_file_is_written_and_the_page_holds_the_numbers(micro):
    run_dir, results = micro
    for name in ("results.json", "leaderboard.csv", "claims.csv", "units.csv", "ppl_vs_length.png",
                 "ratio_vs_length.png", "shift_test.png", "report.html", "run.json", "report.md"):
        assert (run_dir / name).stat().st_size > 0, name
    html = (run_dir / "report.html").read_text()
    alibi = next(r for r in results["leaderboard"] if r["scheme"] == "alibi")
    assert "data:image/png;base64," in html and alibi["ppl@1x"] in html and "What this run shows" in html


def test_the_leaderboard_is_the_mean_and_spread_of_the_units(micro):
    _, results = micro
    units = results["units"]
    assert sorted((u["scheme"], u["seed"]) for u in units) == [("alibi", 0), ("alibi", 1),
                                                              ("learned_absolute", 0), ("learned_absolute", 1)]
    alibi = [u for u in units if u["scheme"] == "alibi"]
    row = next(r for r in results["leaderboard"] if r["scheme"] == "alibi")
    for m in ("1", "2", "4", "8"):
        values = [u["ppl"][m] for u in alibi]
        assert row[f"ppl@{m}x mean"] == pytest.approx(statistics.fmean(values))
        assert row[f"ppl@{m}x std"] == pytest.approx(statistics.stdev(values))
        assert row[f"ppl@{m}x"] == f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"
    ratio = statistics.fmean(u["ppl"]["8"] / u["ppl"]["1"] for u in alibi)
    assert row["8x/1x"].startswith(f"{ratio:.2f}")
    assert all(abs(u["shift_loss_change"]["100"]) < 1e-4 for u in alibi)  # shift-invariant: no change


def test_a_scheme_past_its_table_is_labelled_and_not_ranked_on_that_length(micro):
    _, results = micro
    learned = next(r for r in results["leaderboard"] if r["scheme"] == "learned_absolute")
    assert learned["ppl@8x"] == "longer than the model's table"  # 128 > max_seq_len 64
    assert learned["rank"] in ("not converged", "n/a")  # no ppl@8x: nothing to rank it by
    units = [u for u in results["units"] if u["scheme"] == "learned_absolute"]
    assert all(abs(u["shift_loss_change"]["10"]) > 1e-4 for u in units)


def test_convergence_and_claims_follow_from_the_numbers(micro):
    _, results = micro
    means = {r["scheme"]: r["ppl@1x mean"] for r in results["leaderboard"]}
    best = min(means.values())
    assert results["best_ppl@1x"] == pytest.approx(best)
    assert set(results["converged"]) == {s for s, m in means.items() if m <= 1.10 * best}
    verdicts = {c["claim"]: c for c in results["claims"]}
    assert all(c["verdict"] in ("held", "failed", "inconclusive") and c["rule"] for c in verdicts.values())
    assert "not in this run" in verdicts["RoPE degrades past the training length"]["evidence"]


def test_one_process_gives_the_numbers_of_two(micro, tmp_path):
    _, parallel = micro
    _, serial = run(tmp_path, "compare.schemes=[alibi]", "compare.seeds=[1]", "compare.jobs=1")
    one = next(u for u in parallel["units"] if (u["scheme"], u["seed"]) == ("alibi", 1))
    assert serial["units"][0]["ppl"] == one["ppl"]


def test_the_task_runs_when_asked_with_its_own_model(tmp_path):
    _, results = run(tmp_path, "compare.schemes=[alibi]", "compare.seeds=[0]", "task.name=copy", "task.max_steps=3")
    accuracy = results["units"][0]["task_accuracy"]
    assert set(accuracy) == {str(n) for n in range(1, 33)} and all(0.0 <= a <= 1.0 for a in accuracy.values())


def test_compare_rejects_unknown_scheme_and_a_seed_override_before_training(tmp_path, capsys):
    assert main(["compare", "compare.schemes=[rope,alibbi]", f"out_dir={tmp_path}"]) == 2
    assert "did you mean 'alibi'" in capsys.readouterr().err
    assert main(["compare", "trainer.seed=3", f"out_dir={tmp_path}"]) == 2
    assert "compare.seeds" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_report_re_renders_from_saved_files(micro, capsys):
    run_dir, results = micro
    (run_dir / "report.html").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert next(r for r in results["leaderboard"] if r["scheme"] == "alibi")["ppl@1x"] in \
        (run_dir / "report.html").read_text()
    assert main(["report", str(run_dir.parent)]) == 2  # not a compare folder: one-line error


def test_a_resumed_compare_evaluates_the_trained_models_again_without_training(tmp_path, capsys):
    """--run-dir on a finished run: every model is loaded from its checkpoint (no step is trained) and
    evaluated again, to the same numbers. Other eval.* settings are refused, with the run's results left as
    they were (issue 24, item 3: a resume never replaces what a run holds); so are settings that change a model."""
    first = run(tmp_path, "compare.schemes=[alibi]", "compare.seeds=[0]", "compare.jobs=1")[0]
    unit = first / "alibi" / "seed-0"
    checkpoints = sorted(p.name for p in (unit / "checkpoints").iterdir())
    history = json.loads((unit / "train.json").read_text())["history"]
    before = json.loads((first / "results.json").read_text())
    code = main(["compare", *MICRO, "compare.schemes=[alibi]", "compare.seeds=[0]", "compare.jobs=1",
                 f"out_dir={tmp_path}", "--run-dir", str(first)])
    assert code == 0
    again = json.loads((first / "results.json").read_text())
    assert again["units"][0]["ppl"] == before["units"][0]["ppl"]  # evaluated again, the same numbers
    assert sorted(p.name for p in (unit / "checkpoints").iterdir()) == checkpoints
    assert json.loads((unit / "train.json").read_text())["history"] == history
    capsys.readouterr()
    files = {p.name: p.read_bytes() for p in first.iterdir() if p.is_file() and p.name != "run.json"}
    code = main(["compare", *MICRO, "compare.schemes=[alibi]", "compare.seeds=[0]", "compare.jobs=1",
                 "eval.length_multipliers=[1,2]", f"out_dir={tmp_path}", "--run-dir", str(first)])
    err = capsys.readouterr().err
    assert code == 2 and "eval.length_multipliers" in err and "posenc eval" in err
    assert {p.name: p.read_bytes() for p in first.iterdir() if p.is_file() and p.name != "run.json"} == files
    code = main(["compare", *MICRO, "compare.schemes=[alibi]", "compare.seeds=[0]", "trainer.lr=0.5",
                 f"out_dir={tmp_path}", "--run-dir", str(first)])
    assert code == 2 and "trainer.lr: 0.003 -> 0.5" in capsys.readouterr().err
