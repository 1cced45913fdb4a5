"""perplexity()'s two modes against references written here: nonoverlapping is one cross_entropy over
a batch of windows; sliding scores every token exactly once, each from its own forward pass over the
context the ALiBi paper's protocol gives it (the window it falls in the last `stride` tokens of)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from posenc.experiments.evaluation.perplexity import perplexity
from tests.conftest import VOCAB, tiny_gpt

TEXT = torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(0))
SCHEMES = ["learned_absolute", "alibi"]  # absolute positions (an offset mistake shows) and a bias


def model_for(scheme: str):
    return tiny_gpt(scheme, init_std=0.3)  # large weights: a token's loss depends strongly on its context


@torch.no_grad()
def nonoverlapping_reference(model, tokens, length: int, max_windows: int, offset: int = 0) -> float:
    count = min(max_windows, (len(tokens) - 1) // length)  # windows of length + 1 tokens, overlapping by one
    windows = torch.stack([tokens[i * length : i * length + length + 1] for i in range(count)])  # (W,L+1)
    pos = torch.arange(offset, offset + length).expand(count, length)
    logits = model(windows[:, :-1], position_ids=pos)  # (W,L,V)
    return math.exp(F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].reshape(-1)).item())


@torch.no_grad()
def sliding_reference(model, tokens, length: int, stride: int, max_windows: int) -> float:
    """Target j is predicted from tokens[start : j], where start is the first window start
    (0, stride, 2 stride, ...) whose window [start, start + length) still holds position j - 1."""
    starts = [s for s in range(0, len(tokens) - length, stride)][:max_windows]
    last_target = starts[-1] + length
    nll = []
    for j in range(1, last_target + 1):
        start = next(s for s in starts if j - 1 < s + length)
        assert j - start >= (1 if start == 0 else length - stride + 1)  # the stated context
        context = tokens[start:j][None]
        logits = model(context, position_ids=torch.arange(j - start)[None])[0, -1]
        nll.append(F.cross_entropy(logits[None], tokens[j : j + 1]).item())
    return math.exp(sum(nll) / len(nll))


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("length", "max_windows"), [(16, 16), (16, 3), (20, 100)])
def test_nonoverlapping_equals_cross_entropy_over_the_windows(scheme, length, max_windows):
    model = model_for(scheme)
    ours = perplexity(model, TEXT, length, mode="nonoverlapping", max_windows=max_windows)
    assert ours == pytest.approx(nonoverlapping_reference(model, TEXT, length, max_windows), rel=1e-5)


def test_nonoverlapping_with_a_position_offset_moves_every_position():
    model = model_for("learned_absolute")
    ours = perplexity(model, TEXT, 16, mode="nonoverlapping", max_windows=4, position_offset=7)
    assert ours == pytest.approx(nonoverlapping_reference(model, TEXT, 16, 4, offset=7), rel=1e-5)
    assert ours != pytest.approx(nonoverlapping_reference(model, TEXT, 16, 4), rel=1e-3)  # the offset mattered


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize(("length", "stride", "max_windows"), [(16, 8, 16), (16, 5, 16), (16, 1, 40), (12, 7, 3)])
def test_sliding_scores_each_token_once_with_the_stated_context(scheme, length, stride, max_windows):
    model = model_for(scheme)
    ours = perplexity(model, TEXT, length, mode="sliding", stride=stride, max_windows=max_windows)
    assert ours == pytest.approx(sliding_reference(model, TEXT, length, stride, max_windows), rel=1e-5)


def test_sliding_default_stride_is_half_the_window_and_a_full_stride_is_nonoverlapping():
    model = model_for("learned_absolute")
    assert perplexity(model, TEXT, 16, mode="sliding") == pytest.approx(sliding_reference(model, TEXT, 16, 8, 16),
                                                                        rel=1e-5)
    assert perplexity(model, TEXT, 16, mode="sliding", stride=16) == pytest.approx(
        perplexity(model, TEXT, 16, mode="nonoverlapping"), rel=1e-6)
    # more context per scored token: sliding differs from nonoverlapping on a context-dependent model
    assert perplexity(model, TEXT, 16, mode="sliding", stride=4) != pytest.approx(
        perplexity(model, TEXT, 16, mode="nonoverlapping"), rel=1e-3)


class _Bigram(torch.nn.Module):
    """Logits from the current token only: its NLL of a text does not depend on where windows start."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(0)))

    def forward(self, input_ids, position_ids=None):
        return self.table[input_ids]


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_every_length_scores_the_same_text(mode):
    """A model blind to context gets one perplexity at every length iff every length scores the same
    tokens (with a window count per length, 8x read 8 times the text of 1x)."""
    from posenc.experiments.config.sections import EvalConfig
    from posenc.experiments.evaluation.perplexity import perplexity_by_length

    tokens = torch.randint(0, VOCAB, (5000,), generator=torch.Generator().manual_seed(1))
    cfg = EvalConfig(length_multipliers=(1, 2, 4, 8), mode=mode, max_windows=3)
    ppl = perplexity_by_length(_Bigram(), tokens, 16, cfg)
    assert len(ppl) == 4
    for value in ppl.values():
        assert value == pytest.approx(ppl[16], rel=1e-6)
    # and that text is max_windows windows of the longest length
    whole = perplexity(_Bigram(), tokens[: 3 * 128 + 1], 128, "nonoverlapping", max_windows=3)
    assert ppl[128] == pytest.approx(whole, rel=1e-6)
