#!/usr/bin/env bash
# Issue 16: does a run's outcome follow its initial weights or its rows?
# Runs of the arithmetic column's recipe (bf16) whose init and data come from
# different seeds, or whose init is a spliced model directory
# (STATE-TRACKING.md, rounds 26-27). Two steps:
#
# Here, on the CPU (no GPU needed), after `bash tests/gpu/stage --no-tests`:
#   bash tests/gpu/init-cross.sh inits .gpu/inits 1 9
#     writes .gpu/inits/initS (config.json + model.safetensors) per seed:
#     the recipe's exact initial weights, from a one-step run at lr 1e-30
#     without decay (which moves no weight). It first checks that the flags
#     below are still the recipe's: a one-step `repro state-tracking` run of
#     the first seed must hold the same run config (cadence aside).
#   .gpu/bin/splice_init .gpu/inits/init1 .gpu/inits/init9 .gpu/inits/x-dd \
#     in_proj.weight:640-704 dt_bias          # init 1 with init 9's dd rows
#
# There, with .gpu carried (runs go to ROOT, default runs/cross, kept while
# the machine stays warm, so a second call resumes them):
#   STOP=24000 TOTAL=530 bash tests/gpu/init-cross.sh train 9:1 1:9 x-dd:1 1:1:2e-3
#     each INIT:DATA trains `--seed INIT --data-seed DATA`, or, where INIT
#     names a directory under .gpu/inits, `--init-from` it with
#     `--data-seed DATA`; a third field sets that run's peak learning rate
#     (else LR, else the recipe's 1e-3), a fourth its precision (bf16, the
#     default, or f32, each with its recipe chunk); EXTRA adds flags to
#     every fresh run (e.g. EXTRA="--trim", or EXTRA="--edit layers.1.mixer.in_proj.weight:
#     656-672*0@4000", no spaces inside a flag's value); STEPS=60000 makes
#     fresh runs longer, the curriculum keeping its 60%. All at once under CUDA MPS, each
#     stopped at step STOP or after TOTAL seconds (cleanly: a later call
#     resumes it; a directory already under ROOT with checkpoints, e.g. one
#     that `splice_init` made from a training checkpoint, is resumed the same
#     way). Every run logs the dynamics probe (`--log-dynamics`, which
#     changes no step). Prints a line per run (started: the first evaluation at
#     >= 50% raw at the training size; fitted: at >= 94%; scaled scores;
#     each block's mean retention at the last probe; raw curve) into
#     $OUT/summary-ROOTNAME.txt. FETCH=1 (the round's last
#     call) also returns every run's metrics and logs and stops MPS; KEEP=1
#     returns what a later machine needs to resume the runs instead (each
#     run's newest checkpoint, metrics and log, one archive cut into 15 MiB
#     pieces $OUT/runs.tgz.partNN), for rounds that span sessions: here,
#     `mkdir -p .gpu/keep/NAME && cat FILES_AT/runs.tgz.part* | tar xz -C
#     .gpu/keep/NAME`, carry .gpu, and start the later call with `mkdir -p
#     runs && cp -r .gpu/keep/NAME runs/` to resume with ROOT=runs/NAME (a
#     ROOT inside .gpu would be overwritten by the next call's carried
#     copy). A call returns at most 64 MiB: about nine runs' KEEP.
#   EDIT_AT=4000 AFTER=6000 TOTAL=560 FETCH=1 bash tests/gpu/init-cross.sh \
#     causal 1:1::f32 1:1:2e-3 2:2:2e-3 20:20:2e-3
#     round 34 in one call, needing nothing from an earlier one: the pairs
#     train to EDIT_AT, and each whose middle layer then keeps a long memory
#     is continued with that layer's decay reset and, as the control, with
#     the last layer's (`causal` below). DEVICE=cpu runs any mode's
#     training on the CPU instead, for a smoke test of the script with a
#     few steps (EDIT_AT=2 AFTER=1 THRESH=0 and f32 pairs).
#   bash tests/gpu/init-cross.sh rate 2000
#     `train --trim`'s rate against the padded step's (`rate` below);
#     PACK=2 MODES="trimmed packed" RUNS=6 FROM=80 ... rate 1500: packing's
#     rate with six runs under MPS, rows of every size.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." && . "$here/common.sh"
# The arithmetic recipe (runtime/src/repro/recipe.rs) as `train` flags, less
# the chunk (each precision's own, `chunk_of`); `inits` checks them against
# `repro`.
# STEPS (default the recipe's 40,000) lengthens every run, the curriculum
# keeping its 60% share as `repro --steps` keeps it (round 37's screen).
steps=${STEPS:-40000}
curriculum=$((steps * 3 / 5))
recipe=(--task modarith-prec --train-len 80 --eval-lens 80,128 --curriculum "$curriculum"
  --curriculum-start 20 --skewed-rows 0.5 --eval-mix 20-128 --eval-products 8
  --d-model 128 --n-layer 3 --d-state 64 --headdim 16 --expand 2 --rotation data
  --a-activation softplus --dt-init 0.01,0.1 --batch 256 --steps "$steps"
  --warmup 1000 --decay outputs --beta2 0.95 --adam-eps 1e-8 --clip 1
  --eval-every 1000 --log-every "$steps" --keep-at "$curriculum" --ema 0.999)

