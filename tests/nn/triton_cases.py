"""posenc's Triton kernels equal the reference paths, outputs and gradients: attention with a bias row per head
(every scheme in the registry that offers bias_by_distance, its own parameters' gradients included) and RoPE.

Not collected by `make test` directly: tests/nn/test_triton_kernels.py runs this file in a fresh process, with
TRITON_INTERPRET=1 on a machine without a GPU (tiny shapes: Triton's interpreter runs the kernels on the CPU)
and compiled on a CUDA machine (real sizes). See tests/nn/triton_support.py for why a fresh process.
"""

from __future__ import annotations

import copy
import dataclasses
from contextlib import nullcontext

import pytest
import torch

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT
from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.registry import SCHEMES
from posenc.registry import build as registry_build
from posenc.rotary import _core, _fast
from posenc.scheme import Scheme
from tests.conftest import tiny_config
from tests.nn.triton_support import (
    EMULATE_TF32,
    at_kernel_precision,
    attention_reference,
    exact_float32,
    gqa_group_with_large_partials,
    head_parameter_gradients_given_output,
    kernel_device,
    key_gradients_within,
    twins,
    within_float32_sums,
    within_reach,
)

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device()

from posenc.nn.triton import attention, head_bias, rotary  # noqa: E402  (after the interpreter's setting is known)

DIM = 16 if INTERPRETED else 64  # head dim
SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
DISTANCE = [n for n in posenc.available() if SCHEMES[n].bias_by_distance is not Scheme.bias_by_distance]
ROTARY = [n for n in posenc.available() if SCHEMES[n].rotate is not Scheme.rotate]
# On a GPU the kernel serves float32 only as TF32 (attention.serves_float32), which torch must allow; the low
# references multiply on TF32 operands inside at_kernel_precision (triton_support); the interpreter multiplies exactly.
if not INTERPRETED:
    torch.set_float32_matmul_precision("high")
