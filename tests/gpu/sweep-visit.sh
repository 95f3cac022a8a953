#!/usr/bin/env bash
# One device call's share of a sweep (tests/gpu/parity-sweep.sh): runs the
# sweep for LIMIT seconds in a scratch directory, copies the tagged eval
# lines to $OUT/evals.jsonl every 20 s (what a call cut short still brings
# back), then packs the run directories with their checkpoints into 15 MiB
# pieces, $OUT/sweep.tgz.partNN, so a call returns a handful of files
# whatever the number of jobs.
#
#   LIMIT=480 bash tests/gpu/sweep-visit.sh tests/gpu/arith-sweep-6.txt
#
# Here, unpack the pieces and carry them to continue the stopped jobs:
#   cat FILES_AT/sweep.tgz.part* | tar xz -C .gpu     # -> .gpu/sweep
#   RESUME=.gpu/sweep LIMIT=480 bash tests/gpu/sweep-visit.sh SAME-FILE
# BIN names another binary than .gpu/bin/stepgraph. MPS is on (MPS=0 turns
# it off); concurrent jobs share the GPU's throughput rather than add to it
# (BENCHMARKS.md, "Wider heads").
set -uo pipefail
sweep=$1
real=${OUT:?set OUT to the directory whose files come back}
work=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
( while sleep 20; do cp "$work/evals.jsonl" "$real/" 2>/dev/null; done ) &
copier=$!
OUT=$work MPS=${MPS:-1} LIMIT=${LIMIT:-480} PARITY_TAIL=${PARITY_TAIL:-14} \
  bash tests/gpu/parity-sweep.sh "$sweep" ${BIN:-} > "$real/sweep.txt" 2>&1
kill "$copier" 2>/dev/null
cp "$work/evals.jsonl" "$real/" 2>/dev/null
tail -c 20000 "$real/sweep.txt"
tar cz -C "$work" sweep | split -d -b 15M - "$real/sweep.tgz.part"
ls -la "$real"
