"""`posenc finetune` end to end on a tiny model: every output file, the run folder's rule, and a resume
that redoes only the missing steps and replays them exactly."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.experiments.cli_helpers import cli, one_line

TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "data.seq_len=40", "pretrain.max_steps=3",
        "pretrain.batch_size=4", "pretrain.warmup_steps=1", "trainer.batch_size=2", "trainer.warmup_steps=1",
        "finetune.schedule=[0,1,3]", "finetune.seeds=[0,1]", "finetune.jobs=1", "finetune.progress=false",
        "passkey.length_multipliers=[1,2,4]", "passkey.trials=2", "perplexity.length_multipliers=[1,2]",
        "perplexity.max_windows=1"]
OUTPUTS = ("run.json", "results.json", "tables.md", "report.html", "range_by_step.csv", "steps_to_target.csv",
           "claims.csv", "passkey_by_length.csv", "ppl_by_length.csv", "records.csv", "range_vs_steps.png",
           "accuracy_by_length.png", "ppl_by_length.png")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run = tmp_path_factory.mktemp("finetune") / "run"
    from posenc.cli import main  # module-scoped: one run shared by the tests below (capsys is per test)

    assert main(["finetune", "--run-dir", str(run), *TINY]) == 0
    return run


def units_of(run) -> dict[tuple[str, int], list[dict]]:
    results = json.loads((run / "results.json").read_text())
    return {(u["method"], u["seed"]): u["records"] for u in results["units"]}


def test_a_run_writes_every_output_with_a_record_per_method_seed_and_step(finished):
    assert [name for name in OUTPUTS if not (finished / name).is_file()] == []
    results = json.loads((finished / "results.json").read_text())
    assert results["complete"] and json.loads((finished / "run.json").read_text())["command"] == "finetune"
    units = units_of(finished)
    assert set(units) == {(m, s) for m in ("none", "linear", "yarn") for s in (0, 1)}
    for records in units.values():
        assert [r["step"] for r in records] == [0, 1, 3]
        assert all(set(r["passkey"]) == {"40", "80", "160"} and 0 <= r["range"] <= 160 for r in records)
    assert [c["verdict"] in ("held", "failed", "inconclusive") for c in results["claims"]] == [True, True]
    page = (finished / "report.html").read_text()
    assert "PI reaches the target" in page and "YaRN needs fewer steps than PI" in page and "on every seed" in page
    # step 0 of every method is the same base: the same weights under three scalings, not three trainings
    assert units[("none", 0)][0]["ppl"]["40"] != units[("linear", 0)][0]["ppl"]["40"]


def test_a_resume_redoes_only_what_is_missing_and_replays_it_exactly(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    before = units_of(finished)
    unit = run / "seed-1" / "yarn"
    shutil.rmtree(unit / "checkpoints")  # killed after measuring step 0: no checkpoint, one record
    records = json.loads((unit / "records.json").read_text())
    (unit / "records.json").write_text(json.dumps([records[0] | {"train_loss": 12345.0}]))  # a mark
    base = run / "seed-0" / "base" / "checkpoints"
    base_files = {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()}
    (run / "results.json").unlink()
    code, out, _ = cli(capsys, "finetune", "--run-dir", run)  # a bare resume takes the run's own settings
    assert code == 0 and f"run folder: {run}" in out
    after = units_of(run)
    assert after[("yarn", 1)][0]["train_loss"] == 12345.0  # step 0 was not measured again
    assert after[("yarn", 1)][1:] == before[("yarn", 1)][1:]  # steps 1 and 3 replayed exactly
    assert all(after[key] == before[key] for key in before if key != ("yarn", 1))
    assert {p: p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()} == base_files  # no base retrained


def test_a_resume_with_other_settings_is_refused_naming_the_key(finished, capsys):
    code, _, err = cli(capsys, "finetune", "--run-dir", finished, *TINY, "finetune.range_threshold=0.5")
    assert code == 2 and "finetune.range_threshold: 0.8 -> 0.5" in one_line(err)


def test_a_posenc_train_run_is_a_base_and_no_base_is_trained_here(tmp_path, capsys):
    from posenc.experiments.config.training_run import load_config
    from posenc.experiments.training.language_model import train

    base = tmp_path / "base"
    train(load_config(None, ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "data.seq_len=40",
                             "trainer.batch_size=2", "trainer.max_steps=2", "trainer.warmup_steps=1",
                             "trainer.eval_batches=1", "trainer.progress=false"]), base)
    options = [o for o in TINY if not o.startswith(("model.", "pretrain."))]
    code, _, _ = cli(capsys, "finetune", "--run-dir", tmp_path / "run", f"finetune.base={base}", *options,
                     "finetune.methods=[none,linear]", "finetune.seeds=[0]")
    assert code == 0
    assert not (tmp_path / "run" / "seed-0" / "base").exists()
    assert set(units_of(tmp_path / "run")) == {("none", 0), ("linear", 0)}
    code, _, err = cli(capsys, "finetune", "--run-dir", tmp_path / "run2", f"finetune.base={base}",
                       "model.position_embedding_type=xpos")
    assert code == 2 and "a run of model.position_embedding_type=xpos" in one_line(err)


def test_posenc_report_renders_a_finetune_run_again_from_its_files(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    claims = (run / "claims.csv").read_text()
    for name in ("tables.md", "report.html", "claims.csv", "range_vs_steps.png"):
        (run / name).unlink()
    code, out, _ = cli(capsys, "report", run)
    assert code == 0 and "report.html" in out
    assert (run / "claims.csv").read_text() == claims
    assert all((run / name).is_file() for name in ("tables.md", "report.html", "range_vs_steps.png"))


def test_a_diverged_unit_is_kept_named_and_never_a_success(finished, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    unit = run / "seed-0" / "linear"
    (unit / "unit.json").write_text(json.dumps({"status": "diverged", "error": "training diverged at step 2"}))
    code, _, err = cli(capsys, "finetune", "--run-dir", run)
    assert code == 1 and "linear seed 0 diverged" in one_line(err)
    results = json.loads((run / "results.json").read_text())
    assert results["diverged"] == ["linear seed 0"]
    steps = (run / "steps_to_target.csv").read_text().splitlines()
    assert any(row.startswith("linear,diverged") for row in steps)


def test_posenc_report_on_a_stopped_run_marks_the_units_not_run_and_never_complete(finished, tmp_path, capsys):
    """Issue 36: a folder stopped before its second method read 'not by 3' for it, the claims said 'not in
    finetune.methods, or diverged', and results.json was rewritten with complete: true."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    results = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps(results | {
        "units": [u for u in results["units"] if u["method"] == "none"], "complete": False}))
    code, _, _ = cli(capsys, "report", run)
    assert code == 0
    after = json.loads((run / "results.json").read_text())
    assert after["complete"] is False
    steps = (run / "steps_to_target.csv").read_text().splitlines()
    assert any(row.startswith("linear,not run,not run,0/2") for row in steps)
    assert all("not run" in c["evidence"] and "not in finetune.methods" not in c["evidence"] for c in after["claims"])
    assert "Stopped before the end: 2 of 6 units finished" in (run / "tables.md").read_text()