# The floors of within_reach's bound: the fixed tolerances these tests had.
TOLERANCE = {torch.float32: 2e-5 if exact_float32() else 5e-3, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def close(actual: torch.Tensor, exact: torch.Tensor, low: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """The kernel's error against the float64 reference within FACTOR x the reference's own at the kernel's
    precision (low), and within TOLERANCE[dtype] of the largest value at least."""
    within_reach(actual, exact, low, TOLERANCE[dtype], what)


def inputs(b, h, hkv, tq, tk, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, DIM, generator=g)
    k, v = (torch.randn(b, hkv, tk, DIM, generator=g) for _ in range(2))
    return [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]


def gathered(rows: torch.Tensor, e: torch.Tensor, tq: int, tk: int) -> torch.Tensor:
    """The reference's materialised bias (B,H,Tq,Tk) = rows[h, e[b] - i + j]."""
    index = e[:, None, None] - torch.arange(tq, device=e.device)[:, None] + torch.arange(tk, device=e.device)
    return rows[:, index].transpose(0, 1)


def rows_reference(q, k, v, rows, e, causal):
    """Attention with the materialised bias rows[h, e[b] - i + j], computed in q's dtype: float64 leaves give the
    exact reference, the kernel's own leaves the low one (float32 rows cast to 16 bits with the scores)."""
    return attention_reference(q, k, v, gathered(rows, e, q.shape[2], k.shape[2]), causal)


def check_rows(out, inputs, e, causal, dtype, what, grad=None):
    """The kernel's output of inputs (q, k, v, rows), and with `grad` the gradients of those that need one, against
    rows_reference in float64 (exact) and in the kernel's own dtypes (low)."""
    exact_inputs = twins(inputs)
    exact = rows_reference(*exact_inputs, e, causal)
    with at_kernel_precision():
        low = rows_reference(*inputs, e, causal)
    close(out, exact, low, dtype, f"{what} output")
    if grad is None:
        return
    wanted = [n for n, t in enumerate(inputs) if t.requires_grad]
    names = [("dq", "dk", "dv", "drow")[n] for n in wanted]
    fast = torch.autograd.grad(out, [inputs[n] for n in wanted], grad.to(out.dtype))
    slow = torch.autograd.grad(exact, [exact_inputs[n] for n in wanted], grad.double())
    with at_kernel_precision():
        rough = torch.autograd.grad(low, [inputs[n] for n in wanted], grad.to(low.dtype))
    for name, a, b, c in zip(names, fast, slow, rough, strict=True):
        close(a, b, c, dtype, f"{what} {name}")


CASES = {  # name: (B, H, Hkv, Tq, Tk, causal)
    "causal_17": (2, 4, 4, 17, 17, True),
    "causal_48_gqa": (2, 4, 2, 48, 48, True),
    "encoder_17_gqa": (2, 4, 2, 17, 17, False),
    "encoder_48": (1, 2, 2, 48, 48, False),
    "after_cache": (2, 4, 2, 9, 41, True),
    "decode": (2, 4, 2, 1, 33, True),
    "single_token": (1, 2, 1, 1, 1, True),
}


# float32 in every case; the 16-bit types in two (the interpreter's time). Under the interpreter fp16 runs bf16's code
# but for its loads' and stores' conversions, which after_cache's fp16 case reads as causal_48_gqa's would: that one
# is left to the GPU.
DTYPES = [(case, torch.float32) for case in CASES] + [(case, dtype) for case in ("causal_48_gqa", "after_cache")
                                                      for dtype in (torch.bfloat16, torch.float16)]
if INTERPRETED:
    DTYPES.remove(("causal_48_gqa", torch.float16))


@pytest.mark.parametrize(("case", "dtype"), DTYPES)
def test_row_kernel_equals_materialised_bias_with_gradients(case, dtype):
    b, h, hkv, tq, tk, causal = CASES[case]
    tq, tk = (tq * SCALE, tk * SCALE) if tq > 1 else (tq, tk * SCALE)
    q, k, v = inputs(b, h, hkv, tq, tk, dtype)
    length = tq + tk + 3
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(h, length, generator=g).to(DEVICE).requires_grad_()
    e = torch.tensor([tq + 1, tq + 3][:b], device=DEVICE)  # two rows at different offsets
    out = attention.attend_rows(q, k, v, rows, e, causal)
    check_rows(out, [q, k, v, rows], e, causal, dtype, case, torch.randn(out.shape, generator=g).to(DEVICE))


def test_rows_kept_across_calls_follow_a_change_in_place():
    """The rows as the kernels read them are made once per rows tensor (attention.padded_rows) and made again when
    it changed in place: the second call reads the new rows."""
    q, k, v = inputs(2, 4, 2, 17 * SCALE, 17 * SCALE, torch.float32, seed=3)
    rows = torch.linspace(-3, 3, 4 * 40 * SCALE, device=DEVICE).view(4, -1)
    e = torch.tensor([17 * SCALE + 1], device=DEVICE)
    with torch.no_grad():
        before = attention.attend_rows(q, k, v, rows, e, True)
        rows.mul_(-2.0)
        after = attention.attend_rows(q, k, v, rows, e, True)
        assert torch.equal(after, attention.attend_rows(q, k, v, rows.clone(), e, True))  # as a fresh tensor's
    assert not torch.equal(after, before)


@pytest.mark.parametrize("name", ["relative", "kerple"])
def test_a_scheme_changed_in_place_between_calls_over_the_same_positions(name):
    """What the layers share (rows, their padded form, each batch row's first key) is kept for the positions and
    the parameters of a forward: after an optimizer-like step in place the next call equals a fresh scheme's."""
    scheme = build(name)
    q, k, v = (t.requires_grad_() for t in inputs(2, 4, 2, 9 * SCALE, 9 * SCALE, torch.bfloat16, seed=4))
    pos = torch.arange(9 * SCALE, device=DEVICE)[None]
    first = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    with torch.no_grad():
        for p in scheme.parameters():
            p.mul_(1.5).add_(0.25)
    again = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    twin = copy.deepcopy(scheme)
    fresh = dispatch.fast_attention(q, k, v, twin, pos.clone(), pos.clone(), True)
    assert torch.equal(again, fresh) and not torch.equal(again, first)
    grads = [torch.autograd.grad(out.float().square().sum(), [q, *s.parameters()]) for out, s in ((again, scheme),
                                                                                                  (fresh, twin))]
    for a, b in zip(*grads, strict=True):  # the backward read the new rows (KERPLE: their derivatives too)
        assert torch.equal(a, b)


def test_dropping_the_bias_changes_the_output():
    """The kernel reads the rows: with them zeroed its output moves (a check that can fail)."""
    q, k, v = inputs(1, 2, 2, 17 * SCALE, 17 * SCALE, torch.float32)
    rows = torch.linspace(-3, 3, 2 * 34 * SCALE, device=DEVICE).view(2, -1)
    e = torch.tensor([17 * SCALE], device=DEVICE)
    with torch.no_grad():
        biased = attention.attend_rows(q, k, v, rows, e, True)
        plain = attention.attend_rows(q, k, v, torch.zeros_like(rows), e, True)
        assert (biased - plain).abs().max() > 0.1
        exact = attention_reference(*(t.double() for t in (q, k, v)), None, True)
        close(plain, exact, attention_reference(q, k, v, None, True), torch.float32, "without the bias")


def test_row_gradient_repeats_bit_for_bit():
    """A second run gives the row and key gradients of the first bit for bit: the row gradient's diagonal sums are
    reduced in a fixed order, without atomics, from a buffer whose every entry read is written or zeroed."""
    q, k, v = inputs(2, 4, 2, 33 * SCALE, 33 * SCALE, torch.float32, seed=3)
    rows = torch.randn(4, 70 * SCALE, device=DEVICE, requires_grad=True)
    e = torch.tensor([33 * SCALE, 33 * SCALE + 2], device=DEVICE)
    first, again = (torch.autograd.grad(attention.attend_rows(q, k, v, rows, e, True).square().sum(), [rows, k])
                    for _ in range(2))
    for a, b in zip(again, first, strict=True):
        assert torch.equal(a, b)


def test_row_gradient_summed_over_every_distance_is_zero(monkeypatch):
    """Each query's dS = P (dP - D) sums to 0 (D = rowsum(P dP) = rowsum(dO O)), so the row gradient summed over
    every distance is exactly 0 and the kernel's sum stays within reach of the low reference's. With TF32 the
    kernel must round what the tensor cores would truncate (attention_kernels._nearest_tf32, attention.
    output_gradient_and_delta): truncated, its sums drifted to -0.04..-0.07 per head here against the low
    reference's -0.006..+0.003, and KERPLE's parameters, which take their gradient from those rows, with them."""
    gpu_tiles(monkeypatch)
    t = 80 * SCALE
    q, k, v = inputs(1, 4, 2, t, t, torch.float32, seed=9)
    distance = (torch.arange(2 * t + 3, device=DEVICE) - t).abs().float()
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)[:, None]
    rows = (-slopes * torch.log1p(0.8 * distance)).requires_grad_()  # (H,S): KERPLE's log kernel's shape
    e = torch.tensor([t], device=DEVICE)
    (drow,) = torch.autograd.grad(attention.attend_rows(q, k, v, rows, e, True).square().sum(), [rows])
    with at_kernel_precision():
        (low,) = torch.autograd.grad(rows_reference(q, k, v, rows, e, True).square().sum(), [rows])
    exact = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    close(drow.sum(-1), exact, low.sum(-1), torch.float32, "row gradient's sum")


def build(name: str, causal: bool = True):
    cfg = tiny_config(name, n_head=4, d_model=4 * DIM)
    torch.manual_seed(0)
    scheme = registry_build(name, dataclasses.replace(cfg.dims(), causal=causal, n_kv_head=2), cfg.options)
    holder = torch.nn.Module()
    holder.positions = torch.nn.ModuleList([scheme])
    perturb_scheme_parameters(holder)
    return scheme.to(DEVICE)


LAYOUTS = {"causal": (17, 17, True), "after_cache": (9, 30, True), "encoder": (17, 17, False)}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", DISTANCE)
def test_every_distance_scheme_trains_through_the_kernel(name, layout, monkeypatch):
    """row_paths picks the Triton kernel, and the scheme's own parameters get the reference's gradients."""
    tq, tk, causal = LAYOUTS[layout]
    tq, tk = tq * SCALE, tk * SCALE
    if not causal and not SCHEMES[name].supports_bidirectional:
        pytest.skip(f"{name} serves causal stacks only")
    scheme = build(name, causal)
    calls = []
    kernel = attention.attend_rows
    monkeypatch.setattr(attention, "attend_rows", lambda *a: calls.append(1) or kernel(*a))
    q, k, v = inputs(2, 4, 2, tq, tk, torch.float32, seed=2)
    k_pos = (torch.arange(tk) + 5).expand(2, tk).to(DEVICE)
    q_pos = k_pos[:, tk - tq:]
    fast = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, causal)
    assert calls, "the Triton kernel must serve rows per head"
    exact, exact_inputs = scheme_reference(scheme, q, k, v, q_pos, k_pos, causal, torch.float64)
    with at_kernel_precision():
        low, low_inputs = scheme_reference(scheme, q, k, v, q_pos, k_pos, causal, torch.float32)
    close(fast, exact, low, torch.float32, "output")
    params = [p for p in scheme.parameters() if p.requires_grad]
    grad = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters() if p.requires_grad)]
    with at_kernel_precision():
        rough = torch.autograd.grad(low, low_inputs, grad)
    for what, a, b, c in zip(names, torch.autograd.grad(fast, [q, k, v, *params], grad),
                             torch.autograd.grad(exact, exact_inputs, grad.double()), rough, strict=True):
        close(a, b, c, torch.float32, f"{name} {what}")


