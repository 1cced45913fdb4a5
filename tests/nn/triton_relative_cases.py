"""The Triton kernel for rows per query (posenc/nn/triton/relative.py: Shaw, Transformer-XL) equals float64
references, outputs and gradients: the formula itself written out with a materialised (B,H,Tq,Tk) bias and
distance index, and each scheme's own reference path (bias() and mix_values() in float64), every learnable
parameter included.

Run by tests/nn/test_triton_scheme_kernels.py with the other schemes' cases (TRITON_INTERPRET=1 on a
machine without a GPU; see tests/nn/triton_support.py).
"""

from __future__ import annotations

import copy

import pytest
import torch

from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.nn.attention_core import attend_eager
from posenc.scheme import RelativeTable
from tests.nn.triton_cases import DEVICE, INTERPRETED, TOLERANCE, build, close, gpu_tiles
from tests.nn.triton_support import at_kernel_precision, gqa_group_with_large_partials, key_gradients_within, twins

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")

from posenc.nn.triton import relative  # noqa: E402  (after triton_cases set the interpreter up)

DIM = 16 if INTERPRETED else 64
SCALE = 1 if INTERPRETED else 16


def formula(qc, qr, k, v, table, values, e, causal, scale):
    """softmax(qc k / sqrt(Dh) + scale qr . table[c] + mask) (v + values[c]), c = clamp(j - i + e[b]), in k's dtype:
    float64 leaves give the exact reference, the kernel's own the low one (in at_kernel_precision: TF32 operands)."""
    qc, qr, v, table = (t.to(k.dtype) for t in (qc, qr, v, table))
    b, h, tq, d = qc.shape
    tk = k.shape[2]
    k, v = (t.repeat_interleave(h // t.shape[1], 1) for t in (k, v))
    c = (e[:, None, None] - torch.arange(tq, device=e.device)[:, None] + torch.arange(tk, device=e.device))
    c = c.clamp(0, table.shape[1] - 1)[:, None].expand(b, h, tq, tk)  # (B,H,Tq,Tk)
    rows = torch.einsum("bhid,hsd->bhis", qr, table.expand(h, -1, -1)) * scale  # (B,H,Tq,S)
    scores = qc @ k.transpose(-1, -2) * d**-0.5 + rows.gather(-1, c)
    if causal:
        scores = scores.masked_fill(torch.ones(tq, tk, dtype=torch.bool, device=qc.device).triu(tk - tq + 1),
                                    float("-inf"))
    weights = scores.softmax(-1)
    out = weights @ v
    if values is not None:
        mass = torch.zeros(b, h, tq, table.shape[1], dtype=k.dtype, device=qc.device).scatter_add(-1, c, weights)
        out = out + mass @ values.to(k.dtype)
    return out


CASES = {  # name: (B, H, Hkv, Tq, Tk, S, causal, shared table and values (Shaw) or per-head table and shifts)
    "shaw_causal_rows_apart": (2, 1, 1, 32, 32, 9, True, True),  # whole tiles at row 0 (FAR) at 16 x 16
    "shaw_encoder": (1, 1, 1, 20, 20, 5, False, True),
    "xl_after_cache_gqa": (1, 2, 1, 9, 33, 42, True, False),
    # at the GPU's tiles: far passes at the row kernel's tiles (128 x 64 forward, 64 x 128 dK/dV, 128 x 32 dQ) hold
    # several relative blocks each, the near blocks past their own far tiles start where the far block's end
    # (e differs per batch row), and T is no multiple of any tile
    "shaw_far_blocks": (1, 1, 1, 260, 260, 9, True, True),
    # at the GPU's tiles (64 x 64 forward, 32 x 32 backward): products carried across key tiles and the dQ's table
    # gradient flushed a chunk behind, ragged at both ends
    "xl_gpu_tiles": (1, 2, 1, 150, 150, 299, True, False),
}
DTYPES = [(case, torch.float32) for case in CASES if case not in ("shaw_far_blocks", "xl_gpu_tiles")] + [
    ("xl_after_cache_gqa", torch.bfloat16)]


def _case(case, dtype, dim=DIM):
    b, h, hkv, tq, tk, length, causal, shaw = CASES[case]
    g = torch.Generator().manual_seed(len(case))
    q = torch.randn(b, h, tq, dim, generator=g)
    k, v = (torch.randn(b, hkv, tk, dim, generator=g) for _ in range(2))
    table = torch.randn(1 if shaw else h, length, dim, generator=g)
    extras = [torch.randn(length, dim, generator=g)] if shaw else [torch.randn(h, dim, generator=g) for _ in "uv"]
    leaves = [t.to(DEVICE, dtype).requires_grad_() for t in (q, k, v)]
    params = [t.to(DEVICE).requires_grad_() for t in (table, *extras)]
    e = torch.tensor([tk - tq + length // 2 - 3, tk - tq + length // 2][:b], device=DEVICE)  # rows apart
    if not shaw:  # Transformer-XL's rows span every distance: e = Tq - 1 reads index j - i + Tq - 1 >= 0
        e = torch.full((b,), tq - 1, device=DEVICE)
    return leaves, params, e, causal, shaw


def _relative(params, shaw):
    if shaw:
        return RelativeTable(params[0], 0, 0.7, values=params[1])
    return RelativeTable(params[0], 0, 0.7, q_shift=params[1], row_shift=params[2])


def _reference(leaves, params, e, causal, shaw):
    q, k, v = leaves
    if shaw:
        return formula(q, q, k, v, params[0], params[1], e, causal, 0.7)
    return formula(q + params[1][None, :, None], q + params[2][None, :, None], k, v, params[0], None, e, causal, 0.7)


def _check(case, dtype, out, leaves, params, e, causal, shaw):
    exact_leaves, exact_params = twins(leaves), twins(params)
    exact = _reference(exact_leaves, exact_params, e, causal, shaw)
    with at_kernel_precision():
        low = _reference(leaves, params, e, causal, shaw)  # the kernel's dtype: float32 tables cast to bf16 with q
    close(out, exact, low, dtype, f"{case} output")
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    inputs = [*leaves, *params]
    names = ["dq", "dk", "dv", "dtable", *(["dvalues"] if shaw else ["du", "dv_shift"])]
    fast = torch.autograd.grad(out, inputs, grad.to(out.dtype))
    slow = torch.autograd.grad(exact, [*exact_leaves, *exact_params], grad.double())
    with at_kernel_precision():
        rough = torch.autograd.grad(low, inputs, grad.to(low.dtype))
    for name, a, b, c in zip(names, fast, slow, rough, strict=True):
        close(a, b, c, dtype, f"{case} {name}")


@pytest.mark.parametrize(("case", "dtype"), DTYPES)
def test_relative_kernel_equals_the_float64_formula_with_gradients(case, dtype):
    leaves, params, e, causal, shaw = _case(case, dtype)
    out = relative.attend_relative(*leaves, _relative(params, shaw), e, causal)
    _check(case, dtype, out, leaves, params, e, causal, shaw)


@pytest.mark.parametrize("case", ["shaw_encoder", "xl_after_cache_gqa", "shaw_far_blocks", "xl_gpu_tiles"])
def test_gpu_tiles_equal_the_float64_formula_with_gradients(case, monkeypatch):
    """The tiles a GPU launches (attention.TILES at bf16) instead of the interpreter's 16 x 16."""
    gpu_tiles(monkeypatch)
    leaves, params, e, causal, shaw = _case(case, torch.float32, dim=32)
    out = relative.attend_relative(*leaves, _relative(params, shaw), e, causal)
    _check(case, torch.float32, out, leaves, params, e, causal, shaw)


def test_transformer_xl_at_the_head_dim_128_tiles(monkeypatch):
    """Dh 128's tiles at a small head dim (the tile logic does not read Dh): the forward's query block two key tiles
    tall (three chunks of products carried across key tiles), dK/dV's narrow lower chunk. 16-bit tiles: bf16 on a
    GPU (TF32 has no Dh 128 tiles), float32 under the interpreter."""
    from posenc.nn.triton import attention

    monkeypatch.setattr(attention, "tiles", lambda kernel, head_dim, device, dtype: attention.gpu_tiles(
        kernel, 128, torch.bfloat16))
    dtype = torch.float32 if INTERPRETED else torch.bfloat16
    leaves, params, e, causal, shaw = _case("xl_gpu_tiles", dtype, dim=32)
    out = relative.attend_relative(*leaves, _relative(params, shaw), e, causal)
    _check("xl_gpu_tiles", dtype, out, leaves, params, e, causal, shaw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_gqa_groups_key_gradients_are_added_in_float32(dtype):
    """triton_support.gqa_group_with_large_partials through rows per query, a table per head (Transformer-XL's
    form) alike for every head and zero in q's second half: dK and dV are within the 16-bit tolerance of the float64
    reference only where the kernel adds the group's partials in float32 (relative.py's backward). Measured under
    the interpreter, error / bound: bf16 dK 0.016 / 0.032 (head 3 alone, q = [q0, 0], errs as much), dV 0.012 /
    0.109; fp16 dK 0.00056 / 0.0053, dV 0.00083 / 0.018; with partials in 16 bits dK errs by 0.5 and 0.047, dV by
    0.5 and 0.0625."""
    g = torch.Generator().manual_seed(0)
    t = 16
    q, k, v, dout = gqa_group_with_large_partials(t, DIM, dtype, DEVICE, g)
    shape = (1, 2 * t - 1, DIM // 2)
    table = torch.cat((torch.randn(shape, generator=g), torch.zeros(shape)), -1).expand(4, -1, -1).contiguous()
    table, e = table.to(DEVICE), torch.tensor([t - 1], device=DEVICE)  # (H,S,Dh), S = 2T - 1: every distance
    fast = torch.autograd.grad(relative.attend_relative(q, k, v, RelativeTable(table, 0, 0.7), e, True), (k, v),
                               dout)
    leaves = twins([q, k, v])
    exact = formula(leaves[0], *leaves, table.double(), None, e, True, 0.7)
    key_gradients_within(fast, torch.autograd.grad(exact, leaves[1:], dout.double()), TOLERANCE[dtype],
                         f"rows per query {dtype}")


def scheme_reference(scheme, q, k, v, q_pos, k_pos, causal):
    """The scheme's own reference path in q's dtype: its (B,H,Tq,Tk) bias, and its value term from the weights.
    A float64 copy of the scheme and float64 leaves give the exact reference; the scheme itself the low one."""
    out, weights = attend_eager(q, k, v, scheme.bias(q_pos, k_pos, q, k), causal)
    return (out + scheme.mix_values(weights, q_pos, k_pos)) if scheme.needs_weights else out


LAYOUTS = {"after_cache": (7, 20, True), "encoder": (12, 12, False)}
SCHEME_CASES = [("shaw", "after_cache"), ("shaw", "encoder"), ("transformer_xl", "after_cache")]


@pytest.mark.parametrize(("name", "layout"), SCHEME_CASES)
def test_schemes_train_through_the_kernel(name, layout, monkeypatch):
    """dispatch picks the Triton kernel for Shaw and Transformer-XL, and every learnable parameter (P_K, P_V; u, v,
    W_R) gets the float64 reference's gradient."""
    tq, tk, causal = LAYOUTS[layout]
    tq, tk = tq * SCALE, tk * SCALE
    scheme = build(name, causal)
    calls = []
    kernel = relative.attend_relative
    monkeypatch.setattr(relative, "attend_relative", lambda *a: calls.append(1) or kernel(*a))
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, tq, DIM, generator=g).to(DEVICE).requires_grad_()
    k, v = (torch.randn(1, 2, tk, DIM, generator=g).to(DEVICE).requires_grad_() for _ in range(2))
    k_pos = (torch.arange(tk) + 5).expand(1, tk).to(DEVICE)
    q_pos = k_pos[:, tk - tq :]
    fast = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, causal)
    assert calls, "the Triton kernel must serve rows per query"
    twin, exact_inputs = copy.deepcopy(scheme).double(), twins([q, k, v])
    exact = scheme_reference(twin, *exact_inputs, q_pos, k_pos, causal)
    with at_kernel_precision():
        low = scheme_reference(scheme, q, k, v, q_pos, k_pos, causal)
    close(fast, exact, low, torch.float32, "output")
    named = [(n, p) for n, p in scheme.named_parameters() if p.requires_grad]
    assert named, f"{name} must have learnable parameters"
    twin_params = dict(twin.named_parameters())
    grad = torch.randn(fast.shape, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    inputs = [q, k, v, *(p for _, p in named)]
    fast_grads = torch.autograd.grad(fast, inputs, grad)
    slow_grads = torch.autograd.grad(exact, [*exact_inputs, *(twin_params[n] for n, _ in named)], grad.double())
    with at_kernel_precision():
        low_grads = torch.autograd.grad(low, inputs, grad)
    for what, a, b, c in zip(["dq", "dk", "dv", *(f"d{n}" for n, _ in named)], fast_grads, slow_grads, low_grads,
                             strict=True):
        close(a, b, c, torch.float32, f"{name} {layout} {what}")


def test_a_table_for_other_heads_is_refused_in_one_line():
    leaves, params, e, causal, _ = _case("xl_after_cache_gqa", torch.float32)
    with pytest.raises(ValueError, match="relative table"):
        relative.attend_relative(*leaves, RelativeTable(params[0][:, :, :8], 0, 1.0), e, causal)


def test_far_passes_tiles_hold_whole_relative_tiles_wherever_served():
    """Shaw's far passes run at the row kernel's tiles; a relative program recomputes the far block holding its
    own, so each far tile must be a whole number of relative tiles at every head dim and dtype the GPU serves."""
    from posenc.nn.triton import attention

    served = [(dim, dtype) for (kernel, dim, dtype) in attention.TILES if kernel == "relative_forward"]
    assert served
    for dim, dtype in served:
        for near, far in (("relative_values_forward", "forward"), ("relative_values_dkdv", "dkdv"),
                          ("relative_values_dq", "dq")):
            n, f = attention.TILES[near, dim, dtype], attention.TILES[far, dim, dtype]
            assert f.bm % n.bm == 0 and f.bn % n.bn == 0, (near, dim, dtype, n, f)
