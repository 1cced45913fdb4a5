"""The claim of Golovneva et al. 2024 (CoPE, arXiv 2405.18719, Sec. 4) read against one tasks run by a rule
the report prints: CoPE solves selective copy, counting and Flip-Flop where other schemes fail out of
distribution.

Per task, from each seed's accuracy: in-dist = the in-distribution split; OOD = the mean over the other
splits. A seed spread is the sample std over seeds. CoPE is *ahead* of a scheme when its mean OOD minus
that scheme's is above both MIN_GAP and the two spreads added; *behind* when the scheme is ahead of CoPE
by the same rule; tied otherwise. The claim held on a task when CoPE learned it in distribution (mean
>= LEARNED, and within max(MIN_GAP, the two spreads) of the best scheme's in-dist mean) and is ahead of
every other scheme; failed when CoPE learned it and is behind some scheme; inconclusive otherwise (ties
within the seed noise, CoPE not learned at this budget, fewer than 2 seeds, or a scheme missing). Over
the tasks: held when held on every task, failed when failed on every task, inconclusive otherwise.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from posenc.data.tasks import IN_DIST
from posenc.experiments.evaluation.verdict import Verdict

SOURCE = "Golovneva et al. 2024 (CoPE), Sec. 4"
SUBJECT = "cope"  # the scheme the claim is about (a name the registry maps, as in compare's claims)
TASKS = ("selective_copy", "counting", "flip_flop")
LEARNED = 0.90  # CoPE's in-dist mean at or above this: it has learned the task at this budget
MIN_GAP = 0.05  # a difference of means smaller than this is never a difference
TASK_RULE = (f"{SUBJECT} in-dist mean >= {LEARNED:g} and within max({MIN_GAP:g}, the two stds) of the best's; then OOD "
             f"mean (of the OOD splits): held if {SUBJECT}'s minus each other scheme's > max({MIN_GAP:g}, the two stds "
             f"added), failed if some scheme's minus {SUBJECT}'s is; else inconclusive")
ALL_RULE = "held (failed) when held (failed) on every one of the three tasks; else inconclusive"
RULE = f"Claims: per task, over seeds, {TASK_RULE}. Over the tasks: {ALL_RULE}."


@dataclass(frozen=True)
class Spread:
    mean: float
    std: float

    @staticmethod
    def of(values: Sequence[float]) -> Spread:
        return Spread(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0)

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.std:.2f}"


def per_seed(rows: Sequence[dict], task: str) -> dict[str, dict[int, tuple[float, float]]]:
    """scheme -> seed -> (in-dist accuracy, mean OOD accuracy), for one split task's rows."""
    cells: dict[tuple[str, int, bool], list[float]] = defaultdict(list)
    for r in rows:
        if r["task"] == task and "split" in r:
            cells[(r["scheme"], r["seed"], r["split"] == IN_DIST)].append(r["accuracy"])
    out: dict[str, dict[int, tuple[float, float]]] = defaultdict(dict)
    for scheme, seed in sorted({(scheme, seed) for scheme, seed, _ in cells}):
        ind, ood = cells.get((scheme, seed, True)), cells.get((scheme, seed, False))
        if ind and ood:
            out[scheme][seed] = (statistics.fmean(ind), statistics.fmean(ood))
    return dict(out)


def _noise(a: Spread, b: Spread) -> float:
    return max(MIN_GAP, a.std + b.std)


def judge_task(rows: Sequence[dict], task: str, asked: Sequence[int] | None = None) -> Verdict:
    """asked: the run's seeds; a scheme without every one of them (an interrupted run) is left out, and named."""
    claim = f"CoPE solves {task} where other schemes fail out of distribution"
    seeds = per_seed(rows, task)
    partial = sorted(s for s in seeds if asked is not None and set(seeds[s]) != set(asked))
    seeds = {s: v for s, v in seeds.items() if s not in partial}
    others = sorted(s for s in seeds if s != SUBJECT)
    why = (f"{SUBJECT} not in this run, or not on every seed" if SUBJECT not in seeds
           else "no other scheme in this run on every seed" if not others
           else "fewer than 2 seeds: no spread" if min(len(v) for v in seeds.values()) < 2 else None)
    why = why and why + (f" (not on every seed, left out: {', '.join(partial)})" if partial else "")
    if why:
        return Verdict(SOURCE, claim, TASK_RULE, "inconclusive", why)
    ind = {s: Spread.of([v[0] for v in seeds[s].values()]) for s in seeds}
    ood = {s: Spread.of([v[1] for v in seeds[s].values()]) for s in seeds}
    best = max(ind, key=lambda s: ind[s].mean)
    gaps = {s: ood[SUBJECT].mean - ood[s].mean for s in others}
    ahead = [s for s in others if gaps[s] > _noise(ood[SUBJECT], ood[s])]
    behind = [s for s in others if -gaps[s] > _noise(ood[SUBJECT], ood[s])]
    learned = ind[SUBJECT].mean >= LEARNED and ind[best].mean - ind[SUBJECT].mean <= _noise(ind[SUBJECT], ind[best])
    evidence = (f"in-dist {SUBJECT} {ind[SUBJECT]}, best {best} {ind[best]}; OOD "
                + ", ".join(f"{s} {ood[s]}" for s in [SUBJECT, *others]))
    if partial:
        evidence += f"; not on every seed, left out: {', '.join(partial)}"
    if not learned:
        return Verdict(SOURCE, claim, TASK_RULE, "inconclusive",
                       f"{SUBJECT} has not learned it in distribution; {evidence}")
    verdict = "held" if len(ahead) == len(others) else "failed" if behind else "inconclusive"
    if verdict == "failed":
        evidence += f"; ahead of {SUBJECT} OOD: {', '.join(behind)}"
    elif verdict == "inconclusive":
        evidence += f"; within seed noise of {SUBJECT} OOD: {', '.join(s for s in others if s not in ahead)}"
    return Verdict(SOURCE, claim, TASK_RULE, verdict, evidence)


def judge_all(rows: Sequence[dict], tasks: Sequence[str], asked: Sequence[int] | None = None) -> list[Verdict]:
    """One verdict per claim task in the run, then the claim over all of them; [] when the run has none."""
    present = [t for t in TASKS if t in tasks]
    judged = [judge_task(rows, t, asked) for t in present]
    if not judged:
        return []
    verdicts = {v.verdict for v in judged}
    whole = len(present) == len(TASKS) and len(verdicts) == 1 and verdicts <= {"held", "failed"}
    overall = judged[0].verdict if whole else "inconclusive"
    evidence = "; ".join(f"{t}: {v.verdict}" for t, v in zip(present, judged, strict=True))
    if len(present) < len(TASKS):
        evidence += f"; not in this run: {', '.join(t for t in TASKS if t not in present)}"
    return [*judged, Verdict(SOURCE, "CoPE solves selective copy, counting and Flip-Flop where other schemes fail "
                                     "out of distribution", ALL_RULE, overall, evidence)]


__all__ = ["ALL_RULE", "LEARNED", "MIN_GAP", "RULE", "SUBJECT", "TASKS", "TASK_RULE", "Verdict", "judge_all",
           "judge_task", "per_seed"]
