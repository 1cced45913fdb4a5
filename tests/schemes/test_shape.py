"""SHAPE (Kiyono et al. 2021): sinusoidal embeddings of pos + k, one random k per sequence in
training, none at evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.absolute.shape import SHAPE
from posenc.absolute.sinusoidal import sinusoidal_table
from posenc.models import GPTConfig
from posenc.scheme import Dims

D = 16


def added(scheme: SHAPE, pos: torch.Tensor) -> torch.Tensor:
    return scheme.embed(torch.zeros(*pos.shape, D), pos)  # (B,T,D): the position term alone


def test_eval_is_scaled_sinusoidal_of_the_given_positions():
    scheme = SHAPE(Dims(D, 2, 8, 64, init_std=0.02), shape_max_shift=100).eval()
    pos = torch.arange(5, 17).expand(3, -1)
    expected = math.sqrt(2) * 0.02 * sinusoidal_table(pos, D)
    torch.manual_seed(1)
    first = added(scheme, pos)
    torch.manual_seed(2)  # no shift is drawn at evaluation: another RNG state gives the same embedding
    torch.testing.assert_close(first, expected)
    torch.testing.assert_close(added(scheme, pos), expected)


def test_training_shifts_each_sequence_by_one_k_in_range():
    torch.manual_seed(0)
    scheme = SHAPE(Dims(D, 2, 8, 64), shape_max_shift=3).train()
    pos = torch.arange(12).expand(4, -1)
    candidates = torch.stack([added(scheme.eval(), pos + k) for k in range(4)])  # (4 shifts,B,T,D)
    seen = set()
    for _ in range(30):
        out = added(scheme.train(), pos)  # (B,T,D)
        for row in range(4):
            match = [k for k in range(4) if torch.allclose(out[row], candidates[k, row])]
            assert len(match) == 1  # a whole row shifted by one k in [0, 3]
            seen.add(match[0])
    assert seen == {0, 1, 2, 3}  # both ends of [0, max_shift] are drawn


def test_zero_max_shift_is_plain_sinusoidal_in_training():
    scheme = SHAPE(Dims(D, 2, 8, 64), shape_max_shift=0).train()
    pos = torch.arange(9)[None]
    torch.testing.assert_close(added(scheme, pos), added(scheme.eval(), pos))


def test_max_shift_is_validated():
    with pytest.raises(ValueError, match=r"shape_max_shift=-1"):
        GPTConfig(position_embedding_type="shape", shape_max_shift=-1)
