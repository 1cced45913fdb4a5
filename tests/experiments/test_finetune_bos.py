"""Training from a pretrained checkpoint (`posenc train trainer.init_from=gguf:...`, `posenc finetune
finetune.base=gguf:...`) feeds every sequence with the checkpoint's BOS first exactly when its own tokenizer adds one
(posenc.experiments.sequence_start, the rule extend follows): training and validation windows of L positions are
the BOS and L - 1 text tokens with the BOS never a target, passkey rows and prompts begin with it, perplexity windows
too; without a BOS the windows are the ids they always were. The start is recorded and a resume with another is
refused. References are built by hand from the token stream, not read from the code under test."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from posenc.data.tokens import batch_generator, sample_starts, split, target_bytes, windows_at
from posenc.experiments.evaluation.perplexity import total_nll
from posenc.experiments.finetune.mixture import Mixture
from posenc.experiments.finetune.model_source import BYTES
from posenc.experiments.finetune.retrieval import IGNORE, Retrieval
from posenc.experiments.sequence_start import start_record
from tests.conftest import VOCAB, tiny_gpt
from tests.experiments.cli_helpers import cli, one_line

START = 0  # a byte no text below holds: the stand-in BOS of the unit tests
TEXT = " ".join(f"the cat {i} sat on the mat, then the dog {i * 7 % 13} ran." for i in range(160))


@pytest.mark.parametrize("first", [[START], []])
def test_windows_begin_with_the_start_and_never_target_it(first):
    tokens = torch.arange(1, 200)  # (N,) each id its own place + 1, so a target names the text it comes from
    byte_lengths = torch.randint(1, 5, (201,), generator=torch.Generator().manual_seed(0))  # bytes of token id i
    starts, L = [0, 17, 150], 12
    x, y = windows_at(tokens, starts, L, first)  # (3, L) each
    assert x.shape == y.shape == (3, L)
    for row, s in enumerate(starts):
        if first:  # the BOS then L - 1 text tokens in; the L text tokens after each position out
            assert x[row].tolist() == [START, *tokens[s : s + L - 1].tolist()]
            assert y[row].tolist() == tokens[s : s + L].tolist()
        else:  # the windows as they always were: text[s : s + L + 1]
            assert x[row].tolist() == tokens[s : s + L].tolist()
            assert y[row].tolist() == tokens[s + 1 : s + L + 1].tolist()
    assert START not in y.tolist()
    assert target_bytes(byte_lengths[tokens], starts, L, first) == int(byte_lengths[y].sum())


def test_a_window_with_more_than_one_token_before_its_text_is_refused():
    with pytest.raises(ValueError, match=r"^first=\[1, 2\]"):
        windows_at(torch.arange(50), [0], 8, [1, 2])


@pytest.mark.parametrize("mode", ["nonoverlapping", "sliding"])
def test_perplexity_windows_score_the_text_after_the_start(mode):
    model = tiny_gpt("rope")
    text = torch.randint(1, VOCAB, (70,), generator=torch.Generator().manual_seed(1))  # (70,) no START inside
    byte_lengths = torch.randint(1, 4, (70,), generator=torch.Generator().manual_seed(2))
    L, stride = 16, 8
    nats, count, n_bytes = total_nll(model, text, L, mode, stride, max_windows=16, byte_lengths=byte_lengths,
                                     first=[START])
    step = L if mode == "nonoverlapping" else stride
    want, scored = 0.0, []
    with torch.no_grad():
        for i, s in enumerate(range(0, len(text) - L, step)):
            window = torch.cat([torch.tensor([START]), text[s : s + L]])  # (L+1,) the BOS, L text tokens
            logits = model(window[None, :-1]).double()[0]  # (L, V)
            keep = 0 if (mode == "nonoverlapping" or i == 0) else L - stride
            want += F.cross_entropy(logits[keep:], window[keep + 1 :], reduction="sum").item()
            scored += list(range(s + keep, s + L))  # text positions scored: never the BOS
    assert count == len(scored) == len(set(scored)) and scored == sorted(scored)  # every text token at most once
    assert nats == pytest.approx(want, rel=1e-5)
    assert n_bytes == int(byte_lengths[scored].sum())


@pytest.mark.parametrize("start", [[START], []])
def test_passkey_rows_and_prompts_begin_with_the_start_and_score_only_the_answer(start):
    stream = BYTES.stream(TEXT)
    task, plain = Retrieval(BYTES.encode, stream, start), Retrieval(BYTES.encode, stream)
    assert task.shortest == plain.shortest + len(start)
    x, y = task.training_rows(60, 3, random.Random(0))  # (3, 60) each
    assert x.shape == y.shape == (3, 60) and (x[:, : len(start)] == START).all()
    for row in range(3):
        answer = y[row][y[row] != IGNORE]
        assert BYTES.decode(answer.tolist())[-1] == ">" and START not in y[row].tolist()
    for prompt in task.prompts(80, 2, seed=0):
        assert len(prompt.ids) == 81 and prompt.ids[: len(start)] == start and START not in prompt.ids[len(start) :]
        assert f"pass key <{prompt.key}>" in BYTES.decode(prompt.ids)


class Spy(nn.Module):
    """Records what it is fed; uniform logits over the bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(()))
        self.fed: list[torch.Tensor] = []

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.fed.append(ids)
        return self.weight.expand(*ids.shape, 256)  # (B, T, 256)


