"""Published length-extrapolation claims, each read against one run by a rule the report prints.

A rule is a comparison made on every seed (seeds paired by index: same data order). The claim held
when every seed satisfies it, failed when none does, and is inconclusive when seeds disagree, a
needed scheme is missing, did not converge, or has no value (diverged, or past a learned table).
Thresholds are the run's, not the papers': "about flat" is within FLAT of ppl@1x, "explodes" is at
least EXPLODES times ppl@1x, "close" is within CLOSE of the best scheme.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from posenc.experiments.evaluation.verdict import CLOSE, Verdict

FLAT = 1.10  # ppl@Nx / ppl@1x at or below this: "about flat"
EXPLODES = 2.0  # ppl@Nx / ppl@1x at or above this: "explodes"
AT_OR_BELOW = 1.02  # "at or below": within 2% above, or lower

# scheme -> per seed -> {length multiplier: perplexity}
Runs = Mapping[str, Sequence[Mapping[int, float]]]


@dataclass(frozen=True)
class ClaimSpec:
    source: str
    claim: str
    schemes: tuple[str, ...]
    rule: Callable[[int], str]  # N (the multiplier used) -> the rule in words
    test: Callable[[Runs, int, int], tuple[bool, str]]  # (runs, seed, N) -> (satisfied, evidence)
    length: Callable[[Sequence[int]], int | None]  # evaluated multipliers -> the N this claim reads
    must_converge: tuple[str, ...] | None = None  # schemes that must have converged; None: `schemes`


def _ratio(runs: Runs, scheme: str, seed: int, n: int) -> float:
    values = runs[scheme][seed]
    return values[n] / values[1]


def _longest(multipliers: Sequence[int]) -> int | None:
    longer = [m for m in multipliers if m > 1]
    return max(longer) if longer else None


def _near_two(multipliers: Sequence[int]) -> int | None:
    longer = sorted(m for m in multipliers if m > 1)
    return longer[0] if longer else None


def _ratio_claim(source: str, claim: str, scheme: str, op: str, bound: float, length=_longest) -> ClaimSpec:
    def test(runs: Runs, seed: int, n: int) -> tuple[bool, str]:
        r = _ratio(runs, scheme, seed, n)
        return (r <= bound if op == "<=" else r > bound if op == ">" else r >= bound), f"{r:.2f}"

    return ClaimSpec(source, claim, (scheme,), lambda n: f"{scheme}: ppl@{n}x / ppl@1x {op} {bound:g} on every seed",
                     test, length)


def _kerple_vs_alibi(runs: Runs, seed: int, n: int) -> tuple[bool, str]:
    kerple, alibi = runs["kerple"][seed][n], runs["alibi"][seed][n]
    return kerple <= AT_OR_BELOW * alibi, f"{kerple:.2f} vs {alibi:.2f}"


def _nope_close(established: tuple[str, ...]) -> Callable[[Runs, int, int], tuple[bool, str]]:
    def test(runs: Runs, seed: int, n: int) -> tuple[bool, str]:
        others = [runs[s][seed][1] for s in established if s in runs and math.isfinite(runs[s][seed][1])]
        best = min(others)
        return runs["none"][seed][1] <= CLOSE * best, f"{runs['none'][seed][1]:.2f} vs best {best:.2f}"

    return test


ESTABLISHED = ("learned_absolute", "sinusoidal", "rope", "alibi", "kerple", "relative", "sandwich", "xpos")
PRESS, CHI, HAVIV = "Press et al. 2022, Fig. 1", "Chi et al. 2022 (KERPLE)", "Haviv et al. 2022"
CLAIMS: tuple[ClaimSpec, ...] = (
    _ratio_claim(PRESS, "ALiBi stays about flat up to the longest length", "alibi", "<=", FLAT),
    _ratio_claim(PRESS, "RoPE degrades past the training length", "rope", ">", FLAT),
    _ratio_claim(PRESS, "sinusoidal positions explode past the training length", "sinusoidal", ">=", EXPLODES),
    _ratio_claim(PRESS, "learned absolute positions explode past the training length", "learned_absolute", ">=",
                 EXPLODES),
    _ratio_claim(PRESS, "T5's relative bias holds to about 2x", "relative", "<=", FLAT, _near_two),
    ClaimSpec(CHI, "KERPLE is at or below ALiBi at long lengths", ("kerple", "alibi"),
              lambda n: f"kerple ppl@{n}x <= {AT_OR_BELOW:g} x alibi ppl@{n}x on every seed (seeds paired)",
              _kerple_vs_alibi, _longest),
    ClaimSpec(HAVIV, "a causal LM without positions comes close to the others at the training length", ("none",),
              lambda n: f"none ppl@1x <= {CLOSE:g} x the best established scheme's ppl@1x on every seed",
              _nope_close(ESTABLISHED), lambda multipliers: 1, must_converge=()),  # its own subject may lag
)


def _needed_values(runs: Runs, schemes: tuple[str, ...], n: int, labels: Sequence[int]) -> str | None:
    for scheme in schemes:
        for i, values in enumerate(runs[scheme]):
            for m in (1, n):
                if not math.isfinite(values.get(m, math.nan)):
                    return f"{scheme} has no ppl@{m}x on seed {labels[i]} (diverged or past its table)"
    return None


def judge(spec: ClaimSpec, runs: Runs, multipliers: Sequence[int], converged: set[str],
          seeds: Sequence[int] | None = None) -> Verdict:
    """seeds: the seed number of each position in a scheme's list, for the evidence (default 0, 1, ...)."""
    labels = list(seeds) if seeds is not None else list(range(max(map(len, runs.values()), default=0)))
    n = spec.length(multipliers)
    rule = spec.rule(n) if n is not None else spec.rule(0)
    missing = [s for s in spec.schemes if s not in runs]
    why = (f"{', '.join(missing)} not in this run, or not on every seed (interrupted)" if missing
           else "no length past the training length was evaluated" if n is None
           else next((f"{s} did not converge" for s in (spec.schemes if spec.must_converge is None
                                                         else spec.must_converge) if s not in converged), None)
           or _needed_values(runs, spec.schemes, n, labels))
    if why:
        return Verdict(spec.source, spec.claim, rule, "inconclusive", why)
    paired = min(len(runs[s]) for s in spec.schemes)
    outcomes = [spec.test(runs, i, n) for i in range(paired)]
    satisfied = [ok for ok, _ in outcomes]
    verdict = "held" if all(satisfied) else "failed" if not any(satisfied) else "inconclusive"
    evidence = "; ".join(f"seed {labels[i]}: {text}" for i, (_, text) in enumerate(outcomes))
    if verdict == "inconclusive":
        evidence = f"seeds disagree ({evidence})"
    return Verdict(spec.source, spec.claim, rule, verdict, evidence)


def judge_all(runs: Runs, multipliers: Sequence[int], converged: set[str],
              seeds: Sequence[int] | None = None) -> list[Verdict]:
    return [judge(spec, runs, multipliers, converged, seeds) for spec in CLAIMS]


def converged_schemes(runs: Runs, tolerance: float = CLOSE) -> tuple[set[str], float]:
    """Schemes whose mean ppl@1x is within `tolerance` of the best mean ppl@1x; and that best value."""
    means = {}
    for scheme, seeds in runs.items():
        values = [s.get(1, math.nan) for s in seeds]
        if values and all(math.isfinite(v) for v in values):
            means[scheme] = sum(values) / len(values)
    if not means:
        return set(), math.nan
    best = min(means.values())
    return {s for s, m in means.items() if m <= tolerance * best}, best


__all__ = ["CLAIMS", "ESTABLISHED", "Verdict", "converged_schemes", "judge", "judge_all"]
