"""The static decode step under each position map (posenc.models.static_map_terms, static_attention.map_slot_attention):
equal to the ordinary cached decoding and to recomputing each prefix, over steps that cross every boundary of the
map (Self-Extend's window edge, DCA's chunk edges, LM-Infinite's and the sinks' windows, STRING's offset); every key
rotated into its table as the scheme's own rotate() rotates it, bit for bit; no host read and no allocation whose
shape depends on the position anywhere in the step; a full cache and an unserved scheme refused in one line.

Logits agree to ATOL, not bit for bit, as the plain static step's (tests/models/test_static_decode.py): the scores,
the softmax and the value sums run over every slot of the cache, the other maps' and the empty slots at -inf, in
another order than the ordinary step's sums over the runs of attended keys (float64 rounding, ~3e-14 here); with
that attention swapped for the ordinary one, every logit is bit for bit. In bf16 (the GPU's form: the rotation as
one product) the step stays as near the float64 decoding as the ordinary bf16 decoding does."""

from __future__ import annotations

import pytest
import torch

from posenc.models import static_terms
from posenc.models.static_decode import StaticDecoder
from posenc.nn import dispatch
from posenc.position_map import MappedScheme
from posenc.position_maps import SelfExtend
from tests.models.host_syncs import NoHostSync
from tests.models.op_counts import OpCount
from tests.models.static_support import cached_logits, gemma_like
from tests.models.test_static_decode import _RotatesWithoutTables
from tests.position_maps.tiny import tiny_llama, token_ids

ATOL = 1e-12
PROMPT, STEPS = 5, 20  # 25 positions: past every window and offset below, across DCA's chunk edges at 6, 12, 18, 24
SPECS = [
    {"type": "self_extend", "group_size": 3, "window": 5},
    {"type": "self_extend", "group_size": 3, "window": 5, "scale_base": 8},  # a scale per query position
    {"type": "dual_chunk", "chunk_size": 8, "local_window": 2, "scale": False},
    {"type": "dual_chunk", "chunk_size": 8, "local_window": 2, "trained_length": 10},  # m(T)^2 follows the length
    {"type": "lm_infinite", "n_global": 2, "window": 6},
    {"type": "attention_sinks", "n_sink": 3, "window": 5},
    {"type": "string", "shifted_offset": 6, "local_value": 2},
]


def _ids(spec: dict) -> str:
    return "-".join(str(v) for v in spec.values())


def _decode(model, prompt: torch.Tensor, tokens: list[torch.Tensor], max_len: int = 32):
    """The static step's logits of the prompt's last token and of each step, and the maps each step's mask used."""
    decoder = StaticDecoder(model, prompt.shape[0], max_len)
    logits, used = [decoder.prefill(prompt)], set()
    for token in tokens:
        logits.append(decoder.step(token))
        for terms in decoder.terms.maps.values():  # mask (B,1,1,M+1,L): 0 where map m scores a slot
            used |= {m for m in range(len(terms.key_maps)) if bool((terms.step.mask[..., m, :] == 0).any())}
    return logits, used, decoder


@pytest.mark.parametrize("spec", SPECS, ids=_ids)
@torch.no_grad()
def test_static_decoding_under_a_map_equals_cached_decoding_and_recomputation(spec):
    model = tiny_llama(attention_extension=spec)
    prompt = token_ids(2, PROMPT)
    want, tokens = cached_logits(model, prompt, STEPS)
    got, used, _ = _decode(model, prompt, tokens)
    sequence = torch.cat([prompt, *tokens], dim=1)
    # DCA's scale m(T)^2 scales a whole call by its length: a prefix recomputed whole is not a cached decoding
    # there (dual_chunk.py), and the cached decoding is the reference
    whole = not model.schemes[0].position_map.length_scaled
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL, msg=lambda m, step=step: f"cached, step {step}: {m}")
        if whole:
            recomputed = model(sequence[:, : PROMPT + step])[:, -1]  # (B,V)
            torch.testing.assert_close(g, recomputed, rtol=0, atol=ATOL, msg=lambda m, step=step: f"whole {step}: {m}")
        assert torch.equal(g.argmax(-1), w.argmax(-1)), f"greedy token differs at step {step}"
    assert used == set(range(model.schemes[0].position_map.n_maps)), f"maps used: {used}"  # boundaries crossed


