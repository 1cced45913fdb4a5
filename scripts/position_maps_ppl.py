"""Sanity check on a real model: SmolLM2-135M's perplexity on T tokens of Python's docs, plain and with each
position map set so that all its maps are in use at T (windows well inside T).
    .venv/bin/python scripts/position_maps_ppl.py [T]"""

import sys
import time

import torch
import torch.nn.functional as F

from posenc.data.corpus import python_docs_text
from posenc.models.gguf import builtin_smollm2_path
from posenc.models.llama import Llama

t = int(sys.argv[1]) if len(sys.argv) > 1 else 2048
SPECS = [None, {"type": "self_extend", "group_size": 4, "window": t // 4},
         {"type": "dual_chunk", "chunk_size": t * 3 // 8, "local_window": t // 32},
         {"type": "lm_infinite", "window": t // 2}, {"type": "attention_sinks", "window": t // 2}]
model = Llama.from_gguf(builtin_smollm2_path())
ids = torch.tensor([model.tokenizer(python_docs_text()[:20 * t])["input_ids"][:t]])
for spec in SPECS:
    model.set_attention_extension(spec)
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(ids)
    nll = F.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    print(f"{spec}: ppl {torch.tensor(nll).exp():.3f} ({time.perf_counter() - start:.1f} s)")
