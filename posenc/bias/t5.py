"""`relative`: T5's bucketed relative position bias (Raffel et al. 2020, sec. 2.1).

Each (bucket, head) pair has one learned scalar added to the logits. A relative position
r = n - m (key minus query, the sign convention of Mesh TF and HF's T5Attention) falls in:
  - exact buckets for |r| < max_exact (half of the buckets, one per offset),
  - log-spaced buckets for max_exact <= |r| < max_distance, all larger |r| in the last one.
A bidirectional (encoder) stack splits the buckets in two: keys after the query get the
upper half. A causal (decoder) stack only ever sees r <= 0, so all buckets serve the past.
The table is shared by every layer of a stack (per_layer=False), as in T5.

T5 itself does not scale q.k by 1/sqrt(Dh) (its init absorbs it); our attention runs SDPA,
which does, and the bias is added after that scaling. The learned scalars simply adapt.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from posenc.bias._distance import distance_bias
from posenc.errors import bad_value
from posenc.scheme import BucketBias, Dims, Scheme, ScoreMod


def check_bucket_options(num_buckets: int, max_distance: int) -> None:
    """Each direction needs >= 1 exact bucket and max_distance past them (else log(1) = 0 divides)."""
    if not isinstance(num_buckets, int) or isinstance(num_buckets, bool) or num_buckets < 4:
        raise bad_value("relative_attention_num_buckets", num_buckets, "an integer >= 4")
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance <= num_buckets // 2:
        raise bad_value("relative_attention_max_distance", max_distance,
                        f"an integer > relative_attention_num_buckets // 2 = {num_buckets // 2}")


def t5_relative_position_bucket(relative_position: Tensor, bidirectional: bool = True, num_buckets: int = 32,
                                max_distance: int = 128) -> Tensor:
    """Bucket index in [0, num_buckets) for each relative position n - m (any int shape, same shape out)."""
    check_bucket_options(num_buckets, max_distance)
    return _bucket(relative_position.to(torch.int64), bidirectional, num_buckets, max_distance)


def _bucket(relative_position: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    offset = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        offset = torch.where(relative_position > 0, num_buckets, 0)  # keys after the query: upper half
        distance = relative_position.abs()
    else:
        distance = (-relative_position).clamp_min(0)  # only the past counts; future keys share bucket 0
    max_exact = num_buckets // 2
    # float32 as Mesh TF and HF compute it, so a bucket edge can never round differently from the
    # tables of trained T5 checkpoints (float64 agrees on every offset tests/reference checks).
    ratio = distance.clamp_min(1).to(torch.float32) / max_exact
    log_bucket = max_exact + (torch.log(ratio) / math.log(max_distance / max_exact)
                              * (num_buckets - max_exact)).to(torch.int64)
    log_bucket = log_bucket.clamp_max(num_buckets - 1)
    return offset + torch.where(distance < max_exact, distance, log_bucket)


@dataclass(frozen=True, kw_only=True)
class T5BiasOptions:
    relative_attention_num_buckets: int = 32  # HF T5 name: buckets of the bias
    relative_attention_max_distance: int = 128  # distances past this share the last bucket

    def __post_init__(self) -> None:
        check_bucket_options(self.relative_attention_num_buckets, self.relative_attention_max_distance)


class T5RelativeBias(Scheme):
    Options = T5BiasOptions
    shift_invariant = True
    bias_parameters = True  # per-head logit scalars: trainer.bias_lr_scale applies (see Scheme)

    def __init__(self, dims: Dims, options: T5BiasOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.num_buckets = self.options.relative_attention_num_buckets
        self.max_distance = self.options.relative_attention_max_distance
        self.bidirectional = not dims.causal
        # HF's T5 init: normal with std d_model^-0.5 (modeling_t5.T5PreTrainedModel._init_weights).
        self.table = nn.Parameter(torch.randn(self.num_buckets, dims.n_head) * dims.d_model ** -0.5)  # (buckets,H)

    def buckets(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        """(B,Tq), (B,Tk) -> bucket of n - m, (B,Tq,Tk)."""
        relative_position = k_pos[:, None, :] - q_pos[:, :, None]  # (B,Tq,Tk), key minus query
        return _bucket(relative_position, self.bidirectional, self.num_buckets, self.max_distance)

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        return distance_bias(q_pos, k_pos, self.bias_by_distance)  # (B|1,H,Tq,Tk)

    def bias_by_distance(self, distance: Tensor) -> Tensor:
        """distance (S,) m - n -> (H,S): buckets of n - m, looked up once per distance."""
        buckets = _bucket(-distance, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table[buckets].t()

    def bucket_bias(self, distance: Tensor) -> BucketBias:
        """bias_by_distance as the table (H, buckets) and each distance's bucket (S,)."""
        return BucketBias(self.table.t(), _bucket(-distance, self.bidirectional, self.num_buckets, self.max_distance))

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        # One lookup per score: the bias of every distance in range, (H, span), built once per call.
        # (A bucket computation inside score_mod also hits an Inductor C++ codegen bug in torch 2.13.)
        lowest = int(k_pos.min() - q_pos.max())
        distances = torch.arange(lowest, int(k_pos.max() - q_pos.min()) + 1, device=q_pos.device)
        buckets = _bucket(distances, self.bidirectional, self.num_buckets, self.max_distance)
        by_distance = self.table[buckets].t().contiguous().detach()  # (H, span)

        def t5_bias(score, b, h, q_idx, kv_idx):
            return score + by_distance[h, k_pos[b, kv_idx] - q_pos[b, q_idx] - lowest].to(score.dtype)

        return t5_bias

    def extra_repr(self) -> str:
        return f"num_buckets={self.num_buckets}, max_distance={self.max_distance}, bidirectional={self.bidirectional}"


__all__ = ["T5RelativeBias", "check_bucket_options", "t5_relative_position_bucket"]