@pytest.mark.parametrize("extension_layers", ["all", "global"])
def test_a_gemma3_shaped_decoder_under_a_map_decodes_alike(extension_layers):
    """Sliding layers under the map with their window inside it (Windowed), or left plain beside mapped full ones."""
    model = gemma_like(attention_extension={"type": "self_extend", "group_size": 2, "window": 4},
                       extension_layers=extension_layers)
    prompt = token_ids(2, PROMPT)
    want, tokens = cached_logits(model, prompt, 12)
    got, _, decoder = _decode(model, prompt, tokens)
    assert len(decoder.terms.maps) == (2 if extension_layers == "all" else 1)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, rtol=0, atol=ATOL, msg=lambda m, step=step: f"step {step}: {m}")


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3], SPECS[5]], ids=_ids)
@torch.no_grad()
def test_in_bfloat16_the_static_step_stays_as_near_float64_as_the_cached_step(spec):
    """Scores from bf16 products (the GPU's form) and rotations in float32: within twice the cached bf16 decoding's
    own distance from the float64 decoding, along the float64 decoding's tokens."""
    reference, model = tiny_llama(attention_extension=spec), tiny_llama(attention_extension=spec, dtype=torch.bfloat16)
    prompt = token_ids(2, PROMPT)
    want, tokens = cached_logits(reference, prompt, 12)
    cache = model.new_cache()
    cached = [model(prompt, cache=cache)[:, -1], *(model(token, cache=cache)[:, -1] for token in tokens)]
    static, _, _ = _decode(model, prompt, tokens)
    distance = {name: max((g.double() - w).abs().max().item() for g, w in zip(got, want, strict=True))
                for name, got in (("static", static), ("cached", cached))}
    assert distance["static"] <= 2 * distance["cached"], distance


def test_rows_at_different_positions_decode_alike():
    """Each row's selector is its own (the eager map_decode declines such a batch): greedy tokens as the cache's."""
    model = tiny_llama(attention_extension=SPECS[4])
    prompt = token_ids(2, PROMPT)
    positions = torch.arange(PROMPT)[None] + torch.tensor([[0], [4]])  # row 1 four positions on
    assert torch.equal(model.generate(prompt, 12, position_ids=positions, static_cache=True),
                       model.generate(prompt, 12, position_ids=positions))


@pytest.mark.parametrize("spec", [SPECS[0], SPECS[2], SPECS[4]], ids=_ids)
@torch.no_grad()
def test_every_key_is_rotated_into_its_table_as_the_scheme_rotates_it(spec, monkeypatch):
    """A prompt's keys (load) and each step's (map_rotate, by multipliers read off rotate()), as the static cache keeps
    them for every key table, equal the scheme's own rotate() at the key's mapped position, bit for bit (RoPE)."""
    model = tiny_llama(attention_extension=spec)
    prompt = token_ids(2, PROMPT)
    _, tokens = cached_logits(model, prompt, 8)
    cache = model.new_cache()
    model(prompt, cache=cache)  # the prefill's raw keys, as the decoder's own prefill computes them
    raw = [[keys.data[:, :, :PROMPT]] for keys, _ in cache.layers]
    rotate = static_terms.map_rotate

    def keep_raw(q, k, terms):  # each step's raw key, layer by layer
        raw[sum(map(len, raw)) % len(raw)].append(k)
        return rotate(q, k, terms)

    monkeypatch.setattr(static_terms, "map_rotate", keep_raw)
    _, _, decoder = _decode(model, prompt, tokens)
    (terms,) = decoder.terms.maps.values()
    n = decoder.length
    positions = decoder.terms.positions[:, :n]
    tables = {id(p): p for p in terms.position_map.key_positions(positions, positions[:, :1])}.values()
    raw = [torch.cat(keys, dim=2) for keys in raw]  # per layer (B,Hkv,n,Dh)
    for layer, kept in enumerate(decoder.cache.keys):  # (B,Hkv,L,Mk*Dh)
        rotated = kept[:, :, :n].unflatten(-1, (len(tables), -1))  # (B,Hkv,n,Mk,Dh)
        for table, pos in enumerate(tables):
            want = terms.inner.rotate(raw[layer][:, :1, :1], raw[layer], pos[:, :1], pos)[1]
            assert torch.equal(rotated[..., table, :], want), f"layer {layer}, table {table}"



@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3], SPECS[4], SPECS[5]], ids=_ids)
@torch.no_grad()
def test_everything_but_the_attention_over_every_slot_is_bit_for_bit(spec, monkeypatch):
    """With the ordinary path's attention under the map (dispatch.attention over the filled slots' raw keys) in place
    of map_slot_attention, every logit of every step is the ordinary cached decoding's, bit for bit: the step's
    positions, cache and the rest are exact; what differs is the sums over every slot (ATOL above)."""
    model = tiny_llama(attention_extension=spec)
    prompt = token_ids(2, PROMPT)
    want, tokens = cached_logits(model, prompt, STEPS)
    cache = model.new_cache()
    model(prompt, cache=cache)
    raw = [keys.data[:, :, :PROMPT] for keys, _ in cache.layers]  # per layer (B,Hkv,T,Dh), grown by each step
    decoder = StaticDecoder(model, 2, 32)
    rotate, queries = static_terms.MapStepScheme.rotate, {}

    def keep_raw(self, q, k, q_pos, k_pos):
        layer = decoder._layers.index(self)
        raw[layer], queries[layer] = torch.cat((raw[layer], k), dim=2), q
        return rotate(self, q, k, q_pos, k_pos)

    def ordinary(self, q, k, v, q_pos, k_pos, causal, dropout=0.0):
        layer, n = decoder._layers.index(self), decoder.length + 1
        positions = decoder.terms.positions[:, :n]
        qp, kp = decoder.terms.framing.frame(positions[:, n - 1 :], positions)
        return dispatch.attention(queries[layer], raw[layer], v[:, :, :n], decoder.terms.schemes[layer], qp, kp, True)

    monkeypatch.setattr(static_terms.MapStepScheme, "rotate", keep_raw)
    monkeypatch.setattr(static_terms.MapStepScheme, "attend", ordinary)
    got = [decoder.prefill(prompt), *(decoder.step(token) for token in tokens)]
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(g, w), f"step {step}: {(g - w).abs().max().item():.3g}"


