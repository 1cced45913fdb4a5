"""`posenc ladder`: the verdict rule on constructed ratios, the per-size numbers on constructed units, the
errors of bad input, and a tiny run end to end."""

from __future__ import annotations

import json
import math
import re

import pytest

from posenc.experiments.config.loader import as_dict, load
from posenc.experiments.evaluation.statistics import Spread
from posenc.experiments.ladder.config import LadderConfig
from posenc.experiments.ladder.report import rung, verdict
from tests.experiments.cli_helpers import TINY, cli, one_line


def spread(*values: float) -> Spread:
    return Spread(tuple(values))


@pytest.mark.parametrize(("ratios", "expected"), [
    ([spread(1.30, 1.32, 1.28), spread(1.20, 1.21, 1.19), spread(1.10, 1.11, 1.09)], "held"),
    ([spread(1.30, 1.32, 1.28), spread(1.28, 1.31, 1.25), spread(1.10, 1.11, 1.09)], "inconclusive"),  # step 1: noise
    ([spread(1.20, 1.21, 1.19), spread(1.10, 1.11, 1.09), spread(1.25, 1.26, 1.24)], "failed"),  # back above the start
    ([spread(1.20, 1.21, 1.19), spread(1.21, 1.22, 1.20)], "failed"),
    ([spread(1.30, 1.31, 1.29), spread(1.20, math.nan, 1.21)], "inconclusive"),  # a seed without a number
    ([spread(1.0001), spread(1.0000)], "inconclusive"),  # one seed: no spread, so no fall can be told from noise
])
def test_the_verdict_follows_the_printed_rule(ratios, expected):
    assert verdict(ratios) == expected


def test_a_rung_pairs_seeds_and_measures_the_gap():
    cfg = load(LadderConfig, None, ["compare.schemes=[none,rope,alibi]", "compare.seeds=[0,1]"])

    def unit(scheme, seed, p1, p2=None, train=None):
        return {"size": "4x32", "scheme": scheme, "seed": seed, "status": "ok", "params": 100,
                "ppl": {1: p1, 2: p2 or p1}, "train_ppl@1x": train or p1}

    units = [unit("none", 0, 6.0, train=math.exp(1.5)), unit("none", 1, 5.0),
             unit("rope", 0, 4.0, p2=8.0), unit("rope", 1, 5.0, p2=6.0), unit("alibi", 0, 4.5), unit("alibi", 1, 4.6)]
    r = rung(units, cfg, "4x32")
    assert r["best"] == "rope"  # lowest mean among the others: 4.5 against 4.55
    assert r["ratio"].values == (1.5, 1.0)  # seed 0 to seed 0, seed 1 to seed 1
    assert r["extrapolation"].values == (2.0, 1.2)
    assert r["gap"].values[0] == pytest.approx(math.log(6.0) - 1.5) and r["gap"].values[1:] == (0.0,) * 5


@pytest.mark.parametrize(("override", "message"), [
    ("ladder.sizes=[4x32]", r"ladder.sizes=\['4x32'\] is not allowed: a list of at least two distinct model sizes"),
    ("ladder.sizes=[4x32,big]", r"ladder.sizes=.*n_layer x d_model"),
    ("ladder.sizes=[4x30,4x64]", r"ladder.sizes=.*widths divisible by model.n_head=4 \(4x30 is not\)"),
    ("ladder.subject=sinusoidal", r"ladder.subject='sinusoidal' .*one of compare.schemes"),
    ("eval.length_multipliers=[1,4]", r"eval.length_multipliers=\[1, 4\] .*holding 1 and 2"),
    ("model.d_model=256", r"model.d_model.*each of ladder.sizes"),
    # issue 36: [1x16,1x32] held and [1x32,1x16] failed on the same numbers: the verdict reads up the list
    ("ladder.sizes=[1x32,1x16]", r"ladder.sizes=\['1x32', '1x16'\] .*smallest first.*1x32: [\d,]+, 1x16: [\d,]+"),
    ("ladder.sizes=[2x16,1x16]", r"ladder.sizes=.*smallest first"),
    # equal counts are no step up (no two distinct n_layer x d_model here share a count; one size spelled twice does)
    ("ladder.sizes=[1x16,01x16]", r"ladder.sizes=\['1x16', '01x16'\] is not allowed: sizes smallest first, each "
                                  r"with more parameters .*1x16: ([\d,]+), 01x16: \1\)$"),
])
def test_bad_ladder_settings_name_the_field(override, message):
    with pytest.raises(ValueError) as caught:
        load(LadderConfig, None, [override])
    assert re.search(message, str(caught.value)), caught.value


