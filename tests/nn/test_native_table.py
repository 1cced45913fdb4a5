"""The native kernel's rows formed from a table (fused_attention.attend_table: Shaw's and Transformer-XL's decode
step on the CPU) equal the rows written out (attend_rows) plus the value term from the kernel's mass, and equal the
RelativeTable's terms written out in float64: scores ((q + u) . k + (q + v) . table[clamp(r)]) / sqrt(Dh) (Shaw:
no u, v; XL's (a)-(d)), output sum w (v + values[clamp(r)]) (Shaw's eq. 3)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import fused_attention, native

pytestmark = pytest.mark.skipif(not native.has_gemm(), reason="native kernels not built on this machine")


def _operands(b, h, hkv, tq, tk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, tq, d, generator=g)
    k, v = (torch.randn(b, hkv, tk, d, generator=g) for _ in range(2))
    return q, k, v


def _definition(q, k, v, table, scale, values, e, causal, row_shift=None, q_shift=None):
    """float64: scores (q_i + q_shift[h]) . k_j / sqrt(Dh) + scale * (q_i + row_shift[h]) . table[h][clamp(e[b] - i
    + j, 0, S - 1)], softmax, values added."""
    q, k, v, table = q.double(), k.double(), v.double(), table.double()
    qr = q if row_shift is None else q + row_shift.double()[:, None]
    qc = q if q_shift is None else q + q_shift.double()[:, None]
    _, h, tq, d = q.shape
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    tk, length = k.shape[2], table.shape[1]
    i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
    index = (e[:, None, None] - i + j).clamp(0, length - 1)  # (B,Tq,Tk)
    rows = scale * torch.einsum("bhid,hsd->bhis", qr, table.expand(h, -1, -1))  # (B,H,Tq,S)
    bias = rows.gather(-1, index[:, None].expand(-1, h, -1, -1))
    scores = qc @ k.transpose(-1, -2) / d**0.5 + bias
    if causal:
        scores = scores.masked_fill(j > i + tk - tq, float("-inf"))
    weights = scores.softmax(-1)
    out = weights @ v
    if values is not None:
        out = out + torch.einsum("bhij,bhijd->bhid", weights, values.double()[index][:, None])
    return out


@pytest.mark.parametrize(("b", "h", "hkv", "tq", "tk", "causal"), [
    (1, 4, 4, 1, 70, True),  # a decode step
    (2, 4, 2, 1, 1100, True),  # GQA, batch rows at different offsets, one key block of up to 4096
    (2, 4, 1, 7, 1100, True),  # a block of several queries over three key blocks of 512
    (1, 2, 2, 5, 40, False),  # bidirectional: keys past the query read the table's last row
])
@pytest.mark.parametrize("heads", [1, "H"], ids=["one table", "a table per head"])
@pytest.mark.parametrize("with_values", [True, False])
def test_rows_from_a_table_equal_the_definition_and_the_rows_written_out(b, h, hkv, tq, tk, causal, heads,
                                                                       with_values):
    d, length, scale = 16, 9, 0.3
    q, k, v = _operands(b, h, hkv, tq, tk, d)
    g = torch.Generator().manual_seed(1)
    table = torch.randn(h if heads == "H" else 1, length, d, generator=g)
    values = torch.randn(length, d, generator=g) if with_values else None
    e = torch.tensor([4 - (tk - 1), 7 - (tk - 1)][:b])  # the key j - i = -4 (-7 in row 2) reads table[0]
    with torch.no_grad():
        out = fused_attention.attend_table(q, k, v, table, scale, values, e, causal)
        rows = scale * torch.einsum("bhid,hsd->bhis", q, table.expand(h, -1, -1))
        written, mass = fused_attention.attend_rows(q, k, v, rows, e, causal, want_mass=True)
    torch.testing.assert_close(out, written if values is None else written + mass @ values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), _definition(q, k, v, table, scale, values, e, causal),
                               rtol=1e-5, atol=1e-5)


def test_a_table_wanting_gradients_or_of_the_wrong_shape_is_refused_before_the_kernel_runs():
    q, k, v = _operands(1, 4, 2, 1, 30, 16)
    table, values, e = torch.randn(1, 9, 16), torch.randn(9, 16), torch.tensor([0])
    with pytest.raises(ValueError, match="without gradients"):
        fused_attention.attend_table(q, k, v, table.requires_grad_(), 1.0, values, e, True)
    table = table.detach()
    with pytest.raises(ValueError, match="relative table shape"):
        fused_attention.attend_table(q, k, v, torch.randn(3, 9, 16), 1.0, values, e, True)  # 3 heads of 4
    with pytest.raises(ValueError, match="relative values shape"):
        fused_attention.attend_table(q, k, v, table, 1.0, torch.randn(8, 16), e, True)
    with pytest.raises(ValueError, match="relative table layout"):
        fused_attention.attend_table(q, k, v, torch.randn(1, 16, 9).transpose(1, 2), 1.0, values, e, True)


def test_kept_layouts_read_each_calls_own_operands_and_bad_ones_are_still_refused(monkeypatch):
    """attend_table keeps the checked layouts (a decode step's layers share them): a call with kept layouts reads its
    own tensors (as a fresh call does), a table of another shape is checked and refused as at a first call, and
    operands that need a copy give the definition's output without being kept."""
    monkeypatch.setattr(fused_attention, "_table_layouts", {})
    checks = []
    original = fused_attention.check_table
    monkeypatch.setattr(fused_attention, "check_table", lambda *a: checks.append(1) or original(*a))
    d, scale, e = 16, 0.3, torch.tensor([3 - 69])
    with torch.no_grad():
        for seed in range(3):
            q, k, v = _operands(1, 4, 2, 1, 70, d, seed=seed)
            g = torch.Generator().manual_seed(10 + seed)
            table, values = torch.randn(1, 9, d, generator=g), torch.randn(9, d, generator=g)
            out = fused_attention.attend_table(q, k, v, table, scale, values, e, True)
            torch.testing.assert_close(out.double(), _definition(q, k, v, table, scale, values, e, True),
                                       rtol=1e-5, atol=1e-5)
        assert len(checks) == 1 and len(fused_attention._table_layouts) == 1  # checked once, then kept
        with pytest.raises(ValueError, match="relative values shape"):
            fused_attention.attend_table(q, k, v, table, scale, torch.randn(8, d), e, True)
        with pytest.raises(ValueError, match="relative table shape"):
            fused_attention.attend_table(q, k, v, torch.randn(1, 9, d + 1), scale, values, e, True)
        spread = torch.randn(1, 2, 70, 2 * d)[..., ::2]  # keys whose last dim is strided: copied for the kernel
        out = fused_attention.attend_table(q, spread, v, table, scale, values, e, True)
    torch.testing.assert_close(out.double(), _definition(q, spread, v, table, scale, values, e, True),
                               rtol=1e-5, atol=1e-5)
    assert len(fused_attention._table_layouts) == 1  # the copied operands' layouts were not kept


@pytest.mark.parametrize(("b", "h", "hkv", "tq", "tk"), [(1, 4, 4, 1, 70), (2, 4, 2, 1, 600), (1, 4, 1, 6, 1100)])
def test_rows_with_shifts_of_q_equal_the_definition(b, h, hkv, tq, tk):
    """Transformer-XL's table: u shifts the content scores' query, v the rows' (a view of a longer kept span: the
    table's head stride is not S x Dh)."""
    d, scale = 16, 0.25
    q, k, v = _operands(b, h, hkv, tq, tk, d, seed=3)
    g = torch.Generator().manual_seed(2)
    length = tk + 3
    table = torch.randn(h, length + 50, d, generator=g)[:, 20 : 20 + length]  # rows r = low..high of a kept span
    row_shift, q_shift = torch.randn(h, d, generator=g), torch.randn(h, d, generator=g)
    e = torch.tensor([tq - 1, tq + 1][:b])  # the key at the query's position reads table[tk - 1] (tk + 1 in row 2)
    with torch.no_grad():
        out = fused_attention.attend_table(q, k, v, table, scale, None, e, True, row_shift, q_shift)
    expected = _definition(q, k, v, table, scale, None, e, True, row_shift, q_shift)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["shaw", "transformer_xl"])
