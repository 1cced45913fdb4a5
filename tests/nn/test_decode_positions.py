"""A decode step's work on positions does not grow with the cache: the check that key positions count up by one
(posenc.nn.row_paths' offsets) reads only the keys new since the last check, the frame from the first key
(posenc.scheme.from_first_key: FIRE, xPos) subtracts only the new ones, and FIRE's bias row is one native call on the
CPU (posenc.nn.fused_attention.piecewise_row) equal to the PyTorch formula it replaces. Facts learned about the cache's
positions stay learned: a break in the prompt's positions keeps every later step off the paths that need none."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import decode_paths, fused_attention, row_paths
from posenc.nn import native as native_kernels
from posenc.nn.kv_cache import KVCache, from_first_entry, leading_entries
from posenc.nn.row_paths import Offsets
from tests.conftest import VOCAB, tiny_gpt
from tests.models.op_counts import OpCount

PROMPT, STEPS = 40, 6


def _prefilled(name: str, prompt: int = PROMPT):
    model = tiny_gpt(name)
    ids = torch.randint(0, VOCAB, (2, prompt + STEPS), generator=torch.Generator().manual_seed(1))
    cache = model.new_cache()
    with torch.no_grad():
        model(ids[:, :prompt], cache=cache)
    return model, ids, cache


@pytest.mark.parametrize("name", ["alibi", "fire", "xpos"])
def test_a_decode_step_allocates_nothing_as_long_as_the_cache_for_its_positions(name):
    """The old step subtracted the first key from every key position (B,Tk) and took their differences (B,Tk-1)."""
    model, ids, cache = _prefilled(name)
    with torch.no_grad():
        model(ids[:, PROMPT : PROMPT + 1], cache=cache)  # the first step counts the prompt's keys once
        tk = cache.length + 1
        with OpCount() as counted:
            model(ids[:, PROMPT + 1 : PROMPT + 2], cache=cache)
    position_sized = {shape for (_, shape) in counted.allocated if len(shape) == 2 and shape[-1] in (tk - 1, tk)}
    assert position_sized == set(), f"{name}: a step allocated {position_sized} for the cache's {tk} key positions"


def test_the_offsets_check_of_a_step_reads_the_new_key_positions_only(monkeypatch):
    read = []
    for counter in ("_steps_not_one", "_steps_not_one_on_host"):  # on a device / on the CPU's decode path
        counted = getattr(row_paths, counter)
        monkeypatch.setattr(row_paths, counter, lambda pos, counted=counted: read.append(pos.shape[1]) or counted(pos))
    model, ids, cache = _prefilled("alibi")
    with torch.no_grad():
        for t in range(PROMPT, PROMPT + STEPS):
            read.clear()
            model(ids[:, t : t + 1], cache=cache)
            assert read and max(read) <= 2, f"step at {t} read {read} key positions"


@pytest.mark.parametrize("name", ["alibi", "fire"])
def test_a_break_in_the_prompt_positions_is_remembered_by_every_later_step(name):
    """Positions 0..19 then 30..: a jump in the prompt. Each step's new key continues the last one by one, so a check
    of the new keys alone passes; the steps must still not take the paths that need every key counting up by one
    (they would read the bias by index): decoding equals the full forward at the same positions."""
    model = tiny_gpt(name)
    ids = torch.randint(0, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    positions = torch.cat((torch.arange(20), torch.arange(30, 30 + PROMPT - 20 + STEPS))).expand(2, -1)
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(ids[:, :PROMPT], position_ids=positions[:, :PROMPT], cache=cache)]
        steps += [model(ids[:, t : t + 1], position_ids=positions[:, t : t + 1], cache=cache)
                  for t in range(PROMPT, PROMPT + STEPS)]
        full = model(ids, position_ids=positions)
    decoded = torch.cat(steps, dim=1)
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


@pytest.mark.parametrize("name", ["alibi", "fire"])
def test_a_jump_in_a_decode_steps_position_is_counted_and_remembered(name):
    """Positions count up by one through the prompt and the first steps, then one step jumps by 7: that step's check
    of its new key finds the break, and every later step (whose own new key continues by one) still avoids the
    paths that read the bias by index: decoding equals the full forward at the same positions."""
    model = tiny_gpt(name)
    ids = torch.randint(0, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(2))
    jump = PROMPT + 2
    positions = torch.cat((torch.arange(jump), torch.arange(jump + 7, PROMPT + STEPS + 7))).expand(2, -1)
    cache = model.new_cache()
    with torch.no_grad():
        steps = [model(ids[:, :PROMPT], position_ids=positions[:, :PROMPT], cache=cache)]
        steps += [model(ids[:, t : t + 1], position_ids=positions[:, t : t + 1], cache=cache)
                  for t in range(PROMPT, PROMPT + STEPS)]
        full = model(ids, position_ids=positions)
    decoded = torch.cat(steps, dim=1)
    torch.testing.assert_close(decoded, full, rtol=1e-4, atol=1e-4 * full.abs().max().item())


def test_a_cache_positions_from_the_first_key_are_kept_and_equal_the_subtraction():
    cache = KVCache(1)
    first = torch.tensor([[5, 6, 7], [100, 101, 102]])
    keys = cache.add_positions(first)
    shifted = from_first_entry(keys)
    for t in range(40):  # grows past the buffers' first capacity (16)
        keys = cache.add_positions(torch.tensor([[8 + t], [103 + 2 * t]]))
        shifted = from_first_entry(keys)
        torch.testing.assert_close(shifted, keys - keys[:, :1], rtol=0, atol=0)
        assert leading_entries(shifted) is not None  # itself a cache of positions: checked incrementally in turn
    assert from_first_entry(keys[:, :10]).shape == (2, 10)  # an older, shorter view reads the kept prefix
    torch.testing.assert_close(from_first_entry(keys[:, :10]), keys[:, :10] - keys[:, :1], rtol=0, atol=0)
    assert leading_entries(keys[:, 1:]) is None and leading_entries(keys[:1]) is None  # not the leading entries


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("position", [0, 7, 511, 900])
def test_the_native_fire_row_equals_the_pytorch_formula(shared, position, monkeypatch):
    if native_kernels.library() is None:
        pytest.skip("no native kernels here (POSENC_NATIVE=0 or no compiler)")
    scheme = tiny_gpt("fire").schemes.layer(0)
    rows = 1 if shared else 2  # two batch rows at different offsets: each reads its own run of the feature
    delta = torch.tensor([position, position + 3][:rows])
    offsets, q_pos = Offsets(delta, position, int(delta[-1])), delta[:, None]
    served, kernel = [], fused_attention.piecewise_row
    monkeypatch.setattr(fused_attention, "piecewise_row", lambda *args: served.append(kernel(*args)) or served[-1])
    with torch.no_grad():
        pieces = scheme.piecewise_bias(q_pos, -int(delta[-1]), 0)
        native = decode_paths.one_query(pieces, offsets, position + 1)
        assert served and served[-1] is not None  # the native kernel made the row, not the formula
        monkeypatch.setattr(fused_attention, "piecewise_row", lambda *args: None)  # the PyTorch formula
        formula = decode_paths.one_query(pieces, offsets, position + 1)
    assert native.shape == formula.shape == (rows, scheme.dims.n_head, 1, position + 1)
    torch.testing.assert_close(native, formula, rtol=1e-6, atol=1e-6)
