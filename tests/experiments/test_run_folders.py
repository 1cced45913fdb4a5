"""The one run-folder rule, for every command: a second process on a live run folder is refused in one
line and changes nothing; a run killed with SIGKILL leaves no stale lock, its folder resumes, and its
recorded wall time survives the kill and grows with the resume; worker processes end with their parent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from posenc.experiments.runs.rule import RunRule, open_run
from tests.experiments.cli_helpers import TINY, cli, one_line, snapshot
from tests.experiments.test_extend import tiny_extend_model

ROOT = Path(__file__).resolve().parents[2]
WAIT = 600.0  # seconds a child may take to reach a state (a limit on a hang, not a speed requirement)
HOLD = """
import contextlib, sys, time
from pathlib import Path
from posenc.experiments.runs.lock import locked
with contextlib.ExitStack() as held:
    for folder in map(Path, sys.argv[1:]):
        folder.mkdir(parents=True, exist_ok=True)
        held.enter_context(locked(folder))
    print("held", flush=True)
    time.sleep(600)
"""
TASKS = ["leaderboard.tasks=[copy]", "leaderboard.train_len=2", "leaderboard.samples=4", "model.n_layer=1",
         "model.d_model=16", "leaderboard.progress=false", "leaderboard.jobs=1"]
COMPARE = [*TINY, "compare.progress=false", "compare.jobs=1", "compare.seeds=[0]"]
QUICK_EXTEND = {"task": "both", "lengths": [64, 128], "passkey_lengths": [128], "scalings": ["none"],
                "factor": None, "windows": 1, "corpus": "python_docs", "depths": [0.5], "trials": 1,
                "trial_tokens": None, "seed": 0, "dtype": "bfloat16", "prefill_chunk": 32768, "model": None,
                "out_dir": "runs"}


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"the child ended (exit {process.returncode}) before {what}: "
                        f"{process.stderr.read().decode()[-2000:] if process.stderr else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {WAIT:.0f} s")
        time.sleep(0.1)


def hold(*folders: Path) -> subprocess.Popen:
    """Another process that holds the folders until killed."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD, *map(str, folders)], cwd=ROOT, stdout=subprocess.PIPE)
    assert holder.stdout.readline().strip() == b"held"
    return holder


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    process.wait()


def wall(folder: Path) -> float:
    return json.loads((folder / "run.json").read_text())["wall_seconds"]


def _extend_folder(folder: Path) -> None:
    folder.mkdir(exist_ok=True)  # made by the process that holds it
    (folder / "run.json").write_text(json.dumps({"command": "extend", "config": QUICK_EXTEND, "corpus": None}))


def _report_folder(folder: Path) -> None:
    folder.mkdir(exist_ok=True)  # made by the process that holds it
    (folder / "run.json").write_text(json.dumps({"command": "compare", "config": {}, "corpus": None}))
    (folder / "results.json").write_text(json.dumps({"units": []}))


# command -> (how its folder looks before, its argv on that folder)
LIVE = {
    "compare": (None, lambda d: ["compare", *COMPARE, "compare.schemes=[alibi]", "--run-dir", d]),
    "tasks": (None, lambda d: ["tasks", *TASKS, "leaderboard.schemes=[rope]", "leaderboard.seeds=[0]",
                               "trainer.max_steps=2", "--run-dir", d]),
    "train": (None, lambda d: ["train", *TINY, "trainer.max_steps=2", "--run-dir", d]),
    "eval": (None, lambda d: ["eval", d]),
    "extend": (_extend_folder, lambda d: ["extend", "--resume", d]),
    "report": (_report_folder, lambda d: ["report", d]),
}


@pytest.fixture(scope="module")
def live_folders(tmp_path_factory):
    """A folder per command, all held by one other process (one interpreter start, not one per command)."""
    root = tmp_path_factory.mktemp("live")
    folders = {command: root / command for command in LIVE}
    holder = hold(*folders.values())
    yield folders
    kill(holder)


