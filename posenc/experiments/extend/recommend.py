"""Which method at which multiple of the trained context: computed from the run by a rule the report prints."""

from __future__ import annotations

from posenc.experiments.extend.methods import EXTENSIONS
from posenc.registry import POSITION_MAPS

RULE = ("At each length past the trained context, among the methods measured there (with every prompt and task of the "
        "run at that length: in a stopped run, those with fewer do not compete): (1) keep those with the most "
        "passkey prompts right (the highest RULER-style average when passkey was not run); (2) of those, the lowest "
        "perplexity at that length, where measured; (3) then the fewest attention maps (the cheapest). 'nothing "
        "retrieves' when the best gets no passkey prompt right (RULER average 0). 'ppl vs trained' is the method's "
        "perplexity at that length over its perplexity at the trained length.")


def attention_maps(method: str) -> int:
    """Attention calls per layer the method makes (a scaling: 1; `dual_chunk+linear`: DCA's 3)."""
    base = method.partition("+")[0]
    return POSITION_MAPS[base].n_maps if base in EXTENSIONS else 1


def recommend(methods: list[str], passkey: dict[tuple[str, int], float],
              ruler: dict[tuple[str, int], float], ppl: dict[tuple[str, int], float], trained: int) -> list[dict]:
    """methods: canonical names in run order; passkey/ruler/ppl: (method, length) -> accuracy
    (0-1) / average (0-100) / perplexity. One row per length past `trained` where a retrieval score exists."""
    lengths = sorted({n for _, n in [*passkey, *ruler] if n > trained})
    out = []
    for n in lengths:
        scores = passkey if passkey else ruler
        measured = [m for m in methods if (m, n) in scores]
        if not measured:
            continue
        best = max(scores[(m, n)] for m in measured)
        kept = [m for m in measured if scores[(m, n)] == best]
        kept.sort(key=lambda m: (ppl.get((m, n), float("inf")), attention_maps(m)))
        chosen = kept[0]
        before = ppl.get((chosen, trained))
        now = ppl.get((chosen, n))
        out.append({"length": n, "multiple": n / trained, "method": chosen if best > 0 else "nothing retrieves",
                    "passkey": passkey.get((chosen, n)), "ruler": ruler.get((chosen, n)), "ppl": now,
                    "ppl_vs_trained": now / before if now is not None and before else None,
                    "tied": kept[1:]})
    return out
