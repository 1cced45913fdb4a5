"""The one-pass position-map kernel (posenc/nn/triton/mapped.py) in `make test`: under Triton's interpreter against
the references (the cases live in triton_mapped_cases.py, run in a fresh process; tests/nn/triton_support.py says
why), and compiled for the H100 (sm_90) without a GPU: it fits a block's shared memory and spills nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchmarks import gpu_static
from tests.nn.sm90_support import needs_compiler
from tests.nn.triton_support import run_interpreted

CASES = Path(__file__).with_name("triton_mapped_cases.py")


@pytest.mark.slow
def test_mapped_kernel_under_the_interpreter():
    run_interpreted(CASES)


@needs_compiler
@pytest.mark.parametrize(("decode", "keys_in_kernel"), [(False, False), (True, False), (True, True)],
                         ids=["prefill", "decode", "decode rotating keys"])
def test_mapped_kernel_compiles_for_sm90_fits_and_does_not_spill(decode, keys_in_kernel):
    """DCA at Dh 128 in bf16: three maps (a decode program holds three rotated query copies, the most registers;
    a prefill program one, beside the row kernel's 128x64 key tiles)."""
    with tempfile.TemporaryDirectory() as workdir:
        (launch,) = gpu_static.mapped_launches(gpu_static.DTYPES["bf16"], 128, decode, "dual_chunk", keys_in_kernel)
        record = gpu_static.analyse(launch, "", Path(workdir))
        assert record.spilled_bytes == 0, record
        assert record.shared_bytes <= gpu_static.H100_SHARED_BYTES, record
        assert record.loop_instructions > 0, record  # the key loop was found (the kernel has one)
