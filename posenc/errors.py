"""Error types. Every one is a ValueError so callers can catch bad input in one place."""

from __future__ import annotations

import difflib
import signal
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
    """Ctrl-C or SIGTERM (what schedulers, `timeout` and torchrun's agent send): the command saved what it
    could and exits 128 + the signal's number, the shell's code (130 for Ctrl-C, 143 for SIGTERM). A
    KeyboardInterrupt, not a RunFailed: an interruption is never a result, so no handler of failures
    (a unit recorded as diverged, a run marked failed) may catch it on its way out."""

    def __init__(self, message: str, step: int | None = None, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.step = step  # the last completed step, when a training loop was interrupted
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def __reduce__(self):  # crosses process boundaries (a worker's unit) with its step and signal
        return type(self), (str(self), self.step, self.signum)
