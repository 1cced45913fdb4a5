"""Offline RULER-style retrieval tasks (Hsieh et al. 2024, "RULER: What's the Real Context Size of
Your Long-Context Language Models?", NVIDIA/RULER): needles in a noise haystack (single,
multi-key, multi-value, multi-query), variable tracking, common and frequent words extraction.

Prompts are built in the model's own tokens at exact lengths from RULER's templates, each ending
with RULER's answer prefix, and scored as RULER scores them (score: share of answers found).

    builder = RulerBuilder(encode)                 # encode: str -> list[int], no special tokens
    prompt = builder.build("niah_multikey", 32_768, seed=0, trial=3)
    output = decode(greedy(prompt.ids, prompt.answer_tokens))
    score(output, prompt.answers)                  # 0.0 .. 1.0
"""

from posenc.experiments.extend.ruler.builder import RulerBuilder, RulerPrompt
from posenc.experiments.extend.ruler.scoring import score
from posenc.experiments.extend.ruler.tasks import TASKS, RulerTask
from posenc.experiments.extend.ruler.templates import MODEL_TEMPLATES

__all__ = ["MODEL_TEMPLATES", "TASKS", "RulerBuilder", "RulerPrompt", "RulerTask", "score"]
