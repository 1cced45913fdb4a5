"""`posenc eval RUN_DIR`: perplexity against length and the shift test for a trained run folder
(experiments/training/evaluate_run.py). The model, data and corpus come from the run; eval.* options default
to the run's own. Results go to eval.json, or eval-2.json, ... : never over earlier ones."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from posenc.experiments.config.loader import describe
    from posenc.experiments.training.evaluate_run import EvalOptions

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as eval.key=value; default: the run's own):\n" + describe(EvalOptions)
    parser.add_argument("run_dir", help="a folder written by `posenc train`")
    parser.add_argument("overrides", nargs="*", help="eval.* overrides, e.g. eval.mode=sliding")
    parser.add_argument("--config", help="YAML with an eval: section")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.training.evaluate_run import run

    return run(Path(args.run_dir), args.config, args.overrides)