def scheme_reference(scheme, q, k, v, q_pos, k_pos, causal, dtype):
    """Attention with the scheme's own materialised bias: float64 (a copy of the scheme and of q, k, v: the exact
    reference) or float32 (the scheme itself: the low one) -> (output, its leaves: q, k, v, learnable parameters)."""
    leaves = [q, k, v]
    if dtype == torch.float64:
        scheme, leaves = copy.deepcopy(scheme).double(), twins(leaves)
    params = [p for p in scheme.parameters() if p.requires_grad]
    out = attention_reference(*leaves, scheme.bias(q_pos, k_pos, *leaves[:2]), causal)
    return out, [*leaves, *params]


def test_positions_given_once_for_the_whole_batch():
    """(1,T) positions with a batch of 3: the kernel reads one key offset per batch row (a (1,) offset was
    read past its end)."""
    t = 24 * SCALE
    scheme = build("alibi", True)
    q, k, v = inputs(3, 4, 4, t, t, torch.float32, seed=5)
    pos = (torch.arange(t) + 5)[None].to(DEVICE)
    fast = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    exact, _ = scheme_reference(scheme, q, k, v, pos, pos, True, torch.float64)
    with at_kernel_precision():
        low, _ = scheme_reference(scheme, q, k, v, pos, pos, True, torch.float32)
    close(fast, exact, low, torch.float32, "output")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_kernel_equals_the_plain_formula_both_ways(interleaved, dtype):
    g = torch.Generator().manual_seed(4)
    t = 7 * SCALE
    x = torch.randn(2, t, 4, DIM + 8, generator=g).transpose(1, 2).to(DEVICE, dtype)  # strided like a projection
    pos = torch.randint(0, 5000, (2, t), generator=g).sort(-1).values
    cos, sin = (c.to(DEVICE) for c in _core.cos_sin(pos, _core.inv_frequencies(DIM, 10000.0)))  # R = DIM < Dh
    out = rotary.rotate(x, cos, sin, interleaved)
    exact_x, exact_cos, exact_sin = (t.double() for t in (x, cos, sin))
    low_cos, low_sin = cos.to(dtype), sin.to(dtype)
    low = _core.apply_rotary_autograd(x, low_cos, low_sin, interleaved)
    close(out, _core.apply_rotary_autograd(exact_x, exact_cos, exact_sin, interleaved), low, dtype, "rotated")
    back = rotary.rotate(out, cos, sin, interleaved, sign=-1.0)
    close(back, exact_x, _core.apply_rotary_autograd(low, low_cos, -low_sin, interleaved), dtype, "rotated back")
    in_place = x.clone()
    rotary.rotate(in_place, cos, sin, interleaved, out=in_place)
    assert torch.equal(in_place, out)


