"""Trainer options no other test ran: bf16 autocast trains, gradient accumulation changes memory and
nothing else (and resumes exactly), checkpoint pruning keeps the configured number, TensorBoard
writes event files (or is refused up front when the package is missing), torch.compile trains the same."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from posenc.data.tokens import sample_batch
from posenc.experiments.config.training_run import load_config
from posenc.experiments.runs import checkpoint
from posenc.experiments.training import language_model as train_module
from posenc.experiments.training.language_model import train
from tests.experiments.test_train import TINY


def run(tmp_path, name: str, *overrides: str):
    return train(load_config(None, [*TINY, *overrides]), tmp_path / name)


def assert_same_weights(a: torch.nn.Module, b: torch.nn.Module, atol: float) -> None:
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=atol, msg=name)


def test_bf16_trains_a_repeated_batch_with_finite_falling_loss_close_to_fp32(tmp_path, monkeypatch):
    fixed = {}

    def same_batch(tokens, batch_size, seq_len, generator, first=()):
        return fixed.setdefault((batch_size, seq_len), sample_batch(tokens, batch_size, seq_len,
                                                                    torch.Generator().manual_seed(0), first))

    monkeypatch.setattr(train_module, "sample_batch", same_batch)
    steps = ["trainer.max_steps=6", "trainer.checkpoint_interval=6", "trainer.lr=3e-3"]
    bf16 = [h["loss"] for h in run(tmp_path, "bf16", *steps, "trainer.precision=bf16").history]
    fp32 = [h["loss"] for h in run(tmp_path, "fp32", *steps).history]
    assert all(map(torch.isfinite, torch.tensor(bf16)))
    assert bf16[-1] < bf16[0] - 0.1, bf16
    assert bf16 == pytest.approx(fp32, abs=0.05)  # the same training, in lower precision
    assert bf16 != fp32  # and autocast was really on: bf16 rounding shows in the losses


def test_gradient_accumulation_gives_the_same_updates_as_one_batch(tmp_path):
    steps = ["trainer.max_steps=3", "trainer.checkpoint_interval=3", "trainer.batch_size=8"]
    whole = run(tmp_path, "whole", *steps, "trainer.grad_accum=1")
    accumulated = run(tmp_path, "accumulated", *steps, "trainer.grad_accum=2")
    assert [h["loss"] for h in accumulated.history] == pytest.approx([h["loss"] for h in whole.history], abs=1e-5)
    assert_same_weights(accumulated.model, whole.model, atol=1e-5)


def test_resume_with_gradient_accumulation_equals_an_uninterrupted_run(tmp_path):
    steps = ["trainer.max_steps=6", "trainer.grad_accum=4"]
    full = run(tmp_path, "full", *steps, "trainer.checkpoint_interval=6")
    run(tmp_path, "cut", *steps, "trainer.checkpoint_interval=3")
    (tmp_path / "cut" / "checkpoints" / "latest").write_text("step-00000003")  # as if it died after step 3
    resumed = run(tmp_path, "cut", *steps, "trainer.checkpoint_interval=3")
    assert [h["loss"] for h in resumed.history] == pytest.approx([h["loss"] for h in full.history], abs=1e-6)
    assert_same_weights(resumed.model, full.model, atol=1e-6)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_a_compiled_training_step_trains_as_the_eager_one(tmp_path, monkeypatch, scheme):
    """trainer.compile=true: the step runs under torch.compile (here with the aot_eager backend: the graphs Inductor
    would compile, without its C++ build), the same losses and weights; the checkpoint holds the model's own names
    (no compiled wrapper's prefix), so an eager run loads it."""
    graphs = []  # the graphs the compiler was handed: the compiled step really ran

    def counting(graph, example_inputs):
        graphs.append(graph)
        return torch._dynamo.lookup_backend("aot_eager")(graph, example_inputs)

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda module, **options: real_compile(module, backend=counting, **options))
    steps = ["trainer.max_steps=3", "trainer.checkpoint_interval=3", f"model.position_embedding_type={scheme}"]
    eager = run(tmp_path, "eager", *steps)
    assert not graphs
    fast = run(tmp_path, "compiled", *steps, "trainer.compile=true")
    assert graphs
    assert [h["loss"] for h in fast.history] == pytest.approx([h["loss"] for h in eager.history], abs=1e-5)
    assert_same_weights(fast.model, eager.model, atol=1e-5)
    checkpoint.load(checkpoint.latest(tmp_path / "compiled"), eager.model)  # strict: every name the model's own
    assert_same_weights(eager.model, fast.model, atol=0)


def test_compile_takes_a_boolean(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.compile"):
        run(tmp_path, "run", "trainer.compile=fast")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("keep", [1, 3])
def test_checkpoint_pruning_keeps_exactly_the_configured_number(tmp_path, keep):
    run(tmp_path, "run", "trainer.max_steps=5", "trainer.checkpoint_interval=1", f"trainer.keep_checkpoints={keep}",
        "trainer.eval_interval=5")
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*"))
    assert kept == [f"step-{s:08d}" for s in range(6 - keep, 6)]
    assert checkpoint.latest(tmp_path / "run").name == "step-00000005"


TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.mark.skipif(not TENSORBOARD, reason="the tensorboard package is not installed (pip install tensorboard)")
def test_tensorboard_writes_event_files_with_the_losses(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = run(tmp_path, "run", "trainer.max_steps=4", "trainer.checkpoint_interval=4", "trainer.tensorboard=true")
    events = list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))
    assert events
    scalars = EventAccumulator(str(events[0].parent)).Reload()
    logged = [e.value for e in scalars.Scalars("loss")]
    assert logged == pytest.approx([h["loss"] for h in result.history], rel=1e-6)


def test_tensorboard_without_the_package_is_refused_before_any_step(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if the package were missing
    with pytest.raises(ValueError, match=r"trainer.tensorboard=True.*install the `tensorboard` package"):
        run(tmp_path, "run", "trainer.max_steps=2", "trainer.tensorboard=true")
    assert not (tmp_path / "run").exists()
