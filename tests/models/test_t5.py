"""T5 encoder-decoder: positions matter in the encoder, it sees both ways, the decoder is causal,
cross-attention carries no position, cached decoding equals full recomputation, and it learns."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from posenc.models import T5, T5Config
from posenc.registry import SCHEMES

VOCAB = 23
MAIN = ["learned_absolute", "relative", "alibi", "kerple"]
ENCODER_POSITIONAL = ["learned_absolute", "sinusoidal", "relative", "alibi", "kerple", "rope", "sandwich", "shaw"]


def tiny_t5(encoder: str, decoder: str = "relative", seed: int = 0, **overrides) -> T5:
    torch.manual_seed(seed)
    base = dict(vocab_size=VOCAB, n_layer=2, n_head=4, d_model=32, max_seq_len=64,
                encoder_position_embedding_type=encoder, decoder_position_embedding_type=decoder)
    return T5(T5Config(**{**base, **overrides})).eval()


def source(batch: int = 2, length: int = 10, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("encoder", [*ENCODER_POSITIONAL, "none"])
def test_swapping_two_tokens_is_more_than_a_permutation_of_outputs(encoder):
    """Without positions a bidirectional encoder is permutation-equivariant; a positional scheme breaks that."""
    model, ids = tiny_t5(encoder), source()
    swap = torch.arange(ids.shape[1])
    swap[[2, 7]] = swap[[7, 2]]
    with torch.no_grad():
        permuted_outputs, outputs_of_permuted = model.encode(ids)[:, swap], model.encode(ids[:, swap])
    difference = (permuted_outputs - outputs_of_permuted).abs().max().item()
    if encoder == "none":
        assert difference < 1e-5
    else:
        assert difference > 1e-3, f"{encoder}: swapping tokens only permuted the outputs"


@pytest.mark.parametrize("encoder", ENCODER_POSITIONAL)
def test_encoder_is_bidirectional(encoder):
    model, ids = tiny_t5(encoder), source()
    changed = ids.clone()
    changed[:, -1] = changed[:, -1] % (VOCAB - 1) + 1
    with torch.no_grad():
        first_before, first_after = model.encode(ids)[:, 0], model.encode(changed)[:, 0]
    assert (first_before - first_after).abs().max() > 1e-4


@pytest.mark.parametrize("encoder", ["alibi", "kerple"])
def test_distance_biases_are_symmetric_in_the_encoder(encoder):
    scheme = tiny_t5(encoder).encoder_schemes[0]
    pos = torch.arange(12)[None]
    bias = scheme.bias(pos, pos)  # (1,H,T,T)
    torch.testing.assert_close(bias, bias.transpose(-1, -2))
    assert bias.abs().max() > 0


def test_t5_buckets_distinguish_past_and_future_in_the_encoder_only():
    model = tiny_t5("relative", "relative")
    pos = torch.arange(5)[None]
    encoder, decoder = model.encoder_schemes[0], model.decoder_schemes[0]
    assert encoder.bidirectional and not decoder.bidirectional
    enc, dec = encoder.buckets(pos, pos)[0], decoder.buckets(pos, pos)[0]
    assert enc[0, 3] != enc[3, 0]  # key 3 ahead vs 3 behind: different buckets
    assert (dec.triu(1) == 0).all() and dec[3, 0] == 3  # future keys collapse to 0 (masked anyway)


@pytest.mark.parametrize("decoder", ["relative", "alibi", "learned_absolute", "shaw", "transformer_xl"])
def test_decoder_is_causal(decoder):
    model, ids, target = tiny_t5("relative", decoder), source(), source(seed=1)
    changed = target.clone()
    changed[:, 6:] = changed[:, 6:] % (VOCAB - 1) + 1
    with torch.no_grad():
        before, after = model(ids, target), model(ids, changed)
    torch.testing.assert_close(before[:, :6], after[:, :6], rtol=0, atol=1e-5)


def test_cross_attention_has_no_position_term():
    """Relative schemes in both stacks: shifting the source and the target by different amounts changes
    nothing, which would fail if cross-attention compared decoder positions with encoder positions."""
    model, ids, target = tiny_t5("relative", "relative"), source(), source(length=7, seed=1)
    with torch.no_grad():
        base = model(ids, target)
        shifted = model(ids, target, position_ids=torch.arange(10)[None] + 40,
                        decoder_position_ids=torch.arange(7)[None] + 3)
    torch.testing.assert_close(base, shifted, rtol=1e-5, atol=1e-5)


PAIRS = [*itertools.product(MAIN, MAIN), ("rope", "shaw"), ("shaw", "transformer_xl"), ("sandwich", "xpos"),
         ("rope", "xpos")]


@pytest.mark.parametrize(("encoder", "decoder"), PAIRS)
def test_cached_generation_equals_uncached(encoder, decoder):
    model, ids = tiny_t5(encoder, decoder), source()
    cached = model.generate(ids, max_new_tokens=9, use_cache=True, decoder_start_token_id=0)
    uncached = model.generate(ids, max_new_tokens=9, use_cache=False, decoder_start_token_id=0)
    assert cached.shape == (2, 10) and (cached[:, 0] == 0).all()
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("decoder", ["relative", "shaw", "transformer_xl", "kerple"])
def test_cached_decoder_logits_equal_full_decode(decoder):
    model, ids, target = tiny_t5("alibi", decoder), source(), source(length=9, seed=2)
    with torch.no_grad():
        memory = model.cross_memory(model.encode(ids))
        full = model.decode(target, memory)
        cache = model.new_cache()
        parts = [model.decode(target[:, :4], memory, cache=cache)]
        parts += [model.decode(target[:, t : t + 1], memory, cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, 1), full, rtol=1e-5, atol=1e-5)


SYMBOLS = 10  # tokens 2..11; 0 is the decoder start token


def reverse_batch(generator: torch.Generator, batch: int = 32, length: int = 6):
    """Source: random symbols; target: the source reversed, after start token 0."""
    src = torch.randint(2, 2 + SYMBOLS, (batch, length), generator=generator)
    target = src.flip(1)
    decoder_input = torch.cat((torch.zeros(batch, 1, dtype=torch.long), target[:, :-1]), 1)
    return src, decoder_input, target


@pytest.mark.parametrize(("encoder", "decoder"), [*zip(MAIN, MAIN, strict=True), ("relative", "alibi"),
                                                  ("kerple", "learned_absolute"), ("learned_absolute", "kerple"),
                                                  ("alibi", "relative")])
def test_learns_to_reverse(encoder, decoder):
    """Reversal needs positions in the encoder (which token is where) and the decoder (how far along).
    A model that ignores positions cannot beat ln(SYMBOLS) = 2.30 nats; the trained one must go well below."""
    model = tiny_t5(encoder, decoder, seed=1, n_layer=1).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator, losses = torch.Generator().manual_seed(0), []
    for _ in range(200):
        src, decoder_input, target = reverse_batch(generator)
        loss = F.cross_entropy(model(src, decoder_input).flatten(0, 1), target.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    start, end = losses[0], sum(losses[-10:]) / 10
    assert end < 0.75 * math.log(SYMBOLS) and end < 0.55 * start, f"{encoder}/{decoder}: {start:.2f} -> {end:.2f}"


def test_bad_configs_and_inputs_are_value_errors_naming_the_field():
    refused = r"encoder_position_embedding_type='transformer_xl'.*encoder allows: .*relative"
    with pytest.raises(ValueError, match=refused):
        T5Config(encoder_position_embedding_type="transformer_xl")
    with pytest.raises(ValueError, match=r"decoder_position_embedding_type='relatve'.*did you mean 'relative'"):
        T5Config(decoder_position_embedding_type="relatve")
    with pytest.raises(ValueError, match="relative_attention_max_distance"):
        T5Config(relative_attention_num_buckets=32, relative_attention_max_distance=8)
    with pytest.raises(ValueError, match="shaw_max_relative_position"):
        T5Config(shaw_max_relative_position=0)
    model = tiny_t5("relative")
    with pytest.raises(ValueError, match="decoder_start_token_id"):
        model.generate(source(), 3, decoder_start_token_id=VOCAB)
    with pytest.raises(ValueError, match="decoder_input_ids"):
        model(source(batch=2), source(batch=3))


def test_every_bidirectional_scheme_builds_in_the_encoder():
    for name, cls in SCHEMES.items():
        if cls.supports_bidirectional:
            model = tiny_t5(name, name if cls.supports_causal else "relative")
            assert torch.isfinite(model(source(), source(length=4))).all()
