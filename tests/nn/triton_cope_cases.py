"""CoPE's Triton kernel (posenc/nn/triton/cope.py) equals a float64 reference written from the paper's formulas
(Golovneva et al. 2024, eq. 3-5), output and gradients of q, k, v and the position table: causal (CoPE is causal
only), a cache offset (Tq < Tk), GQA, positions clamped at the table's end and not, bf16, and tiles that differ
per kernel (the backward's carries are stored per key tile of dQ and read by dK/dV).

Not collected by `make test` directly: tests/nn/test_triton_scheme_kernels.py runs it in a fresh process with the
interpreter (TRITON_INTERPRET=1: tiny shapes) or compiled on a CUDA machine (see triton_support.py).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.contract.models import perturb_scheme_parameters
from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.registry import build
from tests.conftest import tiny_config
from tests.nn.triton_support import (
    SoftmaxTimesValues,
    all_within_reach,
    at_kernel_precision,
    exact_float32,
    gqa_group_with_large_partials,
    kernel_device,
    key_gradients_within,
    twins,
    within_reach,
)

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device(tf32=True)  # the kernel serves float32 as TF32 on a GPU

from posenc.nn.triton import cope  # noqa: E402  (after the interpreter's setting is known)
from posenc.nn.triton.attention import Tiles  # noqa: E402

SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
# The floors of triton_support.within_reach's bound: the fixed tolerances these tests had.
TOLERANCE = {torch.float32: 2e-5 if exact_float32() else 5e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def reference(q, k, v, table, piece=None):
    """The paper's CoPE attention, written out pair by pair from its formulas: gates, positions counted from the
    query back, the table interpolated between floor and ceil, then softmax. Computed at q's precision: float64
    leaves give the exact reference; the kernel's own the low one (inside at_kernel_precision: float32 products on
    TF32 operands; bf16 scores and P V, but positions, the table and the bias in float32 as the kernel keeps them: a
    bf16 count of dozens of gates keeps no fraction, and its error would be the reference's, not the kernel's).
    -> (output, piece): piece = (floor, ceil, clamped) per pair (B,H,Tq,Tk). Given another run's piece, the formula
    is evaluated on that piece of the interpolation (its linear extension where this run's p falls outside it)."""
    wide = torch.promote_types(q.dtype, torch.float32)
    table = table.to(wide)
    h, tq, tk, dh = q.shape[1], q.shape[2], k.shape[2], q.shape[3]
    k, v = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (k, v))
    z = q @ k.transpose(-1, -2) / dh**0.5  # (B,H,Tq,Tk)
    rows = q.to(wide) @ table.T  # (B,H,Tq,P) = q . e[n], as CoPE.contextual_rows hands them to the kernel
    seen = torch.arange(tk)[None, :] <= torch.arange(tq)[:, None] + (tk - tq)  # query i is key i + Tk - Tq
    # The gates from q . k in float32 as the kernel's product leaves it: from bf16 scores and bf16 sigmoids (a gate
    # near 1 off by up to 2e-3), a position of dozens of gates moves by up to ~0.1 and lands on another piece of the
    # interpolation than the kernel's, which costs a whole slope of dq per pair (after_cache_gqa at the GPU's sizes:
    # 394 of 113,646 unclamped pairs; the kernel's dq 25.5 against the low reference's 6.75 on the H200 and on the
    # interpreter, 2026-11-27; from float32 q . k: 0 pairs, 1.04 against 0.68)
    z_gates = q.to(wide) @ k.to(wide).transpose(-1, -2) / dh**0.5
    gates = torch.where(seen.to(q.device), torch.sigmoid(z_gates), 0.0)
    positions = torch.stack([gates[..., j:].sum(-1, dtype=wide) for j in range(tk)], -1)
    top = table.shape[0] - 1
    if piece is None:
        piece = (positions.clamp(max=top).floor().long(), positions.clamp(max=top).ceil().long(), positions > top)
    low, high, clamped = piece
    positions = torch.where(clamped, float(top), positions)  # past P - 1 gates: the last entry, no gradient
    weight = positions - low  # (B,H,Tq,Tk)
    bias = weight * rows.gather(-1, high) + (1 - weight) * rows.gather(-1, low)  # q . e[p]
    logits = (z + bias).masked_fill(~seen.to(q.device), float("-inf"))
    return SoftmaxTimesValues.apply(logits, v), piece  # the kernel's backward: D = rowsum(dO * O)


