"""What a config never reads, as `dotted key -> why` (a key ending in `.` stands for its whole section): each
schema's `unused()` builds it from these, and config.loader refuses any of them that the user set, so a value
is never recorded in run.json and silently ignored."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from posenc.registry import option_owners


def scheme_options(schemes: Iterable[str], where: str) -> dict[str, str]:
    """model.<option> of every scheme option that none of `schemes` reads."""
    running = set(schemes)
    return {f"model.{option}": f"read by {', '.join(readers)} only, and {where}"
            for option, readers in option_owners().items() if not running & set(readers)}


def eval_options(e: Any) -> dict[str, str]:
    return {} if e.mode == "sliding" else {"eval.stride": f"the stride of eval.mode=sliding (eval.mode is {e.mode})"}
