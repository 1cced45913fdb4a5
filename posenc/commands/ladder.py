"""`posenc ladder`: compare's schemes x seeds at several model sizes, and the verdict on whether NoPE's gap
to the best at the training length shrinks with size (configs/ladder.yaml; results in RESULTS.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.experiments.config import loader as config_loader
from posenc.experiments.ladder.config import LadderConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + config_loader.describe(LadderConfig)
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. 'ladder.sizes=[2x64,4x128,6x192]'")
    parser.add_argument("--config", help="YAML preset, e.g. configs/ladder.yaml (default: built-in defaults)")
    parser.add_argument("--run-dir", help="resume this ladder run with the same settings")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.ladder.run import run

    cfg = config_loader.load(LadderConfig, args.config, args.overrides)  # every bad option fails here
    return run(cfg, Path(args.run_dir) if args.run_dir else None)
