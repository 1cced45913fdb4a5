"""The GPU kernels of FIRE's pieces, Shaw's and Transformer-XL's rows per query and CoPE (posenc/nn/triton) in
`make test`, as test_triton_kernels.py runs the row schemes': under Triton's interpreter in one fresh process on a
machine without a GPU, compiled at real sizes on a CUDA machine. A file of its own: `make test` gives each file to one
worker, so the two interpreted processes (about half a minute each) run side by side."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.nn.triton_support import run_interpreted

CASES = [Path(__file__).with_name(name) for name in (
    "triton_pieces_cases.py", "triton_relative_cases.py", "triton_cope_cases.py", "triton_head_bias_cases.py",
    "triton_bucket_bias_cases.py")]


@pytest.mark.slow
def test_scheme_kernels_under_the_interpreter():
    run_interpreted(*CASES)  # one process: the interpreter's start is paid once


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scheme_kernels_compiled_on_the_gpu():
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                             *map(str, CASES)], cwd=CASES[0].parents[2], env=env, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-8000:]