def test_every_training_row_of_a_fine_tuning_batch_begins_with_the_start():
    stream, spy = BYTES.stream(TEXT), Spy()
    Mixture(stream, Retrieval(BYTES.encode, stream, [START]), 64, 4, 0.5, 0, "finetune").loss(spy, step=3)
    assert [ids.shape for ids in spy.fed] == [(2, 64), (2, 64)]  # corpus rows, passkey rows
    assert all((ids[:, 0] == START).all() and (ids[:, 1:] != START).all() for ids in spy.fed)


# End to end, on a tiny Llama GGUF whose own tokenizer adds its BOS (tests/experiments/bos_gguf.py) or not.


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    from tests.experiments import bos_gguf

    folder = tmp_path_factory.mktemp("bos")
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    return {add: bos_gguf.write(folder / f"add_bos_{add}.gguf", add) for add in (True, False)}, folder / "text.txt"


def train_config(path, corpus, *more):
    from posenc.experiments.config.training_run import load_config

    return load_config(None, [f"trainer.init_from=gguf:{path}", f"data.corpus={corpus}", "data.seq_len=16",
                              "trainer.batch_size=2", "trainer.max_steps=1", "trainer.warmup_steps=0",
                              "trainer.eval_interval=1", "trainer.eval_batches=1", "trainer.progress=false", *more])


def reference_loss(model, tokens, starts, L, start) -> float:
    """The mean next-token loss of rows start + tokens[s : s + L + 1 - len(start)], by hand."""
    rows = torch.stack([torch.cat([torch.tensor(start, dtype=torch.int64), tokens[s : s + L + 1 - len(start)]])
                        for s in starts])  # (B, L+1)
    with torch.no_grad():
        return F.cross_entropy(model(rows[:, :-1]).flatten(0, 1), rows[:, 1:].flatten()).item()


@pytest.mark.parametrize("add_bos", [True, False])
def test_train_from_a_gguf_starts_every_window_as_its_tokenizer_does(tmp_path, checkpoints, add_bos):
    from posenc.experiments.training.language_model import train
    from posenc.models import Llama

    (paths, corpus), L = checkpoints, 16
    before = Llama.from_gguf(paths[add_bos])  # the weights the first step is taken on
    start = [before.tokenizer.bos_token_id] if add_bos else []
    ids = torch.tensor(before.tokenizer(TEXT, add_special_tokens=False)["input_ids"])
    train_ids, val_ids = split(ids, 0.1)
    cfg = train_config(paths[add_bos], corpus)
    result = train(cfg, tmp_path / "run")
    first = result.history[0]
    starts = sample_starts(len(train_ids), 2, L, batch_generator(cfg.trainer.seed, 0))
    assert first["loss"] == pytest.approx(reference_loss(before, train_ids, starts, L, start), rel=1e-5)
    val_starts = sample_starts(len(val_ids), 2, L, batch_generator(cfg.trainer.seed, -1))  # after the one step
    assert first["val_loss"] == pytest.approx(reference_loss(result.model, val_ids, val_starts, L, start), rel=1e-5)
    run = json.loads((tmp_path / "run" / "run.json").read_text())
    assert run["sequence_start"] == start_record(start)
    assert json.loads((tmp_path / "run" / "train.json").read_text())["sequence_start"] == start_record(start)
    if add_bos:  # a run from before the BOS was added (nothing recorded) is not continued with one
        (tmp_path / "run" / "run.json").write_text(json.dumps({k: v for k, v in run.items() if k != "sequence_start"}))
        with pytest.raises(ValueError) as err:
            train(cfg, tmp_path / "run")
        assert str(err.value).startswith("run_dir=") and f"{start}" in str(err.value) and "\n" not in str(err.value)
        train(cfg, tmp_path / "fork", fork_from=tmp_path / "run")  # a fork may change it, and names the change
        forked = json.loads((tmp_path / "fork" / "run.json").read_text())["forked_from"]
        assert f"sequence_start: [] -> {start}" in forked["changed"]


