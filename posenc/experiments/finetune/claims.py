"""The published claims `posenc finetune` reads, each by a rule the report prints, over seeds.

Chen et al. 2023 (PI): with position interpolation LLaMA's passkey range reaches the 16x target in about
200 fine-tuning steps, while fine-tuning at the long length without it moves the range only from 2,048
to 2,560 in 10,000 steps. Peng et al. 2023 (YaRN): it reaches its targets in about 400 steps and needs
fewer steps than PI for the same extension.

A method's steps to the target on a seed: the first scheduled step whose passkey range is at least the
target length (none when no checkpoint reaches it). A claim's rule is checked on every seed: held when
every seed satisfies it, failed when none does, inconclusive when the seeds disagree, or when a method
it reads is missing, diverged, or its base cannot retrieve the key at the trained length (then no
extension can be read from it)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from posenc.experiments.evaluation.verdict import Verdict

FEW_HUNDRED = 400  # "a few hundred steps": at most this many

# method -> seed -> [(step, passkey range)], steps increasing
Ranges = Mapping[str, Mapping[int, Sequence[tuple[int, int]]]]


def steps_to_target(curve: Sequence[tuple[int, int]], target: int) -> int | None:
    """The first step whose range is at least `target`; None when none is."""
    return next((step for step, reach in curve if reach >= target), None)


def _shown(steps: int | None) -> str:
    return "never" if steps is None else str(steps)


def _pi_versus_none(ranges: Ranges, seed: int, target: int) -> tuple[bool, str]:
    pi, none = steps_to_target(ranges["linear"][seed], target), steps_to_target(ranges["none"][seed], target)
    last = ranges["none"][seed][-1][0]
    return (pi is not None and pi <= FEW_HUNDRED and none is None,
            f"linear {_shown(pi)}, none {_shown(none)} (of {last})")


def _yarn_before_pi(ranges: Ranges, seed: int, target: int) -> tuple[bool | None, str]:
    yarn, pi = steps_to_target(ranges["yarn"][seed], target), steps_to_target(ranges["linear"][seed], target)
    text = f"yarn {_shown(yarn)}, linear {_shown(pi)}"
    if yarn is None and pi is None:
        return None, text  # neither reached the target: this seed cannot order them
    return yarn is not None and (pi is None or yarn < pi), text


CLAIMS = (
    ("Chen et al. 2023 (PI), Fig. / Table on passkey range",
     "PI reaches the target in a few hundred steps where no scaling does not", ("linear", "none"),
     f"on every seed: linear's range reaches the target by step {FEW_HUNDRED} and none's range stays below the "
     "target at every checkpoint of the schedule", _pi_versus_none),
    ("Peng et al. 2023 (YaRN), section 4", "YaRN needs fewer steps than PI", ("yarn", "linear"),
     "on every seed: yarn reaches the target at an earlier checkpoint than linear (or linear never does); a seed "
     "where neither reaches it decides nothing", _yarn_before_pi),
)


def judge_all(ranges: Ranges, seeds: Sequence[int], target: int, retrieves: Mapping[int, bool],
              reasons: Mapping[str, str] | None = None) -> list[Verdict]:
    """`retrieves`: seed -> whether its base (method none, step 0) passes the passkey at the trained length;
    `reasons`: method -> why some seed of it has no curve (diverged, not run yet); by default it was not asked."""
    return [_judge(spec, ranges, seeds, target, retrieves, reasons or {}) for spec in CLAIMS]


def _judge(spec: tuple, ranges: Ranges, seeds: Sequence[int], target: int,
           retrieves: Mapping[int, bool], reasons: Mapping[str, str]) -> Verdict:
    source, claim, methods, rule, test = spec
    missing = [m for m in methods if m not in ranges or any(s not in ranges[m] for s in seeds)]
    weak = [s for s in seeds if not retrieves.get(s, False)]
    shown = ", ".join(f"{m} ({reasons.get(m, 'not in finetune.methods')})" for m in missing)
    why = (f"not measured on every seed: {shown}" if missing
           else f"the base of seed {', '.join(map(str, weak))} does not retrieve the key at the trained length"
           if weak else None)
    if why:
        return Verdict(source, claim, rule, "inconclusive", why)
    outcomes = [test(ranges, seed, target) for seed in seeds]
    evidence = "; ".join(f"seed {seed}: {text}" for seed, (_, text) in zip(seeds, outcomes, strict=True))
    decided = [ok for ok, _ in outcomes if ok is not None]
    if len(decided) < len(outcomes) or (any(decided) and not all(decided)):
        return Verdict(source, claim, rule, "inconclusive", f"seeds disagree or cannot decide ({evidence})")
    return Verdict(source, claim, rule, "held" if all(decided) else "failed", evidence)
