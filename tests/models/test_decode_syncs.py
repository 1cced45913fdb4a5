"""The ordinary cached decode step (generate()'s model(token, position_ids, cache)) reads the device back to the
host a fixed number of times, whatever the number of layers: what a step must decide from positions it decides once
per forward, and the ids and positions generate() made itself are not read again (benchmarks/decode_syncs.py
prints the counts per model)."""

from __future__ import annotations

import pytest
import torch

from posenc.models.inputs import check_positions, check_token_ids, vouch
from tests.models.host_syncs import decode_step_syncs, generate_syncs
from tests.models.static_support import VOCAB, WINDOW, gemma_like, gpt

PROMPT = torch.randint(0, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
PAST_WINDOW = WINDOW  # steps: the sliding layers' first keys have left the window


def sliding(n: int):
    """A Gemma-3-shaped decoder with n sliding layers and one full one."""
    return gemma_like(n_layer=n + 1, layer_types=("sliding_attention",) * n + ("full_attention",))


def test_a_gemma_shaped_step_reads_the_host_as_often_with_2_sliding_layers_as_with_6():
    few, many = decode_step_syncs(sliding(2), PROMPT, PAST_WINDOW), decode_step_syncs(sliding(6), PROMPT, PAST_WINDOW)
    assert sum(few.values()) == sum(many.values()), f"2 sliding layers: {dict(few)}; 6: {dict(many)}"


def test_generate_checks_the_prompt_once_and_its_steps_read_nothing_back_without_a_position_read():
    """GPT without a position scheme: the prompt's ids read once (one read for min and max), the decode steps
    nothing: the ids generate() drew and the positions it advanced are its own."""
    calls, own = generate_syncs(gpt("none"), PROMPT, 6)
    assert [sum(c.values()) for c in calls[1:]] == [0] * 5, calls
    assert list(own.values()) == [1] and "check_token_ids" in next(iter(own)), own


def test_vouched_values_changed_in_place_or_asked_of_a_smaller_vocabulary_are_read_again():
    ids = vouch(torch.tensor([[3, 4]]), ("ids", 10))
    check_token_ids(ids, 10)  # vouched: not read
    with pytest.raises(ValueError, match=r"input_ids=4 .*vocab_size=4"):
        check_token_ids(ids, 4)  # drawn over 10 ids: not vouched for 4
    ids[0, 0] = -1
    with pytest.raises(ValueError, match=r"input_ids=-1 "):
        check_token_ids(ids, 10)
    positions = vouch(torch.tensor([[5, 6]]), "positions")
    positions[0, 1] = -2
    with pytest.raises(ValueError, match=r"position_ids=-2 "):
        check_positions(positions, ids)
