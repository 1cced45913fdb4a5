"""`posenc bench` finds the benchmarks from the package, so it works from any folder (issue 24, item 10),
and an installation without them says so in one line."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.commands import bench


def test_bench_help_works_outside_the_repository(tmp_path):
    script = Path(sys.executable).parent / "posenc"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([str(script), "bench", "--help"], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "usage" in result.stdout and "--quick" in result.stdout


def test_an_installation_without_benchmarks_says_where_to_get_them(monkeypatch, capsys):
    monkeypatch.setattr(bench, "checkout", lambda: None)
    assert bench.main(argparse.Namespace(args=["--help"])) == 0
    assert "clone the repository" in capsys.readouterr().out
    with pytest.raises(ValueError, match="a source checkout: benchmarks/ is not in the installed package"):
        bench.main(argparse.Namespace(args=["--quick"]))