# The run config of a checkpoint's train_state.json, less what may differ
# between the check's two runs (this script's runs pad their batches, as the
# runs it compares with did; the recipes now trim, the same steps up to
# rounding).
config_of() {
  python3 - "$1" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
for k in ("checkpoint_every", "keep", "keep_at", "data_seed", "log_every", "precision", "init_from", "trim"):
    run.pop(k, None)
run["model"].pop("chunk_size", None)
run["lr"] = run["min_lr"] = run["weight_decay"] = None
print(json.dumps(run, sort_keys=True, indent=1))
PY
}

inits() {
  local dir=$1 tmp s want got
  shift
  [ $# -gt 0 ] || { echo "usage: init-cross.sh inits DIR SEED..." >&2; exit 2; }
  tmp=$(mktemp -d)
  for s in "$@"; do
    "$bin" train "${recipe[@]}" --chunk-size 64 --device cpu --precision f32 --lr 1e-30 --min-lr 1e-30 \
      --weight-decay 0 --seed "$s" --stop-after 1 --run-dir "$tmp/run$s" --progress quiet \
      > "$tmp/run$s.log" 2>&1 || { cat "$tmp/run$s.log" >&2; exit 1; }
  done
  # Before any init is written: the first seed's run must be the recipe's.
  "$bin" repro state-tracking --tasks modarith-prec --rotations data --seeds 1 \
    --first-seed "$1" --precision f32 --device cpu --stop-after 1 --jobs 1 \
    --out "$tmp/repro" > "$tmp/repro.log" 2>&1 || { cat "$tmp/repro.log" >&2; exit 1; }
  want=$(config_of "$tmp"/repro/runs/*/checkpoints/step-*/train_state.json) || exit 1
  got=$(config_of "$tmp/run$1"/checkpoints/step-*/train_state.json) || exit 1
  if [ -z "$want" ] || ! diff <(echo "$want") <(echo "$got") >&2; then
    echo "init-cross.sh: its flags are no longer the recipe's (diff above)" >&2
    exit 1
  fi
  for s in "$@"; do
    rm -rf "$dir/init$s" && mkdir -p "$dir/init$s"
    cp "$tmp/run$s"/checkpoints/step-00000001/{config.json,model.safetensors} "$dir/init$s/"
    echo "$dir/init$s"
  done
  rm -rf "$tmp"
}

# The recipe's chunk for a precision (the scan's faster one, recipe.rs).
chunk_of() { [ "$1" = f32 ] && echo 32 || echo 64; }

# The run directory name of a pair INIT:DATA[:LR[:PREC]].
name_of() {
  local a b lr prec
  IFS=: read -r a b lr prec <<< "$1"
  echo "i$a-d$b${lr:+-lr$lr}${prec:+-$prec}"
}

# Starts one run in the background, stopped at step $3 or after $4 seconds:
# the pair $2 fresh in directory $1, or $1 resumed where it holds
# checkpoints (a run of an earlier call, or one that `splice_init --run`
# made from a training checkpoint).
launch() {
  local dir=$1 pair=$2 stop=$3 total=$4 a b lr prec
  if [ -d "$dir/checkpoints" ]; then
    timeout -s INT "$total" "$bin" train --resume "$dir" --stop-after "$stop" \
      --log-dynamics --progress plain >> "$dir.log" 2>&1 &
    return
  fi
  IFS=: read -r a b lr prec <<< "$pair"
  prec=${prec:-bf16}
  local from=(--seed "$a") extra
  [ -d ".gpu/inits/$a" ] && from=(--init-from ".gpu/inits/$a")
  read -r -a extra <<< "${EXTRA:-}"
  rm -rf "$dir"
  timeout -s INT "$total" "$bin" train "${recipe[@]}" --chunk-size "$(chunk_of "$prec")" \
    --device "${DEVICE:-cuda}" --precision "$prec" --lr "${lr:-${LR:-1e-3}}" --min-lr 1e-5 --weight-decay 0.1 \
    --checkpoint-every 4000 --keep 1 "${from[@]}" --data-seed "$b" --stop-after "$stop" \
    --run-dir "$dir" --log-dynamics --progress plain "${extra[@]}" > "$dir.log" 2>&1 &
}

# One line per run into $OUT/summary-ROOTNAME.txt; arguments: ROOT, then a
# label and a directory name under ROOT per run.
summary() {
  local root=$1
  shift
  python3 - "$root" "$@" <<'PY' | tee -a "$out/summary-$(basename "$root").txt"
import json, os, sys
root, rest = sys.argv[1], sys.argv[2:]
scaled = lambda a: f"{(a - 0.2) / 0.8 * 100:.1f}"
for label, name in zip(rest[0::2], rest[1::2]):
    path = f"{root}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        print(f"{label}: no metrics")
        continue
    step, started, fitted, last, curve, memory = 0, None, None, {}, [], "-"
    for line in open(path):
        v = json.loads(line)
        if v.get("kind") == "train":
            step = max(step, v["step"])
        elif v.get("kind") == "dynamics":
            # Each block's mean retention over the probe row, at the latest
            # probe: the middle block's long memory marks a stalled run.
            memory = "/".join(f"{l['retention_mean']:.3f}" for l in v["layers"]) + f" @{v['step']}"
        elif v.get("kind") == "eval_ema":
            last[v["set"]] = v["accuracy"]
            if v["set"] == "len 80":
                curve.append(str(round(100 * v["accuracy"])))
                if started is None and v["accuracy"] >= 0.5:
                    started = v["step"]
                if fitted is None and v["accuracy"] >= 0.94:
                    fitted = v["step"]
    s = {k: scaled(last[k]) if k in last else "-" for k in ("len 80", "len 128", "mix 20-128")}
    prod = f"{100 * last['products 8']:.1f}%" if "products 8" in last else "-"
    print(f"{label}: step {step} started {started} fitted {fitted} @80 {s['len 80']} "
          f"@128 {s['len 128']} mix {s['mix 20-128']} prod8 {prod} retention {memory} curve {' '.join(curve)}")
PY
}

# What a round returns: KEEP's archive holds the metrics and logs too, so
# FETCH adds them only without it (a call returns at most 64 MiB); FETCH
# (a round's last call) also stops MPS.
finish() {
  local root=$1
  shift
  grep -h "error" "$root"/*.log | sort | uniq -c | head
  if [ -n "${KEEP:-}" ]; then
    pack_runs "$root" "$@"
  elif [ -n "${FETCH:-}" ]; then
    (cd "$root" && tar czf "$out/metrics-$(basename "$root").tgz" ./*/metrics.jsonl ./*.log)
  fi
  if [ -n "${FETCH:-}" ]; then
    echo quit | nvidia-cuda-mps-control
  fi
}

train() {
  [ $# -gt 0 ] || { echo "usage: init-cross.sh train INIT:DATA[:LR[:PREC]]..." >&2; exit 2; }
  local total=${TOTAL:-530} stop=${STOP:-24000} root=${ROOT:-runs/cross} p names=() rows=()
  mkdir -p "$root"
  nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/gpu: /'
  start_mps # one process per run
  SECONDS=0
  for p in "$@"; do
    names+=("$(name_of "$p")")
    launch "$root/${names[-1]}" "$p" "$stop" "$total"
    rows+=("$p" "${names[-1]}")
  done
  wait
  echo "trained for $SECONDS s"
  summary "$root" "${rows[@]}"
  finish "$root" "${names[@]}"
}

# Layer 2's mean retention (over its heads, a row of 128 operands) in a
# checkpoint, by `examples/dynamics_probe`: the table's third field of its
# second block line.
retention2() {
  "$(dirname "$bin")/dynamics_probe" "$1" modarith-prec 128 \
    | awk -F'|' '$1 ~ /^2 / { split($4, r, "/"); gsub(/ /, "", r[2]); print r[2] }'
}

# Round 34, the causal test of the middle layer's long memory, whole in one
# call (STATE-TRACKING.md): every pair trains to step EDIT_AT (default
# 4000); each run whose layer 2 then keeps at least THRESH (0.1) of its
# state on average is continued twice from that checkpoint for AFTER
# (6000) steps, with layer 2's `A` rows of `in_proj` set to 0 (the test:
# `A = softplus(0)`, a memory of tens of tokens, as at initialisation) and
# with layer 3's (the control, the same shock elsewhere); UNEDITED=1 also
# continues the run itself. TOTAL (560) seconds bound the whole call.
# `splice_init` is the staged example beside the binary.
causal() {
  [ $# -gt 0 ] || { echo "usage: init-cross.sh causal INIT:DATA[:LR[:PREC]]..." >&2; exit 2; }
  local total=${TOTAL:-560} at=${EDIT_AT:-4000} after=${AFTER:-6000} thresh=${THRESH:-0.1}
  local root=${ROOT:-runs/causal} p n ckpt r arm names=() rows=() arms=()
  local a_rows="in_proj.weight:656-672*0"
  mkdir -p "$root"
  nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/gpu: /'
  start_mps
  SECONDS=0
  for p in "$@"; do
    names+=("$(name_of "$p")")
    launch "$root/${names[-1]}" "$p" "$at" "$total"
  done
  wait
  echo "phase 1 (to step $at) took $SECONDS s"
  for n in "${names[@]}"; do rows+=("$n (to step $at)" "$n"); done
  summary "$root" "${rows[@]}"
  for n in "${names[@]}"; do
    ckpt=$(find "$root/$n/checkpoints" -maxdepth 1 -name 'step-*' 2>/dev/null | sort | tail -n 1)
    if [ -z "$ckpt" ] || [ "$(basename "$ckpt")" != "$(printf 'step-%08d' "$at")" ]; then
      echo "$n: did not reach step $at (${ckpt:-no checkpoint}); not edited"
      continue
    fi
    r=$(retention2 "$ckpt")
    echo "$n: layer 2 mean retention $r at step $at"
    if ! awk -v r="$r" -v t="$thresh" 'BEGIN { exit !(r != "" && r + 0 >= t + 0) }'; then
      continue
    fi
    for arm in L2:1 L3:2; do
      rm -rf "$root/$n-${arm%%:*}"
      if "$(dirname "$bin")/splice_init" --run "$ckpt" - "$root/$n-${arm%%:*}" \
        "layers.${arm##*:}.mixer.$a_rows" > "$root/$n-${arm%%:*}.log" 2>&1; then
        arms+=("$n-${arm%%:*}")
      else
        cat "$root/$n-${arm%%:*}.log"
      fi
    done
    [ -n "${UNEDITED:-}" ] && arms+=("$n")
  done
  if [ ${#arms[@]} -eq 0 ]; then
    echo "no run kept a long memory in layer 2 at step $at: nothing to continue"
  elif [ "$SECONDS" -lt "$total" ]; then
    for n in "${arms[@]}"; do
      launch "$root/$n" - "$((at + after))" "$((total - SECONDS))"
    done
    wait
    echo "phase 2 (to step $((at + after))) ended at $SECONDS s"
  fi
  for n in "${arms[@]}"; do
    [ "$n" = "${n%-L[23]}" ] && continue
    summary "$root" "$n (${n##*-} A rows zeroed at $at)" "$n"
  done
  [ -n "${UNEDITED:-}" ] && for n in "${arms[@]}"; do
    [ "$n" = "${n%-L[23]}" ] && summary "$root" "$n (unedited)" "$n"
  done
  finish "$root" "${names[@]}" "${arms[@]}"
}

# KEEP: each run's newest checkpoint (~6 MB; `--resume` takes the newest),
# metrics and log, as one archive cut into 15 MiB pieces, since a call
# returns at most 8 files of 16 MiB. Older checkpoints stay behind (the
# curriculum's-end one of `--keep-at` doubles a run's size).
pack_runs() {
  local root=$1 n newest
  shift
  for n in "$@"; do
    newest=$(cd "$root" && find "$n/checkpoints" -maxdepth 1 -name 'step-*' | sort | tail -n 1)
    [ -n "$newest" ] && printf '%s\n' "$newest"
    printf '%s\n' "$n/metrics.jsonl" "$n.log"
  done > "$root/.keep-list"
  (cd "$root" && tar czf - -T .keep-list) | split -b 15M -d - "$out/runs.tgz.part"
}

# `--trim`'s rate against the padded step's: the recipe's seed 1 (bf16, or
# PREC) trained from step 0 to step $1 (default 2000), padded and then
# trimmed, and with PACK=K also packed K a row (`--pack K`), each timed
# from the processes' start to the last one's exit (capture and
# evaluations included, the same in every mode), into
# $OUT/summary-rate.txt. MODES picks the modes (e.g. "trimmed packed");
# RUNS=N trains seeds 1..N at once under MPS, the table's case, and reports
# run-steps a second; FROM=M starts the curriculum at M operands (80: rows
# of every size from the first step, the rate after the curriculum's end).
rate() {
  local steps=${1:-2000} prec=${PREC:-bf16} runs=${RUNS:-1} mode dir t0 t1 s i
  local flags=("${recipe[@]}")
  if [ -n "${FROM:-}" ]; then
    for i in "${!flags[@]}"; do
      [ "${flags[$i]}" = --curriculum-start ] && flags[i + 1]=$FROM
    done
  fi
  [ "$runs" -gt 1 ] && start_mps
  for mode in ${MODES:-padded trimmed ${PACK:+packed}}; do
    t0=$(date +%s.%N)
    for s in $(seq 1 "$runs"); do
      dir=$work/rate-$mode-$s
      rm -rf "$dir"
      "$bin" train "${flags[@]}" --chunk-size "$(chunk_of "$prec")" --device "${DEVICE:-cuda}" \
        --precision "$prec" --lr 1e-3 --min-lr 1e-5 --weight-decay 0.1 --seed "$s" \
        --stop-after "$steps" --run-dir "$dir" --progress plain \
        $([ "$mode" = trimmed ] && echo --trim) $([ "$mode" = packed ] && echo --pack "$PACK") \
        > "$dir.log" 2>&1 &
    done
    wait
    t1=$(date +%s.%N)
    python3 -c "import sys; s, a, b = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]); \
print(f'{sys.argv[4]}: {sys.argv[5]} x {s} steps in {b - a:.1f} s, {int(sys.argv[5]) * s / (b - a):.1f} run-steps/s')" \
      "$steps" "$t0" "$t1" "$mode${FROM:+ from $FROM operands}" "$runs" | tee -a "$out/summary-rate.txt"
    for s in $(seq 1 "$runs"); do
      grep -h "^stopped" "$work/rate-$mode-$s.log" || tail -3 "$work/rate-$mode-$s.log"
    done | tee -a "$out/summary-rate.txt"
  done
}

case "${1:-}" in
  inits) shift; inits "$@" ;;
  train) shift; train "$@" ;;
  causal) shift; causal "$@" ;;
  rate) shift; rate "$@" ;;
  *) echo "usage: init-cross.sh inits DIR SEED... | train|causal INIT:DATA[:LR[:PREC]]... | rate [STEPS]" >&2; exit 2 ;;
esac
