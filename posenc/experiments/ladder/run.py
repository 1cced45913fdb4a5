"""`posenc ladder`: compare's units (scheme x seed: training/scheme_units.py) at every model size of
`ladder.sizes`, trained by the same recipe, in one pool of processes (largest models first, so the short ones
fill the end). Each rung is a compare run in `RUN_DIR/size-LxD/`; a unit records its size, parameter count,
held-out perplexity per length and its perplexity on the training text (the memorising check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from posenc.experiments.ladder.config import RULE, LadderConfig
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.units import finished
from posenc.experiments.training.scheme_study import on_stop, run_with_bar, units_reported
from posenc.experiments.training.scheme_units import preflight_all, run_unit


def preflight_ladder(cfg: LadderConfig) -> dict[str, str]:
    """Every rung's models sized against memory and the text before any training; the corpus record."""
    corpus = {}
    for size in cfg.ladder.sizes:
        corpus = preflight_all(cfg.at_size(size))
    return corpus


def run_rung_unit(job: tuple[str, tuple]) -> dict[str, Any]:
    size, unit_job = job
    return {"size": size} | run_unit(unit_job)


def jobs(cfg: LadderConfig, run_dir: Path) -> list[tuple[str, tuple]]:
    c = cfg.compare
    return [(size, (cfg.at_size(size), scheme, seed, run_dir / f"size-{size}"))
            for size in reversed(cfg.ladder.sizes) for scheme in c.schemes for seed in c.seeds]


def ladder(cfg: LadderConfig, run_dir: Path, on_unit=None) -> list[dict[str, Any]]:
    """Every (size, scheme, seed) unit; on_unit(units so far) after each finishes."""
    describe = lambda unit: f"{unit['size']} {unit['scheme']} seed {unit['seed']}"
    return run_with_bar(run_rung_unit, jobs(cfg, run_dir), cfg, "ladder", describe, on_unit)


def run(cfg: LadderConfig, run_dir: Path | None) -> int:
    """`posenc ladder`: every rung's units in one run folder, then the report; a stopped run leaves the report of
    the units that finished, marked incomplete (numbers over fewer seeds say so)."""
    from posenc.experiments.ladder.report import report

    corpus = preflight_ladder(cfg)  # every size's models checked before any training
    stopped = on_stop(cfg, report, cfg.ladder.sizes)  # the saved units checked against the ladder's sizes
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), corpus, on_stop=stopped) as opened:
        units, files = units_reported(opened, cfg, report, ladder)
    return finished(units, opened.path, files)


__all__ = ["jobs", "ladder", "preflight_ladder", "run", "run_rung_unit"]
