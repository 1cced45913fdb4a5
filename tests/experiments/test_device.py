"""trainer.device: the name is checked when the config is built, the machine when a run starts (so a
GPU run's saved config still loads on a CPU machine), and a missing GPU is a ValueError naming the
field before any folder or step exists."""

from __future__ import annotations

import pytest
import torch

from posenc.experiments.compare.config import CompareConfig
from posenc.experiments.config.sections import TrainerConfig, run_device
from posenc.experiments.config.training_run import from_plain, load_config
from posenc.experiments.training.language_model import train
from posenc.experiments.training.scheme_units import preflight_all


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("name", ["gpu", "CUDA", "cuda:", "cuda:x", "", 0, None])
def test_a_device_name_that_is_not_one_of_the_forms_is_refused(name):
    with pytest.raises(ValueError, match=r"trainer\.device=.*cpu, cuda, cuda:N or auto"):
        TrainerConfig(device=name)


def test_auto_is_the_gpu_when_there_is_one_else_the_cpu(no_gpu, monkeypatch):
    assert run_device("auto") == torch.device("cpu")
    assert run_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert run_device("auto") == torch.device("cuda")
    assert run_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match=r"trainer\.device='cuda:2'.*2 CUDA device"):
        run_device("cuda:2")


def test_asking_for_a_gpu_on_a_machine_without_one_fails_before_any_work(no_gpu, tmp_path):
    cfg = load_config(None, ["trainer.device=cuda", "trainer.max_steps=2", "model.n_layer=1", "model.d_model=32",
                             "model.n_head=2", "data.seq_len=16"])
    with pytest.raises(ValueError, match=r"trainer\.device='cuda'.*0 CUDA device"):
        train(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    compare = CompareConfig(trainer=cfg.trainer, data=cfg.data)
    with pytest.raises(ValueError, match=r"trainer\.device='cuda'"):
        preflight_all(compare)


def test_a_gpu_runs_saved_config_loads_on_a_cpu_machine(no_gpu):
    saved = load_config(None, ["trainer.device=cuda:0"]).to_dict()
    assert from_plain(saved).trainer.device == "cuda:0"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
@pytest.mark.parametrize("scheme", ["rope", "alibi", "relative", "learned_absolute", "sinusoidal", "transformer_xl"])
def test_training_and_evaluation_on_a_gpu_match_the_cpu(scheme, tmp_path):
    """Same seed, same batches: the GPU run's losses and perplexity agree with the CPU run's (float32;
    only summation order differs), and the model is on the GPU throughout."""
    from posenc.experiments.config.sections import EvalConfig
    from posenc.experiments.evaluation.perplexity import perplexity_by_length

    base = ["trainer.max_steps=30", "trainer.warmup_steps=3", "trainer.eval_interval=15", "trainer.progress=false",
            "model.n_layer=2", "model.d_model=32", "model.n_head=2", "data.seq_len=32", "trainer.batch_size=8",
            f"model.position_embedding_type={scheme}"]
    runs = {}
    for device in ("cpu", "cuda"):
        cfg = load_config(None, [*base, f"trainer.device={device}"])
        result = train(cfg, tmp_path / device)
        assert next(result.model.parameters()).device.type == device
        tokens = torch.arange(2000) % 251
        runs[device] = ([h["loss"] for h in result.history],
                        perplexity_by_length(result.model, tokens, 32, EvalConfig(length_multipliers=(1, 4),
                                                                                     max_windows=4)))
    (cpu_loss, cpu_ppl), (gpu_loss, gpu_ppl) = runs["cpu"], runs["cuda"]
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-3)
    assert gpu_ppl == pytest.approx(cpu_ppl, rel=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on a GPU machine)")
@pytest.mark.parametrize("scheme", ["alibi", "relative"])
def test_long_inference_on_a_gpu_takes_the_flex_path_and_matches_the_cpu(scheme):
    """1,024 x 1,024 scores per head: on CUDA the bias reaches attention as a flex_attention score_mod."""
    import warnings

    from posenc.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=61, n_layer=1, n_head=4, d_model=64, max_seq_len=2048,
                          position_embedding_type=scheme)).eval()  # head dim 16: flex's smallest
    ids = torch.randint(0, 61, (1, 1024))
    with torch.no_grad():
        cpu = model(ids)
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message="posenc: flex_attention failed")  # it warns, then falls back
            gpu = model.cuda()(ids.cuda()).cpu()
    torch.testing.assert_close(gpu, cpu, rtol=1e-3, atol=1e-3)
