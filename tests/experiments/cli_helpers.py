"""Helpers for tests that drive `posenc` through its command line, in process."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path

import pytest

from posenc.cli import main

# A model and run small enough that a command finishes in about a second on one core.
TINY = ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "data.seq_len=16", "trainer.batch_size=4",
        "trainer.warmup_steps=1", "trainer.eval_interval=2", "trainer.eval_batches=1", "trainer.progress=false",
        "eval.max_windows=1", "eval.length_multipliers=[1,2]", "eval.shift_offsets=[0,10]"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `posenc argv...`; a KeyboardInterrupt that escapes is a failure."""
    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped the command (a traceback for the user)")
    out, err = capsys.readouterr()
    return code, out, err


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run_folder(out: str) -> Path:
    return Path(next(line for line in out.splitlines() if line.startswith("run folder:")).split(":", 1)[1].strip())


@contextlib.contextmanager
def read_only(folder: Path):
    """Make `folder` unwritable for this process: chmod as a normal user; as root (which ignores
    modes) a read-only bind mount onto itself; skip where neither works."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        mode = folder.stat().st_mode
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(mode)
        return
    mounted = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("root without mount rights: cannot make a folder read-only")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only")
        yield folder
    finally:
        subprocess.run(["umount", "--lazy", str(folder)], check=True)  # lazy: a test may still map a file
