"""posenc's Triton kernels equal the reference paths, outputs and gradients: attention with a bias row per head
(every scheme in the registry that offers bias_by_distance, its own parameters' gradients included) and RoPE.

Not collected by `make test` directly: tests/nn/test_triton_kernels.py runs this file in a fresh process, with
TRITON_INTERPRET=1 on a machine without a GPU (tiny shapes: Triton's interpreter runs the kernels on the CPU)
and compiled on a CUDA machine (real sizes). See tests/nn/triton_support.py for why a fresh process.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT
from posenc.nn import row_paths
from posenc.nn import triton as gpu
from posenc.nn.attention_core import attend
from posenc.registry import SCHEMES
from posenc.registry import build as registry_build
from posenc.rotary import _core, _fast
from posenc.scheme import Scheme
from tests.conftest import tiny_config
from tests.nn.triton_support import patch_interpreter_for_numpy

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED = gpu.interpreting()
DEVICE = "cpu" if INTERPRETED else "cuda"
if INTERPRETED:
    patch_interpreter_for_numpy()
elif not torch.cuda.is_available():
    pytest.skip("no CUDA device and TRITON_INTERPRET is not set", allow_module_level=True)

from posenc.nn.triton import attention, rotary  # noqa: E402  (after the interpreter's setting is known)

DIM = 16 if INTERPRETED else 64  # head dim
SCALE = 1 if INTERPRETED else 16  # sequence lengths: tiny under the interpreter, real on a GPU
DISTANCE = [n for n in posenc.available() if SCHEMES[n].bias_by_distance is not Scheme.bias_by_distance]
ROTARY = [n for n in posenc.available() if SCHEMES[n].rotate is not Scheme.rotate]
TOLERANCE = {torch.float32: 2e-5 if INTERPRETED else 2e-4, torch.float16: 5e-3, torch.bfloat16: 3e-2}


def close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str) -> None:
    """Largest error within a tolerance of the largest value (gradients of a shared row sum many terms)."""
    error = (actual.float() - expected.float()).abs().max().item()
    bound = TOLERANCE[dtype] * max(1.0, expected.abs().max().item())
    assert error <= bound, f"{what}: max error {error:.3g} > {bound:.3g}"


def inputs(b, h, hkv, tq, tk, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, DIM, generator=g)
    k, v = (torch.randn(b, hkv, tk, DIM, generator=g) for _ in range(2))
    return [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]


def gathered(rows: torch.Tensor, e: torch.Tensor, tq: int, tk: int) -> torch.Tensor:
    """The reference's materialised bias (B,H,Tq,Tk) = rows[h, e[b] - i + j]."""
    index = e[:, None, None] - torch.arange(tq, device=e.device)[:, None] + torch.arange(tk, device=e.device)
    return rows[:, index].transpose(0, 1)


CASES = {  # name: (B, H, Hkv, Tq, Tk, causal)
    "causal_17": (2, 4, 4, 17, 17, True),
    "causal_48_gqa": (2, 4, 2, 48, 48, True),
    "encoder_17_gqa": (2, 4, 2, 17, 17, False),
    "encoder_48": (1, 2, 2, 48, 48, False),
    "after_cache": (2, 4, 2, 9, 41, True),
    "decode": (2, 4, 2, 1, 33, True),
    "single_token": (1, 2, 1, 1, 1, True),
}


# float32 in every case; the 16-bit types in two (the interpreter's time).
DTYPES = [(case, torch.float32) for case in CASES] + [(case, dtype) for case in ("causal_48_gqa", "after_cache")
                                                      for dtype in (torch.bfloat16, torch.float16)]


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
    reference = attend(*(t.float() for t in (q, k, v)), gathered(rows, e, tq, tk), causal)
    close(out, reference, dtype, "output")
    grad = torch.randn(out.shape, generator=g).to(DEVICE)
    fast = torch.autograd.grad(out, [q, k, v, rows], grad.to(dtype))
    slow = torch.autograd.grad(reference, [q, k, v, rows], grad)
    for name, a, b_ in zip(("dq", "dk", "dv", "drow"), fast, slow, strict=True):
        close(a, b_, dtype, name)


def test_dropping_the_bias_changes_the_output():
    """The kernel reads the rows: with them zeroed its output moves (a check that can fail)."""
    q, k, v = inputs(1, 2, 2, 17 * SCALE, 17 * SCALE, torch.float32)
    rows = torch.linspace(-3, 3, 2 * 34 * SCALE, device=DEVICE).view(2, -1)
    e = torch.tensor([17 * SCALE], device=DEVICE)
    with torch.no_grad():
        biased = attention.attend_rows(q, k, v, rows, e, True)
        plain = attention.attend_rows(q, k, v, torch.zeros_like(rows), e, True)
        assert (biased - plain).abs().max() > 0.1
        torch.testing.assert_close(plain, attend(q, k, v, None, True), rtol=1e-4, atol=1e-5)


