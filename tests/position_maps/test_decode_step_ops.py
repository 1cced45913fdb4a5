"""A cached decode step under each map, on the GPU's code path (map_triton, Triton's RoPE), costs the host a bounded
number of operators over plain RoPE's step (issue 34 item 4: the eager step is host-bound, each launch a few us).
Counted, not timed: posenc is told Triton serves CPU tensors and every Triton launch is a counted no-op, so the
Python of the GPU path runs whole and only the kernels are skipped (their outputs are left unwritten).

Per layer a map adds over RoPE's step: its new key rotated into each key table's kept buffer (one launch per table),
the one-pass kernel in place of SDPA, and the merge of the key shares (softmax, product, sum, cast); what a step
derives from positions alone (each map's rows, the new keys' rows, int32 positions, the score scale) is built once
per step for every layer, with one read of the positions."""

from __future__ import annotations

import pytest
import torch

from posenc.models import GPT, GPTConfig
from posenc.nn import attention_core
from posenc.nn import triton as gpu
from tests.models.op_counts import OpCount

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
SPECS = {"self_extend": {"type": "self_extend", "group_size": 4, "window": 8}, "dual_chunk": {"type": "dual_chunk"},
         "lm_infinite": {"type": "lm_infinite"}, "attention_sinks": {"type": "attention_sinks"},
         "string": {"type": "string"}}
TRAINED, CONTEXT = 16, 64  # every map past its window
# A map's most excess over RoPE's step, per layer (Self-Extend's and LM-Infinite's two key tables; one table: 4, 4, 7):
# launches (a rotation per key table, the kernel for SDPA, the merge's 4, less RoPE's own rotation), allocations and
# operators. Before the step's work was shared by the layers (and the kept keys rotated in place): 11-14 launches,
# 10-11 allocations, 22-31 operators.
EXCESS_PER_LAYER = {"launches": 5, "allocs": 4, "aten": 10}


@pytest.fixture
def gpu_path(monkeypatch) -> list[OpCount]:
    """posenc's Triton paths taken on CPU tensors, each launch a no-op, counted by the OpCount the list holds while
    a step is counted."""
    from posenc.nn.triton import mapped, rotary

    counting: list[OpCount] = []
    monkeypatch.setattr(gpu, "_interpret", [True])
    for module in (mapped, rotary):
        monkeypatch.setattr(module, "launch", lambda kernel, grid, *args, **options: [
            count.launched(getattr(kernel, "__name__", "kernel")) for count in counting])
    monkeypatch.setattr(attention_core, "_few_rows_in_float32", lambda *args, **kwargs: None)  # a GPU's bf16 SDPA
    return counting


@torch.no_grad()
def _step(spec: dict | None, layers: int, counting: list[OpCount]) -> OpCount:
    """The counts of the third decode step after a CONTEXT-token prompt, bf16 (the GPU's dtype)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=31, n_layer=layers, n_head=2, d_model=64, max_seq_len=TRAINED,
                          position_embedding_type="rope", attention_extension=spec)).eval().to(torch.bfloat16)
    cache, token = model.new_cache(), torch.zeros(1, 1, dtype=torch.long)
    model(torch.randint(0, 31, (1, CONTEXT)), cache=cache)
    for _ in range(2):
        model(token, cache=cache)
    count = OpCount()
    counting.append(count)
    with count:
        model(token, cache=cache)
    counting.clear()
    return count


@pytest.mark.parametrize("name", list(SPECS))
def test_a_decode_step_under_a_map_costs_a_bounded_excess_over_rope_per_layer(name, gpu_path):
    rope = {n: _step(None, n, gpu_path).columns for n in (1, 3)}
    mapped = {n: _step(SPECS[name], n, gpu_path) for n in (1, 3)}
    assert mapped[3].where["triton _mapped_forward"] == 3, dict(mapped[3].where)  # the kernel served each layer
    excess = {c: ((mapped[3].columns[c] - mapped[1].columns[c]) - (rope[3][c] - rope[1][c])) / 2
              for c in EXCESS_PER_LAYER}
    assert all(excess[c] <= bound for c, bound in EXCESS_PER_LAYER.items()), \
        f"{name}: per layer over RoPE's {excess}, allowed {EXCESS_PER_LAYER}; operators {dict(mapped[3].where)}"
    # host reads: none per layer, and one per step over RoPE's (every map's positions read at once)
    assert mapped[3].columns["syncs"] == mapped[1].columns["syncs"] <= rope[1]["syncs"] + 1, \
        f"{name}: {dict(mapped[3].where)}"
