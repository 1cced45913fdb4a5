"""BENCHMARKS.md from the results of one run (and, optionally, a baseline run's results for "before")."""

from __future__ import annotations

import math
from collections.abc import Callable

from benchmarks import targets
from benchmarks.machine import label


def _cell(value) -> str:
    if isinstance(value, float):
        return "n/a" if math.isnan(value) else f"{value:,.2f}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)\n"
    cols = list(dict.fromkeys(c for r in rows for c in r))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _met(value: float, bound: float | None) -> str:
    return "" if bound is None or math.isnan(value) else ("yes" if value <= bound else "**no**")


def _before(baseline: dict | None, section: str, match: dict, column: str) -> float | None:
    for row in (baseline or {}).get(section, []):
        if all(row.get(k) == v for k, v in match.items()):
            return row.get(column)
    return None


def _with_before(value: float, before: float | None) -> str:
    return _cell(value) if before is None else f"{_cell(value)} (was {_cell(before)})"


def train_table(rows: list[dict], baseline: dict | None) -> list[dict]:
    """One row per scheme, one column per (T, B): x none (and the baseline's), and whether the target holds."""
    shapes = list(dict.fromkeys((r["T"], r["B"]) for r in rows))
    out = []
    for scheme in dict.fromkeys(r["scheme"] for r in rows):
        bound = targets.train_target(scheme)
        line = {"scheme": scheme, "target": f"<= {bound:g}" if bound else ""}
        misses = 0
        for t, b in shapes:
            r = next(r for r in rows if (r["T"], r["B"], r["scheme"]) == (t, b, scheme))
            before = _before(baseline, "train", {"T": t, "B": b, "scheme": scheme}, "x none")
            line[f"T={t} B={b}"] = _with_before(r["x none"], before) if scheme != "none" else f"{r['ms/step']:.1f} ms"
            misses += _met(r["x none"], bound) == "**no**"
        line["met"] = "" if bound is None else ("yes" if not misses else f"**no** ({misses})")
        out.append(line)
    return out


def forward_table(rows: list[dict], baseline: dict | None) -> list[dict]:
    out = []
    for r in rows:
        time_bound, memory_bound = targets.forward_target(r["scheme"])
        before = _before(baseline, "forward", {"T": r["T"], "scheme": r["scheme"]}, "x none")
        out.append({**r, "x none": _with_before(r["x none"], before), "met": " / ".join(
            m for m in (_met(r["x none"], time_bound), _met(r["x none mem"], memory_bound)) if m)})
    return out


def _decode_table(section: str, label: str, base: str, target: Callable[[str], float | None]) -> Callable:
    """A decode section's rows: each ratio to `base` with the baseline's beside it, and whether target(name) holds."""
    def shape(rows: list[dict], baseline: dict | None) -> list[dict]:
        column = f"x {base}"
        return [{**r, column: _with_before(r[column], _before(baseline, section, {"context": r["context"],
                                                                               label: r[label]}, column)),
                 "met": _met(r[column], target(r[label]))} for r in rows]

    return shape


decode_table = _decode_table("decode", "scheme", "none", targets.decode_target)
static_decode_table = _decode_table("static_decode", "scheme", "none", targets.decode_target)
map_decode_table = _decode_table("map_decode", "map", "rope", targets.map_decode_target)


