"""Abacus (McLeish et al. 2024): digit indices restart at every number, offsets only in training,
and a number continuing across the KV cache boundary keeps counting."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.absolute.abacus import DIGIT_IDS, Abacus, digit_run_index
from posenc.models import T5, GPTConfig, T5Config
from posenc.scheme import Dims
from tests.conftest import tiny_gpt

DIGITS = torch.tensor(DIGIT_IDS)


def ids(text: str) -> torch.Tensor:
    return torch.tensor([list(text.encode())])  # (1,T) byte ids


def loop_index(text: str) -> list[int]:
    """The definition, with a counter: +1 on each digit, back to 0 on anything else."""
    out, run = [], 0
    for ch in text:
        run = run + 1 if ch.isdigit() else 0
        out.append(run)
    return out


@pytest.mark.parametrize("text, expected", [
    ("12+345=", [1, 2, 0, 1, 2, 3, 0]),
    ("7", [1]),
    ("a1b22", [0, 1, 0, 1, 2]),
    ("9876543210==0", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 0, 1]),
])
def test_digit_indices_of_examples(text, expected):
    assert digit_run_index(ids(text), DIGITS)[0].tolist() == expected


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="0123456789+=* x", min_size=1, max_size=40))
def test_digit_indices_match_a_plain_loop(text):
    assert digit_run_index(ids(text), DIGITS)[0].tolist() == loop_index(text)


def test_offset_only_in_training_and_one_per_sequence():
    scheme = Abacus(Dims(16, 2, 8, 64), abacus_max_offset=100)
    batch = torch.cat([ids("12+345=678"), ids("9+87=1234.")])  # (2,10)
    plain = digit_run_index(batch, DIGITS)
    assert torch.equal(scheme.eval().digit_index(batch), plain)
    scheme.train()
    torch.manual_seed(0)
    offsets = set()
    for _ in range(50):
        shifted = scheme.digit_index(batch)
        assert torch.equal(shifted == 0, plain == 0)  # non-digits stay at row 0
        for r in (0, 1):
            row = (shifted - plain)[r][plain[r] > 0]  # the offsets added to this row's digits
            assert (row == row[0]).all() and 0 <= int(row[0]) < 100  # one k per sequence
            offsets.add(int(row[0]))
    assert len(offsets) > 10


def test_a_number_continues_across_the_cache_boundary():
    """Prefill "12+3", then "4", "5", "6", "=" one at a time: the logits of the full forward."""
    model = tiny_gpt("abacus", vocab_size=64)
    text = ids("12+3456=7").expand(2, -1)
    cache = model.new_cache()
    parts = [model(text[:, :4], cache=cache)] + [model(text[:, t : t + 1], cache=cache) for t in range(4, 9)]
    torch.testing.assert_close(torch.cat(parts, dim=1), model(text), rtol=1e-4, atol=1e-4)
    # Without the history the new digits would restart at index 1: the embedding would differ.
    scheme = model.schemes[0]
    x = torch.zeros(2, 1, model.cfg.d_model)
    assert not torch.equal(scheme.embed(x, None, input_ids=text[:, :5]), scheme.embed(x, None, input_ids=text[:, 4:5]))


def test_cached_generation_equals_uncached_on_digit_strings():
    model = tiny_gpt("abacus", vocab_size=64, tie_word_embeddings=False)
    with torch.no_grad():  # only digits get non-zero logits, so generation continues numbers
        model.lm_head.weight.zero_()
        model.lm_head.weight[48:58] = torch.randn(10, model.cfg.d_model, generator=torch.Generator().manual_seed(0))
    prompt = torch.cat([ids("123+4567="), ids("98765+43=")])
    cached = model.generate(prompt, 10, use_cache=True)
    assert torch.isin(cached[:, 9:], DIGITS).any()
    assert torch.equal(cached, model.generate(prompt, 10, use_cache=False))


def test_t5_passes_the_tokens_to_encoder_and_decoder():
    torch.manual_seed(0)
    cfg = T5Config(vocab_size=64, n_layer=1, n_head=2, d_model=16, max_seq_len=64,
                   encoder_position_embedding_type="abacus", decoder_position_embedding_type="abacus")
    model = T5(cfg).eval()
    src = ids("12+34=")
    assert torch.equal(model.generate(src, 6, use_cache=True), model.generate(src, 6, use_cache=False))


def test_embed_without_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="input_ids"):
        Abacus(Dims(16, 2, 8, 64)).embed(torch.zeros(1, 3, 16), torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize("field, value", [("abacus_max_offset", 0), ("abacus_digit_ids", []),
                                          ("abacus_digit_ids", [48, 48]), ("abacus_digit_ids", [-1])])
def test_options_are_validated(field, value):
    with pytest.raises(ValueError, match=rf"{field}="):
        GPTConfig(position_embedding_type="abacus", **{field: value})


def test_digit_ids_from_yaml_lists_compare_equal():
    assert GPTConfig(abacus_digit_ids=list(range(48, 58))) == GPTConfig()
