"""`posenc train`: one model from a YAML preset plus dotted overrides. `--run-dir` resumes a run
with the same settings; `--fork` continues one with other settings in a new folder. Under
`torchrun --nproc_per_node N` it trains with DDP (gloo on CPU)."""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.experiments.config.training_run import describe_options, load_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + describe_options()
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. model.position_embedding_type=alibi")
    parser.add_argument("--config", help="YAML preset, e.g. configs/train.yaml")
    parser.add_argument("--run-dir", help="resume this run (same settings), or start a new one in this folder "
                                          "(default: a new folder under out_dir)")
    parser.add_argument("--fork", action="store_true",
                        help="continue the --run-dir run from its newest checkpoint with these settings, in a new "
                             "folder under out_dir; the original run is left as it is")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.training.run import run

    cfg = load_config(args.config, args.overrides)  # every bad option fails here
    return run(cfg, Path(args.run_dir) if args.run_dir else None, fork=args.fork)
