"""The chunked bias path with dropout (each attention weight is kept and scaled by 1/(1-p), or zeroed,
in every block of query rows), and whole models whose prefill is long enough to take the chunked
path: their logits equal the reference path's (the full bias built at once)."""

from __future__ import annotations

import pytest
import torch

from posenc.masks import causal_mask
from posenc.models import T5, T5Config
from posenc.nn import bias_paths, fused_attention
from tests.conftest import tiny_gpt
from tests.nn.test_fast_paths import build

ROWS, T, DH = 16, 64, 16  # four blocks of query rows


def reference_weights(q, k, scheme, pos, causal: bool) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / DH**0.5 + scheme.bias(pos, pos, q, k)  # (B,H,T,T)
    if causal:
        scores = scores.masked_fill(~causal_mask(T, T, q.device), float("-inf"))
    return scores.softmax(-1)


@pytest.mark.parametrize("name", ["alibi", "relative", "kerple"])
@pytest.mark.parametrize("causal", [True, False])
def test_chunked_dropout_keeps_and_rescales_or_zeroes_each_weight_in_every_block(name, causal):
    """With one-hot values (v = identity over the keys) the output rows are the dropped-out weights."""
    scheme, p = build(name, causal), 0.4
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, T, DH, generator=g), torch.randn(2, 4, T, DH, generator=g)
    v = torch.eye(T).expand(2, 4, T, T)  # (B,H,Tk,Tk): key j writes 1 into column j
    pos = torch.arange(T).expand(2, T)
    torch.manual_seed(1)
    with torch.no_grad():
        out = bias_paths.chunked_attention(q, k, v, scheme, pos, pos, causal, dropout=p, rows=ROWS)  # (B,H,T,T)
        weights = reference_weights(q, k, scheme, pos, causal)
    kept = (out - weights / (1 - p)).abs() < 1e-5
    dropped = out.abs() < 1e-7
    assert (kept | dropped).all(), "an output is neither the scaled weight nor zero"
    if causal:
        assert (out[..., ~causal_mask(T, T, out.device)] == 0).all()  # the future stays masked
    live = (weights > 1e-4) & ~(kept & dropped)  # weights whose fate is visible
    for block in range(0, T, ROWS):
        rows = slice(block, block + ROWS)
        fraction = dropped[:, :, rows][live[:, :, rows]].float().mean().item()
        assert abs(fraction - p) < 0.1, f"rows {block}..: {fraction:.2f} of the weights dropped, not {p}"


def test_chunked_dropout_is_off_at_zero_and_follows_the_seed():
    scheme, pos = build("alibi"), torch.arange(T).expand(2, T)
    q, k, v = (torch.randn(2, 4, T, DH, generator=torch.Generator().manual_seed(s)) for s in range(3))
    with torch.no_grad():
        run = lambda dropout: bias_paths.chunked_attention(q, k, v, scheme, pos, pos, True, dropout, ROWS)
        reference = bias_paths.attend(q, k, v, scheme.bias(pos, pos, q, k), True)
        torch.testing.assert_close(run(0.0), reference, rtol=1e-5, atol=1e-5)
        torch.manual_seed(5)
        first = run(0.3)
        torch.manual_seed(5)
        assert torch.equal(run(0.3), first)
        assert not torch.equal(run(0.3), first)  # the next draw differs


@pytest.fixture
def force_chunks(monkeypatch):
    """Dispatch as for a long input: no native rows kernel, no flex, the chunked path above CHUNK_ROWS."""
    calls = []
    real = bias_paths.chunked_attention
    monkeypatch.delenv("POSENC_FLEX", raising=False)
    monkeypatch.setattr(fused_attention, "can_run", lambda *args: False)
    monkeypatch.setattr(bias_paths, "chunked_attention", lambda *args, **kw: calls.append(args[0].shape) or
                        real(*args, **kw))

    def set_mode(chunked: bool) -> list:
        monkeypatch.setattr(bias_paths, "MIN_FAST_SCORES", 0 if chunked else 1 << 62)
        calls.clear()
        return calls

    return set_mode


PREFILL = bias_paths.CHUNK_ROWS + 40  # two blocks: 256 rows and 40


@pytest.mark.parametrize("name", ["alibi", "relative", "kerple", "fire"])
def test_gpt_prefill_through_chunks_equals_the_reference_and_cached_decoding_continues_it(name, force_chunks):
    model = tiny_gpt(name, max_seq_len=1024)
    ids = torch.randint(0, 61, (1, PREFILL + 3), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        force_chunks(chunked=False)
        expected = model(ids)  # (1,T,V), the full bias at once
        calls = force_chunks(chunked=True)
        chunked = model(ids)
        assert calls, "the chunked path was not taken"
        cache = model.new_cache()
        parts = [model(ids[:, :PREFILL], cache=cache)]  # a cached prefill through the chunks
        parts += [model(ids[:, t : t + 1], cache=cache) for t in range(PREFILL, PREFILL + 3)]
    torch.testing.assert_close(chunked, expected, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.cat(parts, 1), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("encoder", ["relative", "alibi"])
def test_t5_encoder_through_chunks_equals_the_reference(encoder, force_chunks):
    torch.manual_seed(0)
    model = T5(T5Config(vocab_size=23, n_layer=2, n_head=4, d_model=32, max_seq_len=512,
                        encoder_position_embedding_type=encoder)).eval()
    ids = torch.randint(0, 23, (1, PREFILL), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        force_chunks(chunked=False)
        expected = model.encode(ids)
        calls = force_chunks(chunked=True)
        chunked = model.encode(ids)
    assert calls
    torch.testing.assert_close(chunked, expected, rtol=1e-4, atol=1e-5)
