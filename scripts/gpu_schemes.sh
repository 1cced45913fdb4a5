#!/usr/bin/env bash
# `make gpu-schemes`: issue 34's prepared GPU command, run after `make gpu-check` (at most 8 minutes on an H100).
# The kernels of the other schemes and of the position maps at the GPU's own compile (FIRE's pieces, Shaw's and
# Transformer-XL's rows per query, CoPE, the maps in one pass: each case file against its float64 reference), then
# their attention timed against causal SDPA at 1k-16k, and each map's 32k prompt and decode step against plain RoPE;
# the decode step captured whole (static cache + CUDA graph) against the ordinary eager step at 4k and 32k, the
# SmolLM2-shaped decoder plain and under each map (graphed, as a ratio to plain's graphed step; at most 75 s, its rows
# kept as measured; the section's GPT rows: `--graph-models gpt`); where the time goes in the cases the first run
# found slow (benchmarks/gpu_profile.py); the targets read out at the end (benchmarks/gpu_targets.py). The kernel
# tests run without -x: the first GPU run stopped at its first failures and hid the rest.
# QUICK=1 runs the same plumbing on a CPU (interpreter, toy sizes) to check the script itself.
set -u
OUT=${OUT:-gpu-schemes}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the kernels changed last first (the part stops at its limit): CoPE's two dQ passes, T5's bucket dQ, the slot kernel
CASES=(tests/nn/triton_cope_cases.py tests/nn/triton_bucket_bias_cases.py tests/nn/triton_slot_cases.py
       tests/nn/triton_pieces_cases.py tests/nn/triton_relative_cases.py tests/nn/triton_head_bias_cases.py
       tests/nn/triton_mapped_cases.py)
if [ "${QUICK:-0}" = 1 ]; then
  BENCH=(--quick --device cpu); KERNELS=(env TRITON_INTERPRET=1); KERNEL_TESTS=(-p no:xdist -k "refused")
  PROFILE=(--quick --device cpu --calls 2 --cases rope_backward,alibi_1k)
  SIZES=(); CASES=(tests/nn/triton_pieces_cases.py tests/nn/triton_cope_cases.py)
else  # four test processes share the GPU: the kernels' compiles run side by side
  BENCH=(); KERNELS=(); KERNEL_TESTS=(-n 4); SIZES=(--lengths 1024,4096,16384 --head-dims 64,128 --kv-groups 1,4)
  PROFILE=(--calls 100)  # with 10 calls the profiler's one-off ~4 ms start lands in every per-call CPU figure
  [ -n "${PROFILE_CASES:-}" ] && PROFILE+=(--cases "$PROFILE_CASES")  # a session profiles what it changed
  CASES+=(tests/models/test_static_decode.py tests/models/test_static_map_decode.py)  # their CUDA-only tests capture
  # and replay the decode step, plain and under each map
fi
PART_KILL_AFTER=5  # the parts' limits (90 + 160 + 90 + 75 + 50 + 20) and 5 s to stop each: 515 s at the very most
source "$(dirname "$0")/gpu_parts.sh"

part kernels 90 "${KERNELS[@]}" "$PY" -m pytest -q -p no:cacheprovider "${CASES[@]}" "${KERNEL_TESTS[@]}"
# A session times what it changed: ATTENTION_SCHEMES (default all four), MAP_LENGTHS (e.g. 32768,65536: the targets
# hold at 64k too), GRAPH_CONTEXTS (e.g. 4096,32768,65536); each part's time limit stays as it is.
part attention 160 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections attention \
  --schemes "${ATTENTION_SCHEMES:-fire,shaw,transformer_xl,cope}" --no-peers "${SIZES[@]}" --out "$OUT/attention"
part maps 90 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections maps ${MAP_LENGTHS:+--map-lengths "$MAP_LENGTHS"} \
  --out "$OUT/maps"
part graphs 75 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections graphs --graph-models smollm2 \
  ${GRAPH_CONTEXTS:+--graph-contexts "$GRAPH_CONTEXTS"} --out "$OUT/graphs"
part profile 50 "$PY" -m benchmarks.gpu_profile "${PROFILE[@]}"
# the host's Python time of the launch-bound calls (RoPE fwd+bwd on the H200: 0.045 ms of kernels in 0.563 ms)
part host 20 "$PY" -m benchmarks.gpu_profile "${PROFILE[@]}" --python --cases rope_backward,alibi_1k
"$PY" -m benchmarks.gpu_targets "$OUT" | tee "$OUT/targets.md"
