"""The native CoPE forward (csrc/cope.cpp) against CoPE's definition (Golovneva et al. 2024, eq. 3-5) written out
in float64, where most keys lie past P - 1 counted gates: the forward stops computing gates once a row's count
reaches P - 1 (every key left of it reads the table's last entry), so the keys on both sides of that point, in one
key block and across blocks, must give the definition's logits. A prompt, a decode step against a long cache, GQA."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import fused_attention

pytestmark = pytest.mark.skipif(not fused_attention.can_run(*(torch.zeros(1, 1, 1, 8),) * 3),
                                reason="no native kernels on this machine")


def cope_by_definition(q, k, v, rows):
    """q (B,H,Tq,Dh), k/v (B,Hkv,Tk,Dh), rows (B,H,Tq,P): causal, the Tq queries the last of the Tk keys."""
    q, k, v, rows = (t.double() for t in (q, k, v, rows))
    h, tq, dh = q.shape[1:]
    group, tk, top = h // k.shape[1], k.shape[2], rows.shape[-1] - 1
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = q @ k.transpose(-1, -2) * dh**-0.5  # (B,H,Tq,Tk)
    seen = torch.arange(tk)[None, :] <= torch.arange(tk - tq, tk)[:, None]  # key j <= query i
    gates = torch.sigmoid(s) * seen
    p = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=top)  # p_ij = sum_{t=j..i} g_it
    low = p.floor().long()
    w = p - low
    bias = w * rows.gather(-1, (low + 1).clamp(max=top)) + (1 - w) * rows.gather(-1, low)
    return torch.softmax((s + bias).masked_fill(~seen, float("-inf")), -1) @ v


@pytest.mark.parametrize(("b", "h", "hkv", "tq", "tk", "p"), [
    (1, 2, 2, 300, 300, 8),  # a prompt: one key block, P - 1 gates reached ~14 keys back
    (2, 4, 2, 1, 5000, 16),  # a decode step, GQA: two key blocks, the count reached in the first
    (1, 2, 1, 3, 700, 300),  # P - 1 reached only ~600 keys back, past several chunks of gates
])
def test_the_native_forward_equals_the_definition_past_p_gates(b, h, hkv, tq, tk, p):
    g = torch.Generator().manual_seed(tk)
    q, k, v = (torch.randn(b, heads, n, 16, generator=g) for heads, n in ((h, tq), (hkv, tk), (hkv, tk)))
    rows = torch.randn(b, h, tq, p, generator=g)
    rows[..., -1] += 3.0  # the clamped keys' entry stands apart from the one below it
    got = fused_attention.attend_contextual(q, k, v, rows)
    torch.testing.assert_close(got.double(), cope_by_definition(q, k, v, rows), rtol=0, atol=2e-5)


def test_slow_gates_cross_p_minus_one_between_chunks_of_keys():
    """Gates near 0.02 (every key's q . k about -4): a count takes ~50 keys to pass from P - 2 to P - 1, so the keys
    whose positions still interpolate reach past a chunk of gates (64 keys): a forward that stopped its gates one
    count early, or read the last entry for them, fails."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, 1, 16, generator=g)
    q = q / q.norm(dim=-1, keepdim=True)
    k = -16.0 * q.expand(-1, -1, 1500, -1) + 0.3 * torch.randn(1, 2, 1500, 16, generator=g)  # q . k / 4 ~ -4
    v = torch.randn(1, 2, 1500, 16, generator=g)
    rows = torch.randn(1, 2, 1, 8, generator=g) * 3.0
    got = fused_attention.attend_contextual(q, k, v, rows)
    torch.testing.assert_close(got.double(), cope_by_definition(q, k, v, rows), rtol=0, atol=2e-5)


@pytest.mark.parametrize(("b", "h", "hkv", "tq", "tk", "p", "gate_logit"), [
    (1, 2, 2, 300, 300, 8, None),  # a prompt: P - 1 reached ~14 keys back, most keys clamped
    (1, 4, 2, 40, 1100, 16, None),  # queries past a cache, GQA: three key blocks, the first sweep stops early
    (1, 2, 1, 3, 700, 300, None),  # P - 1 reached only ~600 keys back, past several chunks of gates
    (1, 2, 2, 2, 1500, 8, -4.0),  # slow gates: the keys that still interpolate reach past a chunk of gates
])
def test_the_native_backward_equals_the_definitions_gradients_past_p_gates(b, h, hkv, tq, tk, p, gate_logit):
    """The backward computes gates and counts only until a row's count reaches P - 1 (no gradient reaches a clamped
    key's gate: every key it counts for is clamped too), and its first sweep, which adds up the counted keys'
    gradient, stops at the key block where every row has: q, k, v and the rows' gradients equal the definition's."""
    g = torch.Generator().manual_seed(tk + tq)
    q, k, v = (torch.randn(b, heads, n, 16, generator=g) for heads, n in ((h, tq), (hkv, tk), (hkv, tk)))
    if gate_logit is not None:  # q . k / 4 ~ gate_logit: gates ~0.02, a count crawls across keys
        q = q / q.norm(dim=-1, keepdim=True)
        k = 4.0 * gate_logit * q[:, :1, :1].expand(-1, hkv, tk, -1) + 0.3 * torch.randn(b, hkv, tk, 16, generator=g)
    rows = torch.randn(b, h, tq, p, generator=g)
    rows[..., -1] += 3.0
    leaves = [t.clone().requires_grad_() for t in (q, k, v, rows)]
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, rows)]
    dout = torch.randn(b, h, tq, 16, generator=g)
    got = torch.autograd.grad(fused_attention.attend_contextual(*leaves), leaves, dout)
    want = torch.autograd.grad(cope_by_definition(*exact), exact, dout.double())
    for name, a, e in zip(("dq", "dk", "dv", "drows"), got, want, strict=True):  # float32's long running sums: P
        # = 300 counts 600 gates, and dq errs by 1.8e-4 of its largest (as before the backward stopped counting)
        torch.testing.assert_close(a.double(), e, rtol=0, atol=4e-4 * e.abs().max().item(),
                                   msg=lambda m, n=name: f"{n}: {m}")


