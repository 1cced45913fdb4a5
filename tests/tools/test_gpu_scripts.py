"""The prepared GPU command of issue 34 (scripts/gpu_schemes.sh, the second of a session lent a GPU) runs through on the
CPU with QUICK=1 (the kernels under Triton's interpreter, the benchmarks and the profile at toy sizes): every part
exits 0 and the targets are read out; and PART_DEADLINE (a second script in the same device call) skips what its
time does not cover, in one line each, instead of running past the call. scripts/gpu_check.sh shares the parts'
plumbing (scripts/gpu_parts.sh) and its benchmark's quick mode is tests/tools/test_gpu_benchmark.py's; its QUICK=1
run (19 s) is left to the hand, to keep `make test` under its 10 minutes, as is scripts/extend_tables_gpu.sh's (98 s:
its four parts exit 0, checked 2026-11-26)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_script(name: str, out: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "QUICK": "1", "OUT": str(out), "PY": sys.executable, **env}
    return subprocess.run(["bash", f"scripts/{name}"], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=300)


SCRIPTS = {"gpu_schemes.sh": ["kernels", "attention", "maps", "graphs", "profile", "host"]}


@pytest.mark.slow
@pytest.mark.parametrize(("script", "parts"), SCRIPTS.items())
def test_a_prepared_gpu_command_runs_every_part(script, parts, tmp_path):
    done = run_script(script, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split(":")[0] for line in summary] == parts, summary
    failed = [line for line in summary if " exit 0 " not in line]
    assert not failed, (failed, *((tmp_path / f"{line.split(':')[0]}.log").read_text()[-1500:] for line in failed))
    assert "| target |" in (tmp_path / "targets.md").read_text()


def test_a_part_past_the_deadline_is_skipped_in_one_line(tmp_path):
    done = run_script("gpu_schemes.sh", tmp_path, PART_DEADLINE=str(int(time.time())))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary == [f"{part}: skipped, {summary[i].split(', ')[1]}" for i, part in
                       enumerate(SCRIPTS["gpu_schemes.sh"])], summary
    assert all("s left before PART_DEADLINE" in line for line in summary)


def test_named_parts_are_skipped_and_recorded(tmp_path):
    # Every part but one skipped by name (that one past the deadline, so nothing runs): one line each, in order.
    parts = SCRIPTS["gpu_schemes.sh"]
    done = run_script("gpu_schemes.sh", tmp_path, PART_SKIP=" ".join(parts[1:]), PART_DEADLINE=str(int(time.time())))
    assert done.returncode == 0, done.stderr[-2000:]
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert summary[0].startswith(f"{parts[0]}: skipped, ") and "PART_DEADLINE" in summary[0], summary
    assert summary[1:] == [f"{part}: skipped (PART_SKIP)" for part in parts[1:]], summary
