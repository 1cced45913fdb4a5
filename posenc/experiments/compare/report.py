"""What a `posenc compare` run shows: per scheme the mean and spread over seeds of perplexity at each
length, generalisation as ppl@Nx / ppl@1x, convergence (ppl@1x within 10% of the best scheme, else
"not converged" and not ranked), ranks with ties where seed ranges overlap, and the published claims
the run can test, each judged by a rule printed next to it (claims.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.data.tokens import SOURCES
from posenc.experiments import report_writer
from posenc.experiments.compare.claims import converged_schemes, judge_all
from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config import loader as config_loader
from posenc.experiments.evaluation.perplexity import BEYOND_TABLE, NOT_FINITE
from posenc.experiments.evaluation.statistics import Spread, ratios, tied_ranks
from posenc.experiments.evaluation.verdict import CLOSE
from posenc.experiments.report_writer import Plot, Report, Table, is_number
from posenc.experiments.runs.units import DIVERGED, load_units

NOT_CONVERGED = "not converged"
NOT_RUN = "not run"  # an interrupted run: no seed of the scheme finished


def _value(unit: dict[str, Any], multiplier: int) -> float:
    value = unit.get("ppl", {}).get(multiplier)
    return float(value) if is_number(value) else math.nan


def per_scheme(units: Sequence[dict[str, Any]], schemes: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """scheme -> its units in seed order."""
    return {s: sorted((u for u in units if u["scheme"] == s), key=lambda u: u["seed"]) for s in schemes}


def runs_for_claims(grouped: dict[str, list[dict]], multipliers: Sequence[int]) -> dict[str, list[dict[int, float]]]:
    """The claims' view: scheme -> per seed -> {multiplier: ppl} (NaN where there is no number)."""
    return {s: [{m: _value(u, m) for m in multipliers} for u in seeds] for s, seeds in grouped.items() if seeds}


def _label(seeds: list[dict[str, Any]], multiplier: int) -> str | None:
    """Why a cell has no number: no seed ran (an interrupted run), every seed diverged, or the length is past
    a learned table."""
    if not seeds:
        return NOT_RUN
    if all(u["status"] == DIVERGED for u in seeds):
        return DIVERGED
    values = [u.get("ppl", {}).get(multiplier) for u in seeds if u["status"] != DIVERGED]
    for label in (BEYOND_TABLE, NOT_FINITE):
        if values and all(v == label for v in values):
            return label
    return None


def over_seeds(text: str, done: int, asked: int | None) -> str:
    """A cell over fewer seeds than asked says so: never one seed's number passed off as the mean over seeds."""
    return text if asked is None or done >= asked or not done else f"{text} ({done} of {asked} seeds)"


def leaderboard(units: Sequence[dict[str, Any]], schemes: Sequence[str], multipliers: Sequence[int],
                seeds_asked: int | None = None) -> tuple[list[dict[str, Any]], set[str], float]:
    """One row per scheme: mean ± std per length, ratios, rank at the longest length; and the converged set.
    With `seeds_asked`, a scheme with fewer finished seeds (a stopped run) says how many its numbers are over."""
    grouped = per_scheme(units, schemes)
    runs = runs_for_claims(grouped, multipliers)
    converged, best = converged_schemes(runs)
    longest = max(multipliers)
    spreads = {s: Spread(tuple(_value(u, longest) for u in grouped[s])) for s in schemes}
    whole = {s for s in schemes if seeds_asked is None or len(grouped[s]) >= seeds_asked}  # a stopped run: not ranked
    ranks = tied_ranks({s: spreads[s] for s in schemes if s in converged and spreads[s].complete and s in whole})
    rows = []
    for s in schemes:
        seeds = grouped[s]
        row: dict[str, Any] = {"scheme": s, "seeds": len(seeds),
                               "diverged": sum(u["status"] == DIVERGED for u in seeds)}
        for m in multipliers:
            spread = Spread(tuple(_value(u, m) for u in seeds))
            label = _label(seeds, m) or ("n/a" if not spread.finite else None)
            row[f"ppl@{m}x"] = label or over_seeds(spread.text(), len(seeds), seeds_asked)
            row[f"ppl@{m}x mean"], row[f"ppl@{m}x std"] = (label, label) if label else (spread.mean, spread.std)
            if m > 1:
                ratio = ratios([_value(u, m) for u in seeds], [_value(u, 1) for u in seeds])
                row[f"{m}x/1x"] = over_seeds(ratio.text(), len(seeds), seeds_asked) if ratio.finite else "n/a"
        bpb = Spread(tuple(float(u["bpb"][1]) for u in seeds if is_number(u.get("bpb", {}).get(1))))
        row["bpb@1x"] = bpb.text(3) if bpb.finite else "n/a"  # bits per byte: comparable across tokenizers
        shifts = [u["shift_dloss"] for u in seeds if is_number(u.get("shift_dloss"))]
        row["shift_dloss"] = max(shifts) if shifts else "n/a"
        partial = f"not ranked ({len(seeds)} of {seeds_asked} seeds)"
        unranked = NOT_CONVERGED if s not in converged else "n/a" if s in whole else partial
        row["rank"] = NOT_RUN if not seeds else ranks.get(s, unranked)
        row["converged"] = s in converged
        rows.append(row)
    order = {s: i for i, s in enumerate(schemes)}
    rank_key = lambda r: (not r["converged"], int(r["rank"].rstrip("=")) if r["rank"][0].isdigit() else 10**6,
                          order[r["scheme"]])
    return sorted(rows, key=rank_key), converged, best