@pytest.mark.skipif(INTERPRETED, reason="the interpreter's fma rounds twice (numpy); a GPU's rounds once")
@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_kernel_rounds_as_torchs_mul_then_addcmul(interleaved):
    """float32 on the GPU: every bit of the kernel's rotation equals the eager kernel's (torch's mul, then addcmul:
    one fma) and so a mapped decode step's Turns': a key rotated with the prompt and by a decode step is one key."""
    g = torch.Generator().manual_seed(6)
    x = (40 * torch.randn(2, 4, 9 * SCALE, DIM, generator=g)).to(DEVICE)
    pos = torch.randint(0, 100_000, (2, 9 * SCALE), generator=g)
    cos, sin = (c.to(DEVICE) for c in _core.cos_sin(pos, _core.inv_frequencies(DIM, 10000.0)))
    for sign in (1.0, -1.0):
        assert torch.equal(rotary.rotate(x, cos, sin, interleaved, sign=sign),
                           _core._eager(x, cos, sin, interleaved, sign))


@pytest.mark.parametrize("name", ROTARY)
def test_rotary_schemes_take_the_kernel_with_gradients(name, monkeypatch):
    cfg = tiny_config(name, n_head=4, d_model=4 * DIM, rotary_percentage=0.5)
    scheme = registry_build(name, cfg.dims(), cfg.options).to(DEVICE)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 7 * SCALE, 4, DIM, generator=g).transpose(1, 2).to(DEVICE).requires_grad_()
    k = torch.randn(2, 4, 7 * SCALE, DIM, generator=g).to(DEVICE).requires_grad_()
    pos = torch.randint(0, 5000, (2, 7 * SCALE), generator=g).sort(-1).values.to(DEVICE)
    calls = []
    kernel = rotary.rotate
    monkeypatch.setattr(rotary, "rotate", lambda *a, **kw: calls.append(1) or kernel(*a, **kw))
    monkeypatch.setattr(_fast, "rotate_native", lambda *a: None)  # the CPU kernel would serve first here
    results = []
    exact_scheme = copy.deepcopy(scheme).double()
    for use_kernel, twin, (q_in, k_in) in ((True, scheme, (q, k)), (False, exact_scheme, twins([q, k])),
                                           (False, scheme, (q, k))):  # the kernel, the exact, the low
        monkeypatch.setattr(_fast, "triton_fits", lambda *a, on=use_kernel, f=_fast.triton_fits: on and f(*a))
        twin._memo = None
        qr, kr = twin.rotate(q_in, k_in, pos, pos)
        results.append((qr, kr, *torch.autograd.grad((qr * 1.5 + kr).sum(), [q_in, k_in])))
    assert calls, "the Triton kernel must rotate on this device"
    for what, a, b, c in zip(("q", "k", "dq", "dk"), *results, strict=True):
        close(a, b, c, torch.float32, f"{name} {what}")


