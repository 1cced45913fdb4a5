"""Greedy or sampled decoding through the KV cache, shared by the causal language models."""

from __future__ import annotations

import torch
from torch import Tensor

from posenc.errors import bad_value
from posenc.models.inputs import check_positions, check_token_ids, vouch
from posenc.validators import is_finite_number


def check_sampling(max_new_tokens: int, temperature: float, top_k: int | None) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 0:
        raise bad_value("max_new_tokens", max_new_tokens, "a non-negative integer")
    if not is_finite_number(temperature) or temperature < 0:
        raise bad_value("temperature", temperature, "a finite number >= 0 (0 = greedy)")
    if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
        raise bad_value("top_k", top_k, "None or a positive integer")


def pick_token(logits: Tensor, temperature: float, top_k: int | None, generator: torch.Generator | None) -> Tensor:
    """logits (B,V) -> (B,1): argmax at temperature 0, else a sample from the top_k softmax."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)


class CausalGeneration:
    """generate() for a model with forward(input_ids, position_ids, cache), new_cache() and cfg.vocab_size."""

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True,
                 temperature: float = 0.0, top_k: int | None = None, position_ids: Tensor | None = None,
                 generator: torch.Generator | None = None, static_cache: bool = False,
                 compiled: bool = False) -> Tensor:
        """Greedy (temperature 0) or sampled continuation; returns (B, T + max_new_tokens). static_cache: decode
        through posenc.models.static_decode (a fixed cache; each step a CUDA graph's replay on CUDA); compiled: its
        step under torch.compile instead (0.76-0.93x the ordinary step's time at a 4k cache on BENCHMARKS.md's Xeon,
        after a compile of seconds: BENCHMARKS.md, "Decode step captured whole")."""
        check_sampling(max_new_tokens, temperature, top_k)
        check_token_ids(input_ids, self.cfg.vocab_size)
        if compiled and not static_cache:
            raise bad_value("compiled", compiled, "False unless static_cache=True (the step it compiles)")
        if static_cache:
            if not use_cache:
                raise bad_value("static_cache", static_cache, "False when use_cache is False")
            return self._generate_static(input_ids, max_new_tokens, temperature, top_k, position_ids, generator,
                                         compiled)
        b, t = input_ids.shape
        pos = (torch.arange(t, device=input_ids.device).expand(b, t) if position_ids is None
               else check_positions(position_ids.to(input_ids.device), input_ids))
        ids, cache = input_ids, (self.new_cache() if use_cache else None)
        logits = self(ids, pos, cache)[:, -1]
        for step in range(max_new_tokens):
            # ids drawn over the logits' V, positions one past checked ones: the step's checks read nothing back
            nxt = vouch(pick_token(logits, temperature, top_k, generator), ("ids", logits.shape[-1]))  # (B,1)
            ids = vouch(torch.cat((ids, nxt), dim=1), ("ids", max(logits.shape[-1], self.cfg.vocab_size)))
            if step == max_new_tokens - 1:
                break
            pos = vouch(torch.cat((pos, pos[:, -1:] + 1), dim=1), "positions")
            logits = (self(nxt, vouch(pos[:, -1:], "positions"), cache)[:, -1] if cache is not None
                      else self(ids, pos)[:, -1])
        return ids

    def _generate_static(self, input_ids: Tensor, max_new_tokens: int, temperature: float, top_k: int | None,
                         position_ids: Tensor | None, generator: torch.Generator | None, compiled: bool) -> Tensor:
        from posenc.models.static_decode import StaticDecoder  # it imports this module's siblings

        b, t = input_ids.shape
        decoder = StaticDecoder(self, b, t + max(max_new_tokens, 1), cuda_graph=False if compiled else None,
                                compiled=compiled)
        logits, tokens = decoder.prefill(input_ids, position_ids), [input_ids]
        for step in range(max_new_tokens):
            tokens.append(pick_token(logits, temperature, top_k, generator))  # (B,1)
            if step < max_new_tokens - 1:
                logits = decoder.step(tokens[-1])
        return torch.cat(tokens, dim=1)


__all__ = ["CausalGeneration", "check_sampling", "pick_token"]
