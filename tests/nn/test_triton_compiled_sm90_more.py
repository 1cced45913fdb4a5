"""posenc's Triton kernels compiled for the H100 (sm_90) in `make test`: fp16, fp32 (TF32 / tf32x3), the other
head dims the dispatch accepts (16, 32, 256), the rows-per-query kernels (Shaw, Transformer-XL), CoPE, a loop that
recognises a hot loop, and RoPE."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_static
from posenc.nn.triton import cope
from tests.nn.sm90_support import check_attention, check_cope, check_piecewise, check_relative, needs_compiler

pytestmark = [needs_compiler, pytest.mark.slow]


@pytest.mark.parametrize("head_dim", [128])
def test_fp16_attention_kernels_compile_fit_and_do_not_spill(head_dim):
    check_attention("fp16", head_dim, True)


@pytest.mark.parametrize("head_dim", [96])
def test_fp32_attention_kernels_compile_fit_and_do_not_spill(head_dim):
    """float32 runs as TF32 (where torch allows TF32), with its own tiles: they fit and do not spill either. At 96
    (padded to 128 columns): float32's widest tiles, which 64's narrower ones share in every other respect."""
    check_attention("fp32", head_dim, True)


@pytest.mark.parametrize("head_dim", [16, 256])
def test_other_head_dims_compile_fit_and_do_not_spill(head_dim):
    """The two ends: 16 (4 warps in the forward, as 32 has) and 256 (the smallest tiles)."""
    check_attention("bf16", head_dim, True)


def test_fire_piecewise_kernels_compile_fit_and_do_not_spill():
    """FIRE's kernels (its MLP per tile) at bf16, Dh 128, causal: the widest tiles of the table at the common head
    dim (python -m benchmarks.gpu_static reads every other setting)."""
    check_piecewise("bf16", 128, True)


def test_shaw_kernels_compile_fit_and_do_not_spill():
    """Shaw's launch (the value table and the far loop: the most registers) at bf16 Dh 64, causal; the other
    settings, and Transformer-XL's launch, are in python -m benchmarks.gpu_static's table."""
    check_relative("bf16", 64, True, values=True)


def test_transformer_xl_kernels_compile_fit_and_do_not_spill():
    """Transformer-XL's launch at bf16 Dh 128, causal: the forward's query block two key tiles tall (64 x 32, three
    chunks carried), dK/dV over 128 keys with the narrow lower chunk; the other settings are in the static table."""
    check_relative("bf16", 128, True, values=False)


def test_cope_kernels_compile_fit_and_do_not_spill():
    """CoPE's forward, dQ (gated and far passes) and dK/dV at bf16, Dh 128 (python -m benchmarks.gpu_static reads
    every setting). dQ's loops stay within their static budgets, SASS instructions per pair and warp: the gated
    pass at most 9 (8.4 at 16 x 32 and 4 warps; 14.4 when its 16 rows spanned 8 warps), the far pass's unmasked
    tiles at most 0.5 (0.34 at 64 x 64; 2.1 when the far keys ran inside the 16-row gated program)."""
    records = check_cope("bf16", 128)
    for kernel, budget in (("dq", 9.0), ("dq_far", 0.5)):
        t = cope.gpu_tiles(kernel, 128, torch.bfloat16)
        per_pair = records[f"cope_{kernel}"].loop_instructions * t.warps / (t.bm * t.bn)
        assert per_pair <= budget, f"cope {kernel} ({t}): {per_pair:.2f} instructions per pair, budget {budget}"


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_rope_kernel_compiles_without_spills(dtype, interleaved):
    with tempfile.TemporaryDirectory() as workdir:
        for head_dim, rotary_dim in ((128, 128), (96, 64)):
            (launch,) = gpu_static.rotary_launches(gpu_static.DTYPES[dtype], head_dim, rotary_dim, interleaved)
            record = gpu_static.analyse(launch, "", Path(workdir))
            assert record.spilled_bytes == 0 and record.shared_bytes <= gpu_static.H100_SHARED_BYTES, record


def test_loop_finder_reads_a_back_edge_around_a_product():
    sass = """
        /*0100*/                   MOV R1, R2 ;
        /*0110*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0120*/                   FFMA R3, R4, R5, R6 ;
        /*0130*/              @P0  BRA 0x110 ;
        /*0140*/                   EXIT ;
        /*0150*/                   FADD R3, R4, R5 ;
        /*0160*/                   BRA 0x150 ;
    """
    assert gpu_static.loop_instructions(sass) == 3  # the loop without a product does not count


def test_straight_path_skips_what_forward_branches_jump_over():
    """FIRE's no-knot path: the loop's instructions less a branch's skipped body (a crossing)."""
    sass = """
        /*0100*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR4], RZ ;
        /*0110*/              @P1  BRA 0x140 ;
        /*0120*/                   FFMA R3, R4, R5, R6 ;
        /*0130*/                   FSEL R3, R4, R5, P2 ;
        /*0140*/                   FADD R3, R4, R5 ;
        /*0150*/              @P0  BRA 0x100 ;
        /*0160*/                   EXIT ;
    """
    assert gpu_static.loop_instructions(sass) == 6
    assert gpu_static.straight_instructions(sass) == 4
