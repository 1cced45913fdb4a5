"""data.tokenizer: bytes by default (today's numbers unchanged), a tokenizer.json file, or the SmolLM2
tokenizer of the built-in GGUF; token byte lengths that bits per byte rests on; the errors of bad input."""

from __future__ import annotations

import math

import pytest
import torch

from posenc.data.tokenizer import Tokens, encode_corpus, load_tokenizer
from posenc.data.tokens import byte_tokens, split
from posenc.experiments.config.sections import EvalConfig
from posenc.experiments.config.training_run import RunConfig, load_config
from posenc.experiments.evaluation.perplexity import perplexity_by_length, scores_by_length, total_nll
from posenc.experiments.runs import manifest
from posenc.models import GPT, GPTConfig
from tests.conftest import smollm2_gguf

TEXT = ("Positional encodings tell attention where a token is. Café, naïve, 東京 and 🙂 are several bytes each; "
        "the byte count of a text is not its character count.\n\n") * 8


def bpe_file(tmp_path, vocab_size: int = 300, text: str = TEXT) -> str:
    """A byte-level BPE tokenizer.json trained here on TEXT (independent of posenc's code)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / f"tokenizer-{vocab_size}.json"
    tok.save(str(path))
    return str(path)


def test_bytes_is_the_default_and_unchanged():
    cfg = RunConfig()
    assert cfg.data.tokenizer == "bytes" and cfg.model.vocab_size == 256
    tokens = encode_corpus(load_tokenizer("bytes"), TEXT, "unused")
    assert torch.equal(tokens.ids, byte_tokens(TEXT))
    assert torch.equal(tokens.byte_lengths, torch.ones(len(TEXT.encode()), dtype=torch.int32))
    train, val = tokens.split(0.1)
    old_train, old_val = split(byte_tokens(TEXT), 0.1)
    assert torch.equal(train.ids, old_train) and torch.equal(val.ids, old_val)


def test_bits_per_byte_of_bytes_is_nats_per_token_over_ln2():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, n_layer=1, n_head=2, d_model=16, position_embedding_type="rope")).eval()
    tokens = encode_corpus(load_tokenizer("bytes"), TEXT, "unused")
    cfg = EvalConfig(length_multipliers=(1, 2), max_windows=4)
    ppl, bpb = scores_by_length(model, tokens.ids, tokens.byte_lengths, 16, cfg)
    assert ppl == perplexity_by_length(model, tokens.ids, 16, cfg)
    for length in ppl:
        assert bpb[length] == pytest.approx(math.log(ppl[length]) / math.log(2), rel=1e-12)


def test_subword_round_trip_and_byte_lengths(tmp_path):
    tok = load_tokenizer(bpe_file(tmp_path))
    tokens = tok.encode(TEXT)
    assert len(tokens) < 0.75 * len(TEXT.encode())  # it merges: fewer tokens than bytes
    assert tok.decode(tokens.ids) == TEXT
    assert int(tokens.byte_lengths.sum()) == len(TEXT.encode("utf-8"))
    # Every prefix that ends on a character boundary covers exactly that prefix's bytes.
    ends = torch.cumsum(tokens.byte_lengths, 0)
    for k in (1, 7, 40, len(tokens) // 2):
        prefix = tok.decode(tokens.ids[:k])
        if "\ufffd" not in prefix:
            assert int(ends[k - 1]) == len(prefix.encode("utf-8"))


def test_subword_bits_per_byte_is_total_nats_over_bytes(tmp_path):
    tok = load_tokenizer(bpe_file(tmp_path))
    tokens = tok.encode(TEXT)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=1, n_head=2, d_model=16,
                          position_embedding_type="alibi")).eval()
    cfg = EvalConfig(length_multipliers=(1,), max_windows=3)
    _, bpb = scores_by_length(model, tokens.ids, tokens.byte_lengths, 8, cfg)
    nats, count, _ = total_nll(model, tokens.ids[: 3 * 8 + 1], 8, max_windows=3)
    scored_bytes = len(tok.decode(tokens.ids[1 : 3 * 8 + 1]).encode("utf-8"))  # targets of three windows of 8
    assert count == 24 and bpb[8] == pytest.approx(nats / (math.log(2) * scored_bytes), rel=1e-9)


def test_vocab_follows_the_tokenizer_and_a_small_one_is_refused(tmp_path):
    path = bpe_file(tmp_path)
    assert load_config(None, [f"data.tokenizer={path}"]).model.vocab_size == load_tokenizer(path).vocab_size == 300
    assert load_config(None, [f"data.tokenizer={path}", "model.vocab_size=512"]).model.vocab_size == 512
    with pytest.raises(ValueError, match=r"model.vocab_size=280 .*>= 300.*data.tokenizer"):
        load_config(None, [f"data.tokenizer={path}", "model.vocab_size=280"])


@pytest.mark.parametrize("value", ["wordpiece", "", "/no/such/tokenizer.json"])
def test_an_unknown_tokenizer_names_the_field_and_what_is_allowed(value):
    with pytest.raises(ValueError, match=r"data.tokenizer=.*bytes, smollm2 .*tokenizer.json"):
        load_config(None, [f"data.tokenizer={value}"] if value else ["data.tokenizer=''"])


def test_a_file_that_is_not_a_tokenizer_and_a_gguf_fine_tune_are_refused(tmp_path):
    junk = tmp_path / "notes.json"
    junk.write_text('{"hello": 1}')
    with pytest.raises(ValueError, match=r"data.tokenizer=.*could not be read"):
        load_config(None, [f"data.tokenizer={junk}"])
    with pytest.raises(ValueError, match=r"data.tokenizer=.*bytes \(its default\) with trainer.init_from=gguf"):
        load_config(None, [f"data.tokenizer={bpe_file(tmp_path)}", "trainer.init_from=gguf:smollm2"])


def test_the_fingerprint_follows_the_content_and_a_changed_tokenizer_is_refused(tmp_path):
    small, large = load_tokenizer(bpe_file(tmp_path, 300)), load_tokenizer(bpe_file(tmp_path, 320))
    assert small.sha256 != large.sha256 != load_tokenizer("bytes").sha256
    assert load_tokenizer(small.name).sha256 == small.sha256  # stable: the same file, the same fingerprint
    stored = {"name": "c", "sha256": "a" * 64, **small.record()}
    manifest.check_corpus(stored, dict(stored))
    with pytest.raises(ValueError, match=r"data.tokenizer=.*the tokenizer the run was trained with"):
        manifest.check_corpus(stored, {**stored, **large.record()})


def test_the_corpus_cache_returns_what_encoding_does(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE_DIR", str(tmp_path / "cache"))
    tok = load_tokenizer(bpe_file(tmp_path))
    first = encode_corpus(tok, TEXT, "f" * 64)
    assert list((tmp_path / "cache" / "tokens").glob("*.npz"))
    again = encode_corpus(tok, TEXT, "f" * 64)
    assert isinstance(again, Tokens) and torch.equal(first.ids, again.ids)
    assert torch.equal(first.byte_lengths, again.byte_lengths)


@pytest.mark.pretrained
def test_smollm2_is_the_gguf_tokenizer_and_round_trips():
    smollm2_gguf()
    tok = load_tokenizer("smollm2")
    assert tok.vocab_size == 49152 and tok.backend.token_to_id("<|im_start|>") == 1  # SmolLM2's chat marker
    tokens = tok.encode(TEXT)
    assert tok.decode(tokens.ids) == TEXT and int(tokens.byte_lengths.sum()) == len(TEXT.encode())
    assert len(tokens) < len(TEXT.encode()) / 2.5  # English subwords: several bytes a token
