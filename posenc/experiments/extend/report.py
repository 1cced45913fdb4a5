"""Results of an extend run: terminal tables, CSV/JSON, markdown tables (for EXTEND.md), plots and
one self-contained HTML page, all in the run folder, each file written atomically."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from posenc.atomic_files import write_json, write_text
from posenc.errors import bad_value
from posenc.experiments import report_writer
from posenc.experiments.config import loader as config_loader
from posenc.experiments.evaluation.statistics import wilson
from posenc.experiments.extend.config import ExtendConfig
from posenc.experiments.extend.plots import accuracy_plot, heatmaps, ppl_plot, ruler_plot
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.recommend import RULE, recommend
from posenc.experiments.extend.ruler_report import ruler_average, ruler_summary, ruler_tables


def passkey_summary(records: list[dict[str, Any]], by_depth: bool = False) -> list[dict[str, Any]]:
    """Accuracy per (method, length[, depth]) with its 95% Wilson interval, in first-seen order."""
    groups: dict[tuple, list[bool]] = defaultdict(list)
    for r in records:
        key = (r["method"], r["length"], r["depth"]) if by_depth else (r["method"], r["length"])
        groups[key].append(bool(r["correct"]))
    rows = []
    for key, hits in groups.items():
        lo, hi = wilson(sum(hits), len(hits))
        rows.append({"method": key[0], "length": key[1], **({"depth": key[2]} if by_depth else {}),
                     "correct": sum(hits), "total": len(hits), "accuracy": sum(hits) / len(hits), "lo": lo, "hi": hi})
    return rows


def _ppl_cell(stat: dict[str, float]) -> str:
    # Parentheses, not brackets: rich reads [..] as markup and would drop the interval.
    if math.isnan(stat["lo"]):  # too little text to resample
        return report_writer.fmt(stat["ppl"])
    return f"{report_writer.fmt(stat['ppl'])} ({report_writer.fmt(stat['lo'])}-{report_writer.fmt(stat['hi'])})"


def _acc_cell(row: dict[str, Any]) -> str:
    return f"{row['correct']}/{row['total']} ({row['lo']:.2f}-{row['hi']:.2f})"


def wide_tables(state: RunState, cfg: ExtendConfig) -> dict[str, tuple[list[dict], list[str]]]:
    """title -> (rows, columns): methods down, lengths across, spreads in brackets."""
    out = {}
    if state.ppl:
        cols = ["method", *map(str, cfg.ppl_lengths)]
        rows = [{"method": name, **{str(n): _ppl_cell(r["ppl_by_length"][n]) for n in cfg.ppl_lengths}}
                for name in cfg.extend.methods if (r := state.ppl.get(name))]
        out["perplexity (95% block-bootstrap interval)"] = (rows, cols)
    if state.passkey:
        cols = ["method", *map(str, cfg.key_lengths)]
        table: dict[str, dict[str, str]] = {}
        for row in passkey_summary(list(state.passkey.values())):
            table.setdefault(row["method"], {"method": row["method"]})[str(row["length"])] = _acc_cell(row)
        rows = [table[name] for name in cfg.extend.methods if name in table]
        out["passkey retrieval: correct/prompts (95% Wilson interval)"] = (rows, cols)
    out.update(ruler_tables(ruler_summary(list(state.ruler.values())), list(cfg.extend.methods), cfg.ruler_lengths))
    return out


def recommendation(state: RunState, cfg: ExtendConfig, trained: int) -> list[dict[str, Any]]:
    """recommend.RULE applied to this run's numbers."""
    methods = list(cfg.extend.methods)
    rows = passkey_summary(list(state.passkey.values()))
    most = defaultdict(int)  # prompts per length of the method with the most: a stopped run's others are partial
    for r in rows:
        most[r["length"]] = max(most[r["length"]], r["total"])
    # only methods with every prompt at a length compete there: 1/1 must not beat 8/10
    passkey = {(r["method"], r["length"]): r["accuracy"] for r in rows if r["total"] == most[r["length"]]}
    ruler = ruler_average(ruler_summary(list(state.ruler.values())))
    ppl = {(name, n): stat["ppl"] for name, row in state.ppl.items() for n, stat in row["ppl_by_length"].items()}
    return recommend(methods, passkey, ruler, ppl, trained)


