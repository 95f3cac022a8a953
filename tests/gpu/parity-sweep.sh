#!/usr/bin/env bash
# Runs several `stepgraph train` jobs side by side on one GPU and prints, for
# each, its eval lines and final summary. Used to search the parity recipe of
# issue 7 (train on sizes <= 160, evaluate 256) on the device machine:
#
#   bash tests/gpu/parity-sweep.sh tests/gpu/parity-sweep-1.txt [BIN]
#
# SWEEP_FILE holds one job per line, `name: train flags`; `#` lines are
# skipped. Every job gets `--progress plain --run-dir $OUT/parity/NAME`; its
# output goes to $OUT/parity/NAME.log. BIN defaults to .gpu/bin/stepgraph,
# which `bash tests/gpu/stage` builds (or pass target/release/stepgraph).
set -uo pipefail
sweep=$1
bin=${2:-.gpu/bin/stepgraph}
if [ ! -x "$bin" ]; then
  echo "no $bin: run 'bash tests/gpu/stage' first, or pass the binary as the second argument" >&2
  exit 2
fi
out=${OUT:-$(mktemp -d)}/parity
mkdir -p "$out"
names=()
while IFS= read -r line; do
  case "$line" in '#'* | '') continue ;; esac
  name=${line%%:*}
  args=${line#*:}
  names+=("$name")
  # shellcheck disable=SC2086 # the flags are meant to split
  ( SECONDS=0
    "$bin" train --progress plain --run-dir "$out/$name" $args > "$out/$name.log" 2>&1
    echo "exit $? after ${SECONDS} s" >> "$out/$name.log" ) &
done < "$sweep"
wait
for name in "${names[@]}"; do
  echo "===== $name: $(grep -m1 '^batch' "$out/$name.log")"
  grep -E '^eval @|^done|^accuracy|^exit|error' "$out/$name.log" | tail -${PARITY_TAIL:-12}
done
