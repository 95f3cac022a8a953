# Sourced by the GPU scripts that drive `stepgraph` (state-tracking.sh,
# table-part.sh, init-cross.sh): the staged binary, checked, and the two
# directories every such script writes, the returned files ($OUT) and the
# runs ($WORK).
# Sets `bin`, `out` and `work`; exits 2 when the binary is missing.
bin=${BIN:-.gpu/bin/stepgraph}
if [ ! -x "$bin" ]; then
  echo "no $bin: run 'bash tests/gpu/stage --no-tests' first, or set BIN" >&2
  exit 2
fi
out=${OUT:-$(mktemp -d)}
work=${WORK:-$(mktemp -d)}
mkdir -p "$out" "$work"