@pytest.mark.parametrize("name", ["kerple", "rope", "fire"])  # fire: its pieces shared by the layers, once per forward
def test_model_with_triton_kernels_equals_model_without(name, monkeypatch):
    """End to end: logits and every gradient of a tiny GPT with the Triton kernels on, against the model without
    them in float64 (exact) and in float32 (low)."""
    tokens = torch.randint(0, 61, (2, 24 * SCALE), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    results = []
    for use_kernels, dtype in ((True, torch.float32), (False, torch.float64), (False, torch.float32)):
        low_precision = at_kernel_precision() if (use_kernels, dtype) == (False, torch.float32) else nullcontext()
        monkeypatch.setattr(gpu, "serves", lambda *t, on=use_kernels, f=gpu.serves: on and f(*t))
        monkeypatch.setattr(_fast, "rotate_native", lambda *a, on=use_kernels, f=_fast.rotate_native: None if on
                            else f(*a))
        torch.manual_seed(0)
        # two layers (FIRE's pieces and KERPLE's rows made once per forward, shared by both), two heads
        model = GPT(tiny_config(name, n_head=2, d_model=2 * DIM, max_seq_len=64 * SCALE)).to(DEVICE).train()
        perturb_scheme_parameters(model)
        model = model.to(dtype)
        with low_precision:  # the low model: every float32 product on TF32 operands
            logits = model(tokens)
            results.append((logits, torch.autograd.grad(logits.square().mean(), list(model.parameters()),
                                                        allow_unused=True)))
    (fast, fast_grads), (exact, exact_grads), (low, low_grads) = results
    close(fast, exact, low, torch.float32, "logits")
    names = [n for n, _ in model.named_parameters()]
    for what, a, b, c in zip(names, fast_grads, exact_grads, low_grads, strict=True):
        if a is not None or b is not None:
            close(a, b, c, torch.float32, f"d{what}")


# --- The GPU's own settings, on the interpreter: its tiles, head dims 64-128, GQA 4:1, a cache offset ---------

def gpu_tiles(monkeypatch):
    """Force the tiles a GPU launches (TILES) instead of the interpreter's 16 x 16."""
    monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype: attention.gpu_tiles(
        kernel, head_dim, torch.bfloat16 if DEVICE == "cpu" else dtype))  # the interpreter: 16-bit tiles on fp32


GPU_CASES = {  # name: (B, H, Hkv, Tq, Tk, causal): ragged against every tile of the table, two query blocks
    "causal_gqa_4to1": (1, 4, 1, 200, 200, True),
    "after_cache_gqa_4to1": (2, 4, 1, 70, 261, True),
    "encoder": (1, 2, 2, 150, 150, False),
}


# Dh 64 and 128 in every case (their dK/dV tiles differ: 64 x 128 and 32 x 128); 80 and 96 padded to 128 and masked
# (EVEN_D false). Under the interpreter, which runs what a launch computes, not registers, 96 takes 80's tiles and
# loops, and causal_gqa_4to1 at 128 takes 80's tiles with the unmasked loads that the other cases at 128 take: both
# left to the GPU (about 6 s of the interpreter's).
GPU_HEAD_DIMS = [(case, dim) for case in GPU_CASES for dim in (64, 128)] + [("causal_gqa_4to1", 80),
                                                                              ("causal_gqa_4to1", 96)]
if INTERPRETED:
    GPU_HEAD_DIMS = [c for c in GPU_HEAD_DIMS if c not in (("causal_gqa_4to1", 96), ("causal_gqa_4to1", 128))]


