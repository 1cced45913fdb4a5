"""Error types. Every one is a ValueError so callers can catch bad input in one place."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A config field has a value that is not allowed."""


def bad_value(field: str, value: object, allowed: str) -> ConfigError:
    return ConfigError(f"{field}={value!r} is not allowed: {allowed}")


def unknown_name(field: str, value: str, valid: Iterable[str]) -> ConfigError:
    valid = sorted(valid)
    near = difflib.get_close_matches(str(value), valid, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    return ConfigError(f"{field}={value!r} is unknown{hint}; valid: {', '.join(valid)}")


def unknown_key(section: str, key: str, valid: Iterable[str]) -> ConfigError:
    valid = sorted(valid)
    near = difflib.get_close_matches(str(key), valid, n=1)
    where = f"{section}." if section else ""
    hint = f" (did you mean '{where}{near[0]}'?)" if near else ""
    return ConfigError(f"unknown key '{where}{key}'{hint}; valid keys: {', '.join(valid)}")


class RunFailed(RuntimeError):
    """A run stopped for a reason that is not bad input (divergence, a full disk): the command
    prints the message as one line and exits 1; what was saved before it stays valid."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C: the command saved what it could and exits 130, the shell's code for SIGINT. A
    KeyboardInterrupt, not a RunFailed: an interruption is never a result, so no handler of failures
    (a unit recorded as diverged, a run marked failed) may catch it on its way out."""

    def __init__(self, message: str, step: int | None = None) -> None:
        super().__init__(message)
        self.step = step  # the last completed step, when a training loop was interrupted
