"""`posenc extend`: the prefix trick is exact, frequency groups and passkey answers are shared where
tables are equal, a run resumes without redoing work, every scaling name and preset is accepted,
bad options fail early in one line, and the quick run on the real SmolLM2 GGUF writes its files."""

from __future__ import annotations

import json
import math
import os
import signal
import time

import pytest
import torch
import torch.nn.functional as F

from posenc.cli import main as cli_main
from posenc.cli import parser
from posenc.experiments.config import loader as config_loader
from posenc.experiments.extend.config import ExtendConfig, presets
from posenc.experiments.extend.flags import config_from_args
from posenc.experiments.extend.methods import Method
from posenc.experiments.extend.passkey import cells, run_passkey
from posenc.experiments.extend.passkey_prompts import PromptBuilder
from posenc.experiments.extend.perplexity import NllMemo, perplexities, planned_tokens
from posenc.experiments.extend.progress import RunState
from posenc.experiments.extend.scalings import PRESETS
from posenc.models import Llama, LlamaConfig
from tests.conftest import smollm2_gguf


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def update(self, n: int) -> None:
        self.n += n

    def set_description(self, text: str) -> None:
        pass


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def tiny_llama(vocab: int = 61, trained: int = 64) -> Llama:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, n_layer=2, n_head=4, n_kv_head=2, d_model=32, ffn_hidden_size=64,
                      max_seq_len=trained)
    return Llama(cfg).eval()


class AsciiTokenizer(CharTokenizer):
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) % 128 for c in text]  # any corpus character inside the tiny model's 128 tokens


def tiny_extend_model(cfg: ExtendConfig | None = None) -> Llama:
    """extend's load_model for a test of the run's machinery (folders, stops, resumes), not of a model: a two-layer
    Llama (trained context 64) and a character tokenizer, whose whole --quick sweep takes a second where a
    SmolLM2 load alone took 10 (passkey prompts need passkey.lengths=[400]: the instructions are 300 characters)."""
    model = tiny_llama(vocab=128, trained=64)
    model._tokenizer = AsciiTokenizer()
    return model


def direct_ppl(model: Llama, ids: torch.Tensor) -> float:
    """exp(mean NLL of tokens 1..T-1) from one plain forward: no token_nll, no chunking, no memo."""
    logits = model(ids)[0, :-1].double()  # (T-1,V)
    return math.exp(F.cross_entropy(logits, ids[0, 1:]).item())


