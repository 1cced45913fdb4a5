"""Run folders: a new one per run (never reused by a second run started in the same second), checked
writable before any work starts, and removed again when a run fails before writing anything."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from posenc.errors import bad_value


def check_writable(folder: str | Path, field: str) -> Path:
    """Raise a ValueError naming `field` unless this process can create files in `folder` (or,
    when it does not exist yet, in the nearest folder above it, where it would be made)."""
    folder = Path(folder)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise bad_value(field, str(folder), f"a folder ({probe} is a file)")
    try:  # a real write: modes, read-only mounts, quotas and root all answer the same way
        fd, name = tempfile.mkstemp(prefix=".posenc-probe-", dir=probe)
        os.close(fd)
        os.unlink(name)
    except OSError as err:
        raise bad_value(field, str(folder), f"a folder this process can write ({err.strerror}: {probe})") from None
    return folder


def new_run_dir(root: str | Path, prefix: str, field: str = "out_dir") -> Path:
    root = Path(root).expanduser()  # `out_dir: ~/runs` in a preset: the home folder, not a folder named ~
    check_writable(root, field)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(root) / f"{prefix}-{stamp}"
    n = 1
    while True:
        try:
            path.mkdir(parents=True)  # exist_ok=False: two runs started in one second get two folders
            return path
        except FileExistsError:
            n += 1
            path = Path(root) / f"{prefix}-{stamp}-{n}"


@contextlib.contextmanager
def removed_if_unused(folder: Path, keep_if: Callable[[Path], bool]) -> Iterator[Path]:
    """A folder this run created: if the run fails before `keep_if(folder)` holds (nothing worth
    keeping was written), the folder goes too, so failed runs leave no empty `train-*` folders."""
    try:
        yield folder
    except BaseException:
        if folder.is_dir() and not keep_if(folder):
            shutil.rmtree(folder, ignore_errors=True)
        raise
