"""`posenc compare`, the main job: train one tiny GPT per scheme and seed at a short length on the
built-in corpus, evaluate at 1x..8x that length plus the shift test (and, when asked, one algorithmic
task), and report means, spreads, convergence and the published claims the run can test
(report.py). Units (scheme, seed: training/scheme_units.py) run in parallel, one process per core. A unit
whose training diverges is reported as "diverged", never as numbers; the others go on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.experiments.compare.config import RULE, CompareConfig
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.units import finished
from posenc.experiments.training.scheme_study import on_stop, run_with_bar, units_reported
from posenc.experiments.training.scheme_units import preflight_all, run_unit


def compare(cfg: CompareConfig, run_dir: Path, on_unit=None) -> list[dict[str, Any]]:
    """Every (scheme, seed) unit, in parallel; on_unit(units so far) after each one finishes, so partial
    results survive an interruption. Returns the units in (scheme, seed) order."""
    c = cfg.compare
    jobs = [(cfg, scheme, seed, run_dir) for scheme in c.schemes for seed in c.seeds]
    return run_with_bar(run_unit, jobs, cfg, "compare", lambda unit: f"{unit['scheme']} seed {unit['seed']}", on_unit)


def run(cfg: CompareConfig, run_dir: Path | None) -> int:
    """`posenc compare`: the units in a run folder (a new one, or `run_dir` to continue), then the report; a
    stopped run leaves the report of the units that finished, marked incomplete."""
    from posenc.experiments.compare.report import report

    corpus = preflight_all(cfg)  # every scheme's model sized against memory and the text before any training
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), corpus, on_stop=on_stop(cfg, report)) as opened:
        units, files = units_reported(opened, cfg, report, compare)
    return finished(units, opened.path, files)


__all__ = ["compare", "run"]