CASES = {  # name: (B, H, Hkv, Tq, Tk, Dh, P): P = 3 clamps most pairs (whole tiles past P - 1 gates), 64 none
    "causal_clamped": (1, 2, 2, 33, 33, 16, 3),
    "one_position": (1, 2, 1, 9, 20, 16, 1),
    "decode": (2, 2, 1, 1, 20, 16, 4),
    "after_cache_gqa": (1, 4, 2, 9, 41, 32, 64),
    "causal_gqa_clamped": (1, 4, 1, 33, 33, 16, 6),
    "long_clamped": (1, 2, 1, 70, 70, 16, 4),  # most keys far: past 3 gates, about 6 keys back
}
# float32 GQA after a cache: test_cope_scheme_trains_through_the_kernel (the interpreter's time)
DTYPES = [(case, torch.float32) for case in ("causal_clamped", "one_position", "decode")]
DTYPES += [("after_cache_gqa", torch.bfloat16)]


def inputs(b, h, hkv, tq, tk, dh, positions, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = 2 * torch.randn(b, h, tq, dh, generator=g)  # gates spread over (0, 1)
    k = 2 * torch.randn(b, hkv, tk, dh, generator=g)
    v = torch.randn(b, hkv, tk, dh, generator=g)
    table = torch.randn(positions, dh, generator=g) / 2
    return [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)] + [table.to(DEVICE).requires_grad_()]


def check(case: str, dtype: torch.dtype) -> None:
    b, h, hkv, tq, tk, dh, positions = CASES[case]
    q, k, v, table = inputs(b, h, hkv, tq if tq == 1 else tq * SCALE, tk * SCALE, dh, positions, dtype)
    rows = q.float() @ table.T  # CoPE.contextual_rows: (B,H,Tq,P)
    out = cope.attend_contextual(q, k, v, rows)
    compare(out, [q, k, v, table], dtype, case, torch.Generator().manual_seed(1))


def compare(out, inputs, dtype, what, generator):
    """The kernel's output of inputs (q, k, v, table) and their gradients against the reference in float64 (exact)
    and on the kernel's own inputs (low), by FlashAttention's rule (triton_support.within_reach). The exact one is
    taken on the low one's piece: p's gradient jumps where p crosses an integer (the interpolation's slope) or P - 1,
    and TF32 gates move p by up to about 1e-2, so TF32 and float64 put some pairs on different pieces (the scheme
    case at GPU sizes: 131 of 145k unclamped pairs, none in float32), which costs whole slopes: the H200's dq erred
    by 0.297 against a float64 reference on its own pieces (TF32 emulated on the CPU: the kernel 0.297, the low
    reference 0.293; the same pieces: 0.042 and 0.034)."""
    exact_inputs = twins(inputs)
    with at_kernel_precision():
        low, piece = reference(*inputs)
    exact, _ = reference(*exact_inputs, piece=piece)
    within_reach(out, exact, low, TOLERANCE[dtype], f"{what} output")
    grad = torch.randn(out.shape, generator=generator, dtype=torch.float64).to(DEVICE)
    fast = torch.autograd.grad(out, inputs, grad.to(out.dtype))
    slow = torch.autograd.grad(exact, exact_inputs, grad)
    with at_kernel_precision():
        rough = torch.autograd.grad(low, inputs, grad.to(low.dtype))
    all_within_reach(("dq", "dk", "dv", "dtable"), fast, slow, rough, TOLERANCE[dtype], what)


@pytest.mark.parametrize(("case", "dtype"), DTYPES)
def test_cope_kernel_equals_the_float64_reference_with_gradients(case, dtype):
    check(case, dtype)


