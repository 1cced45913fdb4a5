"""The native fast paths equal the reference paths, outputs and gradients, for every scheme in the registry:
attention computing the bias inside the kernel (posenc.nn.row_paths) and the one-pass RoPE kernel."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import posenc
from posenc.contract.models import perturb_scheme_parameters
from posenc.models import GPT
from posenc.nn import dispatch, native, row_paths
from posenc.nn.attention_core import attend, attend_eager
from posenc.registry import SCHEMES
from posenc.registry import build as registry_build
from posenc.rotary import _core
from posenc.scheme import Scheme
from tests.conftest import tiny_config

pytestmark = pytest.mark.skipif(not native.has_gemm(), reason="native kernels not built on this machine")
ALL = posenc.available()


def build(name: str, causal: bool = True, n_kv_head: int = 4):
    cfg = tiny_config(name, n_head=4, d_model=64)
    torch.manual_seed(0)
    scheme = registry_build(name, dataclasses.replace(cfg.dims(), causal=causal, n_kv_head=n_kv_head), cfg.options)
    holder = torch.nn.Module()
    holder.positions = torch.nn.ModuleList([scheme])
    perturb_scheme_parameters(holder)
    return scheme


def reference(q, k, v, scheme, q_pos, k_pos, causal):
    """NeMo's way: the full (B,H,Tq,Tk) bias, and the weights for a value term."""
    if scheme.needs_weights:
        out, weights = attend_eager(q, k, v, scheme.bias(q_pos, k_pos, q, k), causal)
        return out + scheme.mix_values(weights, q_pos, k_pos)
    return attend(q, k, v, scheme.bias(q_pos, k_pos, q, k), causal)


def has_rows(scheme: Scheme) -> bool:
    """The scheme gives its bias in a form the kernel reads (rows per head or per query, or pieces)."""
    return any(getattr(type(scheme), hook) is not getattr(Scheme, hook)
               for hook in ("bias_by_distance", "relative_rows", "piecewise_bias", "contextual_rows"))


LAYOUTS = {  # name: (Tq, Tk, first key position of each row, extra query offset of each row)
    "full": (40, 40, (0, 0), (0, 0)),
    "after_cache": (9, 50, (5, 5), (0, 0)),
    "decode": (1, 70, (3, 3), (0, 0)),
    "rows_apart": (30, 30, (2, 1000), (0, 0)),
    "queries_shifted_per_row": (12, 30, (0, 0), (0, 3)),  # m - n differs between rows: one e per row
    "decode_shifted_per_row": (1, 70, (3, 3), (0, 3)),  # a decode step whose rows sit at different offsets
}


@pytest.mark.parametrize("name", [n for n in ALL if has_rows(build(n))])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("gqa", [False, True])
def test_rows_equal_reference_with_gradients(name, layout, gqa):
    tq, tk, firsts, shifts = LAYOUTS[layout]
    scheme = build(name, n_kv_head=2 if gqa else 4)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, tq, 16, generator=g, requires_grad=True)
    k, v = (torch.randn(2, 2 if gqa else 4, tk, 16, generator=g, requires_grad=True) for _ in range(2))
    k_pos = torch.stack([torch.arange(tk) + first for first in firsts])
    q_pos = k_pos[:, tk - tq:] + torch.tensor(shifts)[:, None]
    fast = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, True)
    assert fast is not None, "the row path must serve this layout"
    ref = reference(q, k, v, scheme, q_pos, k_pos, True)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    inputs = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
    grad = torch.randn(fast.shape, generator=g)
    for a, b in zip(torch.autograd.grad(fast, inputs, grad), torch.autograd.grad(ref, inputs, grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL if has_rows(build(n))])
