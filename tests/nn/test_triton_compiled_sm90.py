"""posenc's Triton attention compiled for the H100 (sm_90) in `make test`, no GPU needed: bf16 at the head dims
models use (64, 80, 96, 128), causal and not. The other dtypes, head dims and RoPE: test_triton_compiled_sm90_more.py.
The numbers themselves (registers, spills, shared memory, instructions per tile): python -m benchmarks.gpu_static."""

from __future__ import annotations

import pytest

from tests.nn.sm90_support import check_attention, needs_compiler

pytestmark = needs_compiler


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128])
def test_bf16_attention_kernels_compile_fit_and_do_not_spill(head_dim, causal):
    check_attention("bf16", head_dim, causal)
