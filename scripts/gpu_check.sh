#!/usr/bin/env bash
# `make gpu-check`: the first command of any GPU session (issue 33). Runs on the GPU machine's own python3
# (torch 2.11, Triton 3.6; nothing installed), from a checkout, in at most ~8 minutes on an H100. Each part has
# its own timeout (480 s together) and writes to $OUT as it goes, so a part that hangs or dies loses only itself.
# Attention runs without the flex peer here: torch.compile per shape would take minutes (the full benchmark,
# python -m benchmarks.gpu, has it).
# QUICK=1 runs the same plumbing on a CPU (interpreter, toy sizes) to check the script itself.
set -u
OUT=${OUT:-gpu-check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
if [ "${QUICK:-0}" = 1 ]; then  # the kernels under Triton's interpreter, the benchmark at toy sizes on the CPU
  BENCH=(--quick --device cpu); KERNELS=(env TRITON_INTERPRET=1); KERNEL_TESTS=(-p no:xdist -k "causal_17")
  SIZES=()
else  # four test processes share the GPU: the kernels' compiles run side by side
  BENCH=(); KERNELS=(); KERNEL_TESTS=(-n 4); SIZES=(--lengths 1024,4096,16384 --head-dims 64,128 --kv-groups 1,4)
fi

source "$(dirname "$0")/gpu_parts.sh"

part environment 60 "$PY" -c "import platform, torch, triton; print(platform.python_version(), 'torch', torch.__version__, \
'triton', triton.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() \
else 'no GPU')"
# The kernel tests compiled at real sizes (triton_cases.py: head dims 64 and 128, T to 8k, GQA, bf16).
part kernels 150 "${KERNELS[@]}" "$PY" -m pytest -q -p no:cacheprovider tests/nn/triton_cases.py "${KERNEL_TESTS[@]}"
part attention 150 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections attention --schemes alibi,kerple,relative \
  --no-peers "${SIZES[@]}" --out "$OUT/attention"
part rope 45 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections rope --out "$OUT/rope"
part train 75 "$PY" -m benchmarks.gpu "${BENCH[@]}" --sections train --schemes none,rope,alibi,kerple --out "$OUT/train"
"$PY" -m benchmarks.gpu_targets "$OUT" | tee "$OUT/targets.md"