def test_positions_given_once_for_the_whole_batch(name):
    """(1,T) positions with a batch of 3: the kernels read one key offset per batch row, so this once read past
    the end of a one-element tensor (FIRE crashed the process, the row schemes took a wrong bias)."""
    scheme = build(name)
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(3, 4, 40, 16, generator=g, requires_grad=True) for _ in range(3))
    pos = torch.arange(40)[None] + 5
    fast = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    assert fast is not None, "the row path must serve this layout"
    ref = reference(q, k, v, scheme, pos, pos, True)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    inputs = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
    for a, b in zip(torch.autograd.grad(fast.sum(), inputs), torch.autograd.grad(ref.sum(), inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=5e-5)  # sums over 3 x 40 queries: float32 rounding


@pytest.mark.parametrize("name", [n for n in ALL if SCHEMES[n].relative_rows is not Scheme.relative_rows])
def test_rows_per_query_in_query_chunks_equal_reference(name, monkeypatch):
    """Long inference inputs run rows per query in chunks of queries, each spanning only the keys it sees."""
    monkeypatch.setattr(row_paths, "QUERY_CHUNK", 16)
    scheme = build(name, n_kv_head=2)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 40, 16, generator=g)
    k, v = (torch.randn(2, 2, 45, 16, generator=g) for _ in range(2))
    k_pos = torch.arange(45).expand(2, 45) + 7
    q_pos = k_pos[:, 5:]
    with torch.no_grad():
        fast = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, True)
        torch.testing.assert_close(fast, reference(q, k, v, scheme, q_pos, k_pos, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL if SCHEMES[n].relative_table is not Scheme.relative_table])
def test_a_relative_table_gives_the_schemes_rows_per_query(name):
    """relative_table (what the GPU kernel multiplies per tile) and relative_rows (what the CPU kernel reads) are
    one term: scale (q + row_shift) . table[s] equals rows[..., s], with the same low, values and q_shift."""
    scheme = build(name, n_kv_head=2).double()
    q = torch.randn(2, 4, 9, 16, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    low, high = -20, 3
    rows, table = scheme.relative_rows(q, low, high), scheme.relative_table(low, high, q)
    qr = q if table.row_shift is None else q + table.row_shift[None, :, None]
    from_table = torch.einsum("bhid,hsd->bhis", qr, table.table.expand(4, -1, -1)) * table.scale
    assert table.low == rows.low and from_table.shape[-1] == rows.rows.shape[-1]
    torch.testing.assert_close(from_table, rows.rows, rtol=1e-12, atol=1e-12)
    for mine, theirs in ((table.values, rows.values), (table.q_shift, rows.q_shift)):
        assert (mine is None) == (theirs is None)
        if mine is not None:
            torch.testing.assert_close(mine, theirs)


@pytest.mark.parametrize("name", [n for n in ALL if has_rows(build(n))])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_rows_without_gradients_equal_reference(name, layout):
    """Inference takes other branches (a decode step reads its bias as a row slice)."""
    tq, tk, firsts, shifts = LAYOUTS[layout]
    scheme = build(name, n_kv_head=2)
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, tq, 16, generator=g)
    k, v = (torch.randn(2, 2, tk, 16, generator=g) for _ in range(2))
    k_pos = torch.stack([torch.arange(tk) + first for first in firsts])
    q_pos = k_pos[:, tk - tq:] + torch.tensor(shifts)[:, None]
    with torch.no_grad():
        fast = dispatch.fast_attention(q, k, v, scheme, q_pos, k_pos, True)
        torch.testing.assert_close(fast, reference(q, k, v, scheme, q_pos, k_pos, True), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", [n for n in ALL if SCHEMES[n].supports_bidirectional and has_rows(build(n))])
def test_rows_equal_reference_in_an_encoder(name):
    scheme = build(name, causal=False)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 4, 33, 16, generator=g, requires_grad=True) for _ in range(3))
    pos = torch.arange(33).expand(2, 33)
    fast = dispatch.fast_attention(q, k, v, scheme, pos, pos, False)
    ref = reference(q, k, v, scheme, pos, pos, False)
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    inputs = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
    for a, b in zip(torch.autograd.grad(fast.sum(), inputs), torch.autograd.grad(ref.sum(), inputs), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_rows_decline_positions_that_do_not_count_up_and_other_dtypes():
    scheme = build("alibi")
    q, k, v = (torch.randn(1, 4, 6, 16) for _ in range(3))
    packed = torch.tensor([[0, 1, 2, 0, 1, 2]])
    assert dispatch.fast_attention(q, k, v, scheme, packed, packed, True) is None
    pos = torch.arange(6)[None]
    assert dispatch.fast_attention(q.double(), k.double(), v.double(), scheme, pos, pos, True) is None



@pytest.mark.parametrize("name", ALL)
def test_model_with_native_kernels_equals_model_without(name, monkeypatch):
    """End to end, every scheme: logits and every gradient equal with the native kernels on and off."""
    tokens = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(0))
    results = []
    for state in (dict(native._state), {"tried": True, "lib": None, "gemm": False}):
        monkeypatch.setattr(native, "_state", state)
        torch.manual_seed(0)
        model = GPT(tiny_config(name)).train()
        perturb_scheme_parameters(model)
        logits = model(tokens)
        grads = torch.autograd.grad(logits.square().mean(), list(model.parameters()), allow_unused=True)
        results.append((logits, grads))
    (fast, fast_grads), (slow, slow_grads) = results
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    for a, b in zip(fast_grads, slow_grads, strict=True):
        if a is not None or b is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


