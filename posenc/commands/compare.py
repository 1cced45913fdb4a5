"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config import loader as config_loader


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
    from posenc.experiments.compare.run import run

    cfg = config_loader.load(CompareConfig, args.config, args.overrides)  # every bad option fails here
    return run(cfg, Path(args.run_dir) if args.run_dir else None)
