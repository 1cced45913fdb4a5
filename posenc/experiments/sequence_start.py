"""The tokens a model's own tokenizer puts before every text: its BOS where the checkpoint says so (a GGUF's
`tokenizer.ggml.add_bos_token`, which transformers' GGUF reader turns into the tokenizer's add_bos_token; an HF
folder's tokenizer config), nothing otherwise. Gemma 3 is trained with `<bos>` first and its perplexity without it
is several times worse; SmolLM2's GGUF says add_bos_token false, so its sequences stay as they were. One rule for
every study that feeds a pretrained checkpoint (extend; finetune and `posenc train trainer.init_from=gguf:...`);
posenc's own GPTs never saw a BOS, so their start is [].

Counting: a sequence of L positions is the start plus L - len(start) text tokens, as HF-style perplexity-by-length
evaluations count (YaRN's and LongLoRA's eval scripts tokenize with the BOS and cut input_ids to L). In extend's
evaluation the forward stays L positions long and L - 1 tokens are scored in both cases (with a BOS every text
token, the first one predicted from the BOS; without, every text token after the first). Training and fine-tuning
windows (posenc.data.tokens.windows_at) add the next text token as the last position's target, so L text tokens
are scored per row either way. The start itself is never a target.
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


def recorded_start(stored: dict[str, Any] | None) -> list[int]:
    """The start a run folder's record says its sequences began with ([] for a run from before it was recorded:
    nothing was put before its text then)."""
    return list(((stored or {}).get("sequence_start") or {}).get("ids", []))


def check_same_start(opened: Any, start: list[int]) -> None:
    """A resumed run (`opened`: an open runs.rule.Run) goes on with the sequences it began with: a model trained or
    measured on windows without a BOS is not continued on windows with one, nor the other way round."""
    if opened.stored is None:
        return
    before = recorded_start(opened.stored)
    if before != start:
        raise bad_value("run_dir", str(opened.path), f"a run whose sequences start with {start}, as this model's "
                                                     f"tokenizer asks (its sequences start with {before}: start anew)")


__all__ = ["COUNTING", "check_same_start", "recorded_start", "sequence_start", "start_record"]
