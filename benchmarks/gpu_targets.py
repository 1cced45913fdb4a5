"""The target table of `make gpu-check` (issues 33 and 34), from the rows its parts wrote: every target, measured or
missed. `python -m benchmarks.gpu_targets OUT` reads OUT/*/benchmarks/results-gpu*.jsonl."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.report import table

ROW_SCHEMES = ("alibi", "kerple", "sandwich", "relative")
ATTENTION = {"fwd": 1.10, "fwd+bwd": 1.20}  # ratio to causal SDPA, bf16, T = 1k..16k, Dh 64 and 128
# per scheme: the row kernel's (issue 33); the schemes with kernels of their own (issue 34)
ATTENTION_BOUNDS = {**dict.fromkeys(ROW_SCHEMES, ATTENTION), "fire": {"fwd": 1.30, "fwd+bwd": 1.40},
                    "shaw": {"fwd": 1.6, "fwd+bwd": 1.6}, "transformer_xl": {"fwd": 1.6, "fwd+bwd": 1.6},
                    "cope": {"fwd": 2.0, "fwd+bwd": 2.0}}
MAP_PROMPT, MAP_DECODE = 1.5, 1.3  # issue 34: a 32k prompt under a map, a decode step, to plain RoPE
ROPE = 1.2  # fwd+bwd, ratio to a same-bytes copy (and no slower than Liger's kernel)
TRAIN = {"rope": 0.95, "alibi": 0.90, "kerple": 0.90, "sandwich": 0.90, "relative": 0.90}  # tokens/s to `none`


def rows(out: Path) -> dict[str, list[dict]]:
    found: dict[str, list[dict]] = {}
    for path in sorted(out.glob("*/benchmarks/results-gpu*.jsonl")):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            found.setdefault(row.pop("section"), []).append(row)
    return found


def _verdict(value, bound: float, higher_is_better: bool = False) -> str:
    if not isinstance(value, float) or value != value:
        return f"missed ({value})" if isinstance(value, str) else "missed (not measured)"
    return "met" if (value >= bound if higher_is_better else value <= bound) else "**not met**"


def targets(found: dict[str, list[dict]]) -> list[dict]:
    table_rows = []
    attention = [r for r in found.get("attention", []) if r["path"].startswith("posenc ")]
    for r in attention:
        name = r["path"].split(" ", 1)[1]
        if name in ATTENTION_BOUNDS:
            bound = ATTENTION_BOUNDS[name][r["pass"]]
            table_rows.append({"target": f"attention {name} {r['pass']}", "setting": f"T={r['T']} Dh={r['Dh']} "
                               f"H:Hkv={r['H:Hkv']}", "bound": f"<= {bound}", "measured": r["x SDPA"],
                               "verdict": _verdict(r["x SDPA"], bound)})
    rope = found.get("rope", [])
    for r in rope:
        if r["path"].startswith("posenc") and r["pass"] == "fwd+bwd":
            liger = next((x for x in rope if x["path"] == "Liger rope" and x["B,H,T,Dh"] == r["B,H,T,Dh"]
                          and x["pass"] == r["pass"]), None)
            table_rows.append({"target": f"RoPE {r['path'][7:]} fwd+bwd", "setting": r["B,H,T,Dh"],
                               "bound": f"<= {ROPE} x copy", "measured": r["x copy"],
                               "verdict": _verdict(r["x copy"], ROPE)})
            if liger is not None:
                table_rows.append({"target": f"RoPE {r['path'][7:]} vs Liger", "setting": r["B,H,T,Dh"],
                                   "bound": "<= Liger", "measured": r["us"],
                                   "verdict": "met" if isinstance(r["us"], float) and isinstance(liger["us"], float)
                                   and r["us"] <= liger["us"] else "**not met**"})
    for r in found.get("maps", []):
        if r["path"].startswith("posenc "):
            table_rows.append({"target": f"map {r['path'][7:]} prompt", "setting": f"T={r['T']} Dh={r['Dh']} "
                               f"H:Hkv={r['H:Hkv']}", "bound": f"<= {MAP_PROMPT} x rope", "measured": r["x rope"],
                               "verdict": _verdict(r["x rope"], MAP_PROMPT)})
    for r in found.get("map decode", []):
        if r["map"] != "rope":
            table_rows.append({"target": f"map {r['map']} decode", "setting": f"context {r['context']}",
                               "bound": f"<= {MAP_DECODE} x rope", "measured": r["x rope"],
                               "verdict": _verdict(r["x rope"], MAP_DECODE)})
    for r in found.get("graphs", []):
        if "x rope graphed" in r:
            table_rows.append({"target": f"map {r['model'].split(' ', 1)[1]} graphed decode",
                               "setting": f"context {r['context']}, SmolLM2-shaped",
                               "bound": f"<= {MAP_DECODE} x rope graphed", "measured": r["x rope graphed"],
                               "verdict": _verdict(r["x rope graphed"], MAP_DECODE)})
    for r in found.get("train", []):
        if r["scheme"] in TRAIN:
            table_rows.append({"target": f"124M GPT step {r['scheme']}", "setting": "T=1024 B=8 bf16",
                               "bound": f">= {TRAIN[r['scheme']]} x none", "measured": r["x none"],
                               "verdict": _verdict(r["x none"], TRAIN[r["scheme"]], higher_is_better=True)})
    if not table_rows:
        table_rows.append({"target": "all", "setting": "", "bound": "", "measured": "", "verdict": "missed: no rows"})
    return table_rows


def main(argv: list[str] | None = None) -> int:
    out = Path((argv or sys.argv[1:] or ["gpu-check"])[0])
    found = rows(out)
    device = next((r.get("device") for r in found.get("environment", [])), "unknown device")
    print(f"## Targets of issues 33 and 34 on {device}\n")
    print(table(targets(found)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