def recommendation_table(rows: list[dict[str, Any]]) -> tuple[list[dict], list[str]]:
    cols = ["length", "multiple", "method", "passkey", "RULER avg", "ppl", "ppl vs trained", "tied"]
    out = [{"length": r["length"], "multiple": f"{r['multiple']:g}x", "method": r["method"],
            "passkey": "" if r["passkey"] is None else f"{100 * r['passkey']:.0f}%",
            "RULER avg": "" if r["ruler"] is None else f"{r['ruler']:.1f}",
            "ppl": "" if r["ppl"] is None else report_writer.fmt(r["ppl"]),
            "ppl vs trained": "" if r["ppl_vs_trained"] is None else f"{r['ppl_vs_trained']:.2f}x",
            "tied": ", ".join(r["tied"])} for r in rows]
    return out, cols


def run_summary(meta: dict[str, Any]) -> str:
    """One paragraph: model, precision, factor, wall time and the longest forward's time and memory."""
    text = (f"{meta['model']} (trained context {meta['context_length']}), {meta['dtype']}, factor {meta['factor']:g}, "
            f"prefill chunk {meta['prefill_chunk']}, {meta['threads']} threads: {meta['wall_s'] / 60:.1f} min in all.")
    if meta.get("longest_forward_tokens"):
        text += (f" Longest forward: {meta['longest_forward_tokens']} tokens in {meta['longest_forward_s']:.0f} s "
                 f"({meta['longest_forward_cpu_s']:.0f} CPU s), "
                 f"peak RSS {meta['longest_forward_peak_rss_gib']:.2f} GiB"
                 + (f", peak GPU memory {meta['longest_forward_peak_gpu_gib']:.2f} GiB"
                    if meta.get("longest_forward_peak_gpu_gib") else "") + ".")
    if meta.get("device", "cpu") != "cpu":
        text += f" Device: {meta['device']}."
    if meta.get("complete") is False:
        text += " Stopped before the end: the tables hold the cells that finished (--resume completes them)."
    return text


