"""Long inputs through a pretrained Llama in bounded memory: prefill in chunks through the KV
cache, LM head a slice at a time, greedy decoding from the cache, bfloat16 autocast.

Memory: SDPA never builds (T, T) scores (its causal kernel when a chunk starts an empty cache,
a (chunk, Tk) boolean mask after that), logits exist for at most LOGIT_CHUNK positions, and the
cache holds 2 x layers x kv heads x head_dim values per token (SmolLM2: 23 KB in bfloat16, so
0.75 GB at 32k tokens). Peak memory therefore grows with `chunk` and linearly with the length.
Speed: with this torch build SDPA's masked path costs about twice its causal kernel per
query-key pair, so the fastest plan is the largest chunk that fits (one call when it covers
the prompt).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.errors import bad_value
from posenc.experiments.extend.forward_work import ForwardWork, decode_keys, prefill_pairs
from posenc.models.llama import Llama
from posenc.nn.kv_cache import KVCache

LOGIT_CHUNK = 1024  # positions per LM-head slice: 1024 x 49152 float32 = 200 MB
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@contextlib.contextmanager
def inference(dtype: str, device: torch.device | str = "cpu") -> Iterator[None]:
    """no_grad, plus bfloat16 autocast on `device`'s type: matmuls and attention in bf16 (AMX where the
    CPU has it, tensor cores on a GPU), the residual stream, norms and RoPE angles stay float32."""
    if dtype not in DTYPES:
        raise bad_value("dtype", dtype, f"one of {', '.join(DTYPES)}")
    kind = torch.device(device).type
    with torch.no_grad(), torch.autocast(kind, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        yield


def device_of(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def bfloat16_linears(model: Llama) -> Llama:
    """Store the blocks' projection weights in bfloat16, the values autocast would cast them to on
    every call, once: decoding re-reads every weight per token, so the per-call cast would double
    its memory traffic. Embeddings, norms and the tied LM head stay float32. Use under inference("bfloat16")."""
    for block in model.blocks:
        for module in block.modules():
            if isinstance(module, nn.Linear):
                module.to(torch.bfloat16)
    return model


def prefill(model: Llama, ids: Tensor, cache: KVCache, chunk: int) -> Iterator[Tensor]:
    """Feed ids (1,T) through the cache `chunk` tokens per call; yields each chunk's hidden
    states (1,c,D). chunk <= 0 means one call."""
    step = ids.shape[1] if chunk <= 0 else chunk
    for start in range(0, ids.shape[1], step):
        yield model.features(ids[:, start : start + step], cache=cache)  # positions continue the cache


def window_nll(model: Llama, ids: Tensor, chunk: int) -> Tensor:
    """ids (1,T) -> NLL of tokens 1..T-1, float64 (T-1,) on the CPU, prefilled `chunk` tokens at a time."""
    ids = ids.to(device_of(model))
    out, start = [], 0
    for hidden in prefill(model, ids, model.new_cache(), chunk):  # (1,c,D)
        for lo in range(0, hidden.shape[1], LOGIT_CHUNK):
            h = hidden[0, lo : lo + LOGIT_CHUNK]
            targets = ids[0, start + lo + 1 : start + lo + 1 + h.shape[0]]  # the last position has none
            logits = model.logits(h[: targets.shape[0]]).float()  # (c', V)
            out.append(F.cross_entropy(logits, targets, reduction="none").double().cpu())
        start += hidden.shape[1]
    return torch.cat(out)


def greedy_answer(model: Llama, ids: Tensor, new_tokens: int, chunk: int, stop: int | None = None) -> list[int]:
    """Prefill the prompt ids (1,T) in chunks, then decode up to `new_tokens` greedily from the cache, ending
    after the token `stop` (the tokenizer's end of sequence: generation ends there, as every server's does)."""
    cache = model.new_cache()
    ids = ids.to(device_of(model))
    for hidden in prefill(model, ids, cache, chunk):
        last = hidden[:, -1]  # (1,D): only the last position's logits are needed
    tokens = []
    for step in range(new_tokens):
        token = model.logits(last).argmax(-1, keepdim=True)  # (1,1)
        tokens.append(int(token))
        if stop is not None and tokens[-1] == stop:
            break
        if step < new_tokens - 1:
            last = model.features(token, cache=cache)[:, -1]
    return tokens


# Cost of one prefill, CPU-seconds (2 threads, bfloat16 autocast) measured on SmolLM2-135M on the development machine
# (Xeon with AMX, under load from other jobs): one call from an empty cache took 17 s at 8k tokens, 50 s at 16k and
# 148 s at 32k, i.e. about 1.55e-3 CPU s per token (projections, MLP) plus 1.8e-7 per causal query-key pair
# (attention). Kept per multiply-add (forward_work counts them from a model's config) so the plan scales with the
# model: SmolLM2 has 106.2M MACs per token in its layers and 34,560 per pair (30 layers x 2 x 9 heads x 64), so
# TOKEN_MAC_SECONDS = 1.55e-3 / 106.2M and PAIR_MAC_SECONDS = 1.8e-7 / 34,560. The LM head (SmolLM2: 28.3M MACs)
# is charged at the layers' rate per scored position: the measured forwards' head ran in slices whose cost was not
# separated, so SmolLM2's retrieval prompts keep the estimate measured and its perplexity forwards gain the head.
# Chunks after the first take SDPA's masked path, which measured MASKED_PAIR_COST times the causal kernel's cost
# per pair; a sliding layer's blocks take it too (posenc.nn.sliding_window).
# An attention position map (Self-Extend, DCA) costs MAPPED_PAIR_COST times plain causal attention per pair:
# one SmolLM2 layer at 32,768 tokens, float32, one thread, on an AMD Zen 5 (AVX-512): plain SDPA 13.5 CPU s,
# Self-Extend 23.3 s, DCA 22.6 s (EXTEND.md, "cost of the maps"); the windowed maps cost less, so it bounds them.
TOKEN_MAC_SECONDS, PAIR_MAC_SECONDS, MASKED_PAIR_COST, MAPPED_PAIR_COST = 1.46e-11, 5.21e-12, 2.2, 1.7
# A decoded token behind a T-token cache: the weights' products (layers and head) plus the cached keys' pairs, and
# MAPPED_DECODE_COST times that under a map. Measured alone, one thread, AMD Zen 5, SmolLM2 at T = 8,192
# (scripts/decode_cost.py): 0.10 CPU s plain (about half of it the weights' matrix products: 0.05 s over 134.5M
# MACs), 0.19 under Self-Extend; the rest 6e-6 s per cached key over 34,560 MACs.
DECODE_MAC_SECONDS, DECODE_PAIR_MAC_SECONDS, MAPPED_DECODE_COST = 3.72e-10, 1.74e-10, 1.9


def estimated_cpu_seconds(work: ForwardWork, length: int, chunk: int, mapped: bool = False, decoded: int = 0,
                          scored: int = 1, blocked: bool = True) -> float:
    """Rough bfloat16 cost of prefilling `length` tokens of a model doing `work` (forward_work) `chunk` at a time,
    scoring `scored` positions with the LM head (perplexity: every one; a retrieval prompt: its last), then
    decoding `decoded` tokens; `mapped`: under an attention position map; blocked=False: sliding layers with the
    dense mask posenc used before their block path (to check runs made then)."""
    pairs = prefill_pairs(work, length, chunk, mapped, blocked)
    seconds = TOKEN_MAC_SECONDS * (work.token * length + work.head * scored)
    seconds += PAIR_MAC_SECONDS * (pairs.causal + MASKED_PAIR_COST * pairs.masked + MAPPED_PAIR_COST * pairs.mapped)
    per_decoded = DECODE_MAC_SECONDS * (work.token + work.head) + DECODE_PAIR_MAC_SECONDS * decode_keys(
        work, length, mapped)
    return seconds + decoded * per_decoded * (MAPPED_DECODE_COST if mapped else 1.0)