def test_bad_input_stops_the_command_before_any_folder(tmp_path, capsys):
    code, _, err = cli(capsys, "ladder", "ladder.sizes=[4x32]", f"out_dir={tmp_path}")
    assert code == 2 and not list(tmp_path.iterdir()) and "ladder.sizes" in one_line(err)


def test_a_tiny_ladder_runs_every_size_and_prints_its_verdict(tmp_path, capsys):
    tiny = [o for o in TINY if not o.startswith(("model.n_layer", "model.d_model"))]  # the sizes say them
    code, out, _ = cli(capsys, "ladder", *tiny, "trainer.max_steps=2", "compare.seeds=[0]",
                       "compare.schemes=[none,rope]", "ladder.sizes=[1x8,2x16]", "compare.jobs=1",
                       "compare.progress=false", f"out_dir={tmp_path}")
    assert code == 0
    run = next(tmp_path.glob("ladder-*"))
    results = json.loads((run / "results.json").read_text())
    assert sorted((u["size"], u["scheme"], u["seed"]) for u in results["units"]) == sorted(
        (size, scheme, 0) for size in ("1x8", "2x16") for scheme in ("none", "rope"))
    assert [r["size"] for r in results["rungs"]] == ["1x8", "2x16"]
    assert results["rungs"][0]["params"] < results["rungs"][1]["params"]
    trained = {u["size"]: u["params"] for u in results["units"] if u["scheme"] == "none"}
    assert [r["params"] for r in results["rungs"]] == [trained["1x8"], trained["2x16"]]  # counted before training
    assert results["claim"]["verdict"] in ("held", "failed", "inconclusive") and "verdict" in out
    assert (run / "ladder.png").stat().st_size > 0 and (run / "size-1x8" / "rope" / "seed-0").is_dir()
    assert results["claim"]["verdict"] == "inconclusive"  # one seed per rung: no spread to judge a fall by
    before = (run / "report.md").read_text()
    (run / "report.md").unlink()
    code, out, _ = cli(capsys, "report", str(run))  # `posenc report` re-renders a ladder folder too
    def timeless(text: str) -> str:  # run.json's wall time is final; the first report was written before it
        return re.sub(r"Wall time \d+ s", "Wall time", text)

    assert code == 0 and timeless((run / "report.md").read_text()) == timeless(before)


