"""Writes that cannot half-happen: a crash never leaves a half-written file under its real name,
results are never written over (write_new), and JSON is always valid (no bare NaN). The library
(saving a model) and the experiments (run folders) write through these."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from posenc.errors import bad_value


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
