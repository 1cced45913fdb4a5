"""The Triton path for a bias whose row per head reads its own head's parameters only (Scheme.head_bias: KERPLE,
posenc/nn/triton/head_bias.py) equals the float64 reference: attention with KERPLE's own dense bias, outputs and the
gradients of q, k, v and of every KERPLE parameter (log kernel with p learned and fixed, power kernel), which the
dQ kernel sums per tile as dS times the rows' derivatives.

Not collected by `make test` directly: tests/nn/test_triton_scheme_kernels.py runs this file with the others in one
fresh process (TRITON_INTERPRET=1 without a GPU: tiny shapes; compiled on a CUDA machine at real ones).
"""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.bias.kerple import KERPLE
from posenc.nn import dispatch, row_paths
from posenc.nn import triton as gpu
from posenc.nn.call import Call
from posenc.scheme import Dims
from tests.nn.triton_support import (
    at_kernel_precision,
    attention_reference,
    exact_float32,
    head_parameter_gradients_given_output,
    kernel_device,
    twins,
    within_float32_sums,
    within_reach,
)

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device()

from posenc.nn.triton import attention, head_bias  # noqa: E402  (after the interpreter's setting)

SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
if not INTERPRETED:
    torch.set_float32_matmul_precision("high")  # float32 runs as TF32 on a GPU (attention.serves_float32)
# The floors of triton_support.within_reach's bound, as triton_cases.py's.
TOLERANCE = {torch.float32: 2e-5 if exact_float32() else 5e-3, torch.bfloat16: 3e-2}
# KERPLE's parameters in bf16: each gradient adds dS over every pair, where each query's dS sums to 0 only up to
# bf16's rounding (triton_pieces_cases.py's floor for FIRE's). Measured under the interpreter, log kernel, causal_gqa
# seed 4: dkerple_b errs by 0.273 (|exact| up to 7.93) in this kernel and in triton_rows' diagonal sums alike (the
# same to three digits in all six parameters of two seeds and both kernels), the bf16 reference by 0.093.
PARAMETER_TOLERANCE_BF16 = 6e-2
VARIANTS = {"log": dict(kerple_kernel="log"), "log_p_fixed": dict(kerple_kernel="log", kerple_learn_p=False),
            "power": dict(kerple_kernel="power")}
LAYOUTS = {"causal_gqa": (2, 4, 2, 16, 21, 21, True), "after_cache": (2, 4, 4, 16, 9, 30, True),
           "encoder": (1, 4, 2, 32, 17, 17, False)}  # (B, H, Hkv, Dh, Tq, Tk, causal)


def kerple(variant: str, dim: int) -> KERPLE:
    """KERPLE with b, a, p spread over their domain per head (every derivative's term seen)."""
    scheme = KERPLE(Dims(d_model=4 * dim, n_head=4, head_dim=dim, max_seq_len=1024, n_kv_head=2), **VARIANTS[variant])
    with torch.no_grad():
        scheme.kerple_b.copy_(torch.tensor([0.5, 0.25, 0.8, 0.1]))
        if variant != "power":
            scheme.kerple_a.copy_(torch.tensor([0.5, 1.2, 2.0, 0.9]))
        if variant != "log_p_fixed":
            scheme.kerple_p.copy_(torch.tensor([0.6, 1.0, 1.4, 1.9]))
    return scheme.to(DEVICE)


def inputs(layout: str, dtype: torch.dtype, seed: int = 0):
    b, h, hkv, dim, tq, tk, causal = LAYOUTS[layout]
    tq, tk = tq * SCALE, tk * SCALE
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, dim, generator=g)
    k, v = (torch.randn(b, hkv, tk, dim, generator=g) for _ in range(2))
    k_pos = (torch.arange(tk) + 3 + 2 * torch.arange(b)[:, None]).to(DEVICE)  # two batch rows at other offsets
    q_pos = k_pos[:, tk - tq:]
    qkv = [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]
    return qkv, q_pos, k_pos, causal, torch.randn(b, h, tq, dim, generator=g).to(DEVICE)


