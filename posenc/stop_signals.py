"""SIGTERM is Ctrl-C. Schedulers, `timeout` and torchrun's agent stop a run with SIGTERM; it gets the same
save, record and exit as Ctrl-C (an Interrupted, exit 128 + the signal's number) instead of the silent
death that would lose every step since the last checkpoint. Ctrl-C itself raises the same Interrupted (not
Python's bare KeyboardInterrupt), so a study has one interruption path to handle, whichever signal came."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from posenc.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(f"stopped by {name(signum)}", signum=signum)


@contextlib.contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM and Ctrl-C raise Interrupted for the whole command (the CLI wraps every command in it), restored
    after; training loops defer both signals to the end of the step in flight."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signal.SIGTERM: signal.signal(signal.SIGTERM, raise_interrupted)}
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored Ctrl-C (nohup, &) stays ignored
        before[signal.SIGINT] = signal.signal(signal.SIGINT, raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


__all__ = ["STOP_SIGNALS", "name", "raise_interrupted", "sigterm_as_ctrl_c"]
