"""Fail fast on requests that cannot fit, before allocating anything.

A scheme whose bias is materialised costs (B, H, Tq, Tk) float32 tensors in attention (the bias,
its masked copy and SDPA's working copy: about three). Schemes that add no bias run SDPA with
O(T) extra memory and are bounded only by activations.
"""

from __future__ import annotations

import math
import os

from posenc.scheme import Scheme

BIAS_COPIES = 3  # bias, masked bias, SDPA's scaled scores
ACTIVATION_BYTES_PER_TOKEN_PER_DIM = 4 * 16  # float32, ~16 live (T, D)-sized tensors per layer


class SequenceTooLong(ValueError):
    """The request would need more memory than this machine has."""


def available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def materialises_bias(scheme: Scheme) -> bool:
    return type(scheme).bias is not Scheme.bias or scheme.needs_weights


def attention_bytes(batch: int, heads: int, tq: int, tk: int, scheme: Scheme) -> int:
    return BIAS_COPIES * 4 * batch * heads * tq * tk if materialises_bias(scheme) else 0


def check_fits(batch: int, heads: int, d_model: int, tq: int, tk: int, scheme: Scheme,
               budget: int | None = None) -> None:
    budget = available_bytes() if budget is None else budget
    need = attention_bytes(batch, heads, tq, tk, scheme) + ACTIVATION_BYTES_PER_TOKEN_PER_DIM * batch * tq * d_model
    if need <= budget:
        return
    per_square = BIAS_COPIES * 4 * batch * heads if materialises_bias(scheme) else 0
    longest = math.isqrt(budget // per_square) if per_square else budget // (
        ACTIVATION_BYTES_PER_TOKEN_PER_DIM * batch * d_model)
    raise SequenceTooLong(
        f"sequence length {tk} (batch {batch}) needs ~{need / 2**30:.1f} GiB for attention with "
        f"{type(scheme).__name__}, but {budget / 2**30:.1f} GiB are available; the longest that fits is "
        f"~{longest} tokens"
    )
