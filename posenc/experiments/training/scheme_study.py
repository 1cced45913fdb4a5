"""What the scheme x seed studies (`posenc compare`, `posenc ladder`) share around their units
(training/scheme_units.py): the units run in parallel under one progress bar, saved as each finishes and ended by
the study's report, inside the run folder the study opens (runs.lifecycle.run_folder); a stopped run leaves the
report of the units that finished."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from posenc.experiments import report_writer
from posenc.experiments.runs.units import report_saved, save_units
from posenc.experiments.training.parallel import default_workers, run_units


def run_with_bar(function: Callable[[Any], dict[str, Any]], jobs: Sequence[Any], cfg: Any, desc: str,
                 describe: Callable[[dict[str, Any]], str], on_unit=None) -> list[dict[str, Any]]:
    """[function(job) for job in jobs] on cfg.compare.jobs processes (0: every core), a bar of units whose label
    is describe(unit); on_unit(units so far) after each one finishes, so partial results survive an interruption.
    Returns the units in the jobs' order."""
    c = cfg.compare
    done: list[dict[str, Any]] = []
    bar = tqdm(total=len(jobs), desc=desc, unit="model", disable=not (c.progress and cfg.trainer.progress))

    def one_done(job: Any, unit: dict[str, Any]) -> None:
        done.append(unit)
        bar.set_postfix_str(f"{describe(unit)}: {unit['status']}")
        bar.update()
        if on_unit is not None:
            on_unit(done)

    try:
        return run_units(function, jobs, c.jobs or default_workers(), one_done)
    finally:
        bar.close()


def on_stop(cfg: Any, report: Callable, sizes: tuple[str, ...] | None = None) -> Callable:
    """runs.lifecycle.run_folder's on_stop for a study: the report of the units saved so far, marked incomplete
    (sizes: the ladder's, which its saved units are checked against)."""
    return lambda opened: report_saved(opened.path, cfg, report, opened.wall_seconds, sizes)


def units_reported(opened: Any, cfg: Any, report: Callable, units_of: Callable[..., list[dict[str, Any]]]
                   ) -> tuple[list[dict[str, Any]], list]:
    """Inside the study's open run folder: its units (units_of(cfg, folder, on_unit=...)), saved as each finishes,
    then report(units, cfg, wall seconds) written. Returns the units and the report's files."""
    # run.json's wall time is written before each unit's results, so the time of every saved unit survives a kill.
    units = units_of(cfg, opened.path, on_unit=lambda done: (opened.tick(force=True), save_units(opened.path, done)))
    return units, report_writer.write(opened.path, report(units, cfg, opened.wall_seconds))


__all__ = ["on_stop", "run_with_bar", "units_reported"]
