"""`posenc report RUN_DIR`: re-render a run's tables, plots, Markdown and HTML from its saved files
(e.g. after an interrupted run, or to restyle), without retraining. Any study whose report module
has `rerender(run_dir, stored)` can be re-rendered (compare, ladder, tasks, extend and finetune today)."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from posenc.errors import bad_value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a folder written by `posenc compare`, `posenc ladder`, `posenc tasks`, "
                                                "`posenc extend` or `posenc finetune`")


# Studies whose report module is not experiments/<command>/report.py (the ladder is compare's units at several sizes)
REPORT_MODULES = {"ladder": "posenc.experiments.compare.ladder_report"}


def _rerender(command: object):
    """The study's rerender function, found by the layout (experiments/<command>/report.py), or None."""
    if not isinstance(command, str) or not command.isidentifier():  # a hand-edited run.json
        return None
    try:
        module = importlib.import_module(REPORT_MODULES.get(command, f"posenc.experiments.{command}.report"))
    except ImportError:
        return None
    return getattr(module, "rerender", None)


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.runs import manifest
    from posenc.experiments.runs.files import check_writable
    from posenc.experiments.runs.lock import locked

    run_dir = Path(args.run_dir)
    stored = manifest.read(run_dir) if run_dir.is_dir() else None
    rerender = _rerender(stored["command"]) if stored is not None else None
    if rerender is None or not (run_dir / "results.json").is_file():
        raise bad_value("run_dir", str(run_dir), "a `posenc compare`, `posenc ladder`, `posenc tasks`, `posenc "
                                                 "extend` or `posenc finetune` folder holding results.json")
    check_writable(run_dir, "run_dir")
    with locked(run_dir):  # no other process is writing the files read here
        path = rerender(run_dir, stored)
    print(f"report: {path}")
    return 0
