"""What a `posenc ladder` run shows: per model size, every scheme's held-out perplexity at the training
length (mean ± std over seeds), the subject's (NoPE's) ratio to the best other scheme there, the
extrapolation scheme's (RoPE's) ppl@2x / ppl@1x beside it, and the train/held-out gap (memorising); then
the verdict on "the subject's gap shrinks with size", computed by the rule printed with it (RULE)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.experiments import report_writer
from posenc.experiments.config import loader as config_loader
from posenc.experiments.evaluation.statistics import Spread, ratios
from posenc.experiments.evaluation.verdict import CLOSE
from posenc.experiments.ladder.config import LadderConfig
from posenc.experiments.report_writer import Plot, Report, Table, is_number
from posenc.experiments.runs.units import DIVERGED, load_units

RULE = ("held: the ratio's mean falls at every step up the ladder by more than the seed std of the two rungs added "
        "(mean_k - mean_k+1 > std_k + std_k+1); failed: the largest size's mean is not below the smallest's; "
        "inconclusive otherwise (it falls, but not beyond the seed spread at every step), or when a rung lacks a seed "
        "or has fewer than two (no spread to beat)")


def _ppl(unit: dict[str, Any], multiplier: int) -> float:
    value = unit.get("ppl", {}).get(multiplier)
    return float(value) if is_number(value) else math.nan


def _by_seed(units: Sequence[dict[str, Any]], size: str, scheme: str) -> dict[int, dict[str, Any]]:
    return {u["seed"]: u for u in units if u.get("size") == size and u["scheme"] == scheme}


def _gap(unit: dict[str, Any]) -> float:
    """Held-out minus training loss at 1x, nats per token: positive when the model fits its training text better."""
    train, held = unit.get("train_ppl@1x"), _ppl(unit, 1)
    return math.log(held) - math.log(train) if is_number(train) and train > 0 and held > 0 else math.nan


def rung(units: Sequence[dict[str, Any]], cfg: LadderConfig, size: str) -> dict[str, Any]:
    """One size: per scheme ppl@1x, the best other scheme, subject / best (seeds paired), RoPE 2x/1x, the gap."""
    lad, seeds = cfg.ladder, list(cfg.compare.seeds)
    at_1x = {s: Spread(tuple(_ppl(_by_seed(units, size, s).get(k, {}), 1) for k in seeds))
             for s in cfg.compare.schemes}
    others = {s: sp for s, sp in at_1x.items() if s != lad.subject and sp.complete}
    best = min(others, key=lambda s: others[s].mean) if others else None
    subject = _by_seed(units, size, lad.subject)
    ratio = ratios([_ppl(subject.get(k, {}), 1) for k in seeds],
                   [_ppl(_by_seed(units, size, best).get(k, {}), 1) if best else math.nan for k in seeds])
    ext = _by_seed(units, size, lad.extrapolation)
    extrapolation = ratios([_ppl(ext.get(k, {}), 2) for k in seeds], [_ppl(ext.get(k, {}), 1) for k in seeds])
    mine = [u for u in units if u.get("size") == size and u["status"] == "ok"]
    gap = Spread(tuple(_gap(u) for u in mine))
    return {"size": size, "params": cfg.params_at(size), "best": best or "n/a",  # known before any model ran
            "ratio": ratio, "extrapolation": extrapolation, "gap": gap, "at_1x": at_1x,
            "diverged": sum(u["status"] == DIVERGED for u in units if u.get("size") == size)}


def shown(spread: Spread, digits: int) -> str:
    """mean ± std over seeds, saying how many seeds it is over when some are missing (a stopped or diverged unit):
    never one seed's number passed off as a mean over seeds."""
    text, n = spread.text(digits), len(spread.finite)
    return text if spread.complete or not n else f"{text} ({n} of {len(spread.values)} seeds)"


def not_run(units: Sequence[dict[str, Any]], cfg: LadderConfig) -> list[str]:
    """`size scheme seed N` of every model the config asks for and the folder does not hold (a stopped run)."""
    held = {(u.get("size"), u.get("scheme"), u.get("seed")) for u in units}
    return [f"{size} {scheme} seed {seed}" for size in cfg.ladder.sizes for scheme in cfg.compare.schemes
            for seed in cfg.compare.seeds if (size, scheme, seed) not in held]


def verdict(spreads: Sequence[Spread]) -> str:
    """RULE on the subject / best ratios, smallest size first."""
    if not spreads or not all(s.complete and len(s.finite) > 1 for s in spreads):
        return "inconclusive"  # one seed has std 0: any fall, however small, would count
    steps = list(itertools.pairwise(spreads))
    if all(a.mean - b.mean > a.std + b.std for a, b in steps):
        return "held"
    if spreads[-1].mean >= spreads[0].mean:
        return "failed"
    return "inconclusive"


def _rows(rungs: list[dict[str, Any]], cfg: LadderConfig) -> list[dict[str, Any]]:
    lad = cfg.ladder
    rows = []
    for r in rungs:
        close = ("yes" if r["ratio"].high <= CLOSE else "no") if r["ratio"].complete else "n/a"
        row = {"size": r["size"], "params": r["params"], "best other": r["best"],
               f"{lad.subject} / best": shown(r["ratio"], 3), f"close (<= {CLOSE:g})": close,
                f"{lad.extrapolation} 2x/1x": shown(r["extrapolation"], 2),
                "gap (nats)": r["gap"].text(3), "gap max": max(r["gap"].finite) if r["gap"].finite else "n/a",
                "diverged": r["diverged"]}
        rows.append(row)
    return rows


