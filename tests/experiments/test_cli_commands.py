"""Commands no other test checks the results of: `posenc list` shows every registered scheme with the
family and flags of its class; `posenc eval`'s perplexities and shift losses equal NLLs computed here
straight from the checkpoint's weights; `posenc bench` hands its options to the harness."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

import posenc
from posenc.data.tokens import byte_tokens, load_corpus, split
from posenc.experiments.config.training_run import load_config
from posenc.models import GPT
from posenc.registry import SCHEMES, option_fields
from tests.experiments.cli_helpers import TINY, cli
from tests.experiments.test_perplexity_windows import sliding_reference


def test_list_shows_every_scheme_with_its_class_family_and_flags(capsys):
    code, out, _ = cli(capsys, "list")
    assert code == 0
    rows = {}
    for line in out.splitlines()[1:]:
        name, family, positions, stacks, *options = line.split(maxsplit=4)
        assert name not in rows, f"{name} listed twice"
        rows[name] = (family, positions, stacks, options[0] if options else "")
    assert sorted(rows) == posenc.available()
    for name, (family, positions, stacks, options) in rows.items():
        cls = SCHEMES[name]
        assert family == Path(inspect.getfile(cls)).parent.name, name  # the folder its file lives in
        assert family in {"absolute", "rotary", "bias", "content"}, name
        assert positions == ("shift-invariant" if cls.shift_invariant else "absolute"), name
        assert set(stacks.split("/")) == {s for s, ok in (("causal", cls.supports_causal),
                                                          ("bidirectional", cls.supports_bidirectional)) if ok}, name
        assert options == (", ".join(option_fields(cls)) or "-"), name


RUN = [*TINY, "model.position_embedding_type=sinusoidal", "trainer.max_steps=3", "trainer.checkpoint_interval=3"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    code = posenc.cli.main(["train", "--run-dir", str(run_dir), *RUN])
    assert code == 0
    return run_dir


def independent_model_and_text(run_dir: Path) -> tuple[GPT, torch.Tensor]:
    """The model from the same overrides and the newest checkpoint's tensors; the validation bytes."""
    cfg = load_config(None, RUN)
    model = GPT(cfg.model)
    step = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    state = load_file(str(step / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)  # a tied table is stored once
    assert not unexpected and set(missing) <= {"wte.weight", "lm_head.weight"}
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    _, val = split(byte_tokens(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
    return model.eval(), val


def written_file(out: str) -> Path:
    """The eval results file the command printed (eval.json, eval-2.json, ...: tests share one run)."""
    return Path(out.strip().splitlines()[-1].removeprefix("results: "))


@torch.no_grad()
def mean_nll(model: GPT, tokens: torch.Tensor, length: int, windows: int, offset: int = 0) -> float:
    batch = torch.stack([tokens[i * length : i * length + length + 1] for i in range(windows)])  # (W,L+1)
    logits = model(batch[:, :-1], position_ids=torch.arange(offset, offset + length).expand(windows, length))
    return F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).item()


def test_eval_perplexity_and_shift_loss_equal_nll_computed_from_the_checkpoint(capsys, trained):
    code, out, err = cli(capsys, "eval", trained, "eval.length_multipliers=[1,2]", "eval.max_windows=3",
                         "eval.shift_offsets=[0,10]")
    assert code == 0, err
    results = json.loads(written_file(out).read_text())
    model, val = independent_model_and_text(trained)
    # every length scores the same text: 3 windows of the longest length (32), i.e. 6 windows of 16
    for length, windows in ((16, 6), (32, 3)):
        assert results["ppl_by_length"][str(length)] == pytest.approx(
            math.exp(mean_nll(model, val, length, windows)), rel=1e-5)
    for offset in (0, 10):  # the shift test scores up to 8 windows of the trained length
        assert results["shift_loss"][str(offset)] == pytest.approx(mean_nll(model, val, 16, 8, offset), rel=1e-5)
    assert results["shift_loss"]["0"] != pytest.approx(results["shift_loss"]["10"], rel=1e-4)  # sinusoidal moved


def test_eval_sliding_mode_equals_the_sliding_reference(capsys, trained):
    code, out, err = cli(capsys, "eval", trained, "eval.mode=sliding", "eval.stride=5", "eval.max_windows=4",
                         "eval.length_multipliers=[1]", "eval.shift_offsets=[0]")
    assert code == 0, err
    model, val = independent_model_and_text(trained)
    ppl = json.loads(written_file(out).read_text())["ppl_by_length"]["16"]
    # the scored text is max_windows windows of the longest length: 4 x 16 tokens (+1 for the last target)
    assert ppl == pytest.approx(sliding_reference(model, val[: 4 * 16 + 1], 16, 5, 10**6), rel=1e-5)


def test_bench_passes_options_that_come_first_to_the_harness(capsys, monkeypatch):
    """`posenc bench --quick --out D` used to stop at argparse ("unrecognized arguments")."""
    import benchmarks.run

    seen = []
    monkeypatch.setattr(benchmarks.run, "main", lambda argv: seen.append(argv) or 0)
    assert cli(capsys, "bench", "--quick", "--out", "/somewhere", "--sections", "rope")[0] == 0
    assert cli(capsys, "bench")[0] == 0
    assert seen == [["--quick", "--out", "/somewhere", "--sections", "rope"], []]


@pytest.mark.slow
def test_bench_quick_runs_every_section_and_writes_its_files(capsys, tmp_path):
    code, _, err = cli(capsys, "bench", "--quick", "--out", tmp_path)
    assert code == 0, err
    from benchmarks.machine import isa

    results = json.loads((tmp_path / "benchmarks" / f"results-quick-cpu-{isa()}.json").read_text())
    assert results["quick"] is True
    for section in ("train", "forward", "attention", "decode", "rope"):
        assert results[section], f"section {section} is empty"
    text = (tmp_path / "BENCHMARKS-quick.md").read_text()
    assert text.startswith("# posenc benchmarks")
    assert f"## CPU: {isa().upper()}, " in text and results["machine"]["cpu"] in text  # the machine is named
