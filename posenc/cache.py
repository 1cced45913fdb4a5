"""posenc's per-machine cache folder (built native kernels, cleaned corpora): $POSENC_CACHE_DIR, else
$XDG_CACHE_HOME/posenc, else ~/.cache/posenc."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    if os.environ.get("POSENC_CACHE_DIR"):
        return Path(os.environ["POSENC_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "posenc"


__all__ = ["cache_dir"]
