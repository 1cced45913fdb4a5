# Shared by the prepared GPU commands (scripts/gpu_check.sh, scripts/gpu_schemes.sh, scripts/extend_issue37_gpu.sh):
# each part runs under its own timeout and logs to $OUT as it goes, so a part that hangs or dies loses only itself.
# PART_KILL_AFTER (seconds a part may take to stop after its timeout) and PART_TAIL (lines of its log shown) may be
# set by the sourcing script.
part() {  # part NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, record the exit status
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit} s)"
  local started=$SECONDS
  timeout --kill-after="${PART_KILL_AFTER:-10}" "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -n "${PART_TAIL:-25}" "$OUT/$name.log"
  echo "$name: exit $status after $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}