def test_row_gradient_repeats_bit_for_bit():
    q, k, v = inputs(2, 4, 2, 33 * SCALE, 33 * SCALE, torch.float32, seed=3)
    rows = torch.randn(4, 70 * SCALE, device=DEVICE, requires_grad=True)
    e = torch.tensor([33 * SCALE, 33 * SCALE + 2], device=DEVICE)
    runs = [torch.autograd.grad(attention.attend_rows(q, k, v, rows, e, True).square().sum(), [rows, k])
            for _ in range(3)]
    for run in runs[1:]:
        for a, b in zip(run, runs[0], strict=True):
            assert torch.equal(a, b)


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
    fast = row_paths.attend(q, k, v, scheme, q_pos, k_pos, causal)
    assert calls, "the Triton kernel must serve rows per head"
    reference = attend(q, k, v, scheme.bias(q_pos, k_pos, q, k), causal)
    close(fast, reference, torch.float32, "output")
    params = [p for p in scheme.parameters() if p.requires_grad]
    grad = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    names = ["dq", "dk", "dv", *(f"d{n}" for n, p in scheme.named_parameters() if p.requires_grad)]
    for what, a, b in zip(names, torch.autograd.grad(fast, [q, k, v, *params], grad),
                          torch.autograd.grad(reference, [q, k, v, *params], grad), strict=True):
        close(a, b, torch.float32, f"{name} {what}")


def test_positions_given_once_for_the_whole_batch():
    """(1,T) positions with a batch of 3: the kernel reads one key offset per batch row (a (1,) offset was
    read past its end)."""
    t = 24 * SCALE
    scheme = build("alibi", True)
    q, k, v = inputs(3, 4, 4, t, t, torch.float32, seed=5)
    pos = (torch.arange(t) + 5)[None].to(DEVICE)
    fast = row_paths.attend(q, k, v, scheme, pos, pos, True)
    close(fast, attend(q, k, v, scheme.bias(pos, pos, q, k), True), torch.float32, "output")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rope_kernel_equals_the_plain_formula_both_ways(interleaved, dtype):
    g = torch.Generator().manual_seed(4)
    t = 7 * SCALE
    x = torch.randn(2, t, 4, DIM + 8, generator=g).transpose(1, 2).to(DEVICE, dtype)  # strided like a projection
    pos = torch.randint(0, 5000, (2, t), generator=g).sort(-1).values
    cos, sin = (c.to(DEVICE) for c in _core.cos_sin(pos, _core.inv_frequencies(DIM, 10000.0)))  # R = DIM < Dh
    out = rotary.rotate(x, cos, sin, interleaved)
    close(out, _core.apply_rotary_autograd(x.float(), cos, sin, interleaved), dtype, "rotated")
    back = rotary.rotate(out, cos, sin, interleaved, sign=-1.0)
    close(back, x, dtype, "rotated back")
    in_place = x.clone()
    rotary.rotate(in_place, cos, sin, interleaved, out=in_place)
    assert torch.equal(in_place, out)


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
    for use_kernel in (True, False):
        monkeypatch.setattr(_fast, "triton_fits", lambda *a, on=use_kernel, f=_fast.triton_fits: on and f(*a))
        scheme._memo = None
        qr, kr = scheme.rotate(q, k, pos, pos)
        results.append((qr, kr, *torch.autograd.grad((qr * 1.5 + kr).sum(), [q, k])))
    assert calls, "the Triton kernel must rotate on this device"
    for a, b in zip(*results, strict=True):
        close(a, b, torch.float32, name)


@pytest.mark.parametrize("name", ["kerple", "rope"])
def test_model_with_triton_kernels_equals_model_without(name, monkeypatch):
    """End to end: logits and every gradient of a tiny GPT with the Triton kernels on and off."""
    tokens = torch.randint(0, 61, (2, 24 * SCALE), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    results = []
    for use_kernels in (True, False):
        monkeypatch.setattr(gpu, "serves", lambda *t, on=use_kernels, f=gpu.serves: on and f(*t))
        monkeypatch.setattr(_fast, "rotate_native", lambda *a, on=use_kernels, f=_fast.rotate_native: None if on
                            else f(*a))
        torch.manual_seed(0)
        model = GPT(tiny_config(name, d_model=4 * DIM, max_seq_len=64 * SCALE)).to(DEVICE).train()
        perturb_scheme_parameters(model)
        logits = model(tokens)
        results.append((logits, torch.autograd.grad(logits.square().mean(), list(model.parameters()),
                                                    allow_unused=True)))
    (fast, fast_grads), (slow, slow_grads) = results
    close(fast, slow, torch.float32, "logits")
    for a, b in zip(fast_grads, slow_grads, strict=True):
        if a is not None or b is not None:
            close(a, b, torch.float32, "gradient")
