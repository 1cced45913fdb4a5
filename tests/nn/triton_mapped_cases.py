"""The one-pass position-map kernel (posenc/nn/triton/mapped.py, map_triton) equals the references: each method of
tests/position_maps/test_reference.py (alone and composed with a rope_scaling) on the tiny GQA Llama against the
float64 reference written from the released code; cached decoding against the float64 model; bf16 and the other
rotations (xPos's scales, p-RoPE's cut, interleaved pairs, unrotated dims, a sliding window over the map) against
the eager map path at one attention call. The model runs its maps through map_triton here: the dispatch counts
a CPU tensor under the interpreter as cuda, and each test checks the kernel served.

Not collected by `make test` directly: tests/nn/test_triton_mapped.py runs this file in a fresh process with
TRITON_INTERPRET=1 (tests/nn/triton_support.py says why).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from posenc.nn import dispatch
from posenc.nn import triton as gpu
from posenc.nn.call import Call
from posenc.position_maps.scheme import PositionMapped
from posenc.position_maps.window import Windowed
from posenc.registry import build as registry_build
from posenc.registry import build_position_map
from posenc.scheme import Dims
from tests.nn.triton_support import kernel_device
from tests.position_maps import reference
from tests.position_maps.test_properties import SMALL
from tests.position_maps.test_reference import CASES
from tests.position_maps.tiny import TRAINED, tiny_llama, token_ids

pytestmark = pytest.mark.skipif(not gpu.installed(), reason="triton is not installed")
INTERPRETED, DEVICE = kernel_device(tf32=True)  # float32 runs as TF32 on a GPU
FLOAT32 = 2e-4 if INTERPRETED else 2e-2
T = 40  # > 2x the trained length, not a multiple of the 16-key tiles: ragged tiles, every region of every map
SMALLER = dict(n_layer=1, n_head=2, n_kv_head=1)  # the tiny Llama with one layer and Dh 32, still GQA (the
# interpreter runs each program of the grid in Python)


@pytest.fixture
def served(monkeypatch) -> list[int]:
    """The query counts of the calls map_triton served (it must serve, not decline to the per-map paths)."""
    calls: list[int] = []
    kernel = dispatch.KERNELS["map_triton"]

    def counted(call: Call):
        out = kernel(call)
        if out is not None:
            calls.append(call.q.shape[2])
        return out

    monkeypatch.setitem(dispatch.KERNELS, "map_triton", counted)
    return calls


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float, what: str) -> None:
    error = (got.double() - expected.double()).abs().max().item()
    bound = tolerance * max(1.0, expected.abs().max().item())
    assert error <= bound, f"{what}: max error {error:.3g} > {bound:.3g}"


# One case per method, composed with a rope_scaling where test_reference composes one, and the two scores that
# scale per query: DCA's released m(T)^2 (past the trained length here) and Self-Extend's log scale.
REFERENCE_CASES = [case for case in CASES if case[0] in (
    {"type": "self_extend", "group_size": 3, "window": 6},  # with yarn
    {"type": "self_extend", "group_size": 4, "window": 8, "scale_base": 12},
    {"type": "dual_chunk", "chunk_size": 10, "local_window": 3},  # with linear; scale on (the default)
    {"type": "lm_infinite", "n_global": 2, "window": 10, "max_distance": 7},
    {"type": "attention_sinks", "n_sink": 4},  # with linear
    {"type": "string", "shifted_offset": 9, "local_value": 3, "attention_factor": 1.0},  # with yarn
)]


@pytest.mark.parametrize(("spec", "scaling", "make"), REFERENCE_CASES,
                         ids=lambda c: str(c) if isinstance(c, dict) else "")
@torch.no_grad()
def test_each_map_matches_the_reference_written_from_the_released_code(spec, scaling, make, served):
    model = tiny_llama(rope_scaling=scaling, attention_extension=spec, dtype=torch.float32, **SMALLER).to(DEVICE)
    rope = reference.Rope(32, 100.0, scaling, TRAINED)
    ids = token_ids(1, T)
    expected = reference.llama_logits(tiny_llama(rope_scaling=scaling, attention_extension=spec, **SMALLER), ids,
                                      make(rope))
    _close(model(ids.to(DEVICE)).cpu(), expected, FLOAT32, "logits")
    assert served == [T]  # one launch


# Three maps through a model's cache (DCA's three maps, the sinks' skipped middle, STRING's score scale); every map
# decodes at one attention call in the tests below.
@pytest.mark.parametrize("spec", [SMALL[1], SMALL[3], CASES[-1][0]], ids=lambda s: s["type"])
@torch.no_grad()
def test_cached_decoding_matches_the_float64_model(spec, served):
    model = tiny_llama(attention_extension=spec, dtype=torch.float32, **SMALLER).to(DEVICE)
    ids = token_ids(1, 16)
    cache = model.new_cache()
    steps = [model(ids[:, :12].to(DEVICE), cache=cache)]  # prefill, then one token at a time past every window
    steps += [model(ids[:, t:t + 1].to(DEVICE), cache=cache) for t in range(12, 16)]
    expected = tiny_llama(attention_extension=spec, **SMALLER)(ids)  # float64, the CPU's per-map path
    _close(torch.cat(steps, dim=1).cpu(), expected, FLOAT32, "decoded logits")
    assert served == [12, 1, 1, 1, 1]  # every step went through the kernel


def _attention_inputs(dtype: torch.dtype, b: int, h: int, hkv: int, tq: int, tk: int, dh: int):
    g = torch.Generator().manual_seed(2)
    q = torch.randn(b, h, tq, dh, generator=g) * 2
    k, v = torch.randn(b, hkv, tk, dh, generator=g) * 2, torch.randn(b, hkv, tk, dh, generator=g)
    base = 3 + torch.arange(tk)  # positions from an offset: the origin is read, not assumed 0
    return [t.to(DEVICE, dtype) for t in (q, k, v)], base[tk - tq:][None].to(DEVICE), base[None].to(DEVICE)


ROTATIONS = {  # name: (scheme, options, head dim)
    "xpos": ("xpos", {"xpos_scale_base": 64.0}, 16),  # interleaved pairs, queries and keys scaled apart
    "p_rope": ("p_rope", {"p_rope_fraction": 0.5}, 16),
    "partial_interleaved": ("rope", {"rotary_percentage": 0.5, "rotary_interleaved": True}, 32),  # 16 unrotated
    "yarn": ("rope", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 32),
}
MAPS = [{"type": "self_extend", "group_size": 3, "window": 5}, {"type": "dual_chunk", "chunk_size": 9,
        "local_window": 2}, {"type": "lm_infinite", "n_global": 2, "window": 6},
        {"type": "string", "shifted_offset": 7, "local_value": 2}]


def _mapped(rotation: str, spec: dict, slide: int = 0) -> PositionMapped:
    name, options, dh = ROTATIONS[rotation]
    inner = registry_build(name, Dims(d_model=2 * dh, n_head=2, head_dim=dh, max_seq_len=TRAINED, n_kv_head=1),
                           options)
    position_map = build_position_map(spec, TRAINED)
    return PositionMapped(inner, Windowed(inner=position_map, window=slide) if slide else position_map)


def _both(scheme: PositionMapped, dtype: torch.dtype, tq: int, tk: int) -> tuple[torch.Tensor, torch.Tensor]:
    (q, k, v), q_pos, k_pos = _attention_inputs(dtype, 1, 2, 1, tq, tk, scheme.inner.dims.head_dim)
    call = Call(q, k, v, scheme, q_pos, k_pos, True, 0.0, False)
    got = dispatch.KERNELS["map_triton"](call)
    assert got is not None, "map_triton declined"
    return got, dispatch.KERNELS["map_eager"](call._replace(**{n: getattr(call, n).float() for n in "qkv"}))


@pytest.mark.parametrize(("rotation", "spec"), list(zip(ROTATIONS, MAPS, strict=True)), ids=list(ROTATIONS))
@torch.no_grad()
def test_other_rotations_match_the_eager_path(rotation, spec):
    for tq in (24, 1):  # prefill (keys rotated by the host) and a decode step (rotated in the kernel)
        got, expected = _both(_mapped(rotation, spec), torch.float32, tq, 24)
        _close(got, expected, FLOAT32, f"Tq={tq}")


@pytest.mark.parametrize("spec", MAPS[1:3], ids=lambda s: s["type"])
@torch.no_grad()
def test_bf16_after_a_cache_and_decoding(spec):
    for tq in (9, 1):  # a chunk after cached keys, and a decode step
        got, expected = _both(_mapped("yarn", spec), torch.bfloat16, tq, 24)
        _close(got, expected, 3e-2, f"bf16 Tq={tq}")


@torch.no_grad()
def test_a_sliding_window_over_the_map():
    scheme = _mapped("partial_interleaved", MAPS[0], slide=11)
    got, expected = _both(scheme, torch.float32, 30, 30)
    _close(got, expected, FLOAT32, "windowed")
    unwindowed = _both(_mapped("partial_interleaved", MAPS[0]), torch.float32, 30, 30)[0]
    assert (got - unwindowed).abs().max().item() > 1e-3  # the window removes keys the map attends


# Six 16-key tiles of the interpreter: tiles under one map for every pair (each map of each rule: no selection, no
# mask), tiles no pair of which is attended (skipped), and mixed tiles, prefill and decode (keys rotated by the
# host, then by the kernel). The regions are wider than a tile, so whole tiles occur; 3 + arange positions put
# the chunk and window edges off the tiles' edges.
LONG = 96
LONG_MAPS = [{"type": "self_extend", "group_size": 4, "window": 40},
             {"type": "dual_chunk", "chunk_size": 32, "local_window": 4},
             {"type": "dual_chunk", "chunk_size": 48, "local_window": 4},  # whole tiles inside one chunk
             {"type": "lm_infinite", "n_global": 2, "window": 40, "max_distance": 40},
             {"type": "attention_sinks", "n_sink": 16}]  # a whole tile of sinks
# LM-Infinite's and the sinks': under the interpreter their prompt's tiles are counted (and its output checked) by
# test_a_prompt_visits_only_the_tiles_holding_a_pair_of_each_map, which test_tiles_under_one_map_skipped_and_mixed
# then leaves out: the same launch on the same inputs against the same eager path
COUNTED = LONG_MAPS[3:]


@pytest.mark.parametrize("spec", LONG_MAPS, ids=lambda s: "-".join(map(str, s.values())))
@torch.no_grad()
def test_tiles_under_one_map_skipped_and_mixed(spec):
    for tq in (LONG, 40, 1):  # a prompt, a chunk after cached keys, a decode step
        if tq == LONG and INTERPRETED and spec in COUNTED:
            continue  # checked with its tiles counted (COUNTED)
        got, expected = _both(_mapped("yarn", spec), torch.float32, tq, LONG)
        _close(got, expected, FLOAT32, f"Tq={tq}")


@torch.no_grad()
def test_a_sliding_window_over_long_tiles():
    """Tiles past the window are skipped whole, tiles inside it run unmasked, the window's edge per pair."""
    for tq in (LONG, 1):
        got, expected = _both(_mapped("yarn", LONG_MAPS[0], slide=24), torch.float32, tq, LONG)
        _close(got, expected, FLOAT32, f"windowed Tq={tq}")


