"""The static decode step's Triton attention under a map (posenc/nn/triton/slots.py) in `make test`: under Triton's
interpreter against map_slot_attention (the cases live in triton_slot_cases.py, run in a fresh process;
tests/nn/triton_support.py says why), and compiled for the H100 (sm_90) without a GPU: it fits a block's shared
memory and spills nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from benchmarks import gpu_static
from tests.nn.sm90_support import check_compiled, needs_compiler
from tests.nn.triton_support import run_interpreted

CASES = Path(__file__).with_name("triton_slot_cases.py")


@pytest.mark.slow
def test_slot_kernel_under_the_interpreter():
    run_interpreted(CASES)


@needs_compiler
@pytest.mark.parametrize(("dtype", "head_dim", "rule"), [("bf16", 64, "self_extend"), ("bf16", 80, "self_extend"),
                                                       ("fp32", 64, "dual_chunk"), ("bf16", 64, "lm_infinite"),
                                                       ("fp32", 64, "attention_sinks")])
def test_slot_kernels_compile_for_sm90_fit_and_do_not_spill(dtype, head_dim, rule):
    """SmolLM2's 9:3 heads and a 32k cache: Self-Extend's two key tables in bf16 (the widest keys of its shape, 4
    query rows a head; at Dh 80 padded and masked, where 4 warps spilled), DCA's four rows a head in float32 (exact
    products on CUDA cores), LM-Infinite's and the sinks' pass that skips blocks no map scores; the merge beside
    each. python -m benchmarks.gpu_static reads every map at Dh 16 to 256."""
    with tempfile.TemporaryDirectory() as workdir:
        launches = gpu_static.slot_launches(gpu_static.DTYPES[dtype], head_dim, rule)
        named = {gpu_static._name(launch.kernel): launch for launch in launches}
        assert sorted(named) == ["merge_shares", "slot_forward"] and len(launches) == 2, sorted(named)
        assert named["slot_forward"].grid == (86, 3, 1), named["slot_forward"].grid  # 2 x 132 SMs' programs
        records = check_compiled(named, f"{dtype} Dh={head_dim} {rule} static step", Path(workdir), hot_loop=False)
        if dtype == "bf16":  # the products on tensor cores: the slot loop holds them
            assert records["slot_forward"].loop_instructions > 0, records["slot_forward"]
