"""A tiny random Llama GGUF whose own tokenizer adds its BOS or not, as a checkpoint's `tokenizer.ggml.add_bos_token`
says (Gemma 3 270M's says true, SmolLM2's false): a byte-level BPE tokenizer (GPT-2's byte alphabet, one merge) with
`<s>` as its BOS, written by the gguf package's own writer, read back by transformers' GGUF tokenizer reader as
posenc reads every GGUF's tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

BYTES = 256
MERGED = "\u0120t"  # " t" in GPT-2's byte alphabet: one merge, so the tokenizer is a BPE and not only bytes
BOS = BYTES + 1  # "<s>", after the bytes and the merged token
VOCAB = BYTES + 2


def _vocabulary(add_bos: bool):
    def add(writer: Any) -> None:
        import gguf
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        spelled = bytes_to_unicode()
        tokens = [spelled[b] for b in range(BYTES)] + [MERGED, "<s>"]
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types([gguf.TokenType.NORMAL] * (BYTES + 1) + [gguf.TokenType.CONTROL])
        writer.add_token_merges([" ".join(MERGED)])
        writer.add_bos_token_id(BOS)
        writer.add_add_bos_token(add_bos)

    return add


def write(path: Path, add_bos: bool, seed: int = 0) -> Path:
    """A 1-layer Llama (d_model 16) at `path` whose tokenizer adds `<s>` (id BOS) before a text or not."""
    import transformers

    from tests.models.family_checkpoints import redraw
    from tests.models.family_gguf import write_gguf

    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                      pad_token_id=0, bos_token_id=BOS, eos_token_id=BOS)
    torch.manual_seed(seed)
    hf = transformers.LlamaForCausalLM(config)
    redraw(hf, seed)
    return write_gguf(hf, path, _vocabulary(add_bos))
