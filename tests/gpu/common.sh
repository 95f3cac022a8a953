# Sourced by the GPU scripts that drive `stepgraph` (state-tracking.sh,
# table-part.sh, init-cross.sh, parity-sweep.sh): the staged binary,
# checked, and the two directories every such script writes, the returned
# files ($OUT) and the runs ($WORK).
# Sets `bin`, `out` and `work`; exits 2 when the binary is missing. Defines
# `start_mps`.
bin=${BIN:-.gpu/bin/stepgraph}
if [ ! -x "$bin" ]; then
  echo "no $bin: run 'bash tests/gpu/stage --no-tests' first, or set BIN" >&2
  exit 2
fi
out=${OUT:-$(mktemp -d)}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"

# Starts CUDA MPS once per machine, so that the runs' processes share the
# GPU's SMs instead of time-slicing it (round 25: 6.9 against 7.8 ms a
# run-step); says so when it cannot.
start_mps() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  pgrep -f nvidia-cuda-mps-control >/dev/null && return
  if nvidia-cuda-mps-control -d; then echo "MPS daemon started"
  else echo "MPS did not start: the processes time-slice"; fi
}