def reference(scheme, q, k, v, q_pos, k_pos, causal, exact: bool):
    """Attention with KERPLE's own materialised bias (Scheme.bias): float64 on copies (exact) or in the kernel's
    dtypes (low) -> (output, its leaves: q, k, v, the learnable parameters)."""
    leaves = [q, k, v]
    if exact:
        scheme, leaves = copy.deepcopy(scheme).double(), twins(leaves)
    params = [p for p in scheme.parameters() if p.requires_grad]
    return attention_reference(*leaves, scheme.bias(q_pos, k_pos), causal), [*leaves, *params]


def check(scheme, fast, qkv, q_pos, k_pos, causal, grad, dtype, what) -> tuple[torch.Tensor, ...]:
    exact, exact_leaves = reference(scheme, *qkv, q_pos, k_pos, causal, True)
    with at_kernel_precision():
        low, low_leaves = reference(scheme, *qkv, q_pos, k_pos, causal, False)
    floor = TOLERANCE[dtype]
    within_reach(fast, exact, low, floor, f"{what} output")
    params = [p for p in scheme.parameters() if p.requires_grad]
    names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters() if p.requires_grad)]
    with at_kernel_precision():
        rough = torch.autograd.grad(low, low_leaves, grad.to(low.dtype))
    kernels = torch.autograd.grad(fast, [*qkv, *params], grad.to(fast.dtype))
    for name, a, b, c in zip(names, kernels, torch.autograd.grad(exact, exact_leaves, grad.double()), rough,
                             strict=True):
        wide = name not in ("dq", "dk", "dv") and dtype == torch.bfloat16
        within_reach(a, b, c, PARAMETER_TOLERANCE_BF16 if wide else floor, f"{what} {name}")
    return kernels[3:]  # the parameters' gradients


# Every variant in causal_gqa (GQA, two batch rows at other offsets); the log kernel, whose three parameters all
# learn, in every layout; the power kernel in the encoder too (a second layout for the second formula). The host
# builds rows and derivatives from |distance| per variant, the kernel masks per layout: under the interpreter the
# other pairs repeat a layout's masking with a variant's rows already checked (log_p_fixed: log's rows and
# derivatives, p held fixed; after_cache: distances up to 29, causal_gqa's up to 20). The GPU runs all nine.
VARIANT_LAYOUTS = [(variant, layout) for variant in VARIANTS for layout in LAYOUTS]
if INTERPRETED:
    VARIANT_LAYOUTS = [(v, lay) for v, lay in VARIANT_LAYOUTS
                       if lay == "causal_gqa" or v == "log" or (v, lay) == ("power", "encoder")]


@pytest.mark.parametrize(("variant", "layout"), VARIANT_LAYOUTS)
def test_every_kerple_parameter_gets_the_float64_gradient_from_the_head_kernel(variant, layout, monkeypatch):
    """row_paths.triton_head_bias (the head kernel, in float32 here: the dispatch sends 16-bit types to it) against
    KERPLE's dense bias in float64, every learnable parameter's gradient included."""
    scheme = kerple(variant, LAYOUTS[layout][3])
    qkv, q_pos, k_pos, causal, grad = inputs(layout, torch.float32)
    calls = []
    kernel = head_bias.attend_head_bias
    monkeypatch.setattr(head_bias, "attend_head_bias", lambda *a: calls.append(1) or kernel(*a))
    fast = row_paths.triton_head_bias(Call(*qkv, scheme, q_pos, k_pos, causal, 0.0, True))
    assert calls, "the head kernel must serve KERPLE's training call"
    check(scheme, fast, qkv, q_pos, k_pos, causal, grad, torch.float32, f"{variant} {layout}")