def test_finetune_from_a_gguf_starts_every_sequence_with_its_bos(tmp_path, checkpoints, capsys, monkeypatch):
    from posenc.experiments.finetune import tune
    from posenc.models import Llama

    (paths, corpus), L = checkpoints, 48
    made = []
    monkeypatch.setattr(tune, "Retrieval", lambda *args: made.append(Retrieval(*args)) or made[-1])
    run = tmp_path / "run"
    argv = ["finetune", "--run-dir", run, f"finetune.base=gguf:{paths[True]}", f"data.corpus={corpus}",
            f"data.seq_len={L}", "finetune.factor=2", "finetune.methods=[none]", "finetune.seeds=[0]",
            "finetune.schedule=[0,1]", "finetune.jobs=1", "finetune.progress=false", "passkey.length_multipliers=[1,2]",
            "passkey.trials=1", "perplexity.length_multipliers=[1]", "perplexity.max_windows=1",
            "trainer.batch_size=2", "trainer.warmup_steps=0"]
    code, _, err = cli(capsys, *argv)
    assert code == 0, err
    base = Llama.from_gguf(paths[True])
    bos = base.tokenizer.bos_token_id
    assert [task.start for task in made] == [[bos], [bos]]  # the training and the validation passkeys
    recorded = json.loads((run / "run.json").read_text())["sequence_start"]
    assert recorded == start_record([bos]) == json.loads((run / "results.json").read_text())["sequence_start"]
    _, val_ids = split(torch.tensor(base.tokenizer(TEXT, add_special_tokens=False)["input_ids"]), 0.1)
    (unit,) = json.loads((run / "results.json").read_text())["units"]
    before = next(r for r in unit["records"] if r["step"] == 0)  # the base itself: the first window, BOS first
    assert before["ppl"][str(L)] == pytest.approx(math.exp(reference_loss(base, val_ids, [0], L, [bos])), rel=1e-5)
    stored = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({k: v for k, v in stored.items() if k != "sequence_start"}))
    code, _, err = cli(capsys, "finetune", "--run-dir", run)  # a run from before the BOS: not continued with one
    assert code == 2 and "run_dir=" in one_line(err) and f"with [{bos}]" in err and len(err.strip().splitlines()) == 1


def test_a_compare_unit_evaluates_its_model_with_the_start_it_trained_with(monkeypatch, tmp_path):
    """`posenc compare trainer.init_from=gguf:...` trains each unit on windows begun with the BOS; its perplexity
    by length, training fit and shift test read windows begun the same way (by hand: the BOS, then L text tokens)."""
    from posenc.experiments.compare.config import CompareConfig
    from posenc.experiments.config import loader
    from posenc.experiments.training import scheme_units
    from posenc.experiments.training.language_model import TrainResult
    from tests.experiments.cli_helpers import TINY

    model = tiny_gpt("rope")
    text = torch.randint(1, VOCAB, (80,), generator=torch.Generator().manual_seed(4))  # (80,) no START inside
    val, train = text[:40], text[40:]
    result = TrainResult(model, [{"loss": 1.0}], val_tokens=val, train_tokens=train,
                         val_byte_lengths=torch.ones(40, dtype=torch.int64), start=[START])
    monkeypatch.setattr(scheme_units, "train", lambda cfg, run_dir: result)
    cfg = loader.load(CompareConfig, None, ["compare.schemes=[rope]", "compare.seeds=[0]", *TINY])
    unit = scheme_units.run_unit((cfg, "rope", 0, tmp_path))
    L = cfg.data.seq_len

    def by_hand(tokens: torch.Tensor, offset: int = 0) -> float:  # mean NLL of the windows BOS + tokens[s : s + L]
        nll = []
        for s in (0, L):  # each text below holds two windows of L before its last token
            window = torch.cat([torch.tensor([START]), tokens[s : s + L]])  # (L+1,)
            with torch.no_grad():
                logits = model(window[None, :-1], position_ids=torch.arange(offset, offset + L)[None])[0]
            nll.append(F.cross_entropy(logits, window[1:]).item())
        return sum(nll) / len(nll)

    assert unit["ppl"][1] == pytest.approx(math.exp(by_hand(val)), rel=1e-5)
    assert unit["train_ppl@1x"] == pytest.approx(math.exp(by_hand(train[-(2 * L + 1):])), rel=1e-5)
    assert unit["shift_loss_change"][10] == pytest.approx(by_hand(val, 10) - by_hand(val), abs=1e-5)