def _tiles_holding(scheme: PositionMapped, q_pos: torch.Tensor, k_pos: torch.Tensor, bm: int, bn: int) -> tuple:
    """From the map's own select on the positions, inside the causal mask: per map, the (query block, key tile)
    pairs of tiles holding a pair of the map, and of those where every pair is the map's -> (Counter, Counter)."""
    sel = scheme.position_map.select(q_pos, k_pos, k_pos[:, :1])[0].long()  # (Tq,Tk)
    tq, tk = sel.shape
    sel = sel.masked_fill(torch.ones(tq, tk, dtype=torch.bool).tril(tk - tq).logical_not(), -1)
    holding, every = Counter(), Counter()
    for i0 in range(0, tq, bm):
        for j0 in range(0, tk, bn):
            tile = sel[i0:i0 + bm, j0:j0 + bn]
            for m in tile.unique().tolist():
                holding[m] += m >= 0
                every[m] += m >= 0 and bool((tile == m).all()) and tile.shape[1] == bn
    return holding, every


@pytest.mark.skipif(not INTERPRETED, reason="counts the loops' calls in Python: the interpreter runs them there")
@pytest.mark.parametrize("spec", COUNTED, ids=lambda s: s["type"])
@torch.no_grad()
def test_a_prompt_visits_only_the_tiles_holding_a_pair_of_each_map(spec, monkeypatch):
    """LM-Infinite's and the sinks' programs of map 1 (the start keys) visit the start keys' tile, not every tile
    from it up to the window's edge (mixed there with unattended pairs, none of map 1's); map 0's programs skip the
    start keys' tile past the window. Counted per program in the kernel's own loops (per pair: tiles of BN keys; the
    unmasked loop: whole tiles) against the tiles the map's select puts a pair in, per head."""
    from posenc.nn.triton import mapped
    from posenc.nn.triton import mapped_prefill_kernels as kernels

    pair, whole = Counter(), Counter()

    def scalar(x) -> int:
        return int(x.handle.data.item()) if hasattr(x, "handle") else int(x)

    def pair_tiles(*args):  # (..., m, t_start, t_end, ...): args 10-12
        pair[scalar(args[10])] += max(0, scalar(args[12]) - scalar(args[11]))
        return per_pair(*args)

    def whole_tiles(*args):  # (..., n_start, n_end, ..., BN, PRECISION, UPCAST): args 8, 9 and -3
        whole["tiles"] += max(0, scalar(args[9]) - scalar(args[8])) // scalar(args[-3])
        return unmasked(*args)

    per_pair, unmasked = kernels._pair_tiles, kernels._fwd_tiles
    monkeypatch.setattr(kernels, "_pair_tiles", pair_tiles)
    monkeypatch.setattr(kernels, "_fwd_tiles", whole_tiles)
    scheme = _mapped("yarn", spec)
    got, expected = _both(scheme, torch.float32, LONG, LONG)
    _close(got, expected, FLOAT32, "counted")
    heads, tile = 2, mapped.INTERPRETED_TILES
    _, q_pos, k_pos = _attention_inputs(torch.float32, 1, heads, 1, LONG, LONG, 32)
    holding, every = _tiles_holding(scheme, q_pos, k_pos, tile.bm, tile.bn)
    assert {m: n // heads for m, n in pair.items()} == {m: holding[m] - every[m] for m in (0, 1)}, (pair, holding)
    assert whole["tiles"] // heads == every[0] + every[1], (whole, every)


def _step_syncs(spec: dict, layers: int) -> Counter:
    """The host reads of one cached decode step of the tiny Llama with `layers` layers under the map (the kernel's
    own launch under the interpreter left out: it reads its tensors through numpy)."""
    from tests.models.host_syncs import HostSyncCount

    model = tiny_llama(attention_extension=spec, dtype=torch.float32, n_layer=layers, n_head=2,
                       n_kv_head=1).to(DEVICE)
    ids = token_ids(1, 20).to(DEVICE)
    cache = model.new_cache()
    model(ids[:, :16], cache=cache)
    model(ids[:, 16:17], cache=cache)  # the kept keys' first step
    count = HostSyncCount()
    with count:
        model(ids[:, 17:18], cache=cache)
    return Counter({where: n for where, n in count.where.items() if "nn/triton/mapped.py" not in where})


@pytest.mark.parametrize("spec", [SMALL[0], SMALL[1], SMALL[3]], ids=lambda s: s["type"])
@torch.no_grad()
def test_a_decode_step_reads_the_host_as_often_with_2_layers_as_with_1(spec, served):
    """What a step derives from its positions (each map's rows, the new keys' rows, whether the kept keys still
    hold) is derived once per forward, not per layer and map: no comparison of kept positions (torch.equal) at all.
    (A second layer shows any read per layer; a third would repeat the second's, at the interpreter's cost.)"""
    one, two = _step_syncs(spec, 1), _step_syncs(spec, 2)
    assert sum(one.values()) == sum(two.values()), f"1 layer: {dict(one)}; 2 layers: {dict(two)}"
    assert not any("aten.equal" in where for where in two), dict(two)
    assert served and set(served[-4:]) == {1}  # the steps went through the kernel


@torch.no_grad()
def test_kept_keys_handed_other_positions_are_rotated_again():
    """A store reused with key positions that are not a KV cache's (a store reused by mistake): the kept keys are
    compared and, the positions differing, all rotated again; the result is the one without a store."""
    scheme = _mapped("yarn", MAPS[0])
    (q, k, v), q_pos, k_pos = _attention_inputs(torch.float32, 1, 2, 1, 1, 24, 32)
    kept: dict = {}
    for shift in (0, 5):
        call = Call(q, k, v, scheme, q_pos + shift, k_pos + shift, True, 0.0, False, kept)
        fresh = dispatch.KERNELS["map_triton"](call._replace(kept=None))
        torch.testing.assert_close(dispatch.KERNELS["map_triton"](call), fresh, rtol=0, atol=1e-6)
    assert kept, "the store was used"


@torch.no_grad()
def test_kept_keys_and_step_tables_follow_a_changed_map_or_rotation():
    """Calls on one KV cache's positions buffer (kept keys trusted without a comparison) and one positions tensor
    (the step's tables kept): another map over the same rotation rotates the kept keys again; a frequency changed in
    place between two calls on the same positions gives new tables. Each equals the same call on fresh tensors."""
    from posenc.nn.kv_cache import _Grown

    first, other = _mapped("yarn", MAPS[0]), _mapped("yarn", {**MAPS[0], "group_size": 4})
    other.inner = first.inner  # one rotation, two maps
    (q, k, v), q_pos, raw = _attention_inputs(torch.float32, 1, 2, 1, 1, 24, 32)
    k_pos = _Grown(raw, time_dim=1, append_only=True).append(raw)  # a view of an append-only buffer, as a cache's

    def call(scheme, kept=None, fresh=False):
        positions = (q_pos.clone(), k_pos.clone()) if fresh else (q_pos, k_pos)
        return dispatch.KERNELS["map_triton"](Call(q, k, v, scheme, *positions, True, 0.0, False, kept))

    kept: dict = {}
    before = call(first, kept)
    torch.testing.assert_close(call(other, kept), call(other, fresh=True), rtol=0, atol=1e-6)
    assert (call(other, fresh=True) - before).abs().max() > 1e-3  # the maps differ: the kept keys were not reused
    call(first)  # the step's tables for these positions tensors
    first.inner.inv_freq.mul_(0.5)
    changed = call(first)
    torch.testing.assert_close(changed, call(first, fresh=True), rtol=0, atol=1e-6)
    assert (changed - before).abs().max() > 1e-3


@torch.no_grad()
def test_positions_out_of_order_take_the_per_pair_path(monkeypatch):
    """Positions that jump back and forth (packed or reordered rows): for the last query block (positions 60-75) the
    16-key tiles are far, near, far, mixed, near, diagonal under Self-Extend's window of 40, so neither map's whole
    tiles form one run and each map's range goes per pair; the first blocks see other mixes. Equal to the eager path."""
    from posenc.nn.triton import mapped

    monkeypatch.setattr(mapped, "pair_keys", lambda bn, device: bn // 2)  # the GPU's half tiles in per-pair loops
    scheme = _mapped("yarn", LONG_MAPS[0])
    (q, k, v), _, _ = _attention_inputs(torch.float32, 1, 2, 1, LONG, LONG, 32)
    starts = (0, 200, 0, 16, 100, 60)  # one per 16-key tile
    pos = torch.cat([torch.arange(s, s + 16) for s in starts])[None].to(DEVICE)
    call = Call(q, k, v, scheme, pos, pos, True, 0.0, False)
    got = dispatch.KERNELS["map_triton"](call)
    assert got is not None, "map_triton declined"
    _close(got, dispatch.KERNELS["map_eager"](call), FLOAT32, "positions out of order")


@torch.no_grad()
def test_a_chunk_of_queries_split_into_shares_of_the_keys(monkeypatch):
    """A chunk of queries after cached keys with the keys split into 3 shares (a GPU splits them where the grid is
    small): DCA's three maps' partials of every share merged by log-sum-exp, shares without a pair of a map included."""
    from posenc.nn.triton import mapped

    monkeypatch.setattr(mapped, "key_splits", lambda programs, tk, bn, device: 3)
    monkeypatch.setattr(mapped, "pair_keys", lambda bn, device: bn // 2)
    got, expected = _both(_mapped("yarn", LONG_MAPS[1]), torch.float32, 16, LONG)
    _close(got, expected, FLOAT32, "3 shares")
