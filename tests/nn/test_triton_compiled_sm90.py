"""posenc's Triton attention compiled for the H100 (sm_90) in `make test`, no GPU needed: bf16 at the head dims
models use (64, 80, 96, 128), causal and not. The other dtypes, head dims and RoPE: test_triton_compiled_sm90_more.py.
The numbers themselves (registers, spills, shared memory, instructions per tile): python -m benchmarks.gpu_static."""

from __future__ import annotations

import pytest

from tests.nn.sm90_support import check_attention, check_head_bias, needs_compiler

pytestmark = needs_compiler


@pytest.mark.parametrize(("head_dim", "causal"), [(64, True), (64, False), (80, True), (96, True), (128, True),
                                                   (128, False)])
def test_bf16_attention_kernels_compile_fit_and_do_not_spill(head_dim, causal):
    """Full attention at 80 and 96 compiles the same loops as at 64 and 128 (python -m benchmarks.gpu_static
    reads every setting)."""
    check_attention("bf16", head_dim, causal)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_bf16_head_parameter_dq_compiles_fits_and_does_not_spill(head_dim):
    """KERPLE's dQ with its parameters' sums per tile (the other launches are the row kernel's, above)."""
    check_head_bias("bf16", head_dim, True)