def task_rows(units: Sequence[dict[str, Any]], schemes: Sequence[str], task: Any,
              seeds_asked: int | None = None) -> list[dict[str, Any]]:
    """Exact-match accuracy in distribution, at 2x and at 4x the task's training sizes: mean ± std ('not run'
    for a scheme with no finished seed, 'diverged' where every finished seed's task model diverged)."""
    n, rows = task.train_len, []
    for s, seeds in per_scheme(units, schemes).items():
        row = {"scheme": s}
        for label, (low, high) in (("in", (1, n)), ("2x", (n + 1, 2 * n)), ("4x", (2 * n + 1, 4 * n))):
            per_seed = [sum(a for size, a in u["task_accuracy"].items() if low <= int(size) <= high) / (high - low + 1)
                        for u in seeds if "task_accuracy" in u]
            text = over_seeds(Spread(tuple(per_seed)).text(), len(per_seed), seeds_asked) if per_seed else DIVERGED
            row[f"{task.name}@{label}"] = text if seeds else NOT_RUN
        rows.append(row)
    return rows


def _plots(units: Sequence[dict[str, Any]], schemes: Sequence[str], multipliers: Sequence[int], L: int,
           unit: str = "byte") -> list[Plot]:
    grouped = per_scheme(units, schemes)
    mean, band, ratio = {}, {}, {}
    for s, seeds in grouped.items():
        spreads = {m * L: Spread(tuple(_value(u, m) for u in seeds)) for m in multipliers}
        mean[s] = {x: sp.mean for x, sp in spreads.items()}
        band[s] = {x: (sp.low, sp.high) for x, sp in spreads.items() if sp.finite}
        ratio[s] = {m * L: ratios([_value(u, m) for u in seeds], [_value(u, 1) for u in seeds]).mean
                    for m in multipliers}
    shift = {s: {max(int(k), 1): Spread(tuple(u["shift_loss_change"][k] for u in seeds
                                               if is_number(u.get("shift_loss_change", {}).get(k)))).mean
                 for k in (seeds[0].get("shift_loss_change", {}) if seeds else {})}
             for s, seeds in grouped.items()}
    return [Plot("ppl_vs_length", "Perplexity vs evaluation length (mean; band: seed range)",
                 f"evaluation length ({unit}s)", "perplexity", mean, bands=band, log_y=True, vline=L),
            Plot("ratio_vs_length", "Generalisation: ppl@N / ppl@L (mean over seeds)", f"evaluation length ({unit}s)",
                 "ppl / ppl at the training length", ratio, log_y=True, vline=L),
            Plot("shift_test", "Shift test: all positions + k (mean over seeds)", "position offset k",
                 "loss change (nats/byte)", shift)]


def tokenizer_label(cfg: Any) -> str:
    return Path(cfg.data.tokenizer).name if "/" in cfg.data.tokenizer else cfg.data.tokenizer


