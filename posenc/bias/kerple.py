"""`kerple`: kernelized relative positional bias (Chi et al. 2022, eq. 6-7), as NeMo builds it.

  log kernel (NeMo, default): -b * log(1 + a * |m - n|^p)     b, a >= 0, 0.01 <= p <= 2
  log kernel, p fixed at 1:   -b * log(1 + a * |m - n|)       the paper's two-parameter form
  power kernel:               -b * |m - n|^p                  b >= 0, 0.01 <= p <= 2
Per-head learnable b, a, p. NeMo (KERPLERelativePositionEmbedding) starts b at the ALiBi slopes
(zero for the heads past num_attention_heads_alibi), a and p at 1, and learns all three.

Parameters are the values themselves (NeMo's kerple_b, kerple_a, kerple_p; the paper's code,
chijames/KERPLE, likewise), so one Adam step moves b by about lr whatever its size. The domain
(b, a >= 0; the paper's 0.01 <= p <= 2, where the kernel is conditionally positive definite) is kept
by clamping the value; the gradient still passes where it points back into the domain, so a
parameter that stepped past a bound returns as soon as the loss asks (`_clamp_inward`).
An earlier softplus form (b = softplus(raw)) was positive by construction but made Adam's steps
multiplicative, about lr * b: a head starting at slope 2^-8 could grow at most e^(sum of lr) ~ 1.9x
in `make demo`'s 400 steps, and KERPLE trailed ALiBi (perplexity 7.47 vs 5.85 at L=64, seed 0);
with the values as parameters it reached 5.83 (COMPARE.md).

At initialisation the log kernel is -slope * log(1 + |m - n|), not ALiBi: it grows with the log of
the distance. The power kernel starts exactly as ALiBi (p = 1).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from posenc.bias._distance import distance_bias
from posenc.bias.alibi import partial_slopes
from posenc.errors import bad_value, unknown_name
from posenc.scheme import Dims, HeadBias, Scheme, ScoreMod
from posenc.validators import positive_int

MIN_POWER = 1e-2  # chijames/KERPLE clamps p (and a, b) at 0.01
MAX_POWER = 2.0  # Chi et al. 2022: the kernels are conditionally positive definite for 0 < p <= 2


class _ClampInward(torch.autograd.Function):
    """x.clamp(low, high) whose gradient passes wherever a descent step would move x back into
    [low, high] (inside: always; below low: when it raises x; above high: when it lowers x)."""

    @staticmethod
    def forward(ctx, x: Tensor, low: float, high: float) -> Tensor:
        ctx.save_for_backward(x)
        ctx.low, ctx.high = low, high
        return x.clamp(low, high)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (x,) = ctx.saved_tensors
        inward = ((x >= ctx.low) & (x <= ctx.high)) | ((x < ctx.low) & (grad < 0)) | ((x > ctx.high) & (grad > 0))
        return grad * inward, None, None


def _clamp_inward(x: Tensor, low: float, high: float = float("inf")) -> Tensor:
    return _ClampInward.apply(x, low, high)


def kerple_log(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> Tensor:
    """-b log(1 + a d^p); distance d >= 0."""
    return -b * torch.log1p(a * distance.pow(p))


def kerple_power(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> Tensor:
    """-b d^p (a is unused: the power kernel has two parameters)."""
    return -b * distance.pow(p)


def _power_and_log(distance: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
    """d^p and d^p ln d (0 at d = 0, its limit for p > 0)."""
    power = distance.pow(p)
    return power, power * torch.where(distance > 0, distance, 1.0).log()


def kerple_log_derivatives(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """d/db, d/da, d/dp of -b log(1 + a d^p): -log(1 + a d^p), -b d^p / (1 + a d^p), -b a d^p ln d / (1 + a d^p)."""
    power, power_log = _power_and_log(distance, p)
    inner = 1 + a * power
    return -torch.log1p(a * power), -b * power / inner, -b * a * power_log / inner


def kerple_power_derivatives(distance: Tensor, b: Tensor, a: Tensor, p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """d/db, d/da, d/dp of -b d^p: -d^p, 0, -b d^p ln d."""
    power, power_log = _power_and_log(distance, p)
    return -power, torch.zeros_like(power), -b * power_log


Kernel = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
Derivatives = Callable[[Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]]


KERNELS: dict[str, Kernel] = {"log": kerple_log, "power": kerple_power}
DERIVATIVES: dict[str, Derivatives] = {"log": kerple_log_derivatives, "power": kerple_power_derivatives}


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
    bias_parameters = True  # per-head logit scalars: trainer.bias_lr_scale applies (see Scheme)
    KERNELS: ClassVar[dict[str, Kernel]] = KERNELS
    DERIVATIVES: ClassVar[dict[str, Derivatives]] = DERIVATIVES  # d kernel / d (b, a, p), per KERNELS entry

    def __init__(self, dims: Dims, options: KERPLEOptions | None = None, **flat: Any) -> None:
        super().__init__(dims, options, **flat)
        self.kernel, self.learn_p = self.options.kerple_kernel, self.options.kerple_learn_p
        one = torch.ones(dims.n_head)
        # NeMo's names and initial values; heads past num_attention_heads_kerple start (and may stay) at b = 0.
        self.kerple_b = nn.Parameter(partial_slopes(dims.n_head, self.options.num_attention_heads_kerple))
        self.kerple_a = nn.Parameter(one.clone(), requires_grad=self.kernel == "log")
        self.kerple_p = nn.Parameter(one.clone(), requires_grad=self.learn_p)

    @classmethod
    def check_config(cls, dims: Dims, options: KERPLEOptions) -> None:
        partial_slopes(dims.n_head, options.num_attention_heads_kerple, "num_attention_heads_kerple")

    @property
    def b(self) -> Tensor:
        return _clamp_inward(self.kerple_b, 0.0)

    @property
    def a(self) -> Tensor:
        return _clamp_inward(self.kerple_a, 0.0)

    @property
    def p(self) -> Tensor:
        return _clamp_inward(self.kerple_p, MIN_POWER, MAX_POWER)

    def _kernel_args(self) -> tuple[Kernel, Tensor, Tensor, Tensor]:
        return self.KERNELS[self.kernel], self.b, self.a, self.p

    def bias(self, q_pos: Tensor, k_pos: Tensor, q: Tensor | None = None, k: Tensor | None = None) -> Tensor:
        # the kernel once per distance (H, S), then gathered: no log/pow per (B,H,Tq,Tk) entry
        return distance_bias(q_pos, k_pos, self.bias_by_distance)

    def bias_by_distance(self, distance: Tensor) -> Tensor:
        """distance (S,) m - n -> (H,S): the kernel of |m - n| per head."""
        kernel, b, a, p = self._kernel_args()
        return kernel(distance.abs().to(torch.float32)[None], b[:, None], a[:, None], p[:, None])  # (H,1) params

    def head_bias(self, distance: Tensor) -> HeadBias | None:
        """Each head's row reads its own b, a, p only: the rows with their derivatives in (b, a, p), (H,3,S)."""
        derivatives = self.DERIVATIVES.get(self.kernel)
        if derivatives is None or self.KERNELS[self.kernel] is not KERNELS.get(self.kernel):
            return None  # a subclass's own kernel: no derivatives known
        kernel, b, a, p = self._kernel_args()
        params = torch.stack((b, a, p), -1)  # (H,3), in the graph: gradients reach kerple_b, _a, _p through it
        d = distance.abs().to(torch.float32)[None]  # (1,S)
        with torch.no_grad():
            b, a, p = (x.detach()[:, None] for x in (b, a, p))  # (H,1)
            rows = kernel(d, b, a, p)  # (H,S): bias_by_distance's values
            by_param = torch.stack(derivatives(d, b, a, p), 1)  # (H,3,S)
        return HeadBias(params, rows, by_param)

    def score_mod(self, q_pos: Tensor, k_pos: Tensor) -> ScoreMod:
        kernel, b, a, p = (x.detach() if isinstance(x, Tensor) else x for x in self._kernel_args())

        def kerple(score, batch, h, q_idx, kv_idx):
            distance = (q_pos[batch, q_idx] - k_pos[batch, kv_idx]).abs().to(score.dtype)
            return score + kernel(distance, b[h], a[h], p[h])

        return kerple

    @torch.no_grad()
    def load_nemo_parameters(self, state: Mapping[str, Tensor]) -> None:
        """Take a trained NeMo KERPLE's kerple_b, kerple_a, kerple_p (shape (H,1,1) or (H,))."""
        for name, low, high in (("kerple_b", 0.0, float("inf")), ("kerple_a", 0.0, float("inf")),
                                ("kerple_p", MIN_POWER, MAX_POWER)):
            param = getattr(self, name)
            value = torch.as_tensor(state[name], dtype=torch.float32).reshape(-1)
            if value.shape != param.shape:
                raise bad_value(name, tuple(value.shape), f"{param.numel()} values, one per head")
            if not ((value >= low) & (value <= high)).all():
                raise bad_value(name, value.tolist(), f"values in [{low:g}, {high:g}] (KERPLE's domain)")
            param.copy_(value)

    def extra_repr(self) -> str:
        return f"kernel={self.kernel}, learn_p={self.learn_p}, heads={self.dims.n_head}"


__all__ = ["KERPLE", "kerple_log", "kerple_log_derivatives", "kerple_power", "kerple_power_derivatives"]