def _counted_step(decoder: StaticDecoder, token: torch.Tensor) -> OpCount:
    count = OpCount()
    with torch.no_grad(), count:
        decoder.step(token)
    return count


@pytest.mark.parametrize("spec", [SPECS[1], SPECS[3], SPECS[5]], ids=_ids)
def test_the_step_reads_nothing_back_and_allocates_alike_at_every_position(spec):
    """The whole step, its terms included: no host read, and at position 6 and at position 20 (either side of the
    maps' boundaries) the same operators allocating the same shapes; the captured part alone under NoHostSync."""
    model = tiny_llama(attention_extension=spec)
    decoder = StaticDecoder(model, 2, 32)
    token = decoder.prefill(token_ids(2, PROMPT)).argmax(-1, keepdim=True)
    counts = {}
    for n in range(PROMPT, 21):
        if n in (6, 20):
            counts[n] = _counted_step(decoder, token)
        else:
            decoder.step(token)
    early, late = counts[6], counts[20]
    assert early.columns["syncs"] == late.columns["syncs"] == 0, dict(late.where)
    assert early.allocated == late.allocated, (early.allocated - late.allocated, late.allocated - early.allocated)
    assert early.columns == late.columns
    with torch.no_grad(), NoHostSync():
        decoder.heavy()


def test_the_allocation_check_fails_on_the_ordinary_step():
    """The check can fail: the ordinary cached step under a map reads the host and allocates by the cache's length."""
    model = tiny_llama(attention_extension=SPECS[0])
    with torch.no_grad():
        cache = model.new_cache()
        token = model(token_ids(2, PROMPT), cache=cache)[:, -1:].argmax(-1)
        counts = []
        for _ in range(2):
            count = OpCount()
            with count:
                model(token, cache=cache)
            counts.append(count)
    assert counts[0].columns["syncs"] > 0 and counts[0].allocated != counts[1].allocated


def test_a_full_cache_is_refused_in_one_line():
    decoder = StaticDecoder(tiny_llama(attention_extension=SPECS[2]), 1, 7)
    token = decoder.prefill(token_ids(1, PROMPT)).argmax(-1, keepdim=True)
    decoder.step(token)
    decoder.step(token)
    with pytest.raises(ValueError, match=r"^max_len=7 .*7 tokens already cached") as err:
        decoder.step(token)
    assert "\n" not in str(err.value)


def test_a_map_over_a_rotation_without_pairs_stays_on_the_eager_path(monkeypatch):
    model = tiny_llama(attention_extension=SPECS[0])
    inner = _RotatesWithoutTables(model.schemes[0].dims)
    unpaired = MappedScheme(inner, SelfExtend(group_size=3, window=5))
    assert "does not rotate pairs of dims" in dispatch.static_map_refusal(unpaired)
    assert dispatch.static_map_refusal(model.schemes[0]) is None
    monkeypatch.setattr(model, "layer_scheme", lambda i: unpaired)
    with pytest.raises(ValueError, match=r"under attention_extension self_extend.*rotate pairs of dims") as err:
        StaticDecoder(model, 1, 16)
    assert "\n" not in str(err.value)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("spec", [SPECS[0], SPECS[3], SPECS[4], SPECS[5], SPECS[6]], ids=_ids)
def test_the_captured_map_step_replays_what_the_eager_step_computes(spec):
    """On CUDA, in float64 (the eager paths' Triton kernels take float32 with TF32 products; float64 keeps the
    comparison exact): the graph captured at the first step and replayed at every other gives the eager static step's
    logits and the ordinary cached decoding's."""
    model = tiny_llama(attention_extension=spec).cuda()
    prompt = token_ids(2, PROMPT).cuda()
    want, tokens = cached_logits(model, prompt, STEPS)
    graphed, eager = StaticDecoder(model, 2, 32), StaticDecoder(model, 2, 32, cuda_graph=False)
    torch.testing.assert_close(graphed.prefill(prompt), eager.prefill(prompt), rtol=0, atol=0)
    for step, token in enumerate(tokens, start=1):
        got = graphed.step(token)
        torch.testing.assert_close(got, eager.step(token), rtol=0, atol=ATOL)
        torch.testing.assert_close(got, want[step], rtol=0, atol=1e-10)
    assert graphed._graph is not None
