"""Load check: one evaluation window of T tokens through a trained compare-run model, reporting
perplexity, wall time and the process's peak resident memory.
    .venv/bin/python scripts/long_eval.py RUN_DIR/SCHEME T
"""

import json
import resource
import sys
import time
from pathlib import Path

import torch

from posenc.data.tokens import byte_tokens, load_corpus
from posenc.experiments.config.training_run import from_plain
from posenc.experiments.evaluation.perplexity import perplexity
from posenc.experiments.runs import checkpoint
from posenc.models import GPT

run, length = Path(sys.argv[1]), int(sys.argv[2])
cfg = from_plain(json.loads((checkpoint.latest(run) / "state.json").read_text())["config"])
model = GPT(cfg.model)
checkpoint.load(checkpoint.latest(run), model)
tokens = byte_tokens(load_corpus(cfg.data.corpus).text)  # the whole text: the validation tail is only 46k
start = time.perf_counter()
with torch.no_grad():
    ppl = perplexity(model.eval(), tokens, length, max_windows=1)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"{cfg.model.position_embedding_type} T={length}: ppl {ppl:.2f}, {time.perf_counter() - start:.0f} s, "
      f"peak RSS {peak:.2f} GiB")
