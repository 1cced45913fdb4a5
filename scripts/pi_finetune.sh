#!/usr/bin/env bash
# Position interpolation for fine-tuning (Chen et al. 2023; NeMo's seq_len_interpolation_factor for SFT),
# at toy scale on this CPU: a RoPE GPT trained at L=64 is extended to 256 (factor 4) three ways and
# evaluated at 256: zero-shot (no fine-tune), fine-tuned without PI, fine-tuned with PI.
#   usage: scripts/pi_finetune.sh BASE_RUN_DIR [STEPS]    (BASE_RUN_DIR: e.g. runs/compare-*/rope)
set -euo pipefail
BASE=$1; STEPS=${2:-100}; OUT=runs/pi-finetune-$(date +%Y%m%d-%H%M%S)
COMMON=(--config configs/compare.yaml model.position_embedding_type=rope data.seq_len=256 trainer.batch_size=8
        trainer.max_steps=$STEPS trainer.warmup_steps=10 trainer.lr=1e-3 trainer.min_lr=1e-4
        trainer.eval_interval=$STEPS trainer.checkpoint_interval=$STEPS trainer.init_from=$BASE
        "eval.length_multipliers=[1,2]")
.venv/bin/posenc train --run-dir "$OUT/no-pi" "${COMMON[@]}"
.venv/bin/posenc train --run-dir "$OUT/pi-4" "${COMMON[@]}" model.seq_len_interpolation_factor=4
.venv/bin/python - "$BASE" "$OUT" <<'PY'
import json, sys
from pathlib import Path
from posenc.data.tokens import byte_tokens, load_corpus, split
from posenc.experiments.run_folder import checkpoint
from posenc.experiments.config.training_run import from_plain
from posenc.experiments.evaluation.perplexity import perplexity
from posenc.models import GPT

base, out = Path(sys.argv[1]), Path(sys.argv[2])
def load(run, **changes):
    cfg = from_plain(json.loads((checkpoint.latest(run) / "state.json").read_text())["config"])
    model = GPT(cfg.model.replace(**changes)); checkpoint.load(checkpoint.latest(run), model)
    return model.eval(), cfg
_, cfg = load(base)
_, val = split(byte_tokens(load_corpus(cfg.data.corpus).text), cfg.data.val_fraction)
rows = {"base (L=64), no PI": load(base)[0], "base, PI x4 zero-shot": load(base, seq_len_interpolation_factor=4.0)[0],
        "fine-tuned at 256, no PI": load(out / "no-pi")[0], "fine-tuned at 256, PI x4": load(out / "pi-4")[0]}
table = {name: {L: perplexity(m, val, L, max_windows=16) for L in (64, 256, 512)} for name, m in rows.items()}
(out / "pi_results.json").write_text(json.dumps(table, indent=2))
print(f"{'model':28s} {'ppl@64':>8s} {'ppl@256':>8s} {'ppl@512':>8s}")
for name, r in table.items():
    print(f"{name:28s} {r[64]:8.2f} {r[256]:8.2f} {r[512]:8.2f}")
print(f"results: {out / 'pi_results.json'}")
PY
