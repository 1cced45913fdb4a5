"""One process per run folder: an exclusive flock on the folder itself, held while a command works in
it. The kernel drops the lock when its process ends in any way (SIGKILL included), so a killed run
leaves no stale lock behind, and the lock needs no file in the folder. Spawned workers do not
inherit it (Python opens descriptors non-inheritable), so it is never held by an orphan."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from posenc.errors import bad_value


@contextlib.contextmanager
def locked(folder: Path, field: str = "run_dir") -> Iterator[Path]:
    """Hold `folder` (which must exist) for this block; a one-line ValueError if another process holds it."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise bad_value(field, str(folder), "a run folder no other process is using (another posenc process is "
                                            "writing it now; wait for it to end, or use another folder)") from None
    try:
        yield folder
    finally:
        os.close(fd)  # closing the only descriptor releases the lock
