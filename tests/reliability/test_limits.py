"""Over-long requests fail fast with the limit in the message, before anything is allocated."""

from __future__ import annotations

import re

import pytest
import torch

from posenc.models.limits import SequenceTooLong, check_fits, longest_that_fits, needed_bytes
from posenc.nn.attention import SelfAttention
from posenc.registry import SCHEMES
from tests.conftest import tiny_gpt


def test_an_over_long_request_fails_before_the_forward_with_the_longest_length_that_fits(monkeypatch):
    model = tiny_gpt("shaw")  # Shaw's eager path holds (B,H,T,T) scores
    ids = torch.zeros(1, 300_000, dtype=torch.long)

    def must_not_run(*args, **kwargs):
        raise AssertionError("the forward started before the length was checked")

    monkeypatch.setattr(torch.nn.Embedding, "forward", must_not_run)  # the model's very first step
    monkeypatch.setattr(SelfAttention, "forward", must_not_run)
    with pytest.raises(SequenceTooLong) as err:
        model(ids)
    message = str(err.value)
    longest = int(re.search(r"the longest that fits is ~(\d+) tokens", message).group(1))
    assert "sequence length 300000" in message and "GiB are available" in message
    assert 1_000 < longest < 300_000


@pytest.mark.parametrize("name", ["alibi", "rope", "shaw"])
def test_longest_that_fits_is_the_boundary_of_the_estimate(name):
    scheme = SCHEMES[name].__new__(SCHEMES[name])  # the estimate reads class flags only
    budget = 2**30
    longest = longest_that_fits(1, 8, 256, scheme, budget)
    assert needed_bytes(1, 8, 256, longest, longest, scheme) <= budget
    assert needed_bytes(1, 8, 256, longest + 1, longest + 1, scheme) > budget
    check_fits(1, 8, 256, longest, longest, scheme, budget)
    with pytest.raises(SequenceTooLong):
        check_fits(1, 8, 256, longest + 1, longest + 1, scheme, budget)


def test_bias_schemes_are_bounded_by_chunk_rows_not_by_t_squared():
    alibi, shaw = SCHEMES["alibi"].__new__(SCHEMES["alibi"]), SCHEMES["shaw"].__new__(SCHEMES["shaw"])
    assert longest_that_fits(1, 8, 256, alibi, 2**33) > 10 * longest_that_fits(1, 8, 256, shaw, 2**33)
