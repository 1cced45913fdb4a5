"""`posenc bench`: the benchmark harness (benchmarks/run.py; run from the repository root)."""

from __future__ import annotations

import argparse

from posenc.errors import bad_value

PASSES_ARGUMENTS_ON = True  # the cli hands every argument after `bench` to the harness untouched


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to `python -m benchmarks.run` (--quick, ...)")


def main(args: argparse.Namespace) -> int:
    try:
        from benchmarks.run import main as run
    except ImportError:
        raise bad_value("cwd", "benchmarks", "the repository root, where benchmarks/ lives") from None
    return run(args.args)
