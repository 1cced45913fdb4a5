"""Training: deterministic data, exact resume after an interruption, DDP equals one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from posenc.data.tokens import batch_generator, byte_tokens, load_corpus, sample_batch, split
from posenc.experiments.config.training_run import load_config
from posenc.experiments.runs import checkpoint
from posenc.experiments.training.language_model import lr_at, prepare, train
from posenc.experiments.training.loop import optimizer_step

TINY = ["model.n_layer=2", "model.d_model=32", "model.n_head=2", "data.seq_len=32", "trainer.batch_size=8",
        "trainer.warmup_steps=2", "trainer.eval_interval=4", "trainer.eval_batches=2", "trainer.progress=false",
        "model.position_embedding_type=alibi"]


def test_corpus_and_batches_are_deterministic():
    a, b = load_corpus("python_docs"), load_corpus("python_docs")
    assert a.sha256 == b.sha256 and len(a.text) > 100_000
    train_tokens, val_tokens = split(byte_tokens(a.text), 0.1)
    assert len(val_tokens) == len(byte_tokens(a.text)) - len(train_tokens)
    x1, _ = sample_batch(train_tokens, 4, 16, batch_generator(0, 5))
    x2, _ = sample_batch(train_tokens, 4, 16, batch_generator(0, 5))
    x3, _ = sample_batch(train_tokens, 4, 16, batch_generator(0, 6))
    assert torch.equal(x1, x2) and not torch.equal(x1, x3)


def test_learning_rate_schedule_warms_up_then_decays_to_floor():
    cfg = load_config(None, ["trainer.max_steps=100", "trainer.warmup_steps=10", "trainer.lr=1.0",
                             "trainer.min_lr=0.1"]).trainer
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(55, cfg) == pytest.approx(0.55) and lr_at(100, cfg) == pytest.approx(0.1)


@pytest.mark.parametrize("scheme", ["relative", "kerple"])
def test_bias_scalars_get_their_own_learning_rate_and_no_decay(scheme):
    """trainer.bias_lr_scale multiplies the lr of a scheme's per-head logit scalars, and only theirs."""
    cfg = load_config(None, [*TINY, f"model.position_embedding_type={scheme}", "trainer.bias_lr_scale=10"])
    run = prepare(cfg)
    scheme_params = {id(p) for p in run.model.schemes.parameters()}
    assert scheme_params
    scaled = [g for g in run.opt.param_groups if g.get("lr_scale", 1.0) != 1.0]
    assert len(scaled) == 1 and {id(p) for p in scaled[0]["params"]} == scheme_params
    assert scaled[0]["weight_decay"] == 0.0 and scaled[0]["lr_scale"] == 10
    others = {id(p) for g in run.opt.param_groups if g is not scaled[0] for p in g["params"]}
    assert not others & scheme_params

    def backward(step):
        loss = run.model(run.train_tokens[None, :32]).float().square().mean()
        loss.backward()
        return loss.item()

    before = {id(p): p.detach().clone() for p in run.model.schemes.parameters()}
    optimizer_step(run.model, run.opt, cfg.trainer, 3, 0, backward)
    for group in run.opt.param_groups:
        assert group["lr"] == pytest.approx(lr_at(3, cfg.trainer) * group.get("lr_scale", 1.0))
    # Adam's first step moves every parameter with a gradient by about its group's lr
    moved = max(float((p.detach() - before[id(p)]).abs().max()) for p in run.model.schemes.parameters())
    assert moved == pytest.approx(10 * lr_at(3, cfg.trainer), rel=0.05)


def test_learned_position_tables_keep_the_common_learning_rate():
    """learned_absolute's rows are embeddings, not logit scalars: x10 on them cost perplexity (6.08 -> 6.68)."""
    cfg = load_config(None, [*TINY, "model.position_embedding_type=learned_absolute", "trainer.bias_lr_scale=10"])
    opt = prepare(cfg).opt
    assert len(opt.param_groups) == 2 and all("lr_scale" not in g for g in opt.param_groups)