def test_prefix_of_a_long_forward_equals_a_short_forward():
    model, ids = tiny_llama(), torch.randint(0, 61, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = Method("none", None, None, 0)
        ppl = perplexities(model, plain, [32, 128], NllMemo(ids, Counter()))  # 32 is served by the 128 forward
        assert ppl[32]["ppl"] == pytest.approx(direct_ppl(model, ids[:, :32]), rel=1e-5)
        assert ppl[128]["ppl"] == pytest.approx(direct_ppl(model, ids), rel=1e-5)
        assert ppl[32]["ppl"] != pytest.approx(ppl[128]["ppl"], rel=1e-3)  # two different token sets


def test_dynamic_shares_forwards_with_none_inside_the_trained_length():
    cfg = flat_config(lengths=(16, 32, 64, 128), scalings=("none", "dynamic"), windows=2, task="ppl")
    # none: one 128 forward; dynamic equals none up to 64 (shared) and differs at 128.
    assert planned_tokens(tiny_llama(), cfg) == (128 + 128) * 2


def flat_config(**options) -> ExtendConfig:
    """A config from the flat keys of earlier versions (aliases of the dotted ones)."""
    return config_loader.build(ExtendConfig, options)


def passkey_setup(tmp_path, scalings, trained):
    model = tiny_llama(vocab=128, trained=trained)
    model._tokenizer = CharTokenizer()  # prompts in characters: only encode/decode are needed
    cfg = flat_config(task="passkey", lengths=(300, 400), scalings=scalings, depths=(0.2, 0.8), trials=2,
                       dtype="float32")
    return model, cfg, PromptBuilder(model.tokenizer.encode), RunState(tmp_path)


def test_passkey_sweep_resumes_without_redoing_prompts(tmp_path):
    model, cfg, builder, state = passkey_setup(tmp_path, ("none", "yarn"), trained=64)
    counter = Counter()
    with torch.no_grad():
        run_passkey(cfg, model, builder, state, counter)
    assert len(state.passkey) == 2 * len(cells(cfg)) == 16
    assert counter.n == 2 * sum(n for n, _, _ in cells(cfg))
    resumed = RunState.load(tmp_path)
    assert resumed.passkey == json.loads(json.dumps(state.passkey))
    again = Counter()
    with torch.no_grad():
        run_passkey(cfg, model, builder, resumed, again)
    assert again.n == 0


def test_passkey_answers_are_shared_where_tables_agree(tmp_path):
    # Prompts inside the trained context: dynamic NTK is plain RoPE there, so it reuses none's answers.
    model, cfg, builder, state = passkey_setup(tmp_path, ("none", "dynamic"), trained=512)
    counter = Counter()
    with torch.no_grad():
        run_passkey(cfg, model, builder, state, counter)
    dynamic = [r for r in state.passkey.values() if r["method"] == "dynamic"]
    assert len(dynamic) == len(cells(cfg)) and all(r["shared_with"] == "none" for r in dynamic)
    assert counter.n == sum(n for n, _, _ in cells(cfg))


def test_trial_tokens_caps_trials_but_keeps_one():
    cfg = flat_config(lengths=(1024, 8192, 32768), trials=4, trial_tokens=16384)
    assert [cfg.trials_at(n) for n in cfg.key_lengths] == [4, 2, 1]


def args(*argv):
    return parser().parse_args(["extend", *argv])


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_scaling_name_is_accepted(name):
    assert config_from_args(args("--scalings", name)).extend.methods == (name,)


def test_default_runs_every_scaling_and_presets_parse():
    assert config_from_args(args()).extend.methods == tuple(PRESETS)
    assert presets() == ["default", "long", "methods", "quick"]
    for preset in presets():
        assert config_from_args(args("--preset", preset)).perplexity.lengths
    long = config_from_args(args("--preset", "long"))
    assert max(long.all_lengths) == 4 * 8192 and long.scaling_factor(8192) == 4.0
    assert config_from_args(args("--preset", "long", "--lengths", "1024")).key_lengths == [1024]


@pytest.mark.parametrize(("argv", "named"), [
    (["--scalings", "yarnn"], "methods"),
    (["--lengths", "1,128"], "lengths"),
    (["--lengths", "abc"], "lengths"),
    (["--windows", "0"], "windows"),
    (["--windows", "two"], "windows"),
    (["--corpus", "wiki"], "corpus"),
    (["--task", "retrieval"], "extend.metric"),  # --task: the old name of --metric
    (["--depths", "0.5,1.5"], "depths"),
    (["--trials", "0"], "trials"),
    (["--dtype", "float16"], "dtype"),
    (["--preset", "huge"], "preset"),
    (["--model", "/nonexistent/model.gguf"], "model"),
    (["--factor", "0.5"], "factor"),
    (["--resume", "/nonexistent/run"], "resume"),
    (["--prefill-chunk", "4k"], "prefill_chunk"),
    (["--trial-tokens", "0"], "trial_tokens"),
])
def test_bad_options_fail_in_one_line_before_the_model_loads(argv, named, capsys):
    assert cli_main(["extend", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and len(err.strip().splitlines()) == 1


@pytest.mark.pretrained
@pytest.mark.slow
def test_quick_run_writes_results(tmp_path, capsys):
    smollm2_gguf()
    assert cli_main(["extend", "--quick", "--scalings", "none,dynamic,yarn", "--out-dir", str(tmp_path)]) == 0
    (run_dir,) = tmp_path.iterdir()
    assert str(run_dir) in capsys.readouterr().out
    for name in ("results.json", "ppl.csv", "ppl_vs_length.png", "passkey.csv", "passkey_summary.csv",
                 "passkey_heatmap.png", "passkey_vs_length.png", "tables.md", "report.html"):
        assert (run_dir / name).stat().st_size > 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["context_length"] == 8192 and results["longest_forward_peak_rss_gib"] > 0
    by_name = {r["method"]: r["ppl_by_length"] for r in results["ppl"]}
    assert all(math.isfinite(s["ppl"]) and s["ppl"] > 1 for row in by_name.values() for s in row.values())
    assert by_name["dynamic"] == by_name["none"]  # 64 and 128 tokens: far inside the trained 8192
    assert {r["method"] for r in results["passkey"]} == {"none", "dynamic", "yarn"}
    record = json.loads((run_dir / "run.json").read_text())  # extend's folder holds run.json like every other
    assert record["command"] == "extend" and record["config"]["extend"]["methods"] == ["none", "dynamic", "yarn"]
    assert record["wall_seconds"] >= results["wall_s"] > 0  # run.json is written last, after the report


def test_a_stopped_run_writes_the_tables_of_what_finished_and_resume_completes_them(tmp_path, monkeypatch, capsys):
    """Ctrl-C (a real SIGINT, sent where passkey starts; SIGTERM takes the same path, tests/reliability/
    test_stop_signals.py) leaves perplexity tables marked incomplete, not only progress.json (issue 36: only
    SIGTERM did); --resume runs the rest and marks the results complete."""
    from posenc.experiments.extend import run as extend_run

    monkeypatch.setattr(extend_run, "load_model", tiny_extend_model)
    real = extend_run.run_passkey

    def stopped(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(30)  # the handler raises at the next bytecode: never reached

    monkeypatch.setattr(extend_run, "run_passkey", stopped)
    assert cli_main(["extend", "--quick", "--scalings", "none,yarn", "--out-dir", str(tmp_path),
                     "passkey.lengths=[400]"]) == 128 + 2
    (run_dir,) = tmp_path.iterdir()
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"] is False and results["passkey"] == []
    assert {r["method"] for r in results["ppl"]} == {"none", "yarn"}
    assert "Stopped before the end" in (run_dir / "tables.md").read_text()
    tables = (run_dir / "tables.md").read_text()
    (run_dir / "tables.md").unlink()
    assert cli_main(["report", str(run_dir)]) == 0  # re-rendered from the folder alone, no model loaded
    assert (run_dir / "tables.md").read_text().split("\n", 1)[1] == tables.split("\n", 1)[1]  # line 1: wall time
    monkeypatch.setattr(extend_run, "run_passkey", real)
    assert cli_main(["extend", "--resume", str(run_dir)]) == 0
    results = json.loads((run_dir / "results.json").read_text())
    assert results["complete"] is True and {r["method"] for r in results["passkey"]} == {"none", "yarn"}
    assert "Stopped before the end" not in (run_dir / "tables.md").read_text()
