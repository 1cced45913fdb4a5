"""`posenc compare`: the main job (what `make demo` runs)."""

from __future__ import annotations

import argparse
import time

from posenc.experiments.compare import DEFAULT_SCHEMES, compare, write_report
from posenc.experiments.config import describe_options, load_config
from posenc.experiments.rundir import new_run_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = "options (set as section.key=value):\n" + describe_options()
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.max_steps=2000")
    parser.add_argument("--config", help="YAML preset, e.g. configs/compare.yaml (default: built-in defaults)")
    parser.add_argument("--schemes", default=",".join(DEFAULT_SCHEMES), help="comma-separated scheme names")


def main(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    run_dir = new_run_dir(cfg.out_dir, "compare")
    started = time.perf_counter()
    rows = compare(cfg, schemes, run_dir)
    html = write_report(rows, cfg, run_dir, time.perf_counter() - started)
    print(f"run folder: {run_dir}\nreport:     {html}")
    return 0

