"""`posenc bench`: the benchmark harness (benchmarks/run.py of the source checkout posenc runs from)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import posenc
from posenc.errors import bad_value

PASSES_ARGUMENTS_ON = True  # the cli hands every argument after `bench` to the harness untouched


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed to `python -m benchmarks.run` (--quick, ...)")


def checkout() -> Path | None:
    """The source checkout holding posenc, when benchmarks/ sits beside it (an editable install, `make env`).
    Found from the package, not the current folder, so the command works from anywhere."""
    root = Path(posenc.__file__).resolve().parent.parent
    return root if (root / "benchmarks" / "run.py").is_file() else None


def main(args: argparse.Namespace) -> int:
    root = checkout()
    if root is None:
        why = "benchmarks/ is not in the installed package: clone the repository, `make env`, then `posenc bench`"
        if any(arg in ("-h", "--help") for arg in args.args):
            print(f"posenc bench: the CPU and GPU benchmarks (BENCHMARKS.md). {why}.")
            return 0
        raise bad_value("posenc bench", "this installation", f"a source checkout: {why}")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from benchmarks.run import main as run

    return run(args.args)