def _scheme_rows(rungs: list[dict[str, Any]], cfg: LadderConfig) -> list[dict[str, Any]]:
    rows = []
    for r in rungs:
        rows.append({"size": r["size"], "params": r["params"],
                     **{s: shown(r["at_1x"][s], 3) for s in cfg.compare.schemes}})
    return rows


def _plot(rungs: list[dict[str, Any]], cfg: LadderConfig) -> Plot:
    lad = cfg.ladder
    named = {f"{lad.subject} ppl@1x / best other's": "ratio", f"{lad.extrapolation} ppl@2x / ppl@1x": "extrapolation"}
    series = {label: {r["params"]: r[key].mean for r in rungs if is_number(r["params"])}
              for label, key in named.items()}
    bands = {label: {r["params"]: (r[key].mean - r[key].std, r[key].mean + r[key].std)
                     for r in rungs if is_number(r["params"]) and r[key].finite} for label, key in named.items()}
    return Plot("ladder", "Model-size ladder (mean; band: ± std over seeds)", "parameters", "ratio", series,
                bands=bands, ylim=None)


def report(units: Sequence[dict[str, Any]], cfg: LadderConfig, wall_seconds: float) -> Report:
    lad, t, L = cfg.ladder, cfg.trainer, cfg.data.seq_len
    rungs = [rung(units, cfg, size) for size in lad.sizes]
    judged = verdict([r["ratio"] for r in rungs])
    evidence = ", ".join(f"{r['size']}: {shown(r['ratio'], 3)}" for r in rungs)
    missing = not_run(units, cfg)
    claim = {"source": "Haviv et al. 2022", "claim": f"{lad.subject}'s gap to the best at 1x shrinks with size",
             "rule": RULE, "verdict": judged, "evidence": evidence}
    units_rows = [{**u, **{f"ppl@{m}x": u.get("ppl", {}).get(m, u["status"]) for m in cfg.eval.length_multipliers}}
                  for u in units]
    intro = (f"Corpus {cfg.data.corpus}; the same recipe at every size: {t.max_steps} steps x {t.batch_size} windows "
             f"of {L} tokens, lr {t.lr:g}, seeds {', '.join(map(str, cfg.compare.seeds))}; sizes n_layer x d_model "
             f"with {cfg.model.n_head} heads. Held-out perplexity per token at L ({cfg.eval.mode}), mean ± std over "
             f"seeds. {lad.subject} / best: each seed's {lad.subject} ppl@1x over the same seed's ppl@1x of the "
             f"scheme with the lowest mean among the others. Gap: held-out minus training-text loss at 1x (nats per "
             f"token, the same amount of text each), mean ± std over every model of the size; near 0 means no "
             f"memorising. Verdict rule: {RULE}. Wall time {wall_seconds:.0f} s.")
    if missing:
        total = len(lad.sizes) * len(cfg.compare.schemes) * len(cfg.compare.seeds)
        intro += (f" Stopped before the end: {total - len(missing)} of {total} models finished; not run: "
                  f"{', '.join(missing)}. Numbers over fewer seeds say so; `posenc ladder --run-dir DIR` with the "
                  "same settings completes the run.")
    tables = [Table("ladder", f"{lad.subject} against the others at the training length, by model size",
                    list(_rows(rungs, cfg)[0]) if rungs else ["size"], _rows(rungs, cfg)),
              Table("schemes", "Held-out perplexity per token at the training length, mean ± std over seeds",
                    ["size", "params", *cfg.compare.schemes], _scheme_rows(rungs, cfg)),
              Table("claims", "The verdict, by the rule beside it", ["source", "claim", "rule", "verdict", "evidence"],
                    [claim]),
              Table("units", "Every model (size x scheme x seed)",
                    ["size", "scheme", "seed", "status", "params", "final_train_loss", "train_ppl@1x",
                     *[f"ppl@{m}x" for m in cfg.eval.length_multipliers], "seconds"], units_rows, shown=False)]
    results = {"units": list(units), "claim": claim, "complete": not missing, "not_run": missing,
               "rungs": [{"size": r["size"], "params": r["params"], "best": r["best"],
                          "ratio": r["ratio"].values, "extrapolation": r["extrapolation"].values,
                          "gap": r["gap"].values} for r in rungs]}
    return Report("posenc: model-size ladder", intro, tables, [_plot(rungs, cfg)], results)


__all__ = ["RULE", "report", "rung", "verdict"]


def rerender(run_dir: Path, stored: dict[str, Any]) -> Path:
    """`posenc report`: the report again from the saved units and run.json (its settings and wall time)."""
    cfg = config_loader.build(LadderConfig, stored["config"])
    wall = float(stored.get("wall_seconds") or 0.0)
    return report_writer.write(run_dir, report(load_units(run_dir, cfg.compare, cfg.ladder.sizes), cfg, wall))[-1]
