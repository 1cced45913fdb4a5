"""Each map's pair rule (PositionMap.pair_rule: the selector as data, what the GPU kernel reads per tile) says the
same as its select() on every pair, by the rule's documented meaning (posenc.position_map.PAIR_RULES); positions
from an offset, so the origin is read, and past every window and chunk."""

from __future__ import annotations

import pytest
import torch

from posenc.position_map import CHUNKS, SPLIT, WINDOW_AND_START, PairRule
from posenc.position_maps.window import Windowed
from posenc.registry import build_position_map

SPECS = [
    {"type": "self_extend", "group_size": 3, "window": 5},
    {"type": "dual_chunk", "chunk_size": 8, "local_window": 2},
    {"type": "dual_chunk"},
    {"type": "lm_infinite", "n_global": 2, "window": 6},
    {"type": "attention_sinks", "n_sink": 3, "window": 5},
    {"type": "string", "shifted_offset": 7, "local_value": 2},
]


def by_rule(rule: PairRule, q_pos: torch.Tensor, k_pos: torch.Tensor, origin: torch.Tensor) -> torch.Tensor:
    """(B,C), (B,Tk), (B,1) -> (B,C,Tk): the map of each pair as PAIR_RULES documents it, -1 for none."""
    qp, kp = q_pos[:, :, None], k_pos[:, None, :]
    d = qp - kp
    if rule.kind == SPLIT:
        chosen = torch.where(d < rule.a, 0, 1)
    elif rule.kind == WINDOW_AND_START:
        chosen = torch.where(d < rule.a, 0, torch.where(kp - origin[:, :, None] < rule.b, 1, -1))
    else:
        assert rule.kind == CHUNKS
        apart = torch.div(qp, rule.a, rounding_mode="floor") - torch.div(kp, rule.a, rounding_mode="floor")
        chosen = apart.clamp(0, 2)
    return torch.where(d < rule.window, chosen, -1) if rule.window else chosen


@pytest.mark.parametrize("slide", [0, 4, 9])
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s["type"])
def test_the_pair_rule_is_the_selector(spec, slide):
    position_map = build_position_map(spec, 16)
    if slide:
        position_map = Windowed(inner=position_map, window=slide)
    k_pos = torch.stack([torch.arange(40), torch.arange(40) + 5])  # two rows, different origins
    q_pos = k_pos[:, 25:]
    origin = k_pos[:, :1]
    rule = position_map.pair_rule()
    expected = position_map.select(q_pos, k_pos, origin).long()
    assert torch.equal(by_rule(rule, q_pos, k_pos, origin), expected)
    if not slide:  # every map is exercised (a sliding window removes the far ones)
        assert set(expected.unique().tolist()) - {-1} == set(range(position_map.n_maps))