@pytest.mark.parametrize("command", list(LIVE))
def test_a_second_process_on_a_live_run_folder_is_refused_in_one_line(command, live_folders, capsys):
    folder = live_folders[command]
    prepare, argv = LIVE[command]
    if prepare is not None:
        prepare(folder)
    before = snapshot(folder)
    code, _, err = cli(capsys, *argv(folder))
    assert code == 2
    line = one_line(err)
    assert f"run_dir={str(folder)!r}" in line and "another posenc process" in line
    assert folder.is_dir() and snapshot(folder) == before  # the live run's folder is left as it was


def test_a_killed_process_leaves_no_stale_lock(tmp_path):
    folder = tmp_path / "run"
    kill(hold(folder))
    rule = RunRule("train", keeps_results=())
    with open_run(folder, rule, {"a": 1}) as run:
        assert not run.resumed
    assert json.loads((folder / "run.json").read_text())["command"] == "train"


def test_a_continuation_may_change_only_the_keys_its_study_names(tmp_path):
    rule = RunRule("tasks", keeps_results=("board.seeds",), hint="new folder")
    with open_run(tmp_path, rule, {"board": {"seeds": [0], "steps": 5}}):
        pass
    with open_run(tmp_path, rule, {"board": {"seeds": [0, 1], "steps": 5}}) as run:
        assert run.resumed and run.stored["config"]["board"]["seeds"] == [0]
    with pytest.raises(ValueError, match=r"board.steps: 5 -> 6 \(new folder\)"), \
            open_run(tmp_path, rule, {"board": {"seeds": [0], "steps": 6}}):
        pass
    with pytest.raises(ValueError, match="a `posenc compare` run folder"), \
            open_run(tmp_path, RunRule("compare", ()), {"board": {"seeds": [0], "steps": 5}}):
        pass


def test_a_folder_from_before_a_setting_existed_continues_at_its_old_value(tmp_path):
    """A compare folder written before trainer.compile existed resumes when asked at the value it computed with
    (False), and is refused, naming the key, when asked to change it."""
    rule = RunRule("compare", keeps_results=(), hint="new folder")
    with open_run(tmp_path, rule, {"trainer": {"lr": 0.1}}):  # run.json of a folder from before the setting
        pass
    with open_run(tmp_path, rule, {"trainer": {"lr": 0.1, "compile": False}}) as run:
        assert run.resumed
    with pytest.raises(ValueError, match=r"trainer.compile: False -> True"), \
            open_run(tmp_path, rule, {"trainer": {"lr": 0.1, "compile": True}}):
        pass


def test_a_continuation_adds_its_wall_time_to_the_earlier_sessions(tmp_path):
    rule = RunRule("train", keeps_results=())
    (tmp_path / "run.json").write_text(json.dumps({"command": "train", "config": {}, "corpus": None,
                                                   "wall_seconds": 100.0, "forked_from": {"step": 3}}))
    with open_run(tmp_path, rule, {}) as run:
        assert run.wall_seconds >= 100.0
    record = json.loads((tmp_path / "run.json").read_text())
    assert record["wall_seconds"] >= 100.0 and record["forked_from"] == {"step": 3}  # a study's own keys stay


# `posenc ARGV...` that stops itself (SIGSTOP) as soon as the file argv[1] (the sign of its first saved work)
# appears, until the test's SIGKILL: the kill lands after a known part of the work, not wherever a 0.1 s poll
# found the run, so the run can be short (it was 300 steps a unit, 1,000 for train, to outlast the poll).
FROZEN_AT_SAVED_WORK = """
import os, signal, sys, threading, time
from pathlib import Path
from posenc.cli import main
sign = Path(sys.argv[1])
def freeze():
    while not sign.exists():
        time.sleep(0.001)
    os.kill(os.getpid(), signal.SIGSTOP)
threading.Thread(target=freeze, daemon=True).start()
sys.exit(main(sys.argv[2:]))
"""


