"""The native kernel's rows formed from a table (fused_attention.attend_table: Shaw's decode step on the CPU) equal
the rows written out (attend_rows) plus the value term from the kernel's mass, and equal Shaw's definition written
out in float64 (eq. 3-5: scores q . (k + a^K) / sqrt(Dh), output sum w (v + a^V))."""

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


def _definition(q, k, v, table, scale, values, e, causal):
    """float64: bias(b, h, i, j) = scale * q_i . table[h][clamp(e[b] - i + j, 0, S - 1)], softmax, values added."""
    q, k, v, table = q.double(), k.double(), v.double(), table.double()
    _, h, tq, d = q.shape
    g = h // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    tk, length = k.shape[2], table.shape[1]
    i, j = torch.arange(tq)[:, None], torch.arange(tk)[None, :]
    index = (e[:, None, None] - i + j).clamp(0, length - 1)  # (B,Tq,Tk)
    rows = scale * torch.einsum("bhid,hsd->bhis", q, table.expand(h, -1, -1))  # (B,H,Tq,S)
    bias = rows.gather(-1, index[:, None].expand(-1, h, -1, -1))
    scores = q @ k.transpose(-1, -2) / d**0.5 + bias
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


def test_shaw_decodes_through_the_table_and_equals_its_rows_path(monkeypatch):
    """A cached decode step of a Shaw GPT on the CPU forms its rows in the kernel (attend_table runs in every
    layer), and its logits equal the same step with that kernel declined (the rows path, native_relative)."""
    from posenc.contract.models import perturb_scheme_parameters
    from posenc.models import GPT
    from posenc.nn import dispatch
    from tests.conftest import tiny_config

    torch.manual_seed(0)
    model = GPT(tiny_config("shaw", n_layer=2, n_kv_head=2)).eval()
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
            steps.append(model(tokens[:, -1:], cache=cache))
        assert len(calls) == 2  # the first decode step's two layers: not the prompt's, not the declined step's
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-5, atol=1e-5)
