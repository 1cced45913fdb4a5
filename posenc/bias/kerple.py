"""`kerple`: kernelized relative positional bias (Chi et al. 2022, eq. 6-7), as NeMo builds it.

  log kernel (NeMo, default): -b * log(1 + a * |m - n|^p)     b, a > 0, 0 < p <= 2
  log kernel, p fixed at 1:   -b * log(1 + a * |m - n|)       the paper's two-parameter form
  power kernel:               -b * |m - n|^p                  b > 0, 0 < p <= 2
Per-head learnable b, a, p. NeMo (KERPLERelativePositionEmbedding) starts b at the ALiBi slopes
(zero for the heads past num_attention_heads_alibi), a and p at 1, and learns all three. The paper
bounds p to (0, 2] (the kernel is conditionally positive definite there) and b, a to positive
values; here positivity holds by construction (eps + softplus for b and a, eps + (2 - eps) * sigmoid
for p), so no gradient step can leave that domain and no clamp stops a gradient. NeMo keeps the raw
values unconstrained; `load_nemo_parameters` maps trained NeMo values (kerple_b, kerple_a,
kerple_p) onto ours and refuses values outside the domain.

At initialisation the log kernel is -slope * log(1 + |m - n|), not ALiBi: it grows with the log of
the distance. The power kernel starts exactly as ALiBi (p = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from posenc.bias._distance import distance_bias
from posenc.bias.alibi import partial_slopes
from posenc.checks import positive_int
from posenc.errors import bad_value, unknown_name
from posenc.scheme import Dims, Scheme, ScoreMod

KERPLE_EPS = 1e-6  # floor: softplus underflows to exactly 0 for very negative raw values
MAX_POWER = 2.0  # Chi et al. 2022: the kernels are conditionally positive definite for 0 < p <= 2


def _inverse_softplus(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))


def _positive(raw: Tensor) -> Tensor:
    return F.softplus(raw) + KERPLE_EPS


def _power(raw: Tensor) -> Tensor:
    return KERPLE_EPS + (MAX_POWER - KERPLE_EPS) * torch.sigmoid(raw)


def _raw_positive(value: Tensor) -> Tensor:
    return _inverse_softplus(value - KERPLE_EPS)


def _raw_power(value: Tensor) -> Tensor:
    return torch.logit((value - KERPLE_EPS) / (MAX_POWER - KERPLE_EPS))


def kerple_log(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> Tensor:
    """-b log(1 + a d^p); distance d >= 0."""
    return -b * torch.log1p(a * distance.pow(p))


def kerple_power(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> Tensor:
    """-b d^p (a is unused: the power kernel has two parameters)."""
    return -b * distance.pow(p)


Kernel = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


KERNELS: dict[str, Kernel] = {"log": kerple_log, "power": kerple_power}


@dataclass(frozen=True, kw_only=True)
class KERPLEOptions:
    kerple_kernel: str = "log"  # "log" (NeMo: -b log(1 + a|m-n|^p)) or "power" (-b |m-n|^p)
    kerple_learn_p: bool = True  # log kernel: learn p as NeMo does; False keeps p = 1 (the paper's 2-parameter form)
    num_attention_heads_kerple: int | None = None  # NeMo: bias only the first heads; None = all

    def __post_init__(self) -> None:
        if self.kerple_kernel not in KERNELS:
            raise unknown_name("kerple_kernel", self.kerple_kernel, KERNELS)
        if not isinstance(self.kerple_learn_p, bool):
            raise bad_value("kerple_learn_p", self.kerple_learn_p, "True or False")
        if self.kerple_kernel == "power" and not self.kerple_learn_p:
            raise bad_value("kerple_learn_p", False, "True with kerple_kernel='power' (its exponent is learned)")
        if self.num_attention_heads_kerple is not None:
            positive_int("num_attention_heads_kerple", self.num_attention_heads_kerple)


class KERPLE(Scheme):
    Options = KERPLEOptions
    shift_invariant = True
    KERNELS: ClassVar[dict[str, Kernel]] = KERNELS

    def __init__(self, dims: Dims, options: KERPLEOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.kernel, self.learn_p = self.options.kerple_kernel, self.options.kerple_learn_p
        # Heads NeMo leaves unbiased get b = 0; softplus cannot reach 0, so start them tiny.
        b = partial_slopes(dims.n_head, self.options.num_attention_heads_kerple).clamp_min(2 * KERPLE_EPS)
        one = torch.ones(dims.n_head)
        self.b_raw = nn.Parameter(_raw_positive(b))
        self.a_raw = nn.Parameter(_raw_positive(one), requires_grad=self.kernel == "log")
        self.p_raw = nn.Parameter(_raw_power(one), requires_grad=self.learn_p)

    @classmethod
    def check_config(cls, dims: Dims, options: KERPLEOptions) -> None:
        partial_slopes(dims.n_head, options.num_attention_heads_kerple, "num_attention_heads_kerple")

    @property
    def b(self) -> Tensor:
        return _positive(self.b_raw)

    @property
    def a(self) -> Tensor:
        return _positive(self.a_raw)

    @property
    def p(self) -> Tensor:
        return _power(self.p_raw)

    def _kernel_args(self) -> tuple[Kernel, Tensor, Tensor, Tensor]:
        return self.KERNELS[self.kernel], self.b, self.a, self.p

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        # the kernel once per distance (H, S), then gathered: no log/pow per (B,H,Tq,Tk) entry
        return distance_bias(q_pos, k_pos, self.bias_by_distance)

    def bias_by_distance(self, distance: Tensor) -> Tensor:
        """distance (S,) m - n -> (H,S): the kernel of |m - n| per head."""
        kernel, b, a, p = self._kernel_args()
        return kernel(distance.abs().to(torch.float32)[None], b[:, None], a[:, None], p[:, None])  # (H,1) params

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        kernel, b, a, p = (x.detach() if isinstance(x, Tensor) else x for x in self._kernel_args())

        def kerple(score, batch, h, q_idx, kv_idx):
            distance = (q_pos[batch, q_idx] - k_pos[batch, kv_idx]).abs().to(score.dtype)
            return score + kernel(distance, b[h], a[h], p[h])

        return kerple

    @torch.no_grad()
    def load_nemo_parameters(self, state: Mapping[str, Tensor]) -> None:
        """Take a trained NeMo KERPLE's kerple_b, kerple_a, kerple_p (shape (H,1,1) or (H,))."""
        for name, raw, to_raw, low, high in (("kerple_b", self.b_raw, _raw_positive, 0.0, float("inf")),
                                              ("kerple_a", self.a_raw, _raw_positive, 0.0, float("inf")),
                                              ("kerple_p", self.p_raw, _raw_power, 0.0, MAX_POWER)):
            value = torch.as_tensor(state[name], dtype=torch.float32).reshape(-1)
            if value.shape != raw.shape:
                raise bad_value(name, tuple(value.shape), f"{raw.numel()} values, one per head")
            if not ((value > low + KERPLE_EPS) & (value <= high)).all():
                raise bad_value(name, value.tolist(), f"values in ({low:g}, {high:g}] (KERPLE's domain)")
            raw.copy_(to_raw(value.clamp_max(high - KERPLE_EPS) if high < float("inf") else value))

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, learn_p={self.learn_p}, heads={self.dims.n_head}"


__all__ = ["KERPLE", "kerple_log", "kerple_power"]