def test_tiles_that_differ_per_kernel(monkeypatch):
    """dQ's gated pass sets where the carries are stored and where each query's far keys end (a multiple of its
    key tile, 16 here); its far pass reads those ends with query blocks twice as tall and key tiles twice as wide
    (a tile that some of its queries leave to the gated pass), dK/dV reads the carries with query tiles of another
    height, and the forward walks its own tiles: all equal to the reference."""
    chosen = {"forward": Tiles(32, 16, 1, 1), "dq": Tiles(16, 16, 1, 1), "dq_far": Tiles(32, 32, 1, 1),
              "dkdv": Tiles(32, 16, 1, 1)}
    if INTERPRETED:
        monkeypatch.setattr(cope, "tiles", lambda kernel, *a: chosen[kernel])
    check("long_clamped", torch.float32)


def test_cope_scheme_trains_through_the_kernel(monkeypatch):
    """The dispatch sends CoPE on this device to the Triton kernel, and the table's gradient is the reference's."""
    cfg = tiny_config("cope", n_head=4, d_model=64)
    scheme = build("cope", dataclasses.replace(cfg.dims(), n_kv_head=2), cfg.options)
    holder = torch.nn.Module()
    holder.positions = torch.nn.ModuleList([scheme])
    perturb_scheme_parameters(holder)
    scheme = scheme.to(DEVICE)
    calls = []
    kernel = cope.attend_contextual
    monkeypatch.setattr(cope, "attend_contextual", lambda *a: calls.append(1) or kernel(*a))
    q, k, v, _ = inputs(2, 4, 2, 9 * SCALE, 21 * SCALE, 16, 1, torch.float32, seed=2)
    pos = torch.arange(21 * SCALE, device=DEVICE)[None]
    out = dispatch.attention(q, k, v, scheme, pos[:, -9 * SCALE :], pos, True)
    assert calls, "the dispatch must take the Triton kernel for CoPE here"
    compare(out, [q, k, v, scheme.table], torch.float32, "cope", torch.Generator().manual_seed(3))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_gqa_groups_key_gradients_are_added_in_float32(dtype):
    """triton_support.gqa_group_with_large_partials through CoPE: every head's gates (sigmoid of q . k) and rows
    (q . e[n], the table zero in q's second half) are alike, so dK and dV are within the 16-bit tolerance of the
    float64 reference only where the kernel adds the group's partials in float32 (cope.py's backward). Seed 1: at
    seed 0 bf16 dK erred by 0.0205 against a bound of 0.03, as much as head 3 alone does (0.0185; q = [q0, 0]):
    CoPE's own rounding of dz to bf16, not the group's sum. Measured under the interpreter, error / bound: bf16 dK
    0.0047 / 0.030, dV 0.017 / 0.085; fp16 dK 0.00047 / 0.0050, dV 0.00088 / 0.014; with partials in 16 bits dK
    and dV err by 0.25 (bf16) and 0.031 (fp16)."""
    g = torch.Generator().manual_seed(1)
    t, dh = 16, 16
    q, k, v, dout = gqa_group_with_large_partials(t, dh, dtype, DEVICE, g)
    table = torch.cat((torch.randn(4, dh // 2, generator=g) / 2, torch.zeros(4, dh // 2)), -1).to(DEVICE)  # (P,Dh)
    rows = (q[:, :1].float() @ table.T).expand(-1, 4, -1, -1)  # (1,4,T,P): head 0's for every head, bit for bit
    fast = torch.autograd.grad(cope.attend_contextual(q, k, v, rows), (k, v), dout)
    leaves = twins([q, k, v, table])
    exact, _ = reference(*leaves)
    key_gradients_within(fast, torch.autograd.grad(exact, leaves[1:3], dout.double()), TOLERANCE[dtype],
                         f"CoPE {dtype}")


def test_rows_of_another_shape_are_refused_in_one_line():
    q, k, v, _ = inputs(1, 2, 2, 5, 5, 16, 1, torch.float32)
    with pytest.raises(ValueError, match=r"CoPE rows \(1, 2, 4, 8\)"):
        cope.attend_contextual(q, k, v, torch.zeros(1, 2, 4, 8, device=DEVICE))
