#!/usr/bin/env bash
# Issue 16: the Mamba-3 paper's state-tracking table (Table 5b) on one GPU,
# both precisions, 5 seeds each. The whole table needs far more GPU time than
# one ten-minute visit (an arithmetic run is 40,000 steps, about 4.6 minutes of
# one GPU alone in bf16, and concurrent runs share that throughput), so run
# it a part a visit with TASKS / ROTATIONS / FIRST_SEED and join the parts
# with `stepgraph repro state-tracking --merge`. Stage the
# binary here, run this there (from the repository root, .gpu/ beside it):
#
#   bash tests/gpu/stage --no-tests      # here: builds .gpu/bin/stepgraph
#   bash tests/gpu/state-tracking.sh     # there
#
# What comes back (a device call returns at most 8 files from $OUT):
#   $OUT/summary.txt          timings, both tables, one line per run
#   $OUT/f32-table.md, $OUT/bf16-table.md
#   $OUT/state-tracking.tgz   per precision: table.md, table.json,
#                             results.jsonl, metrics.jsonl (every run's evals,
#                             dynamics, one step in 10), the plots, the logs
# The runs' own directories (full metrics, checkpoints) stay in WORK.
#
# Steps (each bounded, so the whole visit stays within the budget):
#   1. a smoke test: `repro state-tracking --quick` (every cell, 2 seeds, 8
#      runs at once): compiles the kernels into the cache and proves the
#      concurrent runner on this machine; if any run fails there, the table
#      runs one run at a time (JOBS=1) instead;
#   2. the table in f32, then in bf16: `repro state-tracking --seeds 5`,
#      JOBS runs at once, each stopped after LIMIT seconds (the runs left
#      are reported as stopped or skipped; the queue goes seed by seed, so
#      whole seeds finish first).
#
# Environment: OUT (default: a temp dir), WORK (the runs; default: a temp
# dir), BIN (.gpu/bin/stepgraph), JOBS (16), LIMIT (seconds per precision,
# 190), SEEDS (5), FIRST_SEED (0), TASKS and ROTATIONS (comma-separated, as
# the command's --tasks / --rotations; default: all), PRECISIONS ("f32 bf16").
# For example, the parity column of Mamba-3 in both precisions, about 4 min:
#   TASKS=parity ROTATIONS=data JOBS=5 LIMIT=150 bash tests/gpu/state-tracking.sh
set -uo pipefail
. "$(dirname "$0")/common.sh"
root=$work
jobs=${JOBS:-16}
limit=${LIMIT:-190}
seeds=${SEEDS:-5}
subset=(--first-seed "${FIRST_SEED:-0}")
[ -n "${TASKS:-}" ] && subset+=(--tasks "$TASKS")
[ -n "${ROTATIONS:-}" ] && subset+=(--rotations "$ROTATIONS")
summary="$out/summary.txt"
: > "$summary"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader \
  | tee -a "$summary" || true
nproc | sed 's/^/cpus: /' | tee -a "$summary"

SECONDS=0
timeout -s INT 120 "$bin" repro state-tracking --quick --seeds 2 --jobs 8 \
  --out "$root/quick" > "$root/quick.log" 2>&1
rc=$?
echo "quick: exit $rc after ${SECONDS} s" | tee -a "$summary"
if [ $rc -ne 0 ] || grep -q '"outcome":"failed' "$root/quick/results.jsonl" 2>/dev/null; then
  echo "quick run failed or lost runs: the table runs one at a time" | tee -a "$summary"
  tail -20 "$root/quick.log" | tee -a "$summary"
  jobs=1
fi

for p in ${PRECISIONS:-f32 bf16}; do
  SECONDS=0
  # The time limit stops the runs cleanly; the outer timeout only guards
  # against a hang (the table is then lost, the runs' own files are not).
  timeout -s INT $((limit + 90)) "$bin" repro state-tracking --seeds "$seeds" \
    --precision "$p" --jobs "$jobs" --time-limit "$limit" "${subset[@]}" --out "$root/$p" \
    > "$root/$p.log" 2>&1
  rc=$?
  echo "$p: exit $rc after ${SECONDS} s (jobs $jobs, limit $limit s)" | tee -a "$summary"
  sed -n '/^scaled accuracy/,$p' "$root/$p.log" | tee -a "$summary"
done
# The per-run table with the dynamics, and what comes back.
for p in ${PRECISIONS:-f32 bf16}; do
  echo "== $p runs" >> "$summary"
  sed -n '/^## Runs/,$p' "$root/$p/table.md" >> "$summary" 2>/dev/null
  cp "$root/$p/table.md" "$out/$p-table.md" 2>/dev/null
done
(cd "$root" && tar czf "$out/state-tracking.tgz" --exclude='*/runs' quick.log f32.log bf16.log \
  f32 bf16 quick 2>/dev/null)
ls -l "$out" | tee -a "$summary"
