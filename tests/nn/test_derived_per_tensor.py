"""posenc.inference_tensors.DerivedPerTensor: what the GPU paths derive from a table every layer shares (padded rows,
row offsets) is made once while the very tensor lives unchanged, and made again when it changed in place, when
another tensor comes, or under inference_mode for a tensor it did not make for one call; a dead tensor's entry goes
with it, and the entries are bounded."""

from __future__ import annotations

import gc

import torch

from posenc.inference_tensors import DerivedPerTensor


def _counted():
    made = []

    def derive(t: torch.Tensor, scale: float) -> torch.Tensor:
        made.append(scale)
        return t * scale

    return DerivedPerTensor(derive, size=4), made


def test_a_value_follows_its_tensor_changed_in_place_and_its_arguments():
    derived, made = _counted()
    rows = torch.arange(4.0)
    first = derived(rows, 2.0)
    assert derived(rows, 2.0) is first and len(made) == 1  # the same tensor, unchanged: kept
    rows.add_(1.0)  # an optimizer step, or any in-place change
    assert torch.equal(derived(rows, 2.0), (torch.arange(4.0) + 1) * 2) and len(made) == 2
    assert torch.equal(derived(rows, 3.0), (torch.arange(4.0) + 1) * 3) and len(made) == 3
    same_values = rows.clone()  # another tensor, equal values: made again (identity, not values)
    derived(same_values, 2.0)
    assert len(made) == 4


def test_a_dead_tensors_entry_goes_with_it_and_entries_are_bounded():
    derived, _ = _counted()
    rows = torch.ones(3)
    derived(rows, 1.0)
    assert len(derived.kept) == 1
    del rows
    gc.collect()
    assert not derived.kept  # its value freed with it
    alive = [torch.full((2,), float(i)) for i in range(10)]
    for t in alive:
        derived(t, 1.0)
    assert len(derived.kept) <= 4


def test_an_inference_tensor_not_made_for_one_call_is_derived_every_time():
    derived, made = _counted()
    with torch.inference_mode():
        rows = torch.ones(3)
        derived(rows, 1.0)
        derived(rows, 1.0)
    assert len(made) == 2  # it may change in place unseen (no version counter): never kept