class _AutogradReference:  # in _Rotate's place: the plain formula, the rest of the row (kernels) unused
    apply = staticmethod(lambda x, cos, sin, interleaved, kernels: _core.apply_rotary_autograd(x, cos, sin,
                                                                                                 interleaved))


ROTARY = [n for n in ALL if SCHEMES[n].rotate is not Scheme.rotate]


@pytest.mark.parametrize("name", ROTARY)
@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_kernel_equals_plain_autograd_with_gradients(name, interleaved, monkeypatch):
    cfg = tiny_config(name, n_head=4, d_model=64, rotary_percentage=0.5, rotary_interleaved=interleaved)
    scheme = registry_build(name, cfg.dims(), cfg.options)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 7, 4, 16, generator=g).transpose(1, 2).requires_grad_()  # strided like a projection
    k = torch.randn(2, 4, 7, 16, generator=g, requires_grad=True)
    pos = torch.randint(0, 5000, (2, 7), generator=g).sort(-1).values
    results = []
    for reference_path in (False, True):
        if reference_path:
            monkeypatch.setattr(_core, "_Rotate", _AutogradReference)
        scheme._memo = None
        qr, kr = scheme.rotate(q, k, pos, pos)
        grads = torch.autograd.grad((qr * 1.5 + kr).sum(), [q, k])
        results.append((qr, kr, *grads))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_gradients_are_bitwise_reproducible():
    """Per-thread sums of a shared row's gradient add up in a fixed order (resumed runs repeat exactly)."""
    scheme = build("kerple")
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(4, 4, 50, 16, generator=g, requires_grad=True) for _ in range(3))
    pos = torch.arange(50).expand(4, 50)
    runs = []
    for _ in range(3):
        out = dispatch.fast_attention(q, k, v, scheme, pos.clone(), pos.clone(), True)
        runs.append(torch.autograd.grad(out.square().sum(), [q, *scheme.parameters()]))
    for run in runs[1:]:
        for a, b in zip(run, runs[0], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("order", ["one_after_another", "two_forwards_then_two_backwards"])
@pytest.mark.parametrize("name", [n for n in ALL if has_rows(build(n)) and any(
    p.requires_grad for p in build(n).parameters())])
def test_repeated_forward_backward_with_one_positions_tensor(name, order):
    """The rows are built once per positions tensor; a backward must not leave the next forward+backward over the
    same tensor and unchanged parameters a freed graph (it raised 'backward through the graph a second time'),
    and every backward gives the reference's gradients, in either order of forwards and backwards."""
    scheme = build(name)
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2, 4, 24, 16, generator=g).requires_grad_() for _ in range(3))
    pos = (torch.arange(24) + 3).expand(2, 24)
    params = [q, k, v, *(p for p in scheme.parameters() if p.requires_grad)]
    expected = torch.autograd.grad(reference(q, k, v, scheme, pos, pos, True).square().sum(), params)
    if order == "one_after_another":
        runs = [torch.autograd.grad(dispatch.fast_attention(q, k, v, scheme, pos, pos, True).square().sum(), params)
                for _ in range(3)]
    else:
        losses = [dispatch.fast_attention(q, k, v, scheme, pos, pos, True).square().sum() for _ in range(2)]
        runs = [torch.autograd.grad(loss, params) for loss in losses]
    for run in runs:
        for a, b in zip(run, expected, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_rows_follow_a_parameter_changed_between_backwards():
    """After an optimizer step the next forward reads the new parameters (the memo's key), and a step between a
    forward and its backward is refused in one line, not answered with stale gradients."""
    scheme = build("kerple")
    q, k, v = (torch.randn(1, 4, 16, 16) for _ in range(3))
    pos = torch.arange(16)[None]
    before = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    with torch.no_grad():
        next(scheme.parameters()).mul_(2.0)
    after = dispatch.fast_attention(q, k, v, scheme, pos, pos, True)
    torch.testing.assert_close(after, reference(q, k, v, scheme, pos, pos, True))
    assert not torch.allclose(before, after)
    with torch.no_grad():
        next(scheme.parameters()).mul_(0.5)
    with pytest.raises(RuntimeError, match="modified in place"):
        after.sum().backward()
