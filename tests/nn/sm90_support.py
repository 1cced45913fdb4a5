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


def check_compiled(launches: dict, label: str, workdir: Path, *, spills_allowed: bool = False,
                   hot_loop: bool = True) -> dict:
    """Compile each named launch for sm_90 and read it: it fits an H100 block's shared memory, spills nothing
    (unless spills_allowed) and (hot_loop) has a hot loop. label names the setting in the failure messages.
    Returns the records by name, for a caller's own checks."""
    records = {}
    for name, launch in launches.items():
        record = gpu_static.analyse(launch, label, workdir)
        what = f"{name} {label} ({record.tiles})"
        assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, f"{what}: {record.shared_bytes} B shared"
        if not spills_allowed:
            assert record.spilled_bytes == 0, f"{what}: {record.spilled_bytes} B spilled per thread"
        if hot_loop:
            assert record.loop_instructions > 0, f"{what}: no hot loop found"
        records[name] = record
    return records


def _with_and_without_grad(launches_of, dtype: str, head_dim: int, causal: bool, grad_name: str) -> dict:
    """The launches of launches_of(dtype, head_dim, causal, grad) for grad True and False by kernel name: the dQ
    kernel twice ("dq <grad_name>" with the bias's gradient, "dq" without), the rest once (they do not depend on
    it)."""
    launches = {}
    for grad in (True, False):
        for launch in launches_of(gpu_static.DTYPES[dtype], head_dim, causal, grad):
            name = gpu_static._name(launch.kernel)
            launches[f"{name} {grad_name}" if name == "dq" and grad else name] = launch
    return launches


def check_attention(dtype: str, head_dim: int, causal: bool, spills_allowed: bool = False) -> None:
    """Every kernel posenc launches for this setting (forward, dK/dV, dQ with and without the row gradient, the
    row reduction) compiles for sm_90, fits an H100 block's shared memory, and (16-bit types) spills nothing;
    the biased forward uses no more shared memory than the same forward without a bias (the bias is not staged
    through the pipeline's buffers)."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = _with_and_without_grad(gpu_static.attention_launches, dtype, head_dim, causal, "rows")
        assert set(launches) == {"forward", "dkdv", "dq", "dq rows", "row_reduce"}, sorted(launches)
        label = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'}"
        records = check_compiled(launches, label, Path(workdir), spills_allowed=spills_allowed, hot_loop=False)
        forward = records["forward"]
        plain = gpu_static.analyse(gpu_static.without_bias(launches["forward"]), "", Path(workdir))
        what = f"forward {label} ({forward.tiles})"
        assert forward.shared_bytes == plain.shared_bytes, f"{what}: the bias takes shared memory"
        assert forward.loop_instructions > plain.loop_instructions > 0, f"{what}: no hot loop found"


def check_head_bias(dtype: str, head_dim: int, causal: bool) -> None:
    """dQ with the per-head parameters' sums (KERPLE's training path, triton/head_bias.py) compiles for sm_90, fits
    an H100 block's shared memory and spills nothing; its other launches are the row kernel's (check_attention)."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.head_bias_launches(gpu_static.DTYPES[dtype], head_dim, causal)
        named = {gpu_static._name(launch.kernel): launch for launch in launches}
        assert sorted(named) == ["dkdv", "dq_head_params", "forward"] and len(launches) == 3, sorted(named)
        label = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'} head params"
        check_compiled({"dq_head_params": named["dq_head_params"]}, label, Path(workdir))