def test_a_stopped_ladder_is_reported_as_incomplete_never_as_a_mean_over_seeds():
    """Issue 36: a stopped ladder showed one seed's number under 'mean ± std over seeds', marked nothing
    incomplete, and had params nan where the subject's unit had not run."""
    from posenc.experiments.ladder.report import report

    cfg = load(LadderConfig, None, ["compare.schemes=[none,rope]", "compare.seeds=[0,1]", "ladder.sizes=[1x16,1x32]"])

    def unit(size, scheme, seed, p1):
        return {"size": size, "scheme": scheme, "seed": seed, "status": "ok", "params": 1, "ppl": {1: p1, 2: p1}}

    units = [unit("1x16", "none", 0, 6.0), unit("1x16", "none", 1, 5.0), unit("1x16", "rope", 0, 4.0),
             unit("1x16", "rope", 1, 5.0), unit("1x32", "rope", 0, 3.0)]  # stopped: three 1x32 models not run
    made = report(units, cfg, 1.0)
    ladder_rows = {r["size"]: r for r in next(t for t in made.tables if t.name == "ladder").rows}
    scheme_rows = {r["size"]: r for r in next(t for t in made.tables if t.name == "schemes").rows}
    assert scheme_rows["1x32"]["rope"] == "3.000 (1 of 2 seeds)" and scheme_rows["1x16"]["rope"] == "4.500 ± 0.707"
    assert scheme_rows["1x32"]["none"] == "n/a"
    assert [ladder_rows[s]["params"] for s in ("1x16", "1x32")] == [cfg.params_at("1x16"), cfg.params_at("1x32")]
    assert made.results["complete"] is False and len(made.results["not_run"]) == 3
    assert "Stopped before the end: 5 of 8 models finished" in made.intro
    assert made.results["claim"]["verdict"] == "inconclusive"


def test_an_interrupted_ladder_writes_the_report_of_what_finished_marked_incomplete(tmp_path, capsys, monkeypatch):
    from posenc.errors import Interrupted
    from posenc.experiments.ladder import run as study

    def stopped(cfg, run_dir, on_unit):
        on_unit([{"size": "1x8", "scheme": "none", "seed": 0, "status": "ok", "params": 1, "ppl": {1: 5.0, 2: 6.0}}])
        raise Interrupted("stopped by Ctrl-C", signum=2)

    monkeypatch.setattr(study, "ladder", stopped)
    tiny = [o for o in TINY if not o.startswith(("model.n_layer", "model.d_model"))]
    run = tmp_path / "run"
    code, _, _ = cli(capsys, "ladder", *tiny, "compare.seeds=[0]", "compare.schemes=[none,rope]",
                     "ladder.sizes=[1x8,2x16]", "--run-dir", run)
    assert code == 130
    results = json.loads((run / "results.json").read_text())
    assert results["complete"] is False and len(results["units"]) == 1
    assert "Stopped before the end: 1 of 4 models finished" in (run / "report.md").read_text()


def _saved_ladder(tmp_path, edit):
    """A ladder folder's results.json of two sizes x two schemes x one seed, hand-edited by `edit`."""
    units = [{"size": size, "scheme": scheme, "seed": 0, "status": "ok", "params": 1, "ppl": {"1": 5.0, "2": 6.0}}
             for size in ("1x16", "1x32") for scheme in ("none", "rope")]
    edit(units)
    (tmp_path / "results.json").write_text(json.dumps({"units": units}))
    config = load(LadderConfig, None, ["compare.schemes=[none,rope]", "compare.seeds=[0]", "ladder.sizes=[1x16,1x32]"])
    return {"command": "ladder", "config": as_dict(config)}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda u: u[0].update(size="9x99"), r"^results units\[0\]\.size='9x99' is not allowed: one of ladder\.sizes"),
    (lambda u: u[1].update(scheme="alibi"), r"^results units\[1\]='alibi seed 0' is not allowed: a unit of this run"),
    (lambda u: u[2]["ppl"].update({"1": -5.0}), r"^results units\[2\]=.*ppl values above 0 .*not -5\.0"),
])
def test_a_hand_edited_ladder_unit_is_one_line_and_nothing_is_rewritten(tmp_path, edit, message):
    """Each of these was dropped without a word (another size, a scheme the run did not ask for) or rendered as a
    negative ratio, and results.json rewritten."""
    from posenc.errors import ConfigError
    from posenc.experiments.ladder.report import rerender

    stored = _saved_ladder(tmp_path, edit)
    before = (tmp_path / "results.json").read_text()
    with pytest.raises(ConfigError, match=message) as err:
        rerender(tmp_path, stored)
    assert "\n" not in str(err.value) and (tmp_path / "results.json").read_text() == before
    assert not (tmp_path / "report.md").exists()