def markdown(tables: dict[str, tuple[list[dict], list[str]]], meta: dict[str, Any] | None = None) -> str:
    parts = [run_summary(meta), ""] if meta else []
    for title, (rows, cols) in tables.items():
        parts.append(f"**{title}**\n\n| {' | '.join(cols)} |\n|{'---|' + '---:|' * (len(cols) - 1)}")
        parts.extend("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows)
        parts.append("")
    return "\n".join(parts)


def longest_forward(forwards: list[dict[str, Any]]) -> dict[str, Any]:
    """The slowest forward of the longest length (the costliest method there, not a cached plain one)."""
    return max(forwards, key=lambda f: (f["length"], f["seconds"]), default={})


def run_meta(state: RunState, cfg: ExtendConfig, corpus: dict[str, str], wall_seconds: float,
             complete: bool) -> dict[str, Any]:
    """results.json's description of the run: the machine it recorded, the settings, the longest forward."""
    m, longest = state.machine, longest_forward(state.forwards)
    trained = m["context_length"]
    return {"model": m["model"], "context_length": trained, "factor": cfg.scaling_factor(trained),
            "corpus": corpus["name"], "corpus_sha256": corpus["sha256"], "dtype": cfg.model.dtype,
            "prefill_chunk": cfg.model.prefill_chunk, "longest_forward_tokens": longest.get("length"),
            "longest_forward_s": longest.get("seconds"), "longest_forward_cpu_s": longest.get("cpu_seconds"),
            "longest_forward_peak_rss_gib": longest.get("peak_rss_gib"), "torch": m["torch"],
            "threads": m["threads"], "cpu": m["cpu"], "device": m["device"],
            "longest_forward_peak_gpu_gib": longest.get("peak_gpu_gib"), "complete": complete,
            "wall_s": wall_seconds,  # every session of a resumed run
            "tuning": state.tuning,  # tune.grid: each point's score on the choice's own prompts, the chosen options
            # the layers the methods acted on (model.extension_layers, resolved); absent in runs before it
            "extension_layers": m.get("extension_layers"), "extended_layers": m.get("extended_layers"),
            # the tokens before every sequence (the model's BOS where its tokenizer adds one); absent before it
            "sequence_start": m.get("sequence_start")}


def rerender(run_dir: Path, stored: dict[str, Any]) -> Path:
    """`posenc report`: the tables, plots and HTML again from progress.json and run.json (no model is loaded)."""
    state = RunState.load(run_dir)
    if not state.machine:
        raise bad_value("run_dir", str(run_dir), "an extend folder written since extend records its machine in "
                                                 "progress.json ('machine'); rerun or --resume it once")
    cfg = config_loader.build(ExtendConfig, stored["config"])
    path = run_dir / "results.json"
    try:
        done = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise bad_value("results", str(path), f"a readable results.json of `posenc extend` ({err})") from None
    done = done.get("complete", True) if isinstance(done, dict) else None
    if not isinstance(done, bool):
        raise bad_value("results", str(path), "a results.json of `posenc extend` (an object; complete: true or false)")
    meta = run_meta(state, cfg, stored["corpus"], float(stored.get("wall_seconds") or 0.0), done)
    return write_results(state, cfg, meta)[-1]


def tuning_table(tuning: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per grid point: map, options, score (0-1) on the choice's prompts, and which was chosen."""
    rows = [{"map": name, "options": json.dumps(p["options"]), "score": f"{p['score']:.2f}", "prompts": p["prompts"],
             "chosen": "yes" if p["options"] == record.get("chosen") else ""}
            for name, record in tuning.items() for p in record["points"]]
    return rows, ["map", "options", "score", "prompts", "chosen"]


def write_results(state: RunState, cfg: ExtendConfig, meta: dict[str, Any]) -> list[Path]:
    """Print the tables; write results.json, CSVs, tables.md, plots and report.html."""
    run_dir, records = state.run_dir, list(state.passkey.values())
    tables = wide_tables(state, cfg)
    advice = recommendation(state, cfg, meta["context_length"])
    if advice:
        tables["which method at which multiple (rule below)"] = recommendation_table(advice)
    if state.tuning:
        tables["options chosen by tune.grid, on prompts of their own"] = tuning_table(state.tuning)
    for title, (rows, cols) in tables.items():
        report_writer.print_table(rows, cols, f"{title}; trained context {meta['context_length']} tokens")
    ppl_rows = [{"method": name, "length": n, "attention_scaling": r["attention_scaling"], **stat}
                for name, r in state.ppl.items() for n, stat in r["ppl_by_length"].items()]
    summary, by_depth = passkey_summary(records), passkey_summary(records, by_depth=True)
    ruler_records = list(state.ruler.values())
    ruler_rows = ruler_summary(ruler_records)
    files = [write_json(run_dir / "results.json", {
        "config": cfg.to_dict(), **meta, "ppl": list(state.ppl.values()), "passkey_summary": summary,
        "passkey_by_depth": by_depth, "passkey": records, "ruler_summary": ruler_rows, "ruler": ruler_records,
        "recommendation": advice, "recommendation_rule": RULE, "forwards": state.forwards})]
    if ppl_rows:
        files.append(report_writer.write_csv(run_dir / "ppl.csv", ppl_rows,
                                      ["method", "length", "ppl", "lo", "hi", "attention_scaling"]))
        files.append(ppl_plot(run_dir / "ppl_vs_length.png", state.ppl, meta))
    if records:
        files.append(report_writer.write_csv(run_dir / "passkey.csv", records, list(records[0])))
        files.append(report_writer.write_csv(run_dir / "passkey_summary.csv", summary, list(summary[0])))
        files.append(accuracy_plot(run_dir / "passkey_vs_length.png", summary, meta))
        files.append(heatmaps(run_dir / "passkey_heatmap.png", by_depth, cfg.extend.methods, meta))
    if ruler_rows:
        files.append(report_writer.write_csv(run_dir / "ruler.csv", ruler_records, list(ruler_records[0])))
        files.append(report_writer.write_csv(run_dir / "ruler_summary.csv", ruler_rows, list(ruler_rows[0])))
        files.append(ruler_plot(run_dir / "ruler_vs_length.png", ruler_rows, meta))
    if advice:
        print(f"rule: {RULE}")
    files.append(write_text(run_dir / "tables.md", markdown(tables, meta) + (f"\nRule: {RULE}\n" if advice else "")))
    sections = [(title, report_writer.html_table(rows, cols)) for title, (rows, cols) in tables.items()]
    if advice:
        sections.append(("the recommendation's rule", f"<p>{RULE}</p>"))
    sections.append(("run", f"<p>{run_summary(meta)}</p>"))
    files.append(report_writer.html_report(run_dir / "report.html", f"{meta['model']}: context extension", sections,
                                    [f for f in files if f.suffix == ".png"], files))
    return files
