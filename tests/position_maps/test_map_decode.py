"""The CPU's decode kernel under a map (posenc/nn/mapped_decode.py, map_decode) against the general path it stands in
front of (map_fused: chunks, a selector, one fused kernel per map and range, a log-sum-exp merge): every step of a
decode equal to it across each map's boundaries, for every rotary scheme and pairing the maps take; rows at other
positions handed to the general path; and its host work per layer bounded (counted, not timed)."""

from __future__ import annotations

import pytest
import torch

from posenc.nn import dispatch
from posenc.nn.call import Call
from posenc.nn.mapped_decode import map_decode
from posenc.position_maps.scheme import PositionMapped
from tests.conftest import tiny_gpt
from tests.models.op_counts import OpCount
from tests.position_maps.test_properties import SMALL, T, _ids
from tests.position_maps.tiny import tiny_llama, token_ids

MAPS = [*SMALL, {"type": "string", "shifted_offset": 7, "local_value": 2},
        {"type": "self_extend", "group_size": 2, "window": 4, "scale_base": 8},  # a score scale per query
        {"type": "dual_chunk", "chunk_size": 8, "local_window": 2}]  # its scale by the length
MODELS = {  # the rotary schemes and pairings a map wraps
    "llama": lambda spec: tiny_llama(attention_extension=spec),  # RoPE, half-split pairs, GQA 4:2
    "llama_yarn": lambda spec: tiny_llama(attention_extension=spec,
                                          rope_scaling={"rope_type": "yarn", "factor": 2.0}),
    "xpos": lambda spec: tiny_gpt("xpos", max_seq_len=16, attention_extension=spec).double(),  # scales q and k apart
    "p_rope": lambda spec: tiny_gpt("p_rope", max_seq_len=16, attention_extension=spec).double(),  # rotates part
    "rope_interleaved": lambda spec: tiny_gpt("rope", max_seq_len=16, rotary_interleaved=True,
                                              attention_extension=spec).double(),
}


def _decoded(model, ids: torch.Tensor, served: list[int]) -> torch.Tensor:
    """Logits of a 5-token prefill then one token at a time; served[0] counts the steps map_decode served."""
    cache = model.new_cache()
    steps = [model(ids[:, :5], cache=cache)]
    steps += [model(ids[:, t:t + 1], cache=cache) for t in range(5, ids.shape[1])]
    return torch.cat(steps, dim=1)


@pytest.fixture
def counted(monkeypatch) -> list[int]:
    served = [0]

    def counting(call):
        out = map_decode(call)
        served[0] += out is not None
        return out

    monkeypatch.setitem(dispatch.KERNELS, "map_decode", counting)
    return served


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("spec", MAPS, ids=_ids)
@torch.no_grad()
def test_every_decode_step_equals_the_general_path(spec, model, counted, monkeypatch):
    ids = token_ids(2, T)
    built = MODELS[model](spec)
    fast = _decoded(built, ids, counted)
    n_layer = len(built.blocks)
    assert counted[0] == n_layer * (T - 5), "map_decode did not serve every step"
    monkeypatch.setitem(dispatch.KERNELS, "map_decode", lambda call: None)  # the general path: map_fused
    general = _decoded(built, ids, counted)
    assert (fast - general).abs().max().item() < 1e-12
    if not built.layer_scheme(0).position_map.length_scaled:  # DCA's scale reads the call's length: a step is not
        assert (fast - built(ids)).abs().max().item() < 1e-10  # a longer call's row; else equal to recomputation


@pytest.mark.parametrize("spec", MAPS[:2], ids=_ids)
@torch.no_grad()
def test_half_precision_decodes_as_the_general_path_does(spec, counted, monkeypatch):
    """bfloat16: scores and sums in float32 on both paths (one rounding at the end), so the two agree to float32's
    rounding, far inside bfloat16's."""
    ids = token_ids(1, T)
    built = tiny_llama(attention_extension=spec, dtype=torch.bfloat16)
    fast = _decoded(built, ids, counted)
    assert counted[0] > 0
    monkeypatch.setitem(dispatch.KERNELS, "map_decode", lambda call: None)
    general = _decoded(built, ids, counted)
    assert (fast.float() - general.float()).abs().max().item() < 1e-2 * general.float().abs().max().item()


