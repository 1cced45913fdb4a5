"""Passkey prompts: exact length, the needle at the requested depth in tokens, prefixes shared
across keys; keys and scoring; and on the real tokenizer, prompts that re-tokenize to themselves."""

from __future__ import annotations

import pytest

from posenc.experiments.extend.passkey_prompts import (
    FILLER,
    INTRO,
    NEEDLE,
    QUESTION,
    PromptBuilder,
    answer,
    draw_key,
    is_correct,
)
from tests.conftest import smollm2_gguf


def word_encode(text: str) -> list[int]:
    """A stand-in tokenizer: one id per character (the builder only needs encode)."""
    return [ord(c) for c in text]


@pytest.mark.parametrize("length", [300, 513, 2048])
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.5, 0.77, 1.0])
def test_prompt_has_the_length_and_the_needle_at_the_depth(length, depth):
    builder = PromptBuilder(word_encode)
    key = draw_key(0, length, depth, 0)
    prompt = builder.build(length, depth, key)
    needle = word_encode(NEEDLE.format(key=key))
    n_filler = length - len(INTRO) - len(needle) - len(QUESTION)
    assert len(prompt.ids) == length
    assert prompt.needle_start == len(INTRO) + round(depth * n_filler)
    assert prompt.ids[prompt.needle_start : prompt.needle_start + len(needle)] == needle
    assert prompt.ids[: len(INTRO)] == word_encode(INTRO)
    assert prompt.ids[-len(QUESTION) :] == word_encode(QUESTION)
    text = "".join(map(chr, prompt.ids))
    assert text.count(str(key)) == 2  # only in the needle sentence
    filler = text[len(INTRO) : prompt.needle_start] + text[prompt.needle_start + len(needle) : -len(QUESTION)]
    assert set(filler) <= set(FILLER)


def test_keys_change_only_the_needle():
    builder = PromptBuilder(word_encode)
    a, b = builder.build(1000, 0.4, 12345), builder.build(1000, 0.4, 67890)
    start, end = a.needle_start, a.needle_start + len(word_encode(NEEDLE.format(key=12345)))
    assert a.ids[:start] == b.ids[:start] and a.ids[end:] == b.ids[end:] and a.ids != b.ids


def test_depth_orders_the_needle():
    builder = PromptBuilder(word_encode)
    starts = [builder.build(3000, d, 11111).needle_start for d in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert starts == sorted(starts) and starts[0] == len(INTRO)
    assert starts[-1] + len(word_encode(NEEDLE.format(key=11111))) + len(QUESTION) == 3000


@pytest.mark.parametrize(("length", "depth", "field"), [(50, 0.5, "lengths"), (500, 1.5, "depths"),
                                                        (500, -0.1, "depths")])
def test_bad_prompts_name_the_field(length, depth, field):
    with pytest.raises(ValueError, match=field):
        PromptBuilder(word_encode).build(length, depth, 12345)


def test_keys_are_five_digits_reproducible_and_vary():
    keys = {draw_key(0, n, d, t) for n in (1024, 2048) for d in (0.1, 0.9) for t in range(5)}
    assert all(10_000 <= k <= 99_999 for k in keys) and len(keys) > 15
    assert draw_key(3, 1024, 0.5, 1) == draw_key(3, 1024, 0.5, 1) != draw_key(4, 1024, 0.5, 1)


@pytest.mark.parametrize(("text", "key", "right"), [
    (" 48213.", 48213, True), ("48213", 48213, True), (" 48213 is the", 48213, True),
    (" 482130", 48213, False), (" 4821.", 48213, False), (" the key", 48213, False), ("", 48213, False),
    (" 11111 or 48213", 48213, False),  # the first number is the answer
])
def test_scoring_is_an_exact_match_of_the_first_number(text, key, right):
    assert is_correct(text, key) is right
    assert answer("no digits") is None


@pytest.mark.pretrained
def test_real_tokenizer_prompts_retokenize_to_themselves():
    from posenc.models.gguf import load_tokenizer

    tokenizer = load_tokenizer(smollm2_gguf())
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)
    builder = PromptBuilder(encode)
    assert builder.answer_tokens() == len(encode(" 99999")) + 1
    for length in (120, 257, 1000):
        for depth in (0.0, 0.33, 1.0):
            key = draw_key(0, length, depth, 0)
            prompt = builder.build(length, depth, key)
            assert len(prompt.ids) == length
            assert encode(tokenizer.decode(prompt.ids)) == prompt.ids  # no seams between the pieces
            assert f"The pass key is {key}." in tokenizer.decode(prompt.ids[prompt.needle_start :])
