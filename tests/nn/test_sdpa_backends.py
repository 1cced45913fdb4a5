"""Which SDPA kernels posenc's attention lets a call take (posenc.nn.attention_core.sdpa) and how the static decode step
calls SDPA (posenc.nn.static_attention), on an emulated CUDA device: CPU tensors that the dispatch and attention_core
treat as CUDA ones, SDPA observed at each call.

On an H200 (torch 2.11) cuDNN's attention, first in SDPA's order there, built a graph for every new key length: 46-58
ms per decode step. A cached call (Tq != Tk) on CUDA therefore runs with cuDNN off, its float mask at an aligned
address; and the static step gives SDPA one query row per head (GQA by enable_gqa), which cuDNN splits over the slots.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from posenc.nn import attention_core
from posenc.nn import triton as gpu
from posenc.nn.static_attention import slot_attention
from tests.conftest import VOCAB, tiny_gpt

REAL_SDPA = F.scaled_dot_product_attention


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Every SDPA call as (q, k, mask, whether cuDNN was allowed), in order."""
    calls = []

    def spy(q, k, v, attn_mask=None, **kwargs):
        calls.append((q, k, attn_mask, torch.backends.cuda.cudnn_sdp_enabled()))
        return REAL_SDPA(q, k, v, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    return calls


def emulate_cuda(monkeypatch) -> None:
    """The dispatch's cuda plan (rows_decode, pieces_decode) and attention_core's CUDA rule, on CPU tensors."""
    monkeypatch.setattr(gpu, "interpreting", lambda: True)
    monkeypatch.setattr(gpu, "attention_fits", lambda *args: True)
    monkeypatch.setattr(attention_core, "on_cuda", lambda t: True)


@pytest.mark.parametrize("name", ["none", "alibi", "fire"])
@torch.no_grad()
def test_a_decode_step_on_cuda_leaves_cudnn_out_and_decodes_the_same(name, sdpa_calls, monkeypatch):
    """Plain SDPA (none, rope), rows_decode (alibi) and pieces_decode (fire): every SDPA call of a cached step runs
    with cuDNN off and an aligned mask, and the logits are the CPU path's."""
    model = tiny_gpt(name)
    prompt = torch.randint(0, VOCAB, (1, 5), generator=torch.Generator().manual_seed(0))
    token = torch.zeros(1, 1, dtype=torch.int64)
    cache, expected_cache = model.new_cache(), model.new_cache()
    model(prompt, cache=cache), model(prompt, cache=expected_cache)  # the prompt off the emulation (Triton kernels)
    expected = [model(token, cache=expected_cache) for _ in range(3)]
    sdpa_calls.clear()
    emulate_cuda(monkeypatch)
    got = [model(token, cache=cache) for _ in range(3)]
    assert len(sdpa_calls) == 3 * model.cfg.n_layer  # every layer of every step took SDPA
    for q, k, mask, cudnn in sdpa_calls:
        assert q.shape[-2] == 1 and k.shape[-2] > 1 and not cudnn
        assert mask is None or mask.data_ptr() % attention_core.MASK_ALIGNMENT == 0
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_a_prompt_on_cuda_keeps_cudnn_and_a_misaligned_mask_is_moved(sdpa_calls, monkeypatch):
    """Tq == Tk (a prompt: one cuDNN graph per length) keeps SDPA's own choice; a cached call's mask that starts off a
    16-byte boundary (a row sliced from a kept table) reaches SDPA aligned, with the same values."""
    monkeypatch.setattr(attention_core, "on_cuda", lambda t: True)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, t, 8, generator=g) for t in (1, 9, 9))
    attention_core.sdpa(k, k, v, causal=True)
    table = torch.randn(1, 2, 1, 12, generator=g)
    mask = table[..., 1:10]  # (1,2,1,9) starting 4 bytes in
    assert mask.data_ptr() % attention_core.MASK_ALIGNMENT != 0
    out = attention_core.sdpa(q, k, v, mask)
    (_, _, _, prompt_cudnn), (_, _, seen, cached_cudnn) = sdpa_calls
    assert prompt_cudnn and not cached_cudnn and torch.backends.cuda.cudnn_sdp_enabled()  # restored after the call
    assert seen.data_ptr() % attention_core.MASK_ALIGNMENT == 0 and torch.equal(seen, mask)
    torch.testing.assert_close(out, REAL_SDPA(q, k, v, attn_mask=mask))


def test_the_static_step_gives_sdpa_one_query_row_per_head(sdpa_calls):
    """GQA (6 heads, 2 key heads): q reaches SDPA as (B,H,1,Dh) with the row expanded, not copied; the output is the
    float64 softmax over the slots with the row added (-inf: empty slots)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, h, t, 16, generator=g) for h, t in ((6, 1), (2, 32), (2, 32)))
    row = torch.randn(1, 1, 1, 32, generator=g)
    row[..., 20:] = float("-inf")
    out = slot_attention(q, k, v, row)
    ((seen_q, _, seen_mask, _),) = sdpa_calls
    assert seen_q.shape == (2, 6, 1, 16) and seen_mask.stride(1) == 0  # one row per head; the row broadcast
    kk, vv = (t.double().repeat_interleave(3, dim=1) for t in (k, v))
    weights = torch.softmax(q.double() @ kk.transpose(-1, -2) / 4 + row.double(), dim=-1)  # (2,6,1,32)
    torch.testing.assert_close(out.double(), weights @ vv, rtol=1e-5, atol=1e-5)
