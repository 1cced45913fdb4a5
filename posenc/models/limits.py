"""Fail fast on requests that cannot fit, before allocating anything.

Score-sized tensors dominate: a scheme read through its weights (Shaw) holds (B,H,Tq,Tk) floats
about three times over (bias, masked bias, weights); a bias scheme on long inputs runs the flex
or chunked path (posenc.nn.bias_paths), holding at most CHUNK_ROWS rows of scores; a scheme with
no bias runs SDPA's own kernel with O(T) extra memory. Activations add ~16 (T, D) floats.
"""

from __future__ import annotations

import torch

from posenc.memory_budget import available_bytes
from posenc.scheme import Scheme, materialises_bias

BIAS_COPIES = 3
ACTIVATION_BYTES_PER_TOKEN_PER_DIM = 4 * 16
SMALL_REQUEST = 1 << 26  # 64 MiB: always fits; skips reading /proc/meminfo on every decode step


class SequenceTooLong(ValueError):
    """The request would need more memory than this machine has."""


def attention_bytes(batch: int, heads: int, tq: int, tk: int, scheme: Scheme) -> int:
    from posenc.nn.bias_paths import CHUNK_ROWS

    if not materialises_bias(scheme):
        return 0
    rows = tq if scheme.needs_weights else min(tq, CHUNK_ROWS)
    return BIAS_COPIES * 4 * batch * heads * rows * tk


def needed_bytes(batch: int, heads: int, d_model: int, tq: int, tk: int, scheme: Scheme) -> int:
    return attention_bytes(batch, heads, tq, tk, scheme) + ACTIVATION_BYTES_PER_TOKEN_PER_DIM * batch * tq * d_model


def longest_that_fits(batch: int, heads: int, d_model: int, scheme: Scheme, budget: int) -> int:
    """Largest T whose estimate fits the budget (bisection on needed_bytes)."""
    low, high = 1, 1 << 30
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if needed_bytes(batch, heads, d_model, mid, mid, scheme) <= budget else (low, mid - 1)
    return low


def check_fits(batch: int, heads: int, d_model: int, tq: int, tk: int, scheme: Scheme,
               budget: int | None = None) -> None:
    need = needed_bytes(batch, heads, d_model, tq, tk, scheme)
    if budget is None and (need < SMALL_REQUEST or torch.compiler.is_compiling()):  # e.g. a decode step: no need
        return  # to ask the kernel; traced by torch.compile: reading /proc/meminfo would break the graph
    budget = available_bytes() if budget is None else budget
    if need <= budget:
        return
    raise SequenceTooLong(
        f"sequence length {tk} (batch {batch}) needs ~{need / 2**30:.1f} GiB for attention with "
        f"{type(scheme).__name__}, but {budget / 2**30:.1f} GiB are available; the longest that fits is "
        f"~{longest_that_fits(batch, heads, d_model, scheme, budget)} tokens"
    )
