"""Every sequence `posenc extend` feeds a model starts with the model's BOS exactly when its own tokenizer adds one
(sequence_start.py): perplexity windows, passkey prompts and RULER prompts keep their lengths in positions (the
BOS is one of them), the BOS is never scored, and a run resumed with another start is refused."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from posenc.experiments.extend.methods import Method
from posenc.experiments.extend.passkey_prompts import PromptBuilder
from posenc.experiments.extend.perplexity import NllMemo, perplexities, token_windows
from posenc.experiments.extend.ruler import TASKS, RulerBuilder
from posenc.experiments.sequence_start import check_same_start, sequence_start, start_record
from tests.experiments.test_extend import Counter, tiny_llama
from tests.experiments.test_ruler_tasks import char_decode, char_encode, check_needle_starts

BOS = 1  # a character id no prompt text uses
TEXT = "The grass is green. The sky is blue. " * 40


def word_tokenizer(add_bos: bool):
    """A tiny transformers tokenizer (word level, <s> its BOS) that adds its BOS or not, as a checkpoint says."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["<s>", "<unk>", "The", "grass", "is", "green."]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", unk_token="<unk>", add_bos_token=add_bos)


@pytest.mark.parametrize(("add_bos", "start"), [(True, [0]), (False, [])])
def test_the_start_is_the_bos_exactly_when_the_tokenizer_adds_one(add_bos, start):
    assert sequence_start(word_tokenizer(add_bos)) == start


def test_a_tokenizer_that_puts_more_than_its_bos_first_is_one_line():
    class Prefixing:  # a prompt-template tokenizer: two ids before every text
        bos_token_id = 7

        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [7, 8, *char_encode(text)] if add_special_tokens else char_encode(text)

    with pytest.raises(ValueError) as err:
        sequence_start(Prefixing())
    assert str(err.value).startswith("tokenizer='Prefixing'") and "\n" not in str(err.value)


@pytest.mark.parametrize("start", [[BOS], []])
def test_windows_begin_with_the_start_and_keep_their_length(start):
    windows = token_windows(char_encode, TEXT, 10, 3, start)  # (3, 10)
    text_len = 10 - len(start)
    assert windows.shape == (3, 10)
    assert windows[:, : len(start)].tolist() == [start] * 3
    assert windows[:, len(start) :].flatten().tolist() == char_encode(TEXT)[: 3 * text_len]  # consecutive text


def test_perplexity_scores_every_text_token_and_never_the_start():
    model = tiny_llama(vocab=128)
    windows = token_windows(char_encode, TEXT, 32, 2, [BOS])  # (2, 32): BOS + 31 characters each
    with torch.no_grad():
        ppl = perplexities(model, Method("none", None, None, 0), [16, 32], NllMemo(windows, Counter()))
        for length in (16, 32):
            ids = windows[:, :length]  # the BOS is an input only: the targets are the length - 1 text tokens
            logits = model(ids)[:, :-1].double()  # (2, length-1, V)
            direct = F.cross_entropy(logits.reshape(-1, 128), ids[:, 1:].reshape(-1))
            assert ids[:, 1:].ne(BOS).all()
            assert ppl[length]["ppl"] == pytest.approx(math.exp(direct.item()), rel=1e-5)


def test_a_passkey_prompt_is_the_start_and_one_text_token_fewer():
    plain, started = PromptBuilder(char_encode), PromptBuilder(char_encode, [BOS])
    assert started.min_length() == plain.min_length() + 1
    for depth in (0.0, 0.5, 1.0):
        ours, text = started.build(400, depth, 12345), plain.build(399, depth, 12345)
        assert len(ours.ids) == 400 and ours.ids == [BOS, *text.ids]
        assert ours.needle_start == text.needle_start + 1
        assert char_decode(ours.ids[ours.needle_start :]).startswith("\nThe pass key is 12345.")


@pytest.mark.parametrize("task", list(TASKS))
def test_a_ruler_prompt_starts_with_the_start_and_keeps_its_length(task):
    plain, started = RulerBuilder(char_encode), RulerBuilder(char_encode, start=[BOS])
    least = started.min_length(task)
    assert least == plain.min_length(task) + 1
    for length in (least, least + 1, 2 * least):
        prompt = started.build(task, length, seed=1, trial=0)
        assert len(prompt.ids) == length and prompt.ids[0] == BOS and BOS not in prompt.ids[1:]
        check_needle_starts(prompt, char_decode)  # the needles' positions count the start


@pytest.mark.parametrize(
    ("stored", "start", "refused"),
    [
        (None, [2], False),  # a new run
        ({"config": {}}, [], False),  # a run from before the start was recorded, on a model without a BOS
        ({"config": {}}, [2], True),  # ... on a model with one: its sequences had none
        ({"sequence_start": start_record([2])}, [2], False),
    ],
)
def test_a_run_resumes_only_with_the_start_it_began_with(tmp_path, stored, start, refused):
    opened = SimpleNamespace(stored=stored, path=tmp_path)
    if not refused:
        check_same_start(opened, start)
        return
    with pytest.raises(ValueError) as err:
        check_same_start(opened, start)
    assert str(err.value).startswith("run_dir=") and "[2]" in str(err.value) and "\n" not in str(err.value)
