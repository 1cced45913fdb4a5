"""The native decode step under a position map (runs_attention.attend_runs, csrc/map_decode.cpp): each run of keys
scored by its own map's query against its own key table, one softmax over every run, equals that definition written
out in float64; a float32 and a bfloat16 model's decode step under each map takes it and equals the operators' path
(bfloat16: both on float32 queries, keys and values, the output rounded once)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import native, runs_attention
from tests.position_maps.test_map_decode import MAPS
from tests.position_maps.tiny import tiny_llama, token_ids

pytestmark = pytest.mark.skipif(not native.has_gemm(), reason="native kernels not built on this machine")


def _definition(queries, tables, v, runs, scale):
    """float64: scores of every run side by side, one softmax, the attended keys' values."""
    scores = torch.cat([scale * queries[m].double() @ tables[t][:, :, a:z].double().transpose(-1, -2)
                        for m, t, a, z in runs], dim=-1)  # (B,Hkv,G,attended)
    values = torch.cat([v[:, :, a:z].double() for _, _, a, z in runs], dim=2)
    return scores.softmax(-1) @ values


def test_runs_equal_their_definition_across_key_blocks_gaps_and_key_heads():
    g = torch.Generator().manual_seed(0)
    b, hkv, groups, tk, d = 2, 2, 3, 2500, 16
    queries = torch.randn(2, b, hkv, groups, d, generator=g)  # two maps
    big = torch.randn(b, hkv, tk + 40, d, generator=g)  # a kept buffer longer than the keys: its strides differ
    tables = [torch.randn(b, hkv, tk, d, generator=g), big[:, :, :tk]]
    v = torch.randn(b, hkv, tk, d, generator=g)
    # map 1 over table 1 and map 0 over table 0, a gap of unattended keys, runs across the kernel's 1024-key blocks
    runs = [(1, 1, 0, 700), (0, 0, 700, 1100), (1, 1, 1300, 2500)]
    out = runs_attention.attend_runs(queries, tables, v, runs, 0.25)
    torch.testing.assert_close(out.double(), _definition(queries, tables, v, runs, 0.25), rtol=1e-5, atol=1e-5)


def test_runs_outside_the_keys_or_tables_are_refused_before_the_kernel_runs():
    queries, table = torch.randn(1, 1, 2, 1, 8), torch.randn(1, 2, 30, 8)
    for run in [(0, 0, 0, 31), (1, 0, 0, 5), (0, 1, 0, 5), (0, 0, 5, 5)]:
        with pytest.raises(ValueError, match="outside"):
            runs_attention.attend_runs(queries, [table], table, [run], 1.0)
    with pytest.raises(ValueError, match="key table 0 has shape"):
        runs_attention.attend_runs(queries, [torch.randn(1, 2, 30, 4)], table, [(0, 0, 0, 5)], 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("spec", MAPS, ids=lambda s: s["type"])
@torch.no_grad()
def test_a_decode_step_under_each_map_takes_the_kernel_and_equals_the_operators(spec, dtype, monkeypatch):
    model = tiny_llama(attention_extension=spec, dtype=dtype)
    ids = token_ids(2, 40)
    calls, original = [], runs_attention.attend_runs
    monkeypatch.setattr(runs_attention, "attend_runs", lambda *a: calls.append(1) or original(*a))
    outputs = []
    for native_runs in (True, False):
        if not native_runs:
            monkeypatch.setattr(runs_attention, "can_run", lambda *a: False)
        cache = model.new_cache()
        model(ids[:, :30], cache=cache)
        outputs.append(torch.cat([model(ids[:, t : t + 1], cache=cache) for t in range(30, 40)], dim=1))
    assert len(calls) == 10 * 2  # ten steps, two layers each, only with the kernel on
    # bf16: a layer's output rounded the other way now and then moves a logit (magnitude up to ~8) by one of its ulps
    rtol, atol = (1e-5, 1e-5) if dtype == torch.float32 else (2e-2, 7e-2)
    torch.testing.assert_close(outputs[0], outputs[1], rtol=rtol, atol=atol)
