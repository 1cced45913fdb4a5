"""posenc's Triton attention compiled for the H100 (sm_90) in `make test`, no GPU needed: bf16 at the head dims
models use (64, 80, 96, 128), causal and not. The other dtypes, head dims and RoPE: test_triton_compiled_sm90_more.py.
The numbers themselves (registers, spills, shared memory, instructions per tile): python -m benchmarks.gpu_static."""

from __future__ import annotations

import pytest

from tests.nn.sm90_support import (
    check_attention,
    check_bucket_bias,
    check_head_bias,
    check_piecewise_by_parameter,
    needs_compiler,
)

pytestmark = [needs_compiler, pytest.mark.slow]


@pytest.mark.parametrize(("head_dim", "causal"), [(64, True), (80, True), (128, True), (128, False)])
def test_bf16_attention_kernels_compile_fit_and_do_not_spill(head_dim, causal):
    """One setting per tile choice: 96 takes 80's tiles (both padded to 128 columns), full attention at 64 the same
    loops as at 128 (python -m benchmarks.gpu_static reads every setting)."""
    check_attention("bf16", head_dim, causal)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_head_parameter_dq_compiles_fits_and_does_not_spill(head_dim):
    """KERPLE's dQ with its parameters' sums per tile (the other launches are the row kernel's, above)."""
    check_head_bias("bf16", head_dim, True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_bucket_table_dq_compiles_fits_and_does_not_spill(head_dim):
    """T5's dQ with its table's sums per bucket and tile, at both tiles (128x64 at Dh 64, 128x32 at 128; the other
    launches are the row kernel's, above; bidirectional: python -m benchmarks.gpu_static)."""
    check_bucket_bias("bf16", head_dim, True)


@pytest.mark.parametrize(("dtype", "head_dim"), [("bf16", 64), ("bf16", 128), ("fp32", 64)])
def test_fire_parameter_dq_compiles_fits_and_does_not_spill(dtype, head_dim):
    """FIRE's training dQ (c's gradient per tile, no diagonal sums) at the tiles of both 16-bit head dims that
    differ (128x32 at 64, 128x16 at 128) and TF32's (the dispatch runs float32 on it too)."""
    check_piecewise_by_parameter(dtype, head_dim, True)
