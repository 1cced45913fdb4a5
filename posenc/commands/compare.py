"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

from posenc.errors import RunFailed
from posenc.experiments import report_writer
from posenc.experiments.compare.config import RULE, CompareConfig
from posenc.experiments.compare.report import report as compare_report
from posenc.experiments.compare.results import DIVERGED, failed, save_units
from posenc.experiments.compare.run import compare, preflight_all
from posenc.experiments.config import loader as config_loader
from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import new_run_dir, removed_if_unused
from posenc.experiments.runs.rule import open_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(CompareConfig)
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides, e.g. compare.schemes=[rope,alibi] trainer.max_steps=2000")
    parser.add_argument("--config", help="YAML preset, e.g. configs/compare.yaml (default: built-in defaults)")
    parser.add_argument("--run-dir", help="resume this compare run with the same settings: finished models are "
                                          "loaded and evaluated again, unfinished ones continue from their "
                                          "checkpoints (or start one in this folder)")


def main(args: argparse.Namespace) -> int:
    cfg = config_loader.load(CompareConfig, args.config, args.overrides)
    corpus = preflight_all(cfg)  # every scheme's model sized against memory and the text before any training
    created = not args.run_dir or not Path(args.run_dir).exists()
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(cfg.out_dir, "compare")
    # A folder made here goes again if the run fails before a checkpoint is in it (never one it found:
    # that may be another process's live run). run.json's wall time is written before each unit's results,
    # so the time of every saved unit survives a kill.
    with removed_if_unused(run_dir, manifest.holds_results) if created else contextlib.nullcontext(), \
            open_run(run_dir, RULE, cfg.to_dict(), corpus) as run:
        units = compare(cfg, run_dir, on_unit=lambda done: (run.tick(force=True), save_units(run_dir, done)))
        files = report_writer.write(run_dir, compare_report(units, cfg, run.wall_seconds))
    print(f"run folder: {run_dir}\nreport:     {files[-1]}")
    if failed(units):
        raise RunFailed(f"{', '.join(failed(units))} diverged (reported as '{DIVERGED}', with no numbers); "
                        f"the other models' results are in {run_dir}")
    return 0