def test_a_decode_step_takes_the_table_and_equals_the_step_without_it(name, monkeypatch):
    """A cached decode step of a Shaw or Transformer-XL GPT on the CPU forms its rows in the kernel (attend_table runs
    in every layer), and its logits equal the same step with that kernel declined (the rows path)."""
    from posenc.contract.models import perturb_scheme_parameters
    from posenc.models import GPT
    from posenc.nn import dispatch
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = GPT(tiny_config(name, n_layer=2, n_kv_head=2)).eval()
    perturb_scheme_parameters(model)
    tokens = torch.randint(0, 61, (2, 30), generator=torch.Generator().manual_seed(0))
    calls, original = [], fused_attention.attend_table
    monkeypatch.setattr(fused_attention, "attend_table", lambda *a: calls.append(1) or original(*a))
    steps = []
    for declined in (False, True):
        if declined:
            monkeypatch.setitem(dispatch.KERNELS, "native_relative_table", lambda call: None)
        cache = model.new_cache()
        with torch.no_grad():
            model(tokens[:, :-1], cache=cache)
            steps.append(torch.cat([model(tokens[:, -1:], cache=cache), model(tokens[:, :1], cache=cache)], 1))
        assert len(calls) == 4  # the first two decode steps' two layers: not the prompt's, not the declined ones
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-5, atol=1e-5)
