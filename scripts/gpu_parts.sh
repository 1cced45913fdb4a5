# Shared by the prepared GPU commands (scripts/gpu_check.sh, scripts/gpu_schemes.sh): each part runs under its own
# timeout and logs to $OUT as it goes, so a part that hangs or dies loses only itself.
part() {  # part NAME SECONDS COMMAND...: run, log to $OUT/NAME.log, record the exit status
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit} s)"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  tail -n 25 "$OUT/$name.log"
  echo "$name: exit $status after $((SECONDS - started)) s" | tee -a "$OUT/summary.txt"
}