def test_an_interrupted_run_writes_the_report_of_what_finished_marked_incomplete(finished, tmp_path, capsys,
                                                                                   monkeypatch):
    """The same hook as compare, ladder and tasks (runs.lifecycle's on_stop): before it, a stopped finetune left
    results.json's finished units and a report of the previous session."""
    from posenc.errors import Interrupted
    from posenc.experiments.finetune import run as study

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    results = json.loads((run / "results.json").read_text())
    (run / "tables.md").unlink()

    def stopped(cfg, run_dir, opened, bases):  # one unit finished (results.json rewritten), then Ctrl-C
        (run_dir / "results.json").write_text(json.dumps(results | {"units": results["units"][:1], "complete": False}))
        raise Interrupted("stopped by Ctrl-C", signum=2)

    monkeypatch.setattr(study, "_finetune", stopped)
    code, _, _ = cli(capsys, "finetune", "--run-dir", run)
    assert code == 130
    assert json.loads((run / "results.json").read_text())["complete"] is False
    assert "Stopped before the end: 1 of 6 units finished" in (run / "tables.md").read_text()


def test_a_hand_edited_results_json_is_one_line_and_nothing_is_rewritten(finished, tmp_path, capsys):
    """Issue 36: '"range": "zero"' in results.json gave a TypeError from `posenc report`."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    results = json.loads((run / "results.json").read_text())
    results["units"][1]["records"][2]["range"] = "zero"
    (run / "results.json").write_text(json.dumps(results))
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    code, _, err = cli(capsys, "report", run)
    assert code == 2 and "units[1].records[2].range='zero'" in one_line(err) and "whole number" in one_line(err)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before


@pytest.mark.parametrize(("edit", "named"), [
    (lambda r: r[1]["passkey"].update({"40": "abc"}), "[1].passkey[40]='abc'"),
    (lambda r: r[0].update({"range": -3}), "[0].range=-3"),
    (lambda r: r[2]["ppl"].update({"80": "abc"}), "[2].ppl[80]='abc'"),
])
def test_a_hand_edited_records_json_is_refused_before_any_unit_runs(finished, tmp_path, capsys, edit, named):
    """Issue 36: a records.json holding "abc" was accepted into the results."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    path = run / "seed-1" / "linear" / "records.json"
    records = json.loads(path.read_text())
    edit(records)
    path.write_text(json.dumps(records))
    (run / "results.json").write_text("{}")  # would be rewritten by the first unit that ran
    code, _, err = cli(capsys, "finetune", "--run-dir", run)
    assert code == 2 and f"records.json {named}" in one_line(err)
    assert (run / "results.json").read_text() == "{}"
