"""The properties that make a scheme usable in a model, each checked on a `View` (contract/models.py).

Every check returns a `Result`: holds, fails (with the numbers), refused (the model raised a clear
ValueError instead of computing, e.g. a position past a learned table) or n/a (the property does not
apply to this model, e.g. a cache in an encoder). Tolerances are float32 round-off for these sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from posenc.contract.models import VOCAB, ModelKind, View
from posenc.registry import scheme_class

ATOL = 2e-4  # float32 round-off of a 2-layer, d_model 32 model; a real violation is orders larger
SHIFTS = (1, 37, 300, 5000)
LONG_OFFSETS = (10**6, 10**9)


@dataclass(frozen=True)
class Result:
    name: str
    status: str  # "holds" | "fails" | "refused" | "n/a"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fails"


def tokens(batch: int = 2, length: int = 24, seed: int = 0) -> Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def _max_change(a: Tensor, b: Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


@torch.no_grad()
def finite(view: View, scheme: str) -> Result:
    out = view.logits(tokens())
    return Result("finite", "holds" if torch.isfinite(out).all() else "fails")


@torch.no_grad()
def finite_far_away(view: View, scheme: str) -> Result:
    """Positions offset by 1e6 and 1e9 still give finite outputs, or a clear error."""
    ids = tokens(1, 16)
    pos = torch.arange(16)[None]
    for offset in LONG_OFFSETS:
        try:
            out = view.logits(ids, position_ids=pos + offset)
        except ValueError as err:
            return Result("finite far away", "refused", f"offset {offset:.0e}: {str(err)[:80]}")
        if not torch.isfinite(out).all():
            return Result("finite far away", "fails", f"non-finite at offset {offset:.0e}")
    return Result("finite far away", "holds", "offsets 1e6, 1e9")


@torch.no_grad()
def causal(view: View, scheme: str) -> Result:
    """Changing tokens 15.. never changes the outputs at 0..14 (and does change later ones)."""
    if not view.causal:
        return Result("causal", "n/a", "bidirectional")
    ids = tokens()
    changed = ids.clone()
    changed[:, 15:] = (changed[:, 15:] + 7) % VOCAB
    before, after = view.logits(ids), view.logits(changed)
    leak = _max_change(before[:, :15], after[:, :15])
    if leak > 1e-5:
        return Result("causal", "fails", f"earlier outputs moved by {leak:.2e}")
    if _max_change(before[:, 15:], after[:, 15:]) < 1e-3:
        return Result("causal", "fails", "later outputs ignore their own tokens")
    return Result("causal", "holds")


@torch.no_grad()
def shift(view: View, scheme: str) -> Result:
    """Shift-invariant schemes: outputs unchanged when every position moves by k; absolute ones change."""
    ids = tokens()
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    base = view.logits(ids, position_ids=pos)
    claimed = scheme_class(scheme).shift_invariant
    changes = []
    for k in SHIFTS:
        try:
            changes.append(_max_change(base, view.logits(ids, position_ids=pos + k)))
        except ValueError as err:  # a fixed-size table refuses positions past its end: clear, not wrong
            if claimed or not changes:
                return Result("shift invariance", "fails" if claimed else "refused", f"shift {k}: {str(err)[:80]}")
    largest = max(changes)
    tolerance = ATOL + 1e-4 * base.abs().max().item()
    if claimed:
        ok = largest <= tolerance
        return Result("shift invariance", "holds" if ok else "fails", f"max change {largest:.2e} (shift-invariant)")
    return Result("shift invariance", "holds" if largest > 1e-2 else "fails",
                  f"max change {largest:.2e} (absolute: must change)")


@torch.no_grad()
def cache_equals_recompute(view: View, scheme: str) -> Result:
    """A prefill, one-token steps and a multi-token chunk through the KV cache equal one full forward."""
    if view.new_cache is None:
        return Result("cache == recompute", "n/a", "no cache")
    ids = tokens()
    full = view.logits(ids)
    cache = view.new_cache()
    parts = [view.logits(ids[:, :10], cache=cache)]
    parts += [view.logits(ids[:, t : t + 1], cache=cache) for t in range(10, 16)]
    parts.append(view.logits(ids[:, 16:], cache=cache))
    diff = _max_change(torch.cat(parts, dim=1), full)
    return Result("cache == recompute", "holds" if diff <= 1e-4 + 1e-4 * full.abs().max().item() else "fails",
                  f"max difference {diff:.2e}")


@torch.no_grad()
def cached_generation(view: View, scheme: str) -> Result:
    """Greedy tokens with the cache equal those without it, also from offset positions where the model takes them."""
    if view.generate is None:
        return Result("cached generation", "n/a", "no generation")
    prompt = tokens()[:, :8]
    runs = [(None, "from 0")] + ([(torch.arange(8).expand(2, 8) + 5, "from 5")] if view.module.__class__.__name__
                                 != "T5" else [])
    for pos, label in runs:
        cached = view.generate(prompt, 10, True, pos) if pos is not None else view.generate(prompt, 10, True)
        plain = view.generate(prompt, 10, False, pos) if pos is not None else view.generate(prompt, 10, False)
        if not torch.equal(cached, plain):
            return Result("cached generation", "fails", f"tokens differ ({label})")
    return Result("cached generation", "holds")


@torch.no_grad()
def batch_independence(view: View, scheme: str) -> Result:
    ids = tokens(3)  # the first rows alone give the outputs they give in the larger batch
    diff = _max_change(view.logits(ids)[:2], view.logits(ids[:2]))
    return Result("batch rows independent", "holds" if diff <= 1e-5 else "fails", f"max difference {diff:.2e}")


def learns(view: View, scheme: str, steps: int = 80) -> Result:
    """The model overfits one fixed batch within `steps` steps (its loss halves), every gradient finite on the way:
    the scheme does not block learning or gradients. It stops at the first step whose loss is under half the first
    (most schemes: 30-50 steps)."""
    model = view.module.train()
    data = torch.randint(0, VOCAB, (4, 33), generator=torch.Generator().manual_seed(5))
    trained = [p for p in model.parameters() if p.requires_grad]
    # foreach: one call per step for every tensor (the same updates, bit for bit; a step is mostly call overhead)
    opt = torch.optim.AdamW(trained, lr=3e-3, foreach=True)
    first = last = None
    taken = 0
    for _ in range(steps):
        loss = view.loss(data)
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.flatten() for p in trained if p.grad is not None]
        if grads and not torch.isfinite(torch.cat(grads)).all():  # one check a step; the name only on a failure
            bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
            model.eval()
            return Result("learns", "fails", f"non-finite gradient in {bad[0]}")
        opt.step()
        taken += 1
        first = loss.item() if first is None else first
        last = loss.item()
        if last < 0.5 * first:
            break
    model.eval()
    detail = f"loss {first:.2f} -> {last:.2f} in {taken} steps"
    return Result("learns", "holds" if last < 0.5 * first else "fails", detail)


@torch.no_grad()
def state_dict_round_trip(view: View, scheme: str, kind: ModelKind | None = None) -> Result:
    """A second model with other weights, given the first one's state dict, computes the same outputs."""
    if kind is None:
        return Result("state dict round trip", "n/a", "needs the model kind")
    clone = kind.view(scheme, seed=99)
    clone.module.load_state_dict(view.module.state_dict())
    ids = tokens()
    diff = _max_change(view.logits(ids), clone.logits(ids))
    return Result("state dict round trip", "holds" if diff == 0.0 else "fails", f"max difference {diff:.2e}")


PROPERTIES: dict[str, Callable[[View, str], Result]] = {
    "finite": finite,
    "finite far away": finite_far_away,
    "causal": causal,
    "shift invariance": shift,
    "cache == recompute": cache_equals_recompute,
    "cached generation": cached_generation,
    "batch rows independent": batch_independence,
    "learns": learns,
    "state dict round trip": state_dict_round_trip,
}


def check(kind: ModelKind, scheme: str, properties: list[str] | None = None, options: dict | None = None,
          ) -> list[Result]:
    """Every property (or the named ones) of `scheme` in one model kind; n/a where the model cannot hold it."""
    names = list(PROPERTIES) if properties is None else properties
    if not kind.serves(scheme):
        return [Result(name, "n/a", f"{kind.name} cannot take {scheme}") for name in names]
    results = []
    for name in names:
        view = kind.view(scheme, options)  # a fresh model per property: learning must not leak into others
        prop = PROPERTIES[name]
        results.append(prop(view, scheme, kind) if prop is state_dict_round_trip else prop(view, scheme))
    return results


__all__ = ["PROPERTIES", "Result", "check"]
