#!/usr/bin/env bash
# Runs every staged test binary (.gpu/t/*, made by tests/gpu/stage) with the
# ignored GPU tests included, so a missing GPU fails them instead of skipping.
# Run it from the repository root (the tests read specs/ and kernels/ there):
#
#   bash .gpu/run-tests.sh [TEST-NAME-FILTER]
#
# Each binary's output goes to $OUT/gpu-tests.log (OUT defaults to a temp
# dir); a failing one's last lines and a summary line per binary are printed.
# GPU_DIR overrides .gpu, GPU_TEST_TIMEOUT (seconds, default 300) bounds
# each binary. Exit status: 0 when every binary passed, 1 otherwise.
set -u
stage=${GPU_DIR:-.gpu}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
summary=""
fail=0
ran=0
for t in "$stage"/t/*; do
  [ -x "$t" ] || continue
  ran=$((ran + 1))
  name=$(basename "$t")
  log="$out/tmp.log"
  timeout "${GPU_TEST_TIMEOUT:-300}" "$t" --include-ignored ${1:+"$1"} > "$log" 2>&1
  rc=$?
  { echo "===== $name (rc=$rc)"; cat "$log"; } >> "$out/gpu-tests.log"
  res=$(grep -E '^test result:' "$log" | tail -1)
  summary+=$(printf '%-40s rc=%-3s %s' "$name" "$rc" "$res")$'\n'
  if [ $rc -ne 0 ]; then
    fail=1
    echo "=== $name FAILED (rc=$rc), last lines:"
    tail -40 "$log"
  fi
done
rm -f "$out/tmp.log"
if [ $ran -eq 0 ]; then
  echo "no test binaries in $stage/t: run 'bash tests/gpu/stage' on the build machine first"
  exit 1
fi
echo "=== summary (full output in $out/gpu-tests.log)"
printf '%s' "$summary"
exit $fail