def test_resume_after_interruption_equals_uninterrupted_training(tmp_path):
    full = train(load_config(None, [*TINY, "trainer.max_steps=8", "trainer.checkpoint_interval=8"]), tmp_path / "a")
    # Interrupted at step 4 (the checkpoint), then resumed in a fresh process-equivalent call.
    train(load_config(None, [*TINY, "trainer.max_steps=8", "trainer.checkpoint_interval=4"]), tmp_path / "b")
    ckpt_dir = tmp_path / "b" / "checkpoints"
    (ckpt_dir / "latest").write_text("step-00000004")  # as if the run had died right after step 4
    resumed = train(load_config(None, [*TINY, "trainer.max_steps=8", "trainer.checkpoint_interval=4"]), tmp_path / "b")
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in full.history], abs=1e-6)
    for (name, p), (_, q) in zip(full.model.state_dict().items(), resumed.model.state_dict().items(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)


def test_corrupt_checkpoint_is_a_clear_error_naming_the_file(tmp_path):
    train(load_config(None, [*TINY, "trainer.max_steps=2", "trainer.checkpoint_interval=2"]), tmp_path)
    last = checkpoint.latest(tmp_path)
    data = (last / "model.safetensors").read_bytes()
    (last / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=f"checkpoint {last}"):
        train(load_config(None, [*TINY, "trainer.max_steps=2", "trainer.checkpoint_interval=2"]), tmp_path)


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_on_the_same_global_batch(tmp_path):
    overrides = [*TINY, "trainer.max_steps=3", "trainer.checkpoint_interval=3", "trainer.grad_accum=2"]
    single = train(load_config(None, overrides), tmp_path / "single")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "posenc.cli",
           "train", "--run-dir", str(tmp_path / "ddp"), *overrides]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=300)
    ddp_history = json.loads((tmp_path / "ddp" / "train.json").read_text())["history"]
    assert [h["loss"] for h in ddp_history] == pytest.approx([h["loss"] for h in single.history], abs=1e-5)


def test_files_are_never_half_written(tmp_path):
    from posenc.atomic_files import atomic_write

    target = tmp_path / "report.json"
    target.write_text("old")

    def crash(tmp: Path) -> None:
        tmp.write_text("half")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, crash)
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


@pytest.mark.slow
def test_ctrl_c_under_torchrun_stops_every_rank_after_the_same_step_and_saves(tmp_path):
    """Issue 24, item 9: Ctrl-C reaches torchrun and both workers (the terminal signals the whole process
    group; the agent then forwards it again). Every rank stops after the same step (no rank left waiting
    in an all-reduce), rank 0 saves it and the run is recorded as interrupted, so it resumes."""
    import re
    import signal
    import threading
    import time

    from posenc.experiments.runs import checkpoint

    run_dir = tmp_path / "ddp"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # rank 0's progress bar on stderr says how many steps ran: the Ctrl-C comes after a few, not after 3 s of them
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "posenc.cli",
           "train", "--run-dir", str(run_dir), *TINY, "trainer.max_steps=1000000",
           "trainer.checkpoint_interval=1000000", "trainer.progress=true"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    stderr = bytearray()

    def drain() -> None:
        for chunk in iter(lambda: os.read(proc.stderr.fileno(), 4096), b""):
            stderr.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    steps = lambda: max(map(int, re.findall(rb"(\d+)/1000000", bytes(stderr))), default=0)
    deadline = time.monotonic() + 120
    while steps() < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("a rank hung after Ctrl-C")
    reader.join()
    err = stderr.decode(errors="replace")
    record = json.loads((run_dir / "train.json").read_text())
    assert record["status"] == "interrupted", err
    step = record["history"][-1]["step"]
    assert checkpoint.latest(run_dir).name == f"step-{step:08d}"
    assert f"interrupted at step {step}" in err
