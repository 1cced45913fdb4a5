"""The report of `posenc finetune`: passkey range against fine-tuning steps per method (mean, std and
range over seeds), the steps each method needs to reach the target, accuracy and perplexity by length
before and after fine-tuning, the claims with their rules, and the plots (range against steps, one line
per method; accuracy and perplexity by length)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posenc.experiments import report_writer
from posenc.experiments.config import loader as config_loader
from posenc.experiments.evaluation.statistics import Spread
from posenc.experiments.finetune import stored as stored_files
from posenc.experiments.finetune.claims import FEW_HUNDRED, judge_all, steps_to_target
from posenc.experiments.finetune.config import FinetuneConfig, resolved
from posenc.experiments.report_writer import Plot, Report, Table, is_number

MARKDOWN = "tables.md"


def _ok(units: Sequence[dict]) -> list[dict]:
    return [u for u in units if u.get("status") == "ok"]


def _ranges(units: Sequence[dict]) -> dict[str, dict[int, list[tuple[int, int]]]]:
    out: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for u in _ok(units):
        out.setdefault(u["method"], {})[u["seed"]] = [(r["step"], r["range"]) for r in u["records"]]
    return out


def _record(units: Sequence[dict], method: str, seed: int, step: int) -> dict | None:
    for u in _ok(units):
        if u["method"] == method and u["seed"] == seed:
            return next((r for r in u["records"] if r["step"] == step), None)
    return None


def _spread(values: Sequence[Any]) -> Spread:
    return Spread(tuple(float(v) if is_number(v) else float("nan") for v in values))


def _text(s: Spread, digits: int = 0) -> str:
    return s.text(digits) if s.complete else f"{s.text(digits)} ({len(s.finite)} of {len(s.values)} seeds)"


def _whole(value: float) -> int | None:
    """A range over seeds is a tested length (an int); NaN when no seed measured it."""
    return int(value) if is_number(value) else None


def _range_rows(cfg: FinetuneConfig, units: Sequence[dict]) -> list[dict[str, Any]]:
    f, rows = cfg.finetune, []
    for method in f.methods:
        for step in f.schedule:
            records = [_record(units, method, seed, step) for seed in f.seeds]
            s = _spread([r["range"] if r else None for r in records])
            reached = sum(1 for r in records if r and r["range"] >= cfg.target_length)
            rows.append({"method": method, "step": step, "range": _text(s), "min": _whole(s.low), "max": _whole(s.high),
                         "range / L": s.mean / cfg.data.seq_len if s.finite else None,
                         "seeds at target": f"{reached}/{len(f.seeds)}"})
    return rows


def not_run(cfg: FinetuneConfig, units: Sequence[dict]) -> list[tuple[str, int]]:
    """(method, seed) of every unit the config asks for and the folder does not hold (a stopped run)."""
    held = {(u.get("method"), u.get("seed")) for u in units}
    return [(m, s) for m in cfg.finetune.methods for s in cfg.finetune.seeds if (m, s) not in held]


def _steps_rows(cfg: FinetuneConfig, units: Sequence[dict]) -> list[dict[str, Any]]:
    f, ranges, rows = cfg.finetune, _ranges(units), []
    diverged = {(u["method"], u["seed"]) for u in units if u.get("status") != "ok"}
    missing = set(not_run(cfg, units))
    for method in f.methods:
        row: dict[str, Any] = {"method": method}
        steps = []
        for seed in f.seeds:
            if (method, seed) in diverged or (method, seed) in missing:
                row[f"seed {seed}"] = "diverged" if (method, seed) in diverged else "not run"
                continue
            s = steps_to_target(ranges.get(method, {}).get(seed, []), cfg.target_length)
            row[f"seed {seed}"] = s if s is not None else f"not by {f.schedule[-1]}"
            steps.append(s)
        reached = [s for s in steps if s is not None]
        row["reached"] = f"{len(reached)}/{len(f.seeds)}"  # a unit not run or diverged has not reached it
        row["steps (reached seeds)"] = _spread(reached).text(0) if reached else "n/a"
        rows.append(row)
    return rows


def _by_length(cfg: FinetuneConfig, units: Sequence[dict], key: str, multipliers: Sequence[int],
               digits: int) -> list[dict[str, Any]]:
    f, L, rows = cfg.finetune, cfg.data.seq_len, []
    for method in f.methods:
        for step in (f.schedule[0], f.schedule[-1]):
            records = [_record(units, method, seed, step) for seed in f.seeds]
            row = {"method": method, "step": step}
            for m in multipliers:
                row[f"{m * L}"] = _text(_spread([r[key].get(m * L) if r else None for r in records]), digits)
            rows.append(row)
    return rows


def _record_rows(cfg: FinetuneConfig, units: Sequence[dict]) -> tuple[list[dict], list[str]]:
    L, rows = cfg.data.seq_len, []
    pk = [f"passkey@{m * L}" for m in cfg.passkey.length_multipliers]
    ppl = [f"ppl@{m * L}" for m in cfg.perplexity.length_multipliers]
    for u in sorted(_ok(units), key=lambda u: (cfg.finetune.methods.index(u["method"]), u["seed"])):
        for r in u["records"]:
            row = {"method": u["method"], "seed": u["seed"], "step": r["step"], "range": r["range"],
                   "train_loss": r["train_loss"]}
            row |= {f"passkey@{n}": v for n, v in r["passkey"].items()} | {f"ppl@{n}": v for n, v in r["ppl"].items()}
            rows.append(row)
    return rows, ["method", "seed", "step", "range", "train_loss", *pk, *ppl]


def _plots(cfg: FinetuneConfig, units: Sequence[dict]) -> list[Plot]:
    f, L = cfg.finetune, cfg.data.seq_len
    series, bands = {}, {}
    for method in f.methods:
        points, band = {}, {}
        for step in f.schedule:
            s = _spread([r["range"] if (r := _record(units, method, seed, step)) else None for seed in f.seeds])
            if s.finite:
                points[step], band[step] = s.mean / L, (s.low / L, s.high / L)
        series[method], bands[method] = points, band
    series[f"target ({cfg.target_multiplier}L)"] = {step: cfg.target_multiplier for step in f.schedule}
    last = f.schedule[-1]

    def final(key: str, multipliers: Sequence[int]) -> dict[str, dict[int, float]]:
        out = {}
        for method in f.methods:
            for step, label in ((0, f"{method}, step 0"), (last, f"{method}, step {last}")):
                out[label] = {m * L: _spread([r[key].get(m * L) if (r := _record(units, method, seed, step))
                                              else None for seed in f.seeds]).mean for m in multipliers}
        return out

    return [Plot("range_vs_steps", "Passkey range against fine-tuning steps (band: min-max over seeds)",
                 "fine-tuning steps", f"passkey range / L (threshold {f.range_threshold:g})", series, bands,
                 log_x=False),
            Plot("accuracy_by_length", "Passkey accuracy by length (mean over seeds)", "length (tokens)",
                 "accuracy", final("passkey", cfg.passkey.length_multipliers), ylim=(-0.02, 1.02), vline=L),
            Plot("ppl_by_length", "Perplexity by length (mean over seeds)", "length (tokens)", "perplexity",
                 final("ppl", cfg.perplexity.length_multipliers), log_y=True, vline=L)]


def _reasons(units: Sequence[dict], missing: Sequence[tuple[str, int]]) -> dict[str, str]:
    """method -> why some seed of it has no passkey curve (the claims say so instead of 'not asked for')."""
    out: dict[str, list[str]] = {}
    for u in units:
        if u.get("status") != "ok":
            out.setdefault(u["method"], []).append(f"seed {u['seed']} diverged")
    for method, seed in missing:
        out.setdefault(method, []).append(f"seed {seed} not run: the run stopped before it")
    return {m: "; ".join(why) for m, why in out.items()}


def _stopped(cfg: FinetuneConfig, missing: Sequence[tuple[str, int]]) -> str:
    if not missing:
        return ""
    total = len(cfg.finetune.methods) * len(cfg.finetune.seeds)
    shown = ", ".join(f"{m} seed {s}" for m, s in missing)
    return (f" Stopped before the end: {total - len(missing)} of {total} units finished; not run: {shown} (they read "
            "'not run'; `posenc finetune --run-dir DIR` completes them).")


def _intro(cfg: FinetuneConfig, wall_seconds: float) -> str:
    f, L = cfg.finetune, cfg.data.seq_len
    base = (f"posenc's own {cfg.model.position_embedding_type} GPT ({cfg.model.n_layer} layers, d_model "
            f"{cfg.model.d_model}), trained from nothing at L = {L} for {cfg.pretrain.max_steps} steps on "
            f"{cfg.data.corpus} mixed with passkey sequences (share {cfg.pretrain.passkey_share:g}), one per seed"
            if f.base is None else f"{f.base} at L = {L}")
    return (f"Base: {base}. Each method fine-tunes it at the target {cfg.target_length} = {cfg.target_multiplier}L "
            f"(batch {cfg.trainer.batch_size}, lr {cfg.trainer.lr:g}, passkey share {f.passkey_share:g}) for "
            f"{f.schedule[-1]} steps, measured at steps {list(f.schedule)}; seeds {list(f.seeds)}. Passkey range: "
            f"the longest tested length up to which every tested length has accuracy >= {f.range_threshold:g} "
            f"({cfg.passkey.trials} keys per length, needles at evenly spaced depths). A few hundred steps: "
            f"<= {FEW_HUNDRED}. Wall time {wall_seconds / 60:.1f} min.")


def finetune_report(cfg: FinetuneConfig, units: Sequence[dict], bases: Sequence[dict],
                    wall_seconds: float, sequence_start: dict[str, Any] | None = None) -> Report:
    """The report; `sequence_start` (run.json's record of what every sequence began with) is kept in results.json."""
    f, L = cfg.finetune, cfg.data.seq_len
    # The base itself is method none at step 0; without that row it is not checked (nothing to check it with).
    retrieves = {seed: bool((r := _record(units, "none", seed, 0)) and r["passkey"].get(L, 0) >= f.range_threshold)
                 if "none" in f.methods else True for seed in f.seeds}
    missing = not_run(cfg, units)
    verdicts = judge_all(_ranges(units), f.seeds, cfg.target_length, retrieves, _reasons(units, missing))
    records, record_columns = _record_rows(cfg, units)
    steps_cols = ["method", *[f"seed {s}" for s in f.seeds], "reached", "steps (reached seeds)"]
    pk_cols = [f"{m * L}" for m in cfg.passkey.length_multipliers]
    ppl_cols = [f"{m * L}" for m in cfg.perplexity.length_multipliers]
    tables = [
        Table("range_by_step", f"Passkey range (tokens) by fine-tuning step, mean ± std over seeds (target "
              f"{cfg.target_length})", ["method", "step", "range", "min", "max", "range / L", "seeds at target"],
              _range_rows(cfg, units), group="method"),
        Table("steps_to_target", f"Steps to reach the target (range >= {cfg.target_length})", steps_cols,
              _steps_rows(cfg, units)),
        Table("claims", "Published claims, read by the printed rule", ["claim", "source", "rule", "verdict",
                                                                        "evidence"],
              [dataclasses.asdict(v) for v in verdicts]),
        Table("passkey_by_length", "Passkey accuracy by length (mean ± std over seeds), before and after",
              ["method", "step", *pk_cols], _by_length(cfg, units, "passkey", cfg.passkey.length_multipliers, 2),
              group="method"),
        Table("ppl_by_length", "Perplexity by length (mean ± std over seeds), before and after",
              ["method", "step", *ppl_cols], _by_length(cfg, units, "ppl", cfg.perplexity.length_multipliers, 2),
              group="method"),
        Table("records", "Every measurement", record_columns, records, shown=False),
    ]
    diverged = [f"{u['method']} seed {u['seed']}" for u in units if u.get("status") != "ok"]
    results = {"config": cfg.to_dict(), "bases": list(bases), "units": list(units), "diverged": diverged,
               "claims": [dataclasses.asdict(v) for v in verdicts], "wall_seconds": wall_seconds,
               "sequence_start": sequence_start, "complete": not missing}
    return Report("Fine-tuning to extend the context (posenc finetune)",
                  _intro(cfg, wall_seconds) + _stopped(cfg, missing), tables, _plots(cfg, units), results)


def rerender(run_dir: Path, stored: dict) -> Path:
    """`posenc report RUN_DIR`: the report again from results.json and run.json (no model is loaded)."""
    units, bases = stored_files.results(Path(run_dir) / "results.json")  # checked as a whole, before any rewrite
    cfg = resolved(config_loader.build(FinetuneConfig, stored["config"]))
    report = finetune_report(cfg, units, bases, float(stored.get("wall_seconds") or 0.0), stored.get("sequence_start"))
    return report_writer.write(Path(run_dir), report, markdown=MARKDOWN, echo=False)[-1]
