"""`posenc ladder`: compare's schemes x seeds at several model sizes, and the verdict on whether NoPE's gap
to the best at the training length shrinks with size (configs/ladder.yaml; results in RESULTS.md)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from posenc.errors import RunFailed
from posenc.experiments import report_writer
from posenc.experiments.compare.ladder import ladder, preflight_ladder
from posenc.experiments.compare.ladder_config import RULE, LadderConfig
from posenc.experiments.compare.ladder_report import report as ladder_report
from posenc.experiments.compare.results import DIVERGED, RESULTS, failed, load_units, save_units
from posenc.experiments.config import loader as config_loader
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import new_run_dir, removed_if_unused
from posenc.experiments.runs.rule import open_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(LadderConfig)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. 'ladder.sizes=[2x64,4x128,6x192]'")
    parser.add_argument("--config", help="YAML preset, e.g. configs/ladder.yaml (default: built-in defaults)")
    parser.add_argument("--run-dir", help="resume this ladder run with the same settings")


def main(args: argparse.Namespace) -> int:
    cfg = config_loader.load(LadderConfig, args.config, args.overrides)
    corpus = preflight_ladder(cfg)  # every size's models checked before any training
    created = not args.run_dir or not Path(args.run_dir).exists()
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(cfg.out_dir, "ladder")
    with removed_if_unused(run_dir, manifest.holds_results) if created else contextlib.nullcontext(), \
            open_run(run_dir, RULE, cfg.to_dict(), corpus) as run:
        try:
            units = ladder(cfg, run_dir, on_unit=lambda done: (run.tick(force=True), save_units(run_dir, done)))
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the report of the models that finished, marked incomplete
            if (run_dir / RESULTS).is_file():
                report_writer.write(run_dir, ladder_report(load_units(run_dir), cfg, run.wall_seconds), echo=False)
            raise
        files = report_writer.write(run_dir, ladder_report(units, cfg, run.wall_seconds))
    print(f"run folder: {run_dir}\nreport:     {files[-1]}")
    if failed(units):
        raise RunFailed(f"{', '.join(failed(units))} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {run_dir}")
    return 0
