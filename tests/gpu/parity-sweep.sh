#!/usr/bin/env bash
# Runs several `stepgraph train` jobs side by side on one GPU and prints, for
# each, its eval lines and final summary. Written to search the parity recipe
# of issue 7 (train on sizes <= 160, evaluate 256); the arithmetic sweeps of
# issue 16 use it too:
#
#   bash tests/gpu/parity-sweep.sh tests/gpu/parity-sweep-1.txt [BIN]
#   MPS=1 LIMIT=540 bash tests/gpu/parity-sweep.sh tests/gpu/arith-sweep-1.txt
#
# SWEEP_FILE holds one job per line, `name: train flags`; `#` lines are
# skipped. Every job gets `--progress plain --run-dir $OUT/sweep/NAME`; its
# output goes to $OUT/sweep/NAME.log. BIN defaults to .gpu/bin/stepgraph,
# which `bash tests/gpu/stage` builds (or pass target/release/stepgraph).
#
# LIMIT (seconds) stops every job then as a signal would (a checkpoint, the
# final evaluation, exit 0), so a device call's time limit never loses the
# summaries. MPS=1 starts the CUDA MPS daemon first, so the jobs' kernels
# share the GPU instead of time-slicing it. Every 15 s, and at the end,
# $OUT/evals.jsonl gets every job's eval lines tagged with its name: what a
# call that is cut short still brings back.
#
# RESUME=DIR continues a sweep an earlier call stopped: a job whose run
# directory DIR/NAME holds a checkpoint continues from it with
# `train --resume` (its flags come from the checkpoint; the line's flags are
# not read), the others start. Pack $OUT/sweep into the call's files, unpack
# it here into .gpu/sweep, carry .gpu, and pass RESUME=.gpu/sweep.
set -uo pipefail
sweep=$1
BIN=${2:-${BIN:-.gpu/bin/stepgraph}}
. "$(dirname "$0")/common.sh"
top=$out out=$out/sweep
mkdir -p "$out"
[ "${MPS:-0}" = 1 ] && start_mps
limit=()
[ -n "${LIMIT:-}" ] && limit=(timeout --preserve-status -s INT "$LIMIT")
collect() {
  for log in "$out"/*/metrics.jsonl; do
    [ -e "$log" ] || continue
    name=$(basename "$(dirname "$log")")
    grep -hE '"kind":"(eval|curriculum)"' "$log" | sed "s|^{|{\"job\":\"$name\",|"
  done > "$top/evals.jsonl.tmp"
  # The loop fails when the last job has no eval line yet; the file stands.
  mv "$top/evals.jsonl.tmp" "$top/evals.jsonl"
}
names=()
pids=()
while IFS= read -r line; do
  case "$line" in '#'* | '') continue ;; esac
  name=${line%%:*}
  args=${line#*:}
  names+=("$name")
  from=${RESUME:+$RESUME/$name}
  if [ -n "$from" ] && [ -d "$from/checkpoints" ]; then
    cp -r "$from" "$out/$name"
    cp "$RESUME/$name.log" "$out/$name.log" 2>/dev/null
    run=(train --progress plain --resume "$out/$name")
  else
    # shellcheck disable=SC2206 # the flags are meant to split
    run=(train --progress plain --run-dir "$out/$name" $args)
  fi
  ( SECONDS=0
    "${limit[@]}" "$bin" "${run[@]}" >> "$out/$name.log" 2>&1
    echo "exit $? after ${SECONDS} s" >> "$out/$name.log" ) &
  pids+=($!)
done < "$sweep"
( while sleep 15; do collect; done ) &
collector=$!
wait "${pids[@]}"
kill "$collector" 2>/dev/null
collect
for name in "${names[@]}"; do
  echo "===== $name: $(grep -m1 '^batch' "$out/$name.log")"
  grep -E '^eval @|^done|^accuracy|^exit|error' "$out/$name.log" | tail -${PARITY_TAIL:-12}
done