# command -> (argv on a folder, the file whose presence says some of the work is saved, what a finished run holds)
KILLED = {
    "compare": (lambda d: ["compare", *COMPARE, "compare.schemes=[alibi,rope,none]", "trainer.max_steps=20",
                           "--run-dir", d],
                "results.json",
                lambda d: len(json.loads((d / "results.json").read_text())["units"]) == 3),
    "tasks": (lambda d: ["tasks", *TASKS, "leaderboard.schemes=[rope,alibi,none]", "leaderboard.seeds=[0]",
                         "trainer.max_steps=20", "--run-dir", d],
              "results.json",
              lambda d: json.loads((d / "results.json").read_text())["complete"]),
    "train": (lambda d: ["train", *TINY, "trainer.max_steps=40", "trainer.checkpoint_interval=10", "--run-dir", d],
              "checkpoints/latest",
              lambda d: (d / "train.json").is_file()
              and json.loads((d / "train.json").read_text())["history"][-1]["step"] == 40),
}


@pytest.mark.parametrize("command", list(KILLED))
def test_a_killed_run_resumes_and_keeps_its_wall_time(command, tmp_path, capsys):
    folder = tmp_path / "run"
    argv, sign, finished = KILLED[command]
    child = subprocess.Popen([sys.executable, "-c", FROZEN_AT_SAVED_WORK, folder / sign, *argv(folder)], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for((folder / sign).exists, "saved work", child)
    kill(child)
    assert not finished(folder), "the run ended before the kill"
    killed_at = wall(folder)
    assert killed_at > 0  # the time of the finished work survived SIGKILL
    if command == "compare":  # one unit at a time: the session lasted at least as long as its finished units
        assert killed_at >= sum(u["seconds"] for u in json.loads((folder / "results.json").read_text())["units"])
    code, _, err = cli(capsys, *argv(folder))
    assert code == 0, err
    assert finished(folder) and wall(folder) > killed_at


# `posenc extend` on the tiny model that stops in its second method's perplexities, its first row saved, until
# the test's SIGKILL: the kill lands after a known amount of saved work, not at a time.
EXTEND_STALLED = """
import sys, time
from pathlib import Path
from posenc.cli import main
from posenc.experiments.extend import perplexity, run
from tests.experiments.test_extend import tiny_extend_model
run.load_model = tiny_extend_model
real, calls = perplexity.perplexities, []
def perplexities(*args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        Path(sys.argv[1]).touch()
        time.sleep(600)
    return real(*args, **kwargs)
perplexity.perplexities = perplexities
sys.exit(main(sys.argv[2:]))
"""


def test_a_killed_extend_run_resumes_and_keeps_its_wall_time(tmp_path, capsys, monkeypatch):
    """Also issue 24, item 2: the resume computes only what the killed run had not saved."""
    import posenc.experiments.extend.perplexity as extend_perplexity
    from posenc.experiments.extend import run as extend_run

    out, stalled = tmp_path / "runs", tmp_path / "stalled"
    argv = ["extend", "--quick", "--scalings", "none,linear,yarn", "--out-dir", out, "passkey.lengths=[400]"]
    child = subprocess.Popen([sys.executable, "-c", EXTEND_STALLED, stalled, *argv], cwd=ROOT,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wait_for(stalled.exists, "saved work", child)
    kill(child)
    (folder,) = out.iterdir()
    assert not (folder / "results.json").exists(), "the run ended before the kill"
    killed_at = wall(folder)
    assert killed_at > 0
    saved = json.loads((folder / "progress.json").read_text())["ppl"]
    assert list(saved) == ["none"]  # the first method's row, saved before the second began
    computed: list[str] = []
    real = extend_perplexity.perplexities
    monkeypatch.setattr(extend_perplexity, "perplexities",
                        lambda model, method, *a, **k: computed.append(method) or real(model, method, *a, **k))
    monkeypatch.setattr(extend_run, "load_model", tiny_extend_model)
    code, _, err = cli(capsys, "extend", "--resume", folder)
    assert code == 0, err
    assert (folder / "results.json").is_file() and wall(folder) > killed_at
    rows = json.loads((folder / "progress.json").read_text())["ppl"]
    assert len(computed) == len(rows) - len(saved)  # the rows saved before the kill were not computed again
    assert all(rows[name] == row for name, row in saved.items())


WORKERS = """
import sys
from pathlib import Path
from posenc.experiments.training.parallel import run_units
from tests.experiments.test_run_folders import sleep_forever
run_units(sleep_forever, [Path(sys.argv[1])] * 2, 2)
"""


STOPPED_WORKERS = """
import sys
from pathlib import Path
from posenc.errors import Interrupted
from posenc.experiments.training import parallel
from posenc.stop_signals import sigterm_as_ctrl_c
from tests.experiments import test_run_folders
parallel.GRACE_SECONDS = 1.0
with sigterm_as_ctrl_c():
    try:
        parallel.run_units(getattr(test_run_folders, sys.argv[2]), [Path(sys.argv[1])] * 2, 2)
    except Interrupted:
        (Path(sys.argv[1]) / "stopped").touch()
"""


def ignore_sigterm_forever(folder: Path) -> None:
    """A unit that goes on after SIGTERM (as a training loop's unit that saved its step and went on to evaluate)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sleep_forever(folder)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
@pytest.mark.parametrize("unit", ["sleep_forever", "ignore_sigterm_forever"])
@pytest.mark.slow
def test_sigterm_stops_the_units_in_flight_instead_of_waiting_for_them(tmp_path, unit):
    """A time limit's SIGTERM reaches the parent only; it used to wait for every running unit to finish (here:
    600 s) and then drop its result. Now the workers get SIGTERM, and those that go on are killed after the
    grace time (1 s here); the parent ends."""
    parent = subprocess.Popen([sys.executable, "-c", STOPPED_WORKERS, str(tmp_path), unit], cwd=ROOT,
                              stderr=subprocess.PIPE)
    wait_for(lambda: len(list(tmp_path.glob("worker-*"))) == 2, "two running workers", parent)
    workers = [int(p.name.removeprefix("worker-")) for p in tmp_path.glob("worker-*")]
    parent.send_signal(signal.SIGTERM)
    wait_for(lambda: parent.poll() is not None, "end of the parent after SIGTERM")
    assert (tmp_path / "stopped").exists(), parent.stderr.read().decode()[-2000:]
    wait_for(lambda: not any(alive(pid) for pid in workers), "end of the stopped workers")


def sleep_forever(folder: Path) -> None:
    """A unit that never ends (run in a spawned worker): it says which process it is, then sleeps."""
    (folder / f"worker-{os.getpid()}").touch()
    time.sleep(600)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent that no longer exists to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_workers_end_when_the_process_that_started_them_is_killed(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", WORKERS, str(tmp_path)], cwd=ROOT, stderr=subprocess.PIPE)
    wait_for(lambda: len(list(tmp_path.glob("worker-*"))) == 2, "two running workers", parent)
    workers = [int(p.name.removeprefix("worker-")) for p in tmp_path.glob("worker-*")]
    assert all(alive(pid) for pid in workers)
    kill(parent)
    wait_for(lambda: not any(alive(pid) for pid in workers), "end of the orphaned workers")


def test_a_folder_holding_only_a_killed_atomic_writes_temp_file_opens_as_new(tmp_path):
    """A SIGKILL inside the first run.json write leaves `.run.json.XXXX.tmp` and nothing else: the folder is
    posenc's, not a stranger's; opening it again starts the run (the leftover goes) instead of refusing it."""
    from posenc.errors import ConfigError

    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".run.json.k3j9.tmp").write_text("{")
    with open_run(folder, RunRule("compare", keeps_results=()), {"seed": 1}) as run:
        assert run.path == folder
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]
    stranger = tmp_path / "other"
    stranger.mkdir()
    (stranger / ".run.json.k3j9.tmp").write_text("{")
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="did not write"), open_run(stranger, RunRule("compare", keeps_results=()),
                                                                     {"seed": 1}):
        pass
    assert (stranger / ".run.json.k3j9.tmp").exists()  # a folder with other files is left as it was