@pytest.mark.parametrize(("case", "head_dim"), GPU_HEAD_DIMS)
def test_gpu_tiles_equal_the_float64_reference_with_gradients(case, head_dim, monkeypatch):
    gpu_tiles(monkeypatch)
    b, h, hkv, tq, tk, causal = GPU_CASES[case]
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(b, h, tq, head_dim, generator=g).to(DEVICE).requires_grad_()
    k, v = (torch.randn(b, hkv, tk, head_dim, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    rows = torch.randn(h, tq + tk + 3, generator=g).to(DEVICE).requires_grad_()
    e = torch.tensor([tq + 1, tq + 3][:b], device=DEVICE)
    out = attention.attend_rows(q, k, v, rows, e, causal)
    check_rows(out, [q, k, v, rows], e, causal, torch.float32, f"{case} Dh={head_dim}",
               torch.randn(out.shape, generator=g).to(DEVICE))


def test_gpu_tiles_without_the_row_gradient(monkeypatch):
    """dQ without the row gradient runs other tiles (dq, 128 x 32) than with it (dq_rows): both equal."""
    gpu_tiles(monkeypatch)
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 4, 190, 64, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    rows = torch.randn(4, 400, generator=g).to(DEVICE)
    e = torch.tensor([191], device=DEVICE)
    out = attention.attend_rows(q, k, v, rows, e, True)
    grad = torch.randn(out.shape, generator=g).to(DEVICE)
    check_rows(out, [q, k, v, rows], e, True, torch.float32, "without drow", grad)


@pytest.mark.parametrize("name", ["kerple", "relative", "fire"])
def test_repeated_forward_backward_with_one_positions_tensor(name, monkeypatch):
    """The crash of the GPU benchmark's warm-up: fwd+bwd twice with one positions tensor and unchanged learnable
    parameters ('backward through the graph a second time'); each time the reference's gradients."""
    gpu_tiles(monkeypatch)
    scheme = build(name)
    t = 80
    q, k, v = inputs(1, 4, 2, t, t, torch.float32, seed=9)
    pos = torch.arange(t, device=DEVICE)[None]
    params = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
    assert len(params) > 3, f"{name} must have learnable parameters for this test"
    out, leaves = scheme_reference(scheme, q, k, v, pos, pos, True, torch.float64)
    exact = torch.autograd.grad(out.square().sum(), leaves)
    with at_kernel_precision():
        out, leaves = scheme_reference(scheme, q, k, v, pos, pos, True, torch.float32)
        low = torch.autograd.grad(out.square().sum(), leaves)
    for _ in range(2):
        grads = torch.autograd.grad(dispatch.fast_attention(q, k, v, scheme, pos, pos, True).square().sum(), params)
        names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters() if p.requires_grad)]
        for what, a, b, c in zip(names, grads, exact, low, strict=True):
            close(a, b, c, torch.float32, f"{name} {what}")


