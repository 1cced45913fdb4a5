"""What `posenc finetune` measures at every checkpoint: passkey accuracy at each length (greedy, cached
decoding of the answer), the passkey range, and perplexity at each length on the validation text, every
prompt and window begun with the model's BOS where its tokenizer adds one (vocab.start)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from posenc.experiments.config.sections import EvalConfig
from posenc.experiments.evaluation.perplexity import model_device, perplexity_by_length
from posenc.experiments.finetune.config import FinetuneConfig
from posenc.experiments.finetune.model_source import Vocabulary
from posenc.experiments.finetune.retrieval import Retrieval, answered


def passkey_range(accuracy: Mapping[int, float], threshold: float) -> int:
    """The longest tested length n such that every tested length up to n has accuracy >= threshold; 0 when
    the shortest fails (Chen et al. 2023's passkey range, with the share of trials as the threshold)."""
    reached = 0
    for length in sorted(accuracy):
        if not accuracy[length] >= threshold:  # NaN (not measured) fails too
            break
        reached = length
    return reached


@torch.no_grad()
def passkey_accuracy(model: nn.Module, retrieval: Retrieval, vocab: Vocabulary, lengths: list[int], trials: int,
                     seed: int) -> dict[int, float]:
    model.eval()
    device, out = model_device(model), {}
    for length in lengths:
        prompts = retrieval.prompts(length, trials, seed)
        correct = 0
        for size in sorted({p.answer_start for p in prompts}):  # one batch per prompt length (equal for bytes)
            group = [p for p in prompts if p.answer_start == size]
            answer_tokens = max(len(p.ids) - p.answer_start for p in group)
            ids = torch.tensor([p.ids[: p.answer_start] for p in group], device=device)  # (B, P)
            generated = model.generate(ids, max_new_tokens=answer_tokens, use_cache=True)[:, size:]  # (B, A)
            correct += sum(answered(vocab.decode(row.tolist()), p.key) for row, p in zip(generated, group, strict=True))
        out[length] = correct / len(prompts)
    return out


def measure(model: nn.Module, cfg: FinetuneConfig, val_stream: Tensor, retrieval: Retrieval,
            vocab: Vocabulary) -> dict[str, Any]:
    L = cfg.data.seq_len
    accuracy = passkey_accuracy(model, retrieval, vocab, [m * L for m in cfg.passkey.length_multipliers],
                                cfg.passkey.trials, cfg.passkey.seed)
    p = cfg.perplexity
    ppl = perplexity_by_length(model, val_stream, L, EvalConfig(length_multipliers=p.length_multipliers,
                                                                max_windows=p.max_windows), first=vocab.start)
    model.train()
    return {"passkey": accuracy, "range": passkey_range(accuracy, cfg.finetune.range_threshold), "ppl": ppl}