def report(units: Sequence[dict[str, Any]], cfg: Any, wall_seconds: float) -> Report:
    L, e, c = cfg.data.seq_len, cfg.eval, cfg.compare
    unit = "byte" if cfg.data.tokenizer == "bytes" else "token"  # a byte-level token is a byte
    multipliers = list(e.length_multipliers)
    rows, converged, best = leaderboard(units, c.schemes, multipliers, len(c.seeds))
    grouped = per_scheme(units, c.schemes)
    # An interrupted run: a claim is judged only on schemes with every seed ("on every seed" means every seed
    # asked for), the others are not in its evidence.
    every_seed = {s: seeds for s, seeds in grouped.items() if len(seeds) == len(c.seeds)}
    verdicts = judge_all(runs_for_claims(every_seed, multipliers), multipliers, converged, sorted(c.seeds))
    claims = [v.__dict__ for v in verdicts]
    longest = max(multipliers)
    columns = ["scheme", "rank", *[f"ppl@{m}x" for m in multipliers], "bpb@1x",
               *[f"{m}x/1x" for m in multipliers if m > 1],
               "shift_dloss", "diverged"]
    about = SOURCES[cfg.data.corpus].__doc__.splitlines()[0].rstrip(".") if cfg.data.corpus in SOURCES else None
    corpus = f"corpus {cfg.data.corpus}" + (f" ({about})" if about else "")
    intro = (f"{corpus}; per scheme {len(c.seeds)} models (seeds {', '.join(map(str, c.seeds))}), each trained "
             f"{cfg.trainer.max_steps} steps x {cfg.trainer.batch_size} windows of {L} {unit}s "
             f"(data.tokenizer={tokenizer_label(cfg)}); model "
             f"{cfg.model.n_layer} layers, d_model {cfg.model.d_model}, {cfg.model.n_head} heads; wall time "
             f"{wall_seconds:.0f} s. Perplexity per {unit} at multiples of L ({e.mode}), mean ± std over seeds; "
             f"bpb@1x: bits per byte at L (the held-out text's nats / (ln 2 x its UTF-8 bytes): comparable across "
             f"tokenizers); "
             f"Nx/1x is each seed's ppl@Nx / ppl@1x (generalisation apart from how well a scheme learned). "
             f"Converged: mean ppl@1x within {CLOSE:g}x of the best scheme ({best:.2f}); the others are marked "
             f"'{NOT_CONVERGED}' and not ranked, since their long-length numbers measure learning speed as much as "
             f"extrapolation. Rank: by mean ppl@{longest}x; schemes whose seed ranges [min, max] overlap share a "
             f"rank ('='). Shift test: the largest loss change over seeds when every position moves by k "
             f"(shift-invariant schemes must show none). '{BEYOND_TABLE}': positions past a learned table; "
             f"'{DIVERGED}': the training loss stopped being finite (no results for that seed). Speed is not "
             f"measured here (a shared machine distorts it): `posenc bench` measures it side by side.")
    if len({(u["scheme"], u["seed"]) for u in units}) < len(c.schemes) * len(c.seeds):
        short = [f"{s} {len(grouped[s])} of {len(c.seeds)}" for s in c.schemes if len(grouped[s]) < len(c.seeds)]
        intro += (f" INTERRUPTED: {len(units)} of {len(c.schemes) * len(c.seeds)} models finished (seeds finished: "
                  f"{'; '.join(short)}); '{NOT_RUN}' marks a scheme with none, and a claim is judged only on "
                  f"schemes with every seed (resume with `posenc compare --run-dir` to finish it).")
    tables = [Table("leaderboard", f"Train at L={L}, evaluate at 1x..{longest}x; perplexity per {unit}, "
                                   f"mean ± std over {len(c.seeds)} seeds", columns, rows),
              Table("claims", "What this run shows: published claims, judged by the rule beside each",
                    ["source", "claim", "rule", "verdict", "evidence"], claims),
              Table("units", "Every model (scheme x seed)", ["scheme", "seed", "status", "final_train_loss",
                    *[f"ppl@{m}x" for m in multipliers], "shift_dloss", "seconds"],
                    [{**u, **{f"ppl@{m}x": u.get("ppl", {}).get(m, u["status"]) for m in multipliers}}
                     for u in units], shown=False)]
    if cfg.task.name:
        t = cfg.task
        tables.insert(1, Table("task", f"{t.name}: a {t.n_layer}-layer d_model-{t.d_model} model per scheme and "
                                       f"seed, {t.max_steps} steps at sizes 1..{t.train_len}; exact match",
                               ["scheme", *[f"{t.name}@{b}" for b in ("in", "2x", "4x")]],
                               task_rows(units, c.schemes, t, len(c.seeds))))
    held = {(u["scheme"], u["seed"]) for u in units}
    not_run = [f"{s} seed {seed}" for s in c.schemes for seed in c.seeds if (s, seed) not in held]
    results = {"units": list(units), "leaderboard": rows, "claims": claims, "converged": sorted(converged),
               "best_ppl@1x": best if math.isfinite(best) else DIVERGED, "complete": not not_run,
               "not_run": not_run}
    plots = _plots(units, c.schemes, multipliers, L, unit)
    return Report("posenc: train short, test long", intro, tables, plots, results)


__all__ = ["NOT_CONVERGED", "NOT_RUN", "leaderboard", "report", "rerender", "runs_for_claims"]


def rerender(run_dir: Path, stored: dict[str, Any]) -> Path:
    """`posenc report`: the report again from the saved units and run.json (its settings and wall time)."""
    cfg = config_loader.build(CompareConfig, stored["config"])
    wall = float(stored.get("wall_seconds") or 0.0)
    return report_writer.write(run_dir, report(load_units(run_dir, cfg.compare), cfg, wall))[-1]
