"""`posenc ladder`: compare's units (scheme x seed: training/scheme_units.py) at every model size of
`ladder.sizes`, trained by the same recipe, in one pool of processes (largest models first, so the short ones
fill the end). Each rung is a compare run in `RUN_DIR/size-LxD/`; a unit records its size, parameter count,
held-out perplexity per length and its perplexity on the training text (the memorising check)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from posenc.experiments import report_writer
from posenc.experiments.ladder.config import RULE, LadderConfig
from posenc.experiments.runs.lifecycle import run_folder
from posenc.experiments.runs.units import finished, report_saved, save_units
from posenc.experiments.training.parallel import default_workers, run_units
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
    todo, done = jobs(cfg, run_dir), []
    bar = tqdm(total=len(todo), desc="ladder", unit="model",
               disable=not (cfg.compare.progress and cfg.trainer.progress))

    def finished(job: tuple, unit: dict[str, Any]) -> None:
        done.append(unit)
        bar.set_postfix_str(f"{unit['size']} {unit['scheme']} seed {unit['seed']}: {unit['status']}")
        bar.update()
        if on_unit is not None:
            on_unit(done)

    try:
        return run_units(run_rung_unit, todo, cfg.compare.jobs or default_workers(), finished)
    finally:
        bar.close()


def run(cfg: LadderConfig, run_dir: Path | None) -> int:
    """`posenc ladder`: every rung's units in one run folder, then the report; a stopped run leaves the report of
    the units that finished, marked incomplete (numbers over fewer seeds say so)."""
    from posenc.experiments.ladder.report import report

    corpus = preflight_ladder(cfg)  # every size's models checked before any training
    stopped = lambda opened: report_saved(opened.path, cfg, report, opened.wall_seconds, cfg.ladder.sizes)
    with run_folder(run_dir, cfg.out_dir, RULE, cfg.to_dict(), corpus, on_stop=stopped) as opened:
        units = ladder(cfg, opened.path, on_unit=lambda done: (opened.tick(force=True), save_units(opened.path, done)))
        files = report_writer.write(opened.path, report(units, cfg, opened.wall_seconds))
    return finished(units, opened.path, files)


__all__ = ["jobs", "ladder", "preflight_ladder", "run", "run_rung_unit"]
