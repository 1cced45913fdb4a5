"""Run folders and writes that cannot half-happen: a crash never leaves a half-written file under
its real name, results are never written over, JSON is always valid (no bare NaN), and a folder
is checked to be writable before any work starts."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | Path, write: Callable[[Path], None]) -> Path:
    """Call write(tmp_path) on a temp file beside `path`, fsync, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(Path(tmp))
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes owner-only files; results are for everyone who may read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_new(path: str | Path, text: str) -> Path:
    """Write `text` to `path`, or to `stem-2.suffix`, `stem-3.suffix`, ... if it exists: never over
    earlier results. os.link refuses an existing name, so two writers cannot pick the same one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".new", dir=path.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1, 10_000):
            candidate = path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")
            try:
                os.link(tmp, candidate)
                return candidate
            except FileExistsError:
                continue
        raise bad_value("path", str(path), "a folder with fewer than 10000 earlier results")
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> Path:
    return atomic_write(path, lambda p: p.write_text(text, encoding="utf-8"))


def finite_json(data: Any) -> Any:
    """NaN and +-inf become null: JSON has no spelling for them (Python's bare NaN is invalid)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: finite_json(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [finite_json(v) for v in data]
    return data


def to_json(data: Any) -> str:
    return json.dumps(finite_json(data), indent=2, default=str, allow_nan=False) + "\n"


def write_json(path: str | Path, data: Any) -> Path:
    return write_text(path, to_json(data))
