#!/usr/bin/env bash
# Issue 16: one visit's share of a state-tracking table that takes several
# visits. A visit trains for LIMIT seconds; the runs the limit stops have
# checkpointed, and the whole table directory (checkpoints included) comes
# back packed, to be carried to the next visit and continued with
# `stepgraph repro state-tracking --resume`.
#
# First visit (PRECISION, TASKS, ROTATIONS, SEEDS, FIRST_SEED, JOBS as the
# command's flags, EXTRA for any other; default the whole bf16 table, 4 runs
# at once):
#   bash tests/gpu/stage --no-tests                       # here
#   PRECISION=bf16 TASKS=modarith-prec ROTATIONS=data LIMIT=540 bash tests/gpu/table-part.sh  # there
# Here, after it: unpack what came back into .gpu/table (carried with .gpu):
#   rm -rf .gpu/table && cat FILES_AT/table.tgz.part* | tar xz -C .gpu
# Later visits continue it:
#   RESUME=.gpu/table LIMIT=540 bash tests/gpu/table-part.sh
#
# SLIM=1 drops the optimizer moments of every checkpoint but each run's
# newest before packing (see below).
#
# What comes back ($OUT, at most 8 files of 16 MiB): table.md, progress.log
# and table.tgz.part00.. (15 MiB pieces of the table directory). A call may
# carry 64 MiB in all, and a run of the arithmetic recipe packs to about
# 5 MiB (its checkpoint and metrics), so keep about ten runs in flight.
set -uo pipefail
. "$(dirname "$0")/common.sh"
limit=${LIMIT:-540}
log="$out/progress.log"
if [ -n "${RESUME:-}" ]; then
  # Continue in a writable copy: the carried tree may be read-only.
  rm -rf "$work/table" && cp -r "$RESUME" "$work/table" && chmod -R u+w "$work/table"
  args=(repro state-tracking --resume "$work/table" --time-limit "$limit")
  [ -n "${JOBS:-}" ] && args+=(--jobs "$JOBS")
else
  args=(repro state-tracking --out "$work/table" --time-limit "$limit"
    --precision "${PRECISION:-bf16}" --seeds "${SEEDS:-5}" --first-seed "${FIRST_SEED:-0}"
    --jobs "${JOBS:-4}")
  [ -n "${TASKS:-}" ] && args+=(--tasks "$TASKS")
  [ -n "${ROTATIONS:-}" ] && args+=(--rotations "$ROTATIONS")
  # EXTRA: more flags of a first visit (e.g. `--quick --device cpu` to try
  # the script here).
  # shellcheck disable=SC2206 # the flags are meant to split
  [ -n "${EXTRA:-}" ] && args+=($EXTRA)
fi
echo "$bin ${args[*]}" | tee "$log"
SECONDS=0
# The time limit stops the runs cleanly; the outer timeout only guards a hang.
timeout -s INT $((limit + 60)) "$bin" "${args[@]}" >> "$log" 2>&1
echo "exit $? after ${SECONDS} s" | tee -a "$log"
cp "$work/table/table.md" "$out/table.md" 2>/dev/null
# SLIM=1: past the curriculum's end a run also keeps that step's checkpoint,
# and five runs' two checkpoints outgrow a call's 64 MiB carry. Only a run's
# newest checkpoint is resumed, so the others keep their weights and average
# (for the CPU readers) and lose the optimizer moments.
if [ "${SLIM:-0}" = 1 ]; then
  for ckpts in "$work"/table/runs/*/checkpoints; do
    find "$ckpts" -mindepth 1 -maxdepth 1 -name 'step-*' | sort | head -n -1 |
      while read -r old; do rm -f "$old/optimizer.safetensors"; done
  done
fi
(cd "$work" && tar czf - table) | split -b 15M -d - "$out/table.tgz.part"
ls -l "$out" | tee -a "$log"
