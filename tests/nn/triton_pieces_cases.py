"""The Triton kernel for a piecewise bias (FIRE) equals the float64 reference path: attention with FIRE's own dense
bias (Scheme.bias, its MLP evaluated on every pair), outputs and the gradients of q, k, v and every learnable FIRE
parameter (its c, its threshold L, both MLP layers).

Not collected by `make test` directly: tests/nn/test_triton_kernels.py runs this file with triton_cases.py in one
fresh process (TRITON_INTERPRET=1 without a GPU: tiny shapes, and tiles forced small so that a query block meets
interior tiles, diagonal tiles and a ragged end; compiled on a CUDA machine at the GPU's own tiles).
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from posenc.contract.models import perturb_scheme_parameters
from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.nn.attention_core import attend
from posenc.registry import build
from tests.conftest import tiny_config
from tests.nn.triton_support import patch_interpreter_for_numpy

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED = gpu.interpreting()
DEVICE = "cpu" if INTERPRETED else "cuda"
if INTERPRETED:
    patch_interpreter_for_numpy()
elif not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)

from posenc.nn.triton import attention, piecewise_attention  # noqa: E402  (after the interpreter's setting)

SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
if not INTERPRETED:
    torch.set_float32_matmul_precision("high")  # float32 runs as TF32 on a GPU (attention.serves_float32)
TOLERANCE = {torch.float32: 2e-5 if INTERPRETED else 5e-3, torch.bfloat16: 3e-2}
# FIRE's own parameters in bf16: their gradients add dS over whole segments of pairs, where each query's dS sums
# to 0 only up to bf16's rounding of P before P V (measured on causal_gqa_bf16: 4.5e-2 on the MLP's output layer,
# where the materialised bias in bf16 autograd errs by 2.0e-2 and q, k, v stay within 3e-2).
PARAMETER_TOLERANCE_BF16 = 6e-2
# Tiles forced down under the interpreter: BM != BN both ways, BM <= BN where the diagonal sums need it.
SMALL = {"pieces_forward": attention.Tiles(32, 16, 4, 2), "pieces_dkdv": attention.Tiles(16, 32, 4, 2),
         "pieces_dq": attention.Tiles(16, 16, 4, 2), "pieces_dq_grad": attention.Tiles(16, 32, 4, 2)}

CASES = {  # name: (B, H, Hkv, Dh, Tq, Tk, causal, dtype)
    "causal_gqa": (1, 2, 1, 16, 48, 48, True, torch.float32),
    "after_cache": (2, 2, 1, 32, 13, 40, True, torch.float32),
    "encoder": (1, 2, 2, 16, 33, 33, False, torch.float32),
    "causal_gqa_bf16": (1, 2, 1, 16, 48, 48, True, torch.bfloat16),
}


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, tolerance=None) -> None:
    error = (actual.double() - expected).abs().max().item()
    bound = (tolerance or TOLERANCE[dtype]) * max(1.0, expected.abs().max().item())
    assert error <= bound, f"{what}: max error {error:.3g} > {bound:.3g}"


def fire(heads: int, head_dim: int, threshold: float):
    """FIRE with perturbed weights and a threshold L inside the sequence (queries on both sides of max(L, i))."""
    cfg = tiny_config("fire", n_head=heads, d_model=heads * head_dim, fire_init_threshold=threshold)
    torch.manual_seed(0)
    scheme = build("fire", dataclasses.replace(cfg.dims(), n_kv_head=heads // 2), cfg.options)
    holder = torch.nn.Module()
    holder.positions = torch.nn.ModuleList([scheme])
    perturb_scheme_parameters(holder)
    return scheme.to(DEVICE)


@pytest.mark.parametrize("case", CASES)
def test_fire_kernel_equals_the_float64_dense_bias_with_every_gradient(case, monkeypatch):
    b, h, hkv, dh, tq, tk, causal, dtype = CASES[case]
    tq, tk = tq * SCALE, tk * SCALE
    if INTERPRETED:
        monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype_: SMALL[kernel])
    calls = []
    kernel = piecewise_attention.attend_pieces
    monkeypatch.setattr(piecewise_attention, "attend_pieces", lambda *a: calls.append(1) or kernel(*a))
    scheme = fire(h, dh, threshold=tk - tq / 2)  # half the queries below L
    g = torch.Generator().manual_seed(1)
    q = torch.randn(b, h, tq, dh, generator=g)
    k, v = (torch.randn(b, hkv, tk, dh, generator=g) for _ in range(2))
    q, k, v = (t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v))
    k_pos = (torch.arange(tk) + 7).expand(b, tk).to(DEVICE)  # a cache offset: queries are the last tq keys
    q_pos, k_pos = scheme.frame(k_pos[:, tk - tq:], k_pos)
    out = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, causal)
    assert calls, "the dispatch must run FIRE through the Triton kernel"
    exact = copy.deepcopy(scheme).double()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    reference = attend(q64, k64, v64, exact.bias(q_pos, k_pos, q64, k64), causal)
    close(out, reference, dtype, f"{case} output")
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64).to(DEVICE)
    names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters())]
    fast = torch.autograd.grad(out, [q, k, v, *scheme.parameters()], grad.to(dtype))
    slow = torch.autograd.grad(reference, [q64, k64, v64, *exact.parameters()], grad)
    assert slow[4].abs().max() > 0 and slow[3].abs().max() > 0, "L and c must both receive a gradient here"
    for n, (what, a, b_) in enumerate(zip(names, fast, slow, strict=True)):
        parameter = n >= 3 and dtype == torch.bfloat16
        close(a, b_, dtype, f"{case} {what}", PARAMETER_TOLERANCE_BF16 if parameter else None)


def test_fire_kernel_without_parameter_gradients_and_its_bias_matters(monkeypatch):
    """Frozen FIRE (no parameter needs a gradient): dQ takes the plain variant; the output moves when the MLP does."""
    if INTERPRETED:
        monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype_: SMALL[kernel])
    scheme = fire(2, 16, threshold=8.0).requires_grad_(False)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 32 * SCALE, 16, generator=g).to(DEVICE).requires_grad_() for _ in range(3))
    pos = torch.arange(32 * SCALE, device=DEVICE)[None]
    out = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    reference = attend(*exact, scheme.bias(pos, pos).double(), True)
    close(out, reference, torch.float32, "output")
    for what, a, b_ in zip(("dq", "dk", "dv"), torch.autograd.grad(out.square().sum(), [q, k, v]),
                           torch.autograd.grad(reference.square().sum(), exact), strict=True):
        close(a, b_, torch.float32, what)
    with torch.no_grad():
        scheme.mlp[2].weight.mul_(3.0)
        assert (dispatch.fast_attention(q, k, v, scheme, pos, pos, True) - out).abs().max() > 1e-2


def test_bad_pieces_are_refused_in_one_line():
    q = torch.zeros(1, 2, 5, 16, device=DEVICE)
    e = torch.tensor([4], device=DEVICE)
    feature, knots = torch.zeros(9, device=DEVICE), torch.zeros(3, device=DEVICE)
    lines = torch.zeros(2, 4, device=DEVICE)
    with pytest.raises(ValueError, match="divisor"):
        piecewise_attention.attend_pieces(q, q, q, feature, torch.ones(1, 4, device=DEVICE), knots, lines, lines, e,
                                          True)
    with pytest.raises(ValueError, match="slopes"):
        piecewise_attention.attend_pieces(q, q, q, feature, torch.ones(1, 5, device=DEVICE), knots,
                                          torch.zeros(3, 4, device=DEVICE), lines, e, True)