@pytest.mark.parametrize("name", ["kerple"])
def test_model_under_bf16_autocast_equals_float32(name, monkeypatch):
    """A tiny GPT under bf16 autocast takes the kernel (bf16 q, k, v; KERPLE's training: the head-parameter path,
    head_bias.attend_head_bias) at the GPU's tiles; its logits and gradients are as near the float64 model without
    the kernels as that model under bf16 autocast is (low)."""
    gpu_tiles(monkeypatch)
    calls, head_calls = [], []
    for module, function in ((attention, "attend_rows"), (head_bias, "attend_head_bias")):
        kernel = getattr(module, function)
        monkeypatch.setattr(module, function, lambda *a, kernel=kernel: calls.append(a[0].dtype) or kernel(*a))
    head_kernel = head_bias.attend_head_bias

    def recorded(q, k, v, *rest):  # each head-kernel call's q, k, v, output and (in the backward) dO
        out = head_kernel(q, k, v, *rest)
        head_calls.append(call := [q, k, v, out])
        out.register_hook(call.append)
        return out

    monkeypatch.setattr(head_bias, "attend_head_bias", recorded)
    # one batch row (two rows read the same positions at these tiles as one does; the kernels' batch rows and the
    # parameters' sums over them: triton_head_bias_cases.py), four heads of Dh 64, two layers, T = 150: two query
    # blocks of the GPU's tiles, the last ragged
    tokens = torch.randint(0, 61, (1, 150), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    torch.manual_seed(0)
    model = GPT(tiny_config(name, d_model=4 * 64, max_seq_len=256)).to(DEVICE).train()
    perturb_scheme_parameters(model)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        fast = model(tokens).float()
    fast_grads = torch.autograd.grad(fast.square().mean(), list(model.parameters()), allow_unused=True)
    assert calls and set(calls) == {torch.bfloat16}, "the kernel must serve bf16 under autocast"
    assert len(head_calls) == model.cfg.n_layer, "the head kernel must serve KERPLE's training call in each layer"
    scheme_gradients_given_outputs(model, fast_grads, head_calls, tokens.shape[1])
    monkeypatch.setattr(gpu, "serves", lambda *t: False)
    exact_model = copy.deepcopy(model).double()
    exact = exact_model(tokens)
    exact_grads = torch.autograd.grad(exact.square().mean(), list(exact_model.parameters()), allow_unused=True)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        low = model(tokens).float()
    low_grads = torch.autograd.grad(low.square().mean(), list(model.parameters()), allow_unused=True)
    close(fast, exact, low, torch.bfloat16, "logits")
    for (what, _), a, b, c in zip(model.named_parameters(), fast_grads, exact_grads, low_grads, strict=True):
        if a is not None and b is not None:
            close(a, b, c, torch.bfloat16, f"d{what}")


def scheme_gradients_given_outputs(model, fast_grads, head_calls, length: int) -> None:
    """The model's scheme parameters' gradients (KERPLE's b, a, p) are the sums over its head-kernel calls of the
    float64 backward given each call's own output (triton_support.head_parameter_gradients_given_output: bf16's D
    alone moves KERPLE's b by 17% of its gradient here, beyond the bf16 tolerance's reach at gradients of 1e-3),
    within float32's sums: a derivative row scaled or read from another head shows."""
    (scheme,) = [m for m in model.modules() if isinstance(m, Scheme)]  # one, shared by the layers
    pos = torch.arange(length, device=DEVICE)[None]
    per_call = [head_parameter_gradients_given_output(scheme, q, k, v, pos, pos, True, out, dout)
                for q, k, v, out, dout in head_calls]
    fast = dict(zip(model.parameters(), fast_grads, strict=True))  # keyed by the parameter itself
    learned = [(name, p) for name, p in scheme.named_parameters() if p.requires_grad]
    for n, (name, param) in enumerate(learned):
        reference, size = (sum(call[n][i] for call in per_call) for i in range(2))
        within_float32_sums(fast[param], reference, size, f"d{name} given the kernel's outputs")


def test_float32_runs_here_only_as_tf32_where_torch_allows_it(monkeypatch):
    """fp32 never takes the non-tensor-core dot: the kernel serves it as TF32 where torch allows TF32 for its own
    matmuls and Dh <= 128; otherwise the exact float32 paths do. The interpreter multiplies exactly."""
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "highest")  # torch's default
    assert not attention.serves_float32(64, interpreted=False)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: "high")
    assert attention.serves_float32(128, interpreted=False) and not attention.serves_float32(256, interpreted=False)
    assert attention.precision(torch.float32, interpreted=False) == "tf32"
    if not EMULATE_TF32:  # the emulation tells the kernels their products are TF32 (triton_support)
        assert attention.precision(torch.float32, interpreted=True) == "ieee"
    assert attention.serves_float32(256, interpreted=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_gqa_groups_key_gradients_are_added_in_float32(dtype):
    """triton_support.gqa_group_with_large_partials through the row kernel, one bias row for every head: the kernel
    adds the heads' partials in float32 and rounds once (key_gradients). Measured under the interpreter, error /
    bound: bf16 dK 0.0069 / 0.031, dV 0.016 / 0.106; fp16 dK 0.00055 / 0.0051, dV 0.00088 / 0.018; with partials
    in 16 bits dK errs by 0.375 and 0.047, dV by 0.5 and 0.063."""
    g = torch.Generator().manual_seed(0)
    t = 16
    q, k, v, dout = gqa_group_with_large_partials(t, DIM, dtype, DEVICE, g)
    row = torch.randn(1, 2 * t - 1, generator=g).expand(4, -1).contiguous().to(DEVICE)  # one row for every head
    ends = torch.tensor([t - 1], device=DEVICE)
    fast = torch.autograd.grad(attention.attend_rows(q, k, v, row, ends, True), (k, v), dout)
    leaves = twins([q, k, v])
    exact = torch.autograd.grad(rows_reference(*leaves, row.double(), ends, True), leaves[1:], dout.double())
    key_gradients_within(fast, exact, TOLERANCE[dtype], f"rows {dtype}")


def _pairs(x: torch.Tensor, generator: torch.Generator, opposite: bool = False) -> torch.Tensor:
    """(1,1,N,Dh) -> (1,1,2N,Dh): each row followed by a twin, the row plus 0.05 noise (keys or queries of nearly
    equal scores), or minus the row where opposite (values or dO)."""
    twin = -x if opposite else x + 0.05 * torch.randn(x.shape, generator=generator)
    return torch.stack((x, twin), 3).flatten(2, 3)


def test_fp16_probabilities_are_rounded_to_fp16_not_bf16():
    """fp16 attention rounds P to fp16 before P V and P^T dO (attention_kernels._fold_values, _dkdv): keys in
    pairs of nearly equal scores with opposite values (v_2m+1 = -v_2m = +-8) make every output a difference of
    nearly equal terms, and queries in such pairs with opposite dO (+-4) every dV the same, so their sizes are
    about 1 while each term's rounding is not: P rounded to bf16 (8 bits against fp16's 11) errs by 8x fp16's.
    Measured under the interpreter, error / bound: output 0.00092 / 0.005, dV 0.0019 / 0.005; with P in bf16 (in
    _fold_values, in _dkdv) 0.0146 and 0.0160. The fixed tolerance, not within_reach's bound: its fp16 low
    reference (scores and softmax in fp16) errs by 0.0029 on both (CPU), and 3x that leaves bf16's P less room."""
    g = torch.Generator().manual_seed(0)
    tq, tk = 16, 4
    q, k = (_pairs(torch.randn(1, 1, t // 2, 16, generator=g), g) for t in (tq, tk))
    v, dout = (_pairs(size * (2 * torch.randint(0, 2, (1, 1, t // 2, 16), generator=g) - 1.0), g, opposite=True)
               for size, t in ((8, tk), (4, tq)))
    q, k, v = (x.to(DEVICE, torch.float16).requires_grad_() for x in (q, k, v))
    rows, e = torch.zeros(1, tq + tk - 1, device=DEVICE), torch.tensor([tq - 1], device=DEVICE)
    out = attention.attend_rows(q, k, v, rows, e, False)
    leaves = twins([q, k, v])
    exact = rows_reference(*leaves, rows.double(), e, False)
    dout = dout.to(DEVICE, torch.float16)
    fast, slow = (torch.autograd.grad(o, x, d) for o, x, d in ((out, v, dout), (exact, leaves[2], dout.double())))
    for name, actual, x in (("output", out, exact), ("dv", fast[0], slow[0])):
        error, bound = (actual.double() - x).abs().max().item(), TOLERANCE[torch.float16] * max(1, x.abs().max().item())
        assert error <= bound, f"fp16 {name}: max error {error:.3g} > {bound:.3g} (P rounded to bf16?)"


def test_rows_that_do_not_cover_the_span_are_not_needed_past_the_padding(monkeypatch):
    """The kernels read the bias unmasked from rows padded on both sides: a row buffer exactly as long as the
    span (S = Tq + Tk - 1 for full attention) serves, and changing the padding's values changes nothing."""
    gpu_tiles(monkeypatch)
    g = torch.Generator().manual_seed(12)
    tq = tk = 130
    q, k, v = (torch.randn(1, 2, tq, 64, generator=g).to(DEVICE) for _ in range(3))
    rows = torch.randn(2, tq + tk - 1, generator=g).to(DEVICE)
    e = torch.tensor([tq - 1], device=DEVICE)
    with torch.no_grad():
        out = attention.attend_rows(q, k, v, rows, e, False)
        check_rows(out, [q, k, v, rows], e, False, torch.float32, "padding")
        padded = attention._padded_rows
        monkeypatch.setattr(attention, "_padded_rows", lambda r, pad: _poisoned(padded(r, pad), pad))
        assert torch.equal(attention.attend_rows(q, k, v, rows, e, False), out)


def _poisoned(view_and_stride, pad):
    view, stride = view_and_stride
    full = torch.as_strided(view, (view.shape[0], stride), (stride, 1), view.storage_offset() - pad)
    full[:, :pad] = 1e4  # finite, large: any read of the padding for a valid pair would show
    full[:, stride - pad:] = 1e4
    return view, stride


def test_rope_kernel_heads_on_the_grid_partial_rotation_in_place():
    """RoPE with R < Dh in place (the dims past R untouched) and out of place (copied), both pairings."""
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 37, 96, generator=g).to(DEVICE)
    pos = torch.arange(37)[None].expand(2, -1)
    cos, sin = (c.to(DEVICE) for c in _core.cos_sin(pos, _core.inv_frequencies(48, 10000.0)))  # R = 48
    for interleaved in (False, True):
        exact = _core.apply_rotary_autograd(*(t.double() for t in (x, cos, sin)), interleaved)
        low = _core.apply_rotary_autograd(x, cos, sin, interleaved)
        close(rotary.rotate(x, cos, sin, interleaved), exact, low, torch.float32, "out of place")
        in_place = x.clone()
        rotary.rotate(in_place, cos, sin, interleaved, out=in_place)
        close(in_place, exact, low, torch.float32, "in place")
        assert torch.equal(in_place[..., 48:], x[..., 48:])


@pytest.mark.skipif(INTERPRETED, reason="real sizes: on a GPU only (make gpu-check)")
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("length", [2048, 8192])
def test_real_sizes_bf16_gqa_on_the_gpu(head_dim, length):
    """The compiled kernels at the sizes training uses: bf16, GQA 4:1, causal, against the float64 reference
    computed from the same bf16 inputs (a (B,H,T,T) float64 tensor: 4 GB at 8k) and the same one in bf16."""
    g = torch.Generator().manual_seed(length + head_dim)
    q = torch.randn(1, 8, length, head_dim, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
    k, v = (torch.randn(1, 2, length, head_dim, generator=g).to(DEVICE, torch.bfloat16).requires_grad_()
            for _ in range(2))
    rows = (-0.01 * torch.arange(2 * length, dtype=torch.float32)).flip(0).repeat(8, 1).to(DEVICE).requires_grad_()
    e = torch.tensor([length - 1], device=DEVICE)
    out = attention.attend_rows(q, k, v, rows, e, True)
    check_rows(out, [q, k, v, rows], e, True, torch.bfloat16, f"T={length} Dh={head_dim}",
               torch.randn(out.shape, generator=g).to(DEVICE))


def test_rows_for_other_heads_are_refused_in_one_line():
    q, k, v = inputs(1, 4, 2, 17, 17, torch.float32)
    e = torch.tensor([16], device=DEVICE)
    for rows in (torch.zeros(8, 40, device=DEVICE), torch.zeros(2, 40, device=DEVICE),
                 torch.zeros(4, 40, dtype=torch.long, device=DEVICE)):
        with pytest.raises(ValueError, match="rows"):
            attention.attend_rows(q, k, v, rows, e, True)
