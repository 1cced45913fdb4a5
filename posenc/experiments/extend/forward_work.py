"""The work of one forward of a Llama-family decoder, counted from its config: what the cost plan of `posenc extend`
scales by, so that its constants (seconds per multiply-add, measured on SmolLM2-135M) carry to another model.

Multiply-adds (MACs), bfloat16 matrix products only; norms, RoPE and activations are left to the constants:
- per token, every layer's projections (q: D x H Dh, k and v: D x Hkv Dh each, o: H Dh x D) and its gated MLP
  (gate, up: D x F each, down: F x D; posenc.nn.llama_block has no other MLP);
- per scored position, the LM head (D x vocabulary): a perplexity forward scores every position, a retrieval
  prompt only its last;
- per (query, key) pair, per layer, H x Dh for q.k and H x Dh for the weighted sum of v: 2 H Dh.
A sliding layer (window W) attends block by block over the keys each block's window reaches
(posenc.nn.sliding_window): a query of a block of b reads about b + W keys, whatever T, through the masked kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

from posenc.models.llama_config import LlamaConfig
from posenc.nn.sliding_window import block_size


@dataclass(frozen=True)
class AttentionGroup:
    """Layers that attend alike: pair MACs summed over them, their window (None: full causal attention), and
    whether the position map or scaling acts on them (LlamaConfig.extends_layer)."""

    pair: int
    window: int | None
    extended: bool


@dataclass(frozen=True)
class ForwardWork:
    token: int  # MACs per token through every layer (projections, MLP)
    head: int  # MACs per scored position (LM head over the vocabulary)
    groups: tuple[AttentionGroup, ...]

    @property
    def pair(self) -> int:
        """MACs per (query, key) pair over every layer: what a pair costs where every layer reaches it."""
        return sum(group.pair for group in self.groups)


def forward_work(cfg: LlamaConfig) -> ForwardWork:
    d, dh = cfg.d_model, cfg.head_size
    projections = d * cfg.n_head * dh * 2 + d * cfg.n_kv_head * dh * 2  # q and o; k and v (GQA: Hkv heads)
    mlp = 3 * d * cfg.ffn_hidden_size  # gate, up, down
    kinds: dict[tuple[int | None, bool], int] = {}
    for layer in range(cfg.n_layer):
        window = cfg.sliding_window if cfg.layer_type(layer) == "sliding_attention" else None
        key = (window, cfg.extends_layer(layer))
        kinds[key] = kinds.get(key, 0) + 2 * cfg.n_head * dh
    groups = tuple(AttentionGroup(pair, window, extended) for (window, extended), pair in kinds.items())
    return ForwardWork(cfg.n_layer * (projections + mlp), d * cfg.vocab_size, groups)


@dataclass(frozen=True)
class PairWork:
    """Pair MACs of a prefill by the kernel that computes them: SDPA's causal kernel, its masked path, a map's."""

    causal: float = 0.0
    masked: float = 0.0
    mapped: float = 0.0

    def __add__(self, other: PairWork) -> PairWork:
        return PairWork(self.causal + other.causal, self.masked + other.masked, self.mapped + other.mapped)


def full_pairs(start: int, size: int) -> float:
    """Causal pairs of `size` queries after `start` cached keys (the triangle counted as size^2 / 2)."""
    return size * start + size * size / 2


def window_pairs(start: int, size: int, window: int, blocked: bool = True) -> float:
    """Pairs a sliding layer's masked kernel computes for queries [start, start + size) over keys [0, start + size)
    once the window is reached: block by block (posenc.nn.sliding_window), or, blocked=False, the whole (Tq, Tk)
    mask that posenc used before the blocks."""
    keys, block = start + size, block_size(window)
    if not blocked or keys <= block + window:  # the blocks would not shrink it: the dense mask
        return float(size * keys)
    pairs = 0.0
    for a in range(0, size, block):
        b = min(size, a + block)
        pairs += (b - a) * (start + b - max(0, start + a - window + 1))
    return pairs


def prefill_pairs(work: ForwardWork, length: int, chunk: int, mapped: bool = False, blocked: bool = True) -> PairWork:
    """Pair MACs of prefilling `length` tokens `chunk` at a time (chunk <= 0: one call). A chunk after the first
    takes the masked path; a map attends itself (its own kernel, window included) on the layers it acts on."""
    step = length if chunk <= 0 else min(chunk, length)
    total = PairWork()
    for start in range(0, length, step):
        size = min(step, length - start)
        for group in work.groups:
            if mapped and group.extended:
                total += PairWork(mapped=group.pair * full_pairs(start, size))
            elif group.window is not None and start + size > group.window:  # some query reaches past the window
                total += PairWork(masked=group.pair * window_pairs(start, size, group.window, blocked))
            elif start == 0:
                total += PairWork(causal=group.pair * full_pairs(start, size))
            else:
                total += PairWork(masked=group.pair * full_pairs(start, size))
    return total


def decode_keys(work: ForwardWork, length: int, mapped: bool = False) -> float:
    """Pair MACs of one decoded token behind `length` cached keys: a sliding layer reads its window's keys only."""
    return sum(group.pair * (length if group.window is None or (mapped and group.extended)
                             else min(length, group.window)) for group in work.groups)


__all__ = ["AttentionGroup", "ForwardWork", "PairWork", "decode_keys", "forward_work", "full_pairs",
           "prefill_pairs", "window_pairs"]
