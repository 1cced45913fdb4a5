"""The tokens a model's own tokenizer puts before every text: its BOS where the checkpoint says so (a GGUF's
`tokenizer.ggml.add_bos_token`, which transformers' GGUF reader turns into the tokenizer's add_bos_token; an HF
folder's tokenizer config), nothing otherwise. Gemma 3 is trained with `<bos>` first and its perplexity without it
is several times worse; SmolLM2's GGUF says add_bos_token false, so its sequences stay as they were.

Counting: a sequence of L positions is the start plus L - len(start) text tokens, as HF-style perplexity-by-length
evaluations count (YaRN's and LongLoRA's eval scripts tokenize with the BOS and cut input_ids to L): the forward
stays L positions long and L - 1 tokens are scored in both cases (with a BOS every text token, the first one
predicted from the BOS; without, every text token after the first). The start itself is never a target.
"""

from __future__ import annotations

from typing import Any

from posenc.errors import bad_value

PROBE = "The grass is green."
COUNTING = "a length of L positions: the start (BOS) plus L - len(start) text tokens; the start is never scored"


def sequence_start(tokenizer: Any) -> list[int]:
    """[bos id] where the tokenizer adds a BOS to a text (add_special_tokens=True), [] where it adds nothing before
    it; read from what the tokenizer does, so the checkpoint's own setting decides, never the family's name."""
    plain = list(tokenizer.encode(PROBE, add_special_tokens=False))
    full = list(tokenizer.encode(PROBE, add_special_tokens=True))
    before = next((k for k in range(len(full) - len(plain) + 1) if full[k : k + len(plain)] == plain), None)
    bos = getattr(tokenizer, "bos_token_id", None)
    if before is None or full[:before] not in ([], [bos]):
        raise bad_value(
            "tokenizer",
            type(tokenizer).__name__,
            f"a tokenizer that adds at most its BOS ({bos}) before a text (it encodes {PROBE!r} as {full})",
        )
    return full[:before]


def start_record(start: list[int]) -> dict[str, Any]:
    """What run.json and results.json keep about it."""
    return {"bos_added": bool(start), "ids": start, "counting": COUNTING}


__all__ = ["COUNTING", "sequence_start", "start_record"]