def test_rows_of_one_query_block_that_reach_p_minus_one_in_different_key_blocks():
    """A block of 32 queries after 1,100 keys (key blocks of 512): query 0's gates ~0.02 (its count reaches P - 1
    ~800 keys back, two key blocks left), the others' ~0.5 (~30 keys back): the backward's first sweep must go on
    until every row of the block has reached P - 1, not stop when the first rows have."""
    g = torch.Generator().manual_seed(5)
    unit = torch.nn.functional.normalize(torch.randn(16, generator=g), dim=0)
    others = torch.randn(1, 2, 31, 16, generator=g)
    others = others - (others @ unit)[..., None] * unit  # q . k ~ 0: gates ~0.5
    q = torch.cat((unit.expand(1, 2, 1, 16), others), dim=2)  # (1,2,32,16)
    k = -16.0 * unit.expand(1, 2, 1100, 16) + 0.3 * torch.randn(1, 2, 1100, 16, generator=g)  # query 0: q . k / 4 ~ -4
    v = torch.randn(1, 2, 1100, 16, generator=g)
    rows = torch.randn(1, 2, 32, 16, generator=g)
    rows[..., -1] += 3.0
    leaves = [t.clone().requires_grad_() for t in (q, k, v, rows)]
    exact = [t.detach().double().requires_grad_() for t in (q, k, v, rows)]
    dout = torch.randn(1, 2, 32, 16, generator=g)
    got = torch.autograd.grad(fused_attention.attend_contextual(*leaves), leaves, dout)
    want = torch.autograd.grad(cope_by_definition(*exact), exact, dout.double())
    for name, a, e in zip(("dq", "dk", "dv", "drows"), got, want, strict=True):
        torch.testing.assert_close(a.double(), e, rtol=0, atol=4e-4 * e.abs().max().item(),
                                   msg=lambda m, n=name: f"{n}: {m}")