@pytest.mark.parametrize("variant", ["log", "power"])
def test_the_dispatch_trains_kerple_in_bf16_through_the_head_kernel(variant, monkeypatch):
    """bf16 with a gradient: the plan's triton_head_bias serves (not triton_rows); float32 keeps triton_rows."""
    scheme = kerple(variant, 16)
    used = []
    for module, name in ((head_bias, "attend_head_bias"), (attention, "attend_rows")):
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, kernel=kernel, name=name: used.append(name) or kernel(*a))
    qkv, q_pos, k_pos, causal, grad = inputs("causal_gqa", torch.bfloat16, seed=4)
    fast = dispatch.fast_attention(*qkv, scheme, q_pos, k_pos, causal)
    assert used == ["attend_head_bias"]
    kernels = check(scheme, fast, qkv, q_pos, k_pos, causal, grad, torch.bfloat16, f"{variant} bf16")
    # check's parameter tolerance is bf16's D (every logit of a query moved alike); the backward given the kernel's
    # own output shares that D, so the kernel's float32 sums of dS times each derivative row must match it closely
    names = [n for n, p in scheme.named_parameters() if p.requires_grad]
    given = head_parameter_gradients_given_output(scheme, *qkv, q_pos, k_pos, causal, fast, grad.to(fast.dtype))
    for name, actual, (reference, size) in zip(names, kernels, given, strict=True):
        within_float32_sums(actual, reference, size, f"{variant} bf16 d{name} given the kernel's output")
    qkv32, *_ = inputs("causal_gqa", torch.float32, seed=4)
    dispatch.fast_attention(*qkv32, scheme, q_pos, k_pos, causal)
    assert used == ["attend_head_bias", "attend_rows"]


def test_a_parameter_that_shifts_every_logit_gets_a_zero_gradient_at_the_gpu_tiles(monkeypatch):
    """A derivative of 1 at every distance (a parameter added to every logit: softmax ignores it) has the exact
    gradient sum dS = 0; the kernel's sum at the GPU's tiles (dq_head_params, ragged query blocks) stays within reach
    of the low reference's. With TF32 emulated this is test_row_gradient_summed_over_every_distance_is_zero's case
    for the head kernel: it reads the dO that output_gradient_and_delta rounded. The second parameter, KERPLE's d/dp,
    checks the same tiles against the exact gradient."""
    monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype: attention.gpu_tiles(
        kernel, head_dim, torch.bfloat16 if DEVICE == "cpu" else dtype))
    t = 80 * SCALE
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 4, t, 64, generator=g).to(DEVICE).requires_grad_()
    k, v = (torch.randn(1, 2, t, 64, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    distance = (torch.arange(2 * t + 3, device=DEVICE) - t).abs().float()  # rows[h, s] at distance |s - t|
    slopes = torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)[:, None]
    shift = torch.zeros(4, device=DEVICE, requires_grad=True)
    power = torch.ones(4, device=DEVICE, requires_grad=True)

    def rows_of(shift, power):  # (H,S): KERPLE's power kernel plus a shift per head
        return shift[:, None] - slopes.to(shift) * distance.to(shift).pow(power[:, None])

    derivatives = torch.stack((torch.ones_like(distance).expand(4, -1),
                               -slopes * distance * torch.where(distance > 0, distance, 1.0).log()), 1)  # (H,2,S)
    e = torch.tensor([t], device=DEVICE)
    out = head_bias.attend_head_bias(q, k, v, torch.stack((shift, power), 1), rows_of(shift, power), derivatives, e,
                                     True)
    grad = torch.randn(out.shape, generator=g).to(DEVICE)
    fast = torch.autograd.grad(out, [shift, power], grad)
    index = e[:, None, None] - torch.arange(t, device=DEVICE)[:, None] + torch.arange(t, device=DEVICE)

    def dense(q, k, v, shift, power):
        return attention_reference(q, k, v, rows_of(shift, power)[:, index].transpose(0, 1), True)

    leaves = twins([q, k, v, shift, power])
    exact = torch.autograd.grad(dense(*leaves), leaves[3:], grad.double())
    with at_kernel_precision():
        low = torch.autograd.grad(dense(q, k, v, shift, power), [shift, power], grad)
    within_reach(fast[0], torch.zeros(4, dtype=torch.float64, device=DEVICE), low[0], TOLERANCE[torch.float32],
                 "the shift's gradient (exactly 0)")
    assert exact[0].abs().max() < 1e-9  # the property itself, in float64
    within_reach(fast[1], exact[1], low[1], TOLERANCE[torch.float32], "the power's gradient")


def test_mismatched_derivatives_are_refused_in_one_line():
    q = k = v = torch.zeros(1, 2, 3, 16, device=DEVICE)
    with pytest.raises(ValueError, match=r"derivatives \(2, 3, 9\): expected \(H,K,S\) = \(2, 2, 9\)"):
        head_bias.attend_head_bias(q, k, v, torch.zeros(2, 2), torch.zeros(2, 9), torch.zeros(2, 3, 9),
                                   torch.tensor([3]), True)
