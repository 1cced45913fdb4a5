"""`posenc report RUN_DIR`: re-render a run's tables, plots, Markdown and HTML from its saved files
(e.g. after an interrupted run, or to restyle), without retraining. The study recorded in the folder's
run.json picks its report module from REPORTS, whose `rerender(run_dir, stored)` writes the report."""

from __future__ import annotations

import argparse
from pathlib import Path

# The one table: every study `posenc report` re-renders -> its report module (experiments/<study>/report.py).
REPORTS = {study: f"posenc.experiments.{study}.report" for study in ("compare", "ladder", "tasks", "extend",
                                                                      "finetune")}
_NAMED = [f"`posenc {study}`" for study in REPORTS]
FOLDERS = f"{', '.join(_NAMED[:-1])} or {_NAMED[-1]}"  # `posenc compare`, ... or `posenc finetune`


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help=f"a folder written by {FOLDERS}")


def main(args: argparse.Namespace) -> int:
    from posenc.experiments.runs.rerender import rerender

    path = rerender(Path(args.run_dir), REPORTS, f"a {FOLDERS} folder holding results.json")
    print(f"report: {path}")
    return 0