@torch.no_grad()
def test_rows_under_other_runs_of_keys_are_left_to_the_general_path():
    """Rows whose keys fall into the maps alike (here: the same distances from a shifted origin) are served, each at
    its own positions; rows that do not (a gap in the second row's positions) are declined, and the dispatch's next
    kernel answers."""
    scheme = tiny_llama(attention_extension=SMALL[0]).layer_scheme(0)
    assert isinstance(scheme, PositionMapped)
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 1, 16, dtype=torch.float64), *torch.randn(2, 2, 2, 20, 16, dtype=torch.float64)
    general = dispatch.KERNELS["map_fused"]
    shifted = torch.stack([torch.arange(20), torch.arange(20) + 7])  # (2,20): the second row 7 positions on
    call = Call(q, k, v, scheme, shifted[:, -1:], shifted, True, 0.0, False)
    assert (map_decode(call) - general(call)).abs().max().item() < 1e-12
    gap = torch.stack([torch.arange(20), torch.cat([torch.arange(18), torch.tensor([25, 26])])])  # inside the window
    call = Call(q, k, v, scheme, gap[:, -1:], gap, True, 0.0, False)
    assert map_decode(call) is None
    assert (dispatch.attention(q, k, v, scheme, gap[:, -1:], gap, True) - general(call)).abs().max().item() == 0


@torch.no_grad()
def _counted_step(spec: dict | None, layers: int) -> OpCount:
    """The counts of the third decode step after a 40-token prompt, float32 on the CPU."""
    torch.manual_seed(0)
    model = tiny_gpt("rope", max_seq_len=16, n_layer=layers, attention_extension=spec)
    cache, token = model.new_cache(), torch.zeros(1, 1, dtype=torch.long)
    model(torch.randint(0, 31, (1, 40)), cache=cache)
    for _ in range(2):
        model(token, cache=cache)
    with OpCount() as count:
        model(token, cache=cache)
    return count


# Per layer over RoPE's step, the most a map adds (Self-Extend 16 / 41, DCA 15 / 43, LM-Infinite 19 / 50, sinks 16 / 44,
# STRING 14 / 36 launches / operators): each map's query rotation (3 compute operators for all maps), the new key's
# rotation per key table (3), a score product per run, the softmax, a value product per span, views. The general path
# (map_fused) took 48-65 / 128-171, with 16-25 host reads per layer.
EXCESS_PER_LAYER = {"launches": 20, "aten": 52, "syncs": 0}


@pytest.mark.parametrize("spec", MAPS, ids=_ids)
def test_a_layer_costs_a_bounded_number_of_operators_over_rope(spec):
    """Counted, not timed: operators per layer over RoPE's, and the host read once per step (the runs of keys), not
    per layer."""
    rope = {n: _counted_step(None, n).columns for n in (1, 3)}
    mapped = {n: _counted_step(spec, n) for n in (1, 3)}
    excess = {c: ((mapped[3].columns[c] - mapped[1].columns[c]) - (rope[3][c] - rope[1][c])) / 2
              for c in EXCESS_PER_LAYER}
    assert all(excess[c] <= bound for c, bound in EXCESS_PER_LAYER.items()), \
        f"per layer over RoPE's {excess}, allowed {EXCESS_PER_LAYER}; operators {dict(mapped[3].where)}"
    assert mapped[3].columns["syncs"] <= rope[3]["syncs"] + 3, dict(mapped[3].where)  # nonzero, two tolist


@torch.no_grad()
def test_on_cuda_it_decodes_what_the_one_pass_kernel_declines(counted, monkeypatch):
    """On CUDA map_triton serves first; a map it declines (one without a pair rule: a user's own) is decoded here,
    not by map_fused's per-layer reads. The key read as cuda, map_triton declining: every step served."""
    monkeypatch.setattr(dispatch, "device_of", lambda *args: "cuda")
    monkeypatch.setitem(dispatch.KERNELS, "map_triton", lambda call: None)
    ids = token_ids(1, T)
    model = MODELS["llama"](SMALL[0])
    _decoded(model, ids, counted)
    assert counted[0] == len(model.blocks) * (T - 5)
