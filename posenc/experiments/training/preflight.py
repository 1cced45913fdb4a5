"""Checks that need the model's shapes or the text's length but must pass before anything is
allocated, trained or written: a model too large for memory, training windows longer than the
text, evaluation lengths the validation text or the memory cannot hold."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from posenc.errors import bad_value
from posenc.models import GPT, GPTConfig
from posenc.models.limits import SequenceTooLong, available_bytes, check_fits

TRAINING_COPIES = 4  # fp32 weights, gradients and AdamW's two moments


def check_model_fits(cfg: GPTConfig, training: bool, budget: int | None = None) -> GPT:
    """Build the model on the meta device (shapes, no memory) and refuse it if its tensors need
    more than the memory available. Returns the meta model for the sequence checks below."""
    with torch.device("meta"):
        model = GPT(cfg)
    params = {name: p for name, p in model.named_parameters()}
    tensors = {**params, **dict(model.named_buffers())}
    need = sum(p.numel() * 4 for p in params.values()) * (TRAINING_COPIES if training else 1)
    need += sum(b.numel() * b.element_size() for n, b in tensors.items() if n not in params)
    budget = available_bytes() if budget is None else budget
    if need <= budget:
        return model
    name, largest = max(tensors.items(), key=lambda item: item[1].numel())
    # Name the option that made the largest tensor large: the size field nearest its longest dim.
    dim = max(largest.shape)
    sizes = {k: v for k, v in cfg.to_dict().items() if isinstance(v, int) and not isinstance(v, bool) and v > 0}
    culprit = min(sizes, key=lambda k: abs(math.log(sizes[k] / dim)))
    raise bad_value(f"model.{culprit}", sizes.get(culprit), f"a size whose model fits in memory: it needs "
                    f"~{need / 2**30:,.1f} GiB ({name} has shape {tuple(largest.shape)}), "
                    f"{budget / 2**30:,.1f} GiB are available")


def check_sequences_fit(model: GPT, batch: int, seq_len: int, field: str, value: object) -> None:
    """A forward of (batch, seq_len) must fit in memory (posenc.models.limits' estimate)."""
    try:
        check_fits(batch, model.cfg.n_head, model.cfg.d_model, seq_len, seq_len, model.scheme(0))
    except SequenceTooLong as err:
        raise bad_value(field, value, f"a length that fits in memory ({err})") from None


def check_text_lengths(seq_len: int, n_val: int, n_train: int | None = None, eval_lengths: Sequence[int] = ()) -> None:
    """Training and validation draw windows of seq_len + 1 tokens; evaluation needs more tokens
    than its longest window."""
    for split, n in (("training", n_train), ("validation", n_val)):
        if n is not None and n <= seq_len + 1:
            raise bad_value("data.seq_len", seq_len, f"shorter than the {split} split ({n} tokens): use a longer "
                                                     "corpus or a shorter data.seq_len")
    too_long = [length for length in eval_lengths if length >= n_val]
    if too_long:
        raise bad_value("eval.length_multipliers", [length // seq_len for length in eval_lengths],
                        f"lengths shorter than the validation text ({n_val} tokens; {max(too_long)} asked)")



def check_one_step(cfg: GPTConfig, seq_len: int) -> None:
    """One forward and backward of a 2 x seq_len batch on the CPU, before any unit trains: a scheme that cannot
    run (a user's bias of the wrong shape, a hook that raises) is named now, not after the others trained."""
    try:
        with torch.random.fork_rng():  # the caller's random state is left as it was
            torch.manual_seed(0)
            model = GPT(cfg)
            model(torch.randint(0, cfg.vocab_size, (2, seq_len))).float().logsumexp(-1).mean().backward()
    except ValueError:
        raise  # already one line naming what is wrong
    except Exception as err:  # a user's scheme that raises: one line naming the scheme
        raise bad_value("model.position_embedding_type", cfg.position_embedding_type,
                        f"a scheme whose forward and backward run: a 2 x {seq_len} batch raised "
                        f"{type(err).__name__}: {err}") from None
