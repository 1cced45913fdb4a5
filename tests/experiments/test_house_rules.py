"""The layout's rules, read from the code's imports (ast, so imports inside functions count too):
the library never imports the experiments, shared experiment folders never import a study, a study
never imports another, and every study folder has the same parts."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "posenc"
EXPERIMENTS = PACKAGE / "experiments"
SHARED = ("config", "runs", "training", "evaluation")  # every other folder of experiments/ is a study
STUDY_PARTS = ("config.py", "run.py", "report.py")  # what a new study copies
APPLICATION = ("commands", "cli.py", "experiments")  # everything else under posenc/ is the library


def studies() -> list[str]:
    return sorted(p.name for p in EXPERIMENTS.iterdir() if p.is_dir() and (p / "__init__.py").is_file()
                  and p.name not in SHARED)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports (`from a.b import c` counts as a.b and a.b.c)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the rules read absolute module names)"
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def reaches(path: Path, package: str) -> list[str]:
    return sorted(m for m in imported_modules(path) if m == package or m.startswith(f"{package}."))


def test_there_are_studies_and_shared_folders():
    assert set(studies()) >= {"compare", "tasks", "extend"}
    assert all((EXPERIMENTS / name / "__init__.py").is_file() for name in SHARED)


def test_the_library_never_imports_the_experiments():
    library = [p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in APPLICATION]
    offenders = {str(p.relative_to(PACKAGE)): reaches(p, "posenc.experiments") for p in library}
    assert not {k: v for k, v in offenders.items() if v}


def test_shared_experiment_code_never_imports_a_study():
    shared = [p for p in EXPERIMENTS.rglob("*.py") if p.relative_to(EXPERIMENTS).parts[0] not in studies()]
    offenders = {str(p.relative_to(PACKAGE)): [m for s in studies() for m in reaches(p, f"posenc.experiments.{s}")]
                 for p in shared}
    assert not {k: v for k, v in offenders.items() if v}


@pytest.mark.parametrize("study", studies())
def test_a_study_never_imports_another(study):
    others = [s for s in studies() if s != study]
    offenders = {str(p.relative_to(PACKAGE)): [m for s in others for m in reaches(p, f"posenc.experiments.{s}")]
                 for p in (EXPERIMENTS / study).rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


@pytest.mark.parametrize("study", studies())
def test_every_study_has_the_same_parts(study):
    assert [part for part in STUDY_PARTS if not (EXPERIMENTS / study / part).is_file()] == []


def test_nn_never_imports_the_schemes_or_the_position_maps():
    """Schemes and maps call nn/'s kernels, so nn/ names theirs only by the protocols below both (scheme.py,
    position_map.py) and, for RoPE's rotation, by name in dispatch.ROTATION_RULES (rotary/ holds the functions)."""
    above = ("posenc.rotary", "posenc.bias", "posenc.absolute", "posenc.content", "posenc.position_maps")
    offenders = {str(p.relative_to(PACKAGE)): [m for package in above for m in reaches(p, package)]
                 for p in (PACKAGE / "nn").rglob("*.py")}
    assert not {k: v for k, v in offenders.items() if v}


def test_the_rules_see_an_import_inside_a_function(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from posenc.experiments.tasks import run\n")
    assert reaches(source, "posenc.experiments.tasks") == ["posenc.experiments.tasks",
                                                           "posenc.experiments.tasks.run"]


def test_git_ignores_no_source_file_of_the_package():
    """.gitignore's `runs/` (where run folders go) once hid a package folder of that name from commits."""
    listed = subprocess.run(["git", "ls-files", "--others", "--ignored", "--exclude-standard", str(PACKAGE)],
                            capture_output=True, text=True, cwd=PACKAGE)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    assert [f for f in listed.stdout.splitlines() if f.endswith((".py", ".yaml", ".cpp", ".h"))] == []


@pytest.mark.parametrize("command", ["compare", "ladder", "tasks", "finetune", "extend"])
def test_a_study_command_only_parses_and_hands_over(command):
    """The run-folder lifecycle (folder, lock, run rule, report on interruption) lives in the study's run():
    runs/lifecycle.py, the same for every study; the command file parses and hands the config over."""
    source = (PACKAGE / "commands" / f"{command}.py").read_text()
    assert "posenc.experiments.runs" not in source and "report_writer" not in source
    assert len(source.splitlines()) <= 50


def test_the_ladder_is_a_study_of_its_own():
    """It lived inside compare (its config, runner and report beside compare's); the rules above now see it."""
    assert "ladder" in studies() and not list((EXPERIMENTS / "compare").glob("ladder*"))


def test_posenc_report_finds_every_study_through_one_table():
    """No special case: the study recorded in run.json is looked up in REPORTS, one entry per study folder."""
    from posenc.commands.report import REPORTS

    def defines_rerender(study: str) -> bool:
        tree = ast.parse((EXPERIMENTS / study / "report.py").read_text(encoding="utf-8"))
        return any(isinstance(node, ast.FunctionDef) and node.name == "rerender" for node in tree.body)

    assert sorted(REPORTS) == studies()
    assert all(REPORTS[s] == f"posenc.experiments.{s}.report" and defines_rerender(s) for s in studies())


LIFECYCLE = ("lifecycle", "lock", "files", "manifest", "rule", "checkpoint")  # what a run folder's life is made of


@pytest.mark.parametrize("path", sorted((PACKAGE / "commands").glob("*.py")), ids=lambda p: p.stem)
def test_no_command_holds_a_run_folders_lifecycle(path):
    """Creating, locking, resuming and reporting a run folder live in experiments/ (a study's run.py, training/,
    runs/): a command file parses its arguments and hands them over."""
    held = [m for part in LIFECYCLE for m in reaches(path, f"posenc.experiments.runs.{part}")]
    assert held == [] and reaches(path, "posenc.experiments.training.ddp") == []


OWN_LIFECYCLE = ("posenc.experiments.runs.rule.open_run", "posenc.experiments.runs.files.new_run_dir",
                 "posenc.experiments.runs.files.removed_if_unused")  # what runs/lifecycle.py puts together


@pytest.mark.parametrize("study", studies())
def test_every_study_opens_its_run_folder_through_the_shared_lifecycle(study):
    """Extend once made, locked and removed its folder and wrote its tables on a stop its own way (and Ctrl-C
    wrote none); now every study's run() opens its folder with runs.lifecycle.run_folder and nothing else."""
    files = list((EXPERIMENTS / study).rglob("*.py"))
    assert {str(p.relative_to(PACKAGE)): sorted(imported_modules(p) & set(OWN_LIFECYCLE)) for p in files
            if imported_modules(p) & set(OWN_LIFECYCLE)} == {}
    assert "posenc.experiments.runs.lifecycle.run_folder" in imported_modules(EXPERIMENTS / study / "run.py")
