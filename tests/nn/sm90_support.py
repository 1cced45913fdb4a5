"""Shared by the sm_90 compile tests (two files, so `make test`'s two workers compile side by side): posenc's
Triton kernels compiled for the H100 without a GPU, through benchmarks/gpu_static.py."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchmarks import gpu_static
from posenc.nn import triton as gpu

needs_compiler = pytest.mark.skipif(not gpu.installed() or gpu.interpreting(),
                                    reason="needs triton, not under TRITON_INTERPRET (kernels must be compiled)")


def check_attention(dtype: str, head_dim: int, causal: bool, spills_allowed: bool = False) -> None:
    """Every kernel posenc launches for this setting (forward, dK/dV, dQ with and without the row gradient, the
    row reduction) compiles for sm_90, fits an H100 block's shared memory, and (16-bit types) spills nothing;
    the biased forward uses no more shared memory than the same forward without a bias (the bias is not staged
    through the pipeline's buffers)."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = {}
        for row_grad in (True, False):
            for launch in gpu_static.attention_launches(gpu_static.DTYPES[dtype], head_dim, causal, row_grad):
                name = gpu_static._name(launch.kernel)
                launches[f"{name}{' rows' if name == 'dq' and row_grad else ''}"] = launch
        assert set(launches) == {"forward", "dkdv", "dq", "dq rows", "row_reduce"}, sorted(launches)
        for name, launch in launches.items():
            record = gpu_static.analyse(launch, f"{dtype} Dh={head_dim}", Path(workdir))
            what = f"{name} {dtype} Dh={head_dim} {'causal' if causal else 'full'} ({record.tiles})"
            assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, f"{what}: {record.shared_bytes} B shared"
            if not spills_allowed:
                assert record.spilled_bytes == 0, f"{what}: {record.spilled_bytes} B spilled per thread"
            if name == "forward":
                plain = gpu_static.analyse(gpu_static.without_bias(launch), "", Path(workdir))
                assert record.shared_bytes == plain.shared_bytes, f"{what}: the bias takes shared memory"
                assert record.loop_instructions > plain.loop_instructions > 0, f"{what}: no hot loop found"


def check_relative(dtype: str, head_dim: int, causal: bool, values: bool) -> None:
    """The rows-per-query kernels (forward, dK/dV, dQ with the tables' gradients) compile for sm_90, fit an H100
    block's shared memory and spill nothing: values=True as Shaw launches them, False as Transformer-XL."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.relative_launches(gpu_static.DTYPES[dtype], head_dim, causal, values)
        assert sorted(gpu_static._name(launch.kernel) for launch in launches) == ["dkdv", "dq", "forward"]
        for launch in launches:
            record = gpu_static.analyse(launch, "", Path(workdir))
            what = f"relative {record.kernel} {dtype} Dh={head_dim} values={values} ({record.tiles})"
            assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, f"{what}: {record.shared_bytes} B shared"
            assert record.spilled_bytes == 0, f"{what}: {record.spilled_bytes} B spilled per thread"
            assert record.loop_instructions > 0, f"{what}: no hot loop found"


def check_cope(dtype: str, head_dim: int) -> None:
    """CoPE's three kernels (forward, dQ, dK/dV) compile for sm_90, fit an H100 block's shared memory and spill
    nothing."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.cope_launches(gpu_static.DTYPES[dtype], head_dim)
        names = [gpu_static._name(launch.kernel) for launch in launches]
        assert names == ["cope_forward", "cope_dq", "cope_dkdv"], names
        for launch in launches:
            record = gpu_static.analyse(launch, f"{dtype} Dh={head_dim} cope", Path(workdir))
            what = f"{record.kernel} {dtype} Dh={head_dim} ({record.tiles})"
            assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, f"{what}: {record.shared_bytes} B shared"
            assert record.spilled_bytes == 0, f"{what}: {record.spilled_bytes} B spilled per thread"
            assert record.loop_instructions > 0, f"{what}: no hot loop found"


def check_piecewise(dtype: str, head_dim: int, causal: bool) -> None:
    """Every kernel the piecewise-bias attention (FIRE) launches for this setting (forward, dK/dV, dQ with and
    without the pieces' gradients) compiles for sm_90, fits an H100 block's shared memory and spills nothing."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = {}
        for param_grad in (True, False):
            for launch in gpu_static.piecewise_launches(gpu_static.DTYPES[dtype], head_dim, causal, param_grad):
                name = gpu_static._name(launch.kernel)
                launches[f"{name}{' grad' if name == 'dq' and param_grad else ''}"] = launch
        launches.pop("row_reduce")  # the row kernel's own reduction, checked there
        assert set(launches) == {"forward", "dkdv", "dq", "dq grad"}, sorted(launches)
        for name, launch in launches.items():
            record = gpu_static.analyse(launch, f"{dtype} Dh={head_dim}", Path(workdir))
            what = f"pieces {name} {dtype} Dh={head_dim} {'causal' if causal else 'full'} ({record.tiles})"
            assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, f"{what}: {record.shared_bytes} B shared"
            assert record.spilled_bytes == 0, f"{what}: {record.spilled_bytes} B spilled per thread"
            assert record.loop_instructions > 0, f"{what}: no hot loop found"