SECTIONS = {
    "train": ("Training step", "A 4-layer GPT, d_model 128, 4 heads, fp32: one step (forward, backward, AdamW) at "
              "2048 tokens per step; each cell is the step time's ratio to `none` (the `none` row gives its time), "
              "every scheme measured in the same rounds. Targets (issue 15): rope, xpos, p_rope, learned_absolute, "
              "sinusoidal <= 1.05; alibi, kerple, sandwich, relative <= 1.25; fire, shaw, transformer_xl, cope <= 2. "
              "`met`: the target holds at every length (else the number of misses).", train_table),
    "forward": ("Inference forward", "A 2-layer GPT, d_model 256, 8 heads, one sequence of T tokens; peak MiB = peak "
                "live bytes of tensors the forward creates (benchmarks/memory.py). Targets: every bias scheme <= "
                "1.25x `none` in time, peak memory within 10% of `none`.", forward_table),
    "attention": ("Causal attention with a bias", "One attention call, 8 heads, head dim 64: `posenc` = the default "
                  "path (on CPU: the bias read from rows in the native kernel; flex_attention on CUDA; chunks of "
                  "queries for schemes without rows); `naive` materialises the (H,T,T) bias (NeMo's way). "
                  "Peak MiB as above.", None),
    "decode": ("Decode step with the KV cache", "A 4-layer GPT, d_model 256, 8 heads: median latency of one new "
               "token against a cache of `context` tokens; `x none` the median of the per-token ratios to `none` "
               "(every scheme decodes one token in each round), `quartiles` theirs. Target: every scheme <= 1.1x.",
               decode_table),
    "map_decode": ("Decode step under a position map", "The same model and cache with rope, trained at a quarter of "
                   "the cache (4x), under each map (Self-Extend G 8, W an eighth of the trained length; the others at "
                   "their defaults): median latency of one new token, the per-token ratio to plain RoPE's step "
                   "(median and quartiles, as above). Target (issue 34): every map <= 1.3x.", map_decode_table),
    "static_decode": ("Decode step captured whole", "The decode section's model and cache through "
                      "posenc.models.static_decode (a fixed cache, the position terms computed once per step for "
                      "every layer): `ordinary ms` the ordinary cached step, `static ms` the static step eager, "
                      "`compiled ms` with its fixed-shape part under torch.compile (`compile s`: its first step); "
                      "`x none` the compiled step's per-token ratio to `none`'s compiled step (median, `quartiles`), "
                      "`x ordinary` its ratio to the scheme's own ordinary step. Schemes the static step serves. "
                      "Target: every scheme <= 1.1x.", static_decode_table),
    "rope": ("RoPE on q and k", "Time to rotate q and k; `x copy` is the ratio to cloning the same bytes (the "
             "floor), `x posenc` the ratio to posenc. Target: posenc <= 1.5x copy, and >= 2x faster than "
             "transformers.", None),
}


ISA_ORDER = ("avx512", "avx2")


def section(results: dict, baseline: dict | None = None) -> str:
    """One machine kind's section: what it ran on, then a table per benchmark."""
    runs = results.get("runs", {})
    parts = [f"\n## CPU: {label(results['machine'])}\n\n",
             "Every ratio comes from one run of its section (its date beside its title where the results record "
             "one), all of its rows measured side by side"]
    parts.append(f"; `(was x)`: the same harness on {baseline['label']}.\n" if baseline else ".\n")
    for key, (title, note, shape) in SECTIONS.items():
        if key in results:
            rows = shape(results[key], baseline) if shape else results[key]
            when = f" ({runs[key]})" if key in runs else ""
            parts += [f"\n### {title}{when}\n", f"{note}\n\n", table(rows)]
    return "".join(parts)


def markdown(by_isa: dict[str, dict], baselines: dict[str, dict] | None = None) -> str:
    """BENCHMARKS.md: one section per instruction set measured (AVX-512 first), each from its own run."""
    order = sorted(by_isa, key=lambda k: ISA_ORDER.index(k) if k in ISA_ORDER else len(ISA_ORDER))
    head = ("# posenc benchmarks\n\nGenerated by `make bench` (`python -m benchmarks.run`, then `--isa avx2` on "
            "an AVX-512 machine). The same code runs at very different speeds with AVX-512 and with AVX2 only, "
            "so each instruction set has its own section, measured in its own run; ratios compare only within a "
            "section. GPU: `posenc bench --device cuda` writes BENCHMARKS-gpu.md.\n")
    return head + "".join(section(by_isa[isa], (baselines or {}).get(isa)) for isa in order)
