"""How much memory this machine can still give: the one place the kernel is asked."""

from __future__ import annotations

import os

from posenc.errors import bad_value


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def check_table_fits(field: str, value: int, rows: int, width: int) -> None:
    """A learned (rows, width) float32 table, trained with AdamW (weights, grads, 2 moments: 4 copies),
    must fit the memory this machine has: refuse it when the config is built, not at allocation."""
    need = 4 * 4 * rows * width
    have = available_bytes()
    if need > have:
        raise bad_value(field, value, f"a table of {rows:,} x {width} needs ~{need / 2**30:,.1f} GiB of memory "
                                      f"to train, but {have / 2**30:.1f} GiB are available")
