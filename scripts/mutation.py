"""`make mutation`: the test suite's strength, measured by mutmut (settings: [tool.mutmut] in pyproject.toml).

    .venv/bin/python scripts/mutation.py            # mutmut run (resumable: stop and rerun), then the report
    .venv/bin/python scripts/mutation.py --report   # only the report, from mutants/ of an earlier run

Writes MUTATION.md: per package, mutants killed (a test failed, or the mutant timed out) out of those
checked, and every survivor by function. `mutmut show NAME` prints a survivor's diff. Slow (each mutant
runs the tests that cover its function), so not part of `make test` or CI.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
import tomllib
from pathlib import Path

DETECTED = {"killed", "timeout", "segfault"}  # the suite noticed the change
MISSED = {"survived", "no tests"}  # it did not ("no tests": no selected test runs that function)


def results(mutmut: str) -> dict[str, str]:
    """mutant name -> status, from `mutmut results --all true`."""
    out = subprocess.run([mutmut, "results", "--all", "true"], capture_output=True, text=True, check=True).stdout
    pairs = (line.strip().rsplit(": ", 1) for line in out.splitlines() if ": " in line)
    return {name: status for name, status in pairs}


def package(mutant: str) -> str:
    """posenc.bias.kerple.x_KERPLE__bias__mutmut_3 -> posenc.bias (a top-level module keeps its name)."""
    parts = mutant.split(".")
    return ".".join(parts[:2]) if len(parts) > 3 else ".".join(parts[:-1])


def function(mutant: str) -> str:
    return mutant.rsplit("__mutmut_", 1)[0]


def report(status: dict[str, str]) -> str:
    by_package: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for name, s in status.items():
        by_package[package(name)][s] += 1
    settings = tomllib.loads(Path("pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    lines = ["# Mutation testing (`make mutation`)", "",
             "Score = mutants detected (killed or timed out) / mutants checked (detected + survived + no tests).",
             f"Mutated: {', '.join(settings.get('only_mutate', settings['source_paths']))}; tests run: "
             f"{' '.join(settings['pytest_add_cli_args_test_selection'])} (pyproject.toml, [tool.mutmut]).",
             "'not checked': mutants the run has not reached yet (`make mutation` resumes).", "",
             "| package | checked | detected | survived | no tests | not checked | score |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    total = collections.Counter()
    for name in sorted(by_package):
        c = by_package[name]
        total.update(c)
        lines.append(_row(name, c))
    lines += [_row("**all**", total), "", "## Survivors by function", ""]
    survivors = collections.defaultdict(list)
    for name, s in sorted(status.items()):
        if s in MISSED:
            survivors[function(name)].append(f"{name.rsplit('__mutmut_', 1)[1]} ({s})")
    lines += [f"- `{fn}`: mutants {', '.join(ids)}" for fn, ids in survivors.items()] or ["none"]
    return "\n".join(lines) + "\n"


def _row(name: str, c: collections.Counter) -> str:
    detected = sum(c[s] for s in DETECTED)
    checked = detected + sum(c[s] for s in MISSED)
    score = f"{100 * detected / checked:.1f}%" if checked else "n/a"
    unchecked = sum(v for s, v in c.items() if s not in DETECTED | MISSED)
    return f"| {name} | {checked} | {detected} | {c['survived']} | {c['no tests']} | {unchecked} | {score} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report", action="store_true", help="only write the report from an earlier run")
    parser.add_argument("--out", default="MUTATION.md")
    args = parser.parse_args(argv)
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    if not args.report:
        subprocess.run([mutmut, "run"], check=False)  # a non-zero exit still leaves results to report
    text = report(results(mutmut))
    Path(args.out).write_text(text, encoding="utf-8")
    print(text.split("\n## ")[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
