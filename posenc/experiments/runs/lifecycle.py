"""A study's run folder from start to end, the same for every study: a new folder under out_dir (or the one
asked for: new, or a run to continue), removed again when the run fails before it holds results; locked,
checked against what it holds and recorded in run.json (rule.open_run); and on Ctrl-C or SIGTERM (both the
Interrupted KeyboardInterrupt under the CLI) the report of what finished, marked incomplete, before the
interruption goes on to exit 130 or 143."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from posenc.experiments.runs import manifest
from posenc.experiments.runs.files import new_run_dir, removed_if_unused
from posenc.experiments.runs.rule import Run, RunRule, open_run


@contextlib.contextmanager
def run_folder(run_dir: str | Path | None, out_dir: str, rule: RunRule, config: dict[str, Any],
               corpus: dict[str, str] | None = None, on_stop: Callable[[Run], None] | None = None,
               read: Callable[[Path], dict[str, Any] | None] = manifest.read) -> Iterator[Run]:
    """Yield the open Run; `on_stop(run)` writes the report of the finished units when the run is interrupted;
    `read` finds what the folder holds (default its run.json; a study with older folders reads those too)."""
    created = run_dir is None or not Path(run_dir).exists()
    path = Path(run_dir) if run_dir is not None else new_run_dir(out_dir, rule.command)
    with removed_if_unused(path, manifest.holds_results) if created else contextlib.nullcontext(), \
            open_run(path, rule, config, corpus, read=read) as run:
        try:
            yield run
        except KeyboardInterrupt:
            if on_stop is not None:
                _report_what_finished(on_stop, run)
            raise


def _report_what_finished(on_stop: Callable[[Run], None], run: Run) -> None:
    try:
        on_stop(run)
    except (ValueError, OSError) as err:  # the interruption stays the news; what was saved stays on disk
        print(f"posenc: the report of the finished units was not written ({err}); `posenc report {run.path}` "
              "writes it", file=sys.stderr)
