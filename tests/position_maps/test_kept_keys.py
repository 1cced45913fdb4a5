"""Cached decoding keeps each map's rotated keys in the KV cache (KVCache.derived): a decode step rotates only its
new keys, and its output is bit for bit the one that re-rotates every cached key."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import mapped_attention as engine
from tests.position_maps.test_properties import SMALL, T, _ids
from tests.position_maps.tiny import tiny_llama, token_ids


def decode(model, ids) -> torch.Tensor:
    """Prefill 5 tokens, then one token at a time."""
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)]
    steps += [model(ids[:, t:t + 1], cache=cache) for t in range(5, T)]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_kept_keys_decode_bit_for_bit_as_rotating_every_key(spec, dtype, monkeypatch):
    """float64, and bfloat16 (keys rotated and values kept in float32, as the whole cache was converted)."""
    model = tiny_llama(attention_extension=spec, dtype=dtype)
    ids = token_ids(2, T)
    kept = decode(model, ids)
    real = engine.mapped_attention  # without the store: every cached key converted and rotated at each step
    monkeypatch.setattr(engine, "mapped_attention", lambda *args, kept=None, **kw: real(*args, **kw))
    assert torch.equal(kept, decode(model, ids))
    if dtype == torch.float64:
        assert (kept - model(ids)).abs().max().item() < 1e-10


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_a_decode_step_rotates_only_its_new_key(spec, monkeypatch):
    model = tiny_llama(attention_extension=spec)
    cache = model.new_cache()
    ids = token_ids(1, T)
    model(ids[:, :12], cache=cache)
    inner = model.schemes[0].inner
    sizes, original = [], type(inner).rotate
    monkeypatch.setattr(type(inner), "rotate", lambda self, q, k, q_pos, k_pos: sizes.append(k.shape[2]) or
                        original(self, q, k, q_pos, k_pos))
    model(ids[:, 12:13], cache=cache)
    # the step rotates its new key, or (map_decode) reads the rotation's tables (no rotate()) or rotates unit
    # vectors at the maps' positions once for every layer: one position per map and key table, never the 12 cached
    # keys again
    assert max(sizes, default=0) <= 6, f"a decode step rotated {max(sizes)} keys at once (every cached key again)"


@torch.no_grad()
def test_kept_keys_are_dropped_when_the_positions_differ():
    """The same store handed keys at other positions (a store reused by mistake) rotates them all again."""
    model = tiny_llama(attention_extension=SMALL[0])
    scheme = model.schemes[0]
    g = torch.Generator().manual_seed(3)
    k = torch.randn(1, 2, 9, 16, generator=g, dtype=torch.float64)
    kept: dict = {}
    pos = torch.arange(9)[None]
    first = engine._rotate_keys(scheme.inner, k, pos, kept, 0)
    torch.testing.assert_close(first, engine._rotate_keys(scheme.inner, k, pos), rtol=0, atol=0)
    moved = engine._rotate_keys(scheme.inner, k, pos + 3, kept, 0)
    assert torch.equal(moved, engine._rotate_keys(scheme.inner, k, pos + 3))
    longer = torch.randn(1, 2, 11, 16, generator=g, dtype=torch.float64)
    longer[:, :, :9] = k
    assert torch.equal(engine._rotate_keys(scheme.inner, longer, torch.arange(11)[None] + 3, kept, 0),
                       engine._rotate_keys(scheme.inner, longer, torch.arange(11)[None] + 3))


@pytest.mark.parametrize("spec", SMALL, ids=_ids)
@torch.no_grad()
def test_a_decode_step_trusts_the_cache_positions_without_comparing_them(spec):
    """The kept keys derive from the KV cache's own positions buffer (appended to only): a step compares no kept
    positions (torch.equal, a read of the device on a GPU), in any layer."""
    from tests.models.host_syncs import HostSyncCount

    model = tiny_llama(attention_extension=spec)
    cache = model.new_cache()
    ids = token_ids(1, T)
    model(ids[:, :12], cache=cache)
    model(ids[:, 12:13], cache=cache)
    count = HostSyncCount()
    with count:
        model(ids[:, 13:14], cache=cache)
    assert not [where for where in count.where if "aten.equal" in where], dict(count.where)