def check_bucket_bias(dtype: str, head_dim: int, causal: bool) -> None:
    """dQ with the bucket table's sums (T5's training path, triton/bucket_bias.py) compiles for sm_90, fits an H100
    block's shared memory and spills nothing, and a tile of the running bucket skips the several-bucket branch (its
    path through the loop is shorter than the loop); its other launches are the row kernel's (check_attention)."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.bucket_bias_launches(gpu_static.DTYPES[dtype], head_dim, causal)
        named = {gpu_static._name(launch.kernel): launch for launch in launches}
        assert sorted(named) == ["dkdv", "dq_buckets", "forward"] and len(launches) == 3, sorted(named)
        label = f"{dtype} Dh={head_dim} {'causal' if causal else 'full'} buckets"
        record = check_compiled({"dq_buckets": named["dq_buckets"]}, label, Path(workdir))["dq_buckets"]
        launch = named["dq_buckets"]
        compiled = gpu_static._compile(launch.kernel, launch.args, launch.options)
        sass = gpu_static._resources(compiled.asm["cubin"], Path(workdir))[2]
        assert 0 < gpu_static.fallthrough_instructions(sass) < record.loop_instructions, label


def check_relative(dtype: str, head_dim: int, causal: bool, values: bool) -> None:
    """The rows-per-query kernels (forward, dK/dV, dQ with the tables' gradients) compile for sm_90, fit an H100
    block's shared memory and spill nothing: values=True as Shaw launches them (a clipped table: the far passes
    at the row kernel's tiles too), False as Transformer-XL."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.relative_launches(gpu_static.DTYPES[dtype], head_dim, causal, values)
        named = {gpu_static._name(launch.kernel): launch for launch in launches}
        expected = ["dkdv", "dq", "forward", *(["far_dkdv", "far_dq", "far_forward"] if values else [])]
        assert sorted(named) == sorted(expected) and len(launches) == len(expected), sorted(named)
        label = f"relative {dtype} Dh={head_dim} {'causal' if causal else 'full'} values={values}"
        check_compiled(named, label, Path(workdir))


def check_cope(dtype: str, head_dim: int) -> dict:
    """CoPE's four kernels (forward, dQ's gated and far passes, dK/dV) compile for sm_90, fit an H100 block's
    shared memory and spill nothing. Returns the records by kernel name."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.cope_launches(gpu_static.DTYPES[dtype], head_dim)
        names = [gpu_static._name(launch.kernel) for launch in launches]
        assert names == ["cope_forward", "cope_dq", "cope_dq_far", "cope_dkdv"], names
        named = dict(zip(names, launches, strict=True))
        return check_compiled(named, f"{dtype} Dh={head_dim} cope", Path(workdir))


def check_piecewise(dtype: str, head_dim: int, causal: bool) -> None:
    """Every kernel the piecewise-bias attention (FIRE) launches for this setting (forward, dK/dV, dQ with and
    without the pieces' gradients) compiles for sm_90, fits an H100 block's shared memory and spills nothing."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = _with_and_without_grad(gpu_static.piecewise_launches, dtype, head_dim, causal, "grad")
        launches.pop("row_reduce")  # the row kernel's own reduction, checked there
        assert set(launches) == {"forward", "dkdv", "dq", "dq grad"}, sorted(launches)
        check_compiled(launches, f"pieces {dtype} Dh={head_dim} {'causal' if causal else 'full'}", Path(workdir))


def check_piecewise_by_parameter(dtype: str, head_dim: int, causal: bool) -> None:
    """dQ with the feature's parameter summed per tile (FIRE's training, BY_PARAMETER) compiles for sm_90, fits an
    H100 block's shared memory and spills nothing; the launches hold no row reduction (its other launches are
    check_piecewise's)."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.piecewise_launches(gpu_static.DTYPES[dtype], head_dim, causal, True, by_parameter=True)
        named = {gpu_static._name(launch.kernel): launch for launch in launches}
        assert sorted(named) == ["dkdv", "dq", "forward"] and len(launches) == 3, sorted(named)
        assert named["dq"].options["BY_PARAMETER"], named["dq"].options
        label = f"pieces {dtype} Dh={head_dim} {'causal' if causal else 'full'} by parameter"
        check_compiled({"dq": named["dq"]}, label, Path(workdir))
