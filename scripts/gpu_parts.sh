# Shared by the prepared GPU commands (scripts/gpu_check.sh, scripts/gpu_schemes.sh, scripts/extend_issue37_gpu.sh):
# each part runs under its own timeout and logs to $OUT as it goes, so a part that hangs or dies loses only itself.
# PART_KILL_AFTER (seconds a part may take to stop after its timeout) and PART_TAIL (lines of its log shown) may be
# set by the sourcing script. PART_DEADLINE (seconds since the epoch) ends every part by then, so that a script run
# after another in one device call still ends inside the call: a part's limit shrinks to what is left, and a part
# with under 10 s left is skipped and recorded as such. PART_SKIP (names separated by spaces) skips those parts,
# recorded as such: a session re-measures what changed and keeps the earlier rows of what did not.
part() {  # part NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, record the exit status
  local name=$1 limit=$2; shift 2
  if [[ " ${PART_SKIP:-} " == *" $name "* ]]; then echo "$name: skipped (PART_SKIP)" | tee -a "$OUT/summary.txt"; return; fi
  if [ -n "${PART_DEADLINE:-}" ]; then
    local left=$((PART_DEADLINE - $(date +%s) - ${PART_KILL_AFTER:-10}))
    if [ "$left" -lt 10 ]; then echo "$name: skipped, ${left} s left before PART_DEADLINE" | tee -a "$OUT/summary.txt"; return; fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (at most ${limit} s)"
  local started=$SECONDS
  timeout --kill-after="${PART_KILL_AFTER:-10}" "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -n "${PART_TAIL:-25}" "$OUT/$name.log"
  echo "$name: exit $status after $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}
