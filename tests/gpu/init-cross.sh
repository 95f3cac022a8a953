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
#     (else LR, else the recipe's 1e-3). All at once under CUDA MPS, each
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
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.." && . "$here/common.sh"
# The arithmetic recipe (runtime/src/repro/recipe.rs) as `train` flags, bf16's
# chunk; `inits` checks them against `repro`.
recipe=(--task modarith-prec --train-len 80 --eval-lens 80,128 --curriculum 24000
  --curriculum-start 20 --skewed-rows 0.5 --eval-mix 20-128 --eval-products 8
  --d-model 128 --n-layer 3 --d-state 64 --headdim 16 --expand 2 --rotation data
  --a-activation softplus --chunk-size 64 --dt-init 0.01,0.1 --batch 256 --steps 40000
  --warmup 1000 --decay outputs --beta2 0.95 --adam-eps 1e-8 --clip 1
  --eval-every 1000 --log-every 40000 --keep-at 24000 --ema 0.999)

# The run config of a checkpoint's train_state.json, less what may differ
# between the check's two runs.
config_of() {
  python3 - "$1" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["run"]
for k in ("checkpoint_every", "keep", "keep_at", "data_seed", "log_every", "precision", "init_from"):
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
    "$bin" train "${recipe[@]}" --device cpu --precision f32 --lr 1e-30 --min-lr 1e-30 \
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

train() {
  [ $# -gt 0 ] || { echo "usage: init-cross.sh train INIT:DATA[:LR]..." >&2; exit 2; }
  local total=${TOTAL:-530} stop=${STOP:-24000} root=${ROOT:-runs/cross} p a b lr dir names=()
  mkdir -p "$root"
  nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/gpu: /'
  start_mps # one process per run
  SECONDS=0
  for p in "$@"; do
    IFS=: read -r a b lr <<< "$p"
    names+=("i$a-d$b${lr:+-lr$lr}")
    dir=$root/${names[-1]}
    if [ -d "$dir/checkpoints" ]; then
      timeout -s INT "$total" "$bin" train --resume "$dir" --stop-after "$stop" \
        --log-dynamics --progress plain >> "$dir.log" 2>&1 &
    else
      local from=(--seed "$a")
      [ -d ".gpu/inits/$a" ] && from=(--init-from ".gpu/inits/$a")
      rm -rf "$dir"
      timeout -s INT "$total" "$bin" train "${recipe[@]}" --device cuda --precision bf16 \
        --lr "${lr:-${LR:-1e-3}}" --min-lr 1e-5 --weight-decay 0.1 --checkpoint-every 4000 --keep 1 "${from[@]}" \
        --data-seed "$b" --stop-after "$stop" --run-dir "$dir" --log-dynamics --progress plain > "$dir.log" 2>&1 &
    fi
  done
  wait
  echo "trained for $SECONDS s"
  python3 - "$root" "$@" "${names[@]}" <<'PY' | tee "$out/summary-$(basename "$root").txt"
import json, os, sys
# The pairs as given, then each one's run directory as named above.
root, rest = sys.argv[1], sys.argv[2:]
pairs, names = rest[: len(rest) // 2], rest[len(rest) // 2 :]
scaled = lambda a: f"{(a - 0.2) / 0.8 * 100:.1f}"
for p, name in zip(pairs, names):
    a, b, lr = (p.split(":") + [""])[:3]
    path = f"{root}/{name}/metrics.jsonl"
    if not os.path.exists(path):
        print(f"{p}: no metrics")
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
    print(f"init {a} data {b}{' lr ' + lr if lr else ''}: step {step} started {started} fitted {fitted} @80 {s['len 80']} "
          f"@128 {s['len 128']} mix {s['mix 20-128']} prod8 {prod} retention {memory} curve {' '.join(curve)}")
PY
  grep -h "error" "$root"/*.log | sort | uniq -c | head
  # KEEP's archive holds the metrics and logs too, so FETCH adds them only
  # without it: a call returns at most 64 MiB.
  if [ -n "${KEEP:-}" ]; then
    pack_runs "$root" "${names[@]}"
  elif [ -n "${FETCH:-}" ]; then
    (cd "$root" && tar czf "$out/metrics-$(basename "$root").tgz" ./*/metrics.jsonl ./*.log)
  fi
  if [ -n "${FETCH:-}" ]; then
    echo quit | nvidia-cuda-mps-control
  fi
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

case "${1:-}" in
  inits) shift; inits "$@" ;;
  train) shift; train "$@" ;;
  *) echo "usage: init-cross.sh inits DIR SEED... | train INIT:DATA[:LR]..." >&2; exit 2 ;;
esac
