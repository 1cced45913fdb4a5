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
