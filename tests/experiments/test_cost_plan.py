"""The cost plan of `posenc extend` scales with the model it runs: work counted from the config (forward_work), seconds
per unit of work calibrated on SmolLM2-135M. Properties: twice the layers cost twice; a sliding layer stops growing
with T past its window; SmolLM2's estimate is today's (the old formula, written out below); Gemma 3 270M's work per
token over SmolLM2's is the ratio of their matrix parameters (counted from the modules themselves) plus the head."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from posenc.experiments.extend.forward_work import decode_keys, forward_work, prefill_pairs
from posenc.experiments.extend.long_context import TOKEN_MAC_SECONDS, estimated_cpu_seconds
from posenc.models import Llama, LlamaConfig

SMOLLM2 = LlamaConfig()  # the defaults are SmolLM2-135M's shapes
# Gemma 3 270M as its GGUF header reads (EXTEND.md, "A second model"): every sixth layer global
GEMMA3 = LlamaConfig(family="gemma3", vocab_size=262144, n_layer=18, n_head=4, n_kv_head=1, d_model=640, head_dim=256,
                     ffn_hidden_size=2048, hidden_act="gelu_pytorch_tanh", max_seq_len=32768, sliding_window=512,
                     layer_types=tuple("full_attention" if i % 6 == 5 else "sliding_attention" for i in range(18)),
                     local_rotary_base=10000.0, rotary_base=1e6)


def old_estimate(length: int, chunk: int, mapped: bool = False, decoded: int = 0) -> float:
    """The plan before it knew the model (SmolLM2's per-token and per-pair constants), as it was written."""
    cost_token, cost_pair, masked, mapped_cost, decode_token, decode_pair, mapped_decode = (
        1.55e-3, 1.8e-7, 2.2, 1.7, 0.05, 6e-6, 1.9)
    step = length if chunk <= 0 else min(chunk, length)
    seconds = cost_token * length + decoded * (decode_token + decode_pair * length) * (mapped_decode if mapped else 1)
    for start in range(0, length, step):
        size = min(step, length - start)
        kernel = mapped_cost if mapped else 1 if start == 0 else masked
        seconds += cost_pair * (size * start + size * size / 2) * kernel
    return seconds


def matrix_parameters(cfg: LlamaConfig) -> int:
    """Weights of the blocks' matrices: one multiply-add each per token. Counted on the meta device (no memory)."""
    with torch.device("meta"):
        model = Llama(cfg)
    return sum(p.numel() for name, p in model.named_parameters() if name.startswith("blocks.") and p.dim() == 2)


@pytest.mark.parametrize("length", [1024, 2048, 8192, 12288, 32768])
@pytest.mark.parametrize("chunk", [0, 1024, 4096])
def test_smollm2_retrieval_estimate_is_todays(length, chunk):
    work = forward_work(SMOLLM2)
    for mapped in (False, True):
        for decoded in (0, 128):
            new, old = estimated_cpu_seconds(work, length, chunk, mapped, decoded), old_estimate(length, chunk, mapped,
                                                                                                decoded)
            assert new == pytest.approx(old, rel=0.01), (mapped, decoded)


def test_smollm2_perplexity_forward_adds_only_its_head():
    """Every scored position adds the LM head at the layers' rate, and nothing else changes."""
    work = forward_work(SMOLLM2)
    assert work.head == 576 * 49152
    for length in (2048, 8192, 32768):
        head = TOKEN_MAC_SECONDS * work.head * (length - 1)
        assert estimated_cpu_seconds(work, length, 0, scored=length) - estimated_cpu_seconds(work, length, 0) == (
            pytest.approx(head))
        assert head < 0.3 * old_estimate(length, 0)


@pytest.mark.parametrize("cfg", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_twice_the_layers_cost_twice(cfg):
    layer_types = None if cfg.layer_types is None else cfg.layer_types * 2
    deep = dataclasses.replace(cfg, n_layer=2 * cfg.n_layer, layer_types=layer_types)
    one, two = forward_work(cfg), forward_work(deep)
    assert two.token == 2 * one.token and two.pair == 2 * one.pair and two.head == one.head
    for length, chunk, mapped in [(4096, 0, False), (32768, 0, False), (32768, 4096, False), (16384, 0, True)]:
        prefill = [estimated_cpu_seconds(work, length, chunk, mapped, scored=0) for work in (one, two)]
        assert prefill[1] == pytest.approx(2 * prefill[0], rel=1e-12)
        assert decode_keys(two, length, mapped) == 2 * decode_keys(one, length, mapped)


def test_a_sliding_layers_cost_stops_growing_with_length_past_its_window():
    """Gemma's 15 local layers: a further 1,024 queries (one block) add the same pairs at 8k as at 32k; with the dense
    mask they grew with T. Its 3 global layers keep growing."""
    work = forward_work(GEMMA3)
    local = dataclasses.replace(work, groups=tuple(g for g in work.groups if g.window is not None))
    assert local.pair == 15 * 2 * 4 * 256

    def added(length: int, blocked: bool = True) -> float:
        return prefill_pairs(local, length + 1024, 0, blocked=blocked).masked - prefill_pairs(
            local, length, 0, blocked=blocked).masked

    assert added(8192) == added(16384) == added(32768) == local.pair * 1024 * (1024 + 511)
    assert added(32768, blocked=False) > 3.5 * added(8192, blocked=False)
    whole = prefill_pairs(work, 32768, 0)
    assert whole.causal == (work.pair - local.pair) * 32768**2 / 2 and whole.mapped == 0
    assert decode_keys(local, 4096) == decode_keys(local, 65536) == local.pair * 512


def test_gemma_work_per_token_over_smollm2s_is_their_parameters_plus_head():
    gemma, smollm2 = forward_work(GEMMA3), forward_work(SMOLLM2)
    assert gemma.token == matrix_parameters(GEMMA3) and smollm2.token == matrix_parameters(SMOLLM2)
    ratio = (matrix_parameters(GEMMA3) + 262144 * 640) / (matrix_parameters(SMOLLM2) + 49152 * 576)
    assert (gemma.token + gemma.head) / (smollm2.token + smollm2.head) == pytest.approx(ratio, rel=1e-12)
    assert ratio > 1.9  # 268M against 134M: the head over 262,144 tokens is most of Gemma's


def test_a_map_on_the_global_layers_leaves_the_local_ones_in_their_blocks():
    """extension_layers=global (Gemma's default): a map's kernel on the 3 global layers only; `all`: on every layer."""
    only_global, every = forward_work(GEMMA3), forward_work(dataclasses.replace(GEMMA3, extension_layers="all"))
    split, all_mapped = prefill_pairs(only_global, 32768, 0, mapped=True), prefill_pairs(every, 32768, 0, mapped=True)
    assert split.mapped == 3 * 2 * 4 * 256 * 32768**2 / 2 and split.masked > 0 and split.causal == 0
    assert all_mapped.mapped == every.pair * 32768**2 / 2 and all_mapped.masked == 0


def test_cost_estimate_grows_and_charges_for_chunks():
    work = forward_work(SMOLLM2)
    one = [estimated_cpu_seconds(work, n, 0) for n in (1024, 2048, 4096)]
    assert one == sorted(one) and one[2] > 2 * one[1]  # superlinear: attention
    assert estimated_cpu_seconds(work, 8192, 1024) > estimated_cpu_seconds(work, 8192, 0) == estimated_cpu_seconds(
        work, 8192, 8192)


def test_cost_estimate_charges_decoded_tokens_more_under_a_map():
    """RULER decodes up to 128 tokens per prompt: about 13 CPU s at 8k plain (scripts/decode_cost.py), a third of
    the prefill, which the plan used to leave out."""
    work = forward_work(SMOLLM2)
    decoding = lambda n, mapped: estimated_cpu_seconds(work, n, 0, mapped, 128) - estimated_cpu_seconds(work, n, 0,
                                                                                                       mapped)
    plain = decoding(8192, False)
    assert 0.05 * 128 < plain < 0.2 * 128 and decoding(8192, True) > 1.5 * plain
    assert decoding(16384, False) > plain  # grows with T


def test_the_run_plans_with_the_model_it_loaded():
    """`posenc extend`'s printed plan reads the loaded model's config (meta-device models: shapes, no memory)."""
    from posenc.experiments.config import loader as config_loader
    from posenc.experiments.extend.config import ExtendConfig
    from posenc.experiments.extend.run import estimate_minutes

    cfg = config_loader.build(ExtendConfig, {"extend": {"methods": ["none", "yarn"]},
                                             "perplexity": {"lengths": [4096, 8192]}, "passkey": {"lengths": [8192]}})
    with torch.device("meta"):
        smollm2, deep = Llama(SMOLLM2), Llama(dataclasses.replace(SMOLLM2, n_layer=60))
    plan = estimate_minutes(cfg, smollm2)
    assert 1.8 * plan < estimate_minutes(cfg, deep) < 2 * plan  # all but the LM head doubles
