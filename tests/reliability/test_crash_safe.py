"""Crash safety and safe loading: SIGKILL mid-checkpoint then resume equals an uninterrupted run; a pickled
payload in a checkpoint is refused, not executed; a corrupt file is named in the error."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from posenc.cli import main
from posenc.errors import RunFailed
from posenc.experiments.config.training_run import load_config
from posenc.experiments.runs import checkpoint
from posenc.experiments.training.language_model import train
from tests.experiments.test_train import TINY

ROOT = Path(__file__).resolve().parents[2]
KILL_RUN = [*TINY, "trainer.max_steps=20", "trainer.checkpoint_interval=5"]


# `posenc train` that SIGKILLs itself half-way through writing its third checkpoint (step 15): the
# model file is in the temp folder, the optimizer's is not, nothing is renamed. A kill at a known
# point, not a race against a clock.
KILLED_MID_WRITE = """
import os, signal, sys
from posenc.cli import main
from posenc.experiments.runs import checkpoint
real, calls = checkpoint.save_file, []
def save_file(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(*args, **kwargs)
checkpoint.save_file = save_file
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_sigkill_mid_checkpoint_then_resume_gives_the_same_final_loss(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["train", "--run-dir", str(tmp_path / "killed"), *KILL_RUN]
    died = subprocess.run([sys.executable, "-c", KILLED_MID_WRITE, *args], env=env, cwd=ROOT, capture_output=True)
    assert died.returncode == -signal.SIGKILL, died.stderr.decode()[-2000:]
    last = checkpoint.latest(tmp_path / "killed")
    assert last is not None, "the run died before its first checkpoint"
    assert json.loads((last / "state.json").read_text())["step"] == 10
    assert list((tmp_path / "killed" / "checkpoints").glob(".tmp-*")), "the kill left no half-written folder"
    # `posenc train` resumes from the folder alone: in this process (another interpreter adds 4 s of imports)
    assert main(["train", "--run-dir", str(tmp_path / "killed"), *KILL_RUN]) == 0
    assert not list((tmp_path / "killed" / "checkpoints").glob(".tmp-*"))  # swept on resume
    reference = train(load_config(None, KILL_RUN), tmp_path / "clean")
    resumed = json.loads((tmp_path / "killed" / "train.json").read_text())["history"]
    assert len(resumed) == 20
    assert abs(resumed[-1]["loss"] - reference.history[-1]["loss"]) < 1e-6


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_pickled_payload_in_a_checkpoint_is_refused_not_executed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train(load_config(None, [*TINY, "trainer.max_steps=2", "trainer.checkpoint_interval=2"]), tmp_path / "run")
    last = checkpoint.latest(tmp_path / "run")
    (last / "model.safetensors").write_bytes(pickle.dumps(_Payload()))
    with pytest.raises(checkpoint.CheckpointError, match=str(last)):
        train(load_config(None, [*TINY, "trainer.max_steps=2", "trainer.checkpoint_interval=2"]), tmp_path / "run")
    assert not (tmp_path / "pwned").exists()


def test_no_module_unpickles_weights():
    """Any torch.load in the package must pass weights_only=True."""
    for path in (ROOT / "posenc").rglob("*.py"):
        for line in path.read_text().splitlines():
            if "torch.load(" in line:
                assert "weights_only=True" in line, f"{path}: {line.strip()}"


def test_a_new_checkpoint_never_replaces_the_last_good_one_until_complete(tmp_path, monkeypatch):
    cfg = load_config(None, [*TINY, "trainer.max_steps=4", "trainer.checkpoint_interval=2"])
    train(cfg, tmp_path)
    shutil.rmtree(tmp_path / "checkpoints" / "step-00000004")  # as if killed before the step-4 checkpoint
    (tmp_path / "checkpoints" / "latest").write_text("step-00000002")
    good = checkpoint.latest(tmp_path)

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_file", boom)
    with pytest.raises(RunFailed, match="disk full"):
        train(cfg, tmp_path)
    assert checkpoint.latest(tmp_path) == good and (good / "model.safetensors").is_file()
    assert not [p for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith(".tmp")]
