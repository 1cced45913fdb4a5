"""One interruption path: under the CLI, Ctrl-C (SIGINT) and SIGTERM both raise posenc's Interrupted, which every
study handles (writes what finished, marked incomplete); an ignored Ctrl-C stays ignored."""

from __future__ import annotations

import os
import signal
import time

import pytest

from posenc.errors import Interrupted
from posenc.stop_signals import sigterm_as_ctrl_c


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_both_stop_signals_raise_interrupted_and_the_handlers_are_restored(signum):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with sigterm_as_ctrl_c(), pytest.raises(Interrupted) as caught:
        os.kill(os.getpid(), signum)
        time.sleep(30)  # the handler raises at the next bytecode: never reached
    assert caught.value.signum == signum and caught.value.exit_code == 128 + signum
    assert {s: signal.getsignal(s) for s in before} == before


def test_an_ignored_ctrl_c_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as for a job started with nohup or &
    try:
        with sigterm_as_ctrl_c():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
