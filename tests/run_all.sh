#!/bin/sh
# run_all.sh BUILD: every test of the project, against the binaries in BUILD; the last line is
# "N passed, M failed" and the exit status is non-zero on any failure (or any test program that
# crashed or printed nothing). Used by `make test` (twice: normal build, then ASan + UBSan).
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 2
PY=/usr/bin/python3
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# threads sleep instead of spinning while they wait: on a shared 2-core machine spinning threads
# of one test program starve another (measured: 0.4 s instead of 12 s for the operator tests)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export DSV4_GOLDEN=${DSV4_GOLDEN:-build/golden}
# Open MPI 4.1's default messaging layer first opens its Omni-Path component, whose library sleeps
# ~0.2 s per process in its constructor before the layer falls back to ob1 over shared memory on a
# machine without that hardware. Asking for ob1 over shared memory directly (the transport the tests
# ran on anyway) takes a 2-rank start from 0.49 to 0.21 s, which the suite's ~1000 starts per pass
# add up. One-process CLI runs make themselves daemon-less singletons without a session directory
# (tools/dsv4cp.c); daemon-less singletons are not asked for here: they all take the same job name,
# and Python helpers started side by side as such raced on its session directory (MPI_Init failed).
export OMPI_MCA_pml=${OMPI_MCA_pml:-ob1}
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
if [ "${DSV4_SANITIZED:-0}" = 1 ]; then
  # Leak checking is on for the C unit tests (they never start MPI). Programs that start Open MPI
  # report its plugins' allocations, kept until exit by design from unloaded modules that no
  # suppression can name, so the CLI and MPI tests run with detect_leaks=0 (errors still abort).
  export ASAN_OPTIONS="detect_leaks=0:exitcode=86"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  LEAKS="ASAN_OPTIONS=detect_leaks=1:exitcode=86"
fi
mkdir -p "$BUILD" "$DSV4_GOLDEN"
LOG="$BUILD/test-log.txt"
: > "$LOG"

run() { # name, command...: runs one test program, appending its output to the log (the lane's, in a lane)
  name=$1; shift
  start=$(date +%s)
  out="$BUILD/.out${LANE:+.$LANE}" log="$LOG${LANE:+.$LANE}"
  "$@" > "$out" 2>&1
  rc=$?
  cat "$out" >> "$log"
  grep -E '^(PASS|FAIL|note:)' "$out" | grep -v '^PASS'
  p=$(grep -c '^PASS' "$out"); f=$(grep -c '^FAIL' "$out")
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "FAIL $name exited with status $rc and reported no failure (crash?)" | tee -a "$log"
    tail -5 "$out"
  fi
  echo "  $name: $p passed, $f failed ($(( $(date +%s) - start )) s)"
}

echo "== C unit tests"
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] && run "$(basename "$t")" env ${LEAKS:-} "$t"
done
run "test_mem, DSV4_NO_HUGEPAGES=1" env ${LEAKS:-} DSV4_NO_HUGEPAGES=1 "$BUILD/tests/test_mem"
# The weight gradients' merged calls (a strip of blocks in one BLAS call) are taken only where a
# probe finds that the kernels give each block its own call's bits: OpenBLAS's AVX2 kernels
# (Haswell, Zen) do not, so on such a machine the merged path would go untested; the AVX kernels
# (Sandybridge, which any x86-64 CPU with AVX runs) do.
run "test_xacc, OPENBLAS_CORETYPE=Sandybridge" env ${LEAKS:-} OPENBLAS_CORETYPE=Sandybridge "$BUILD/tests/test_xacc"
# The long Python drivers run in two lanes at once: alone, each leaves the machine about 45% idle
# (process starts, ranks waiting on each other), and together test_cp and test_v41 took 166 s
# against 279 s one after the other. Nothing they check depends on time except their no-hang bounds
# (30 - 60 s for jobs that take a few); golden cases two lanes share are made under a lock
# (testlib.case_lock). Each lane logs to its own file, appended to the log in lane order at the end.
lane_a() {
  echo "== [a] reference self-test (tests/ref)"
  [ "${DSV4_SANITIZED:-0}" = 1 ] || run "ref selftest" $PY tests/ref/selftest.py
  [ "${DSV4_SANITIZED:-0}" = 1 ] || run "ref selftest41" $PY tests/ref/selftest41.py
  echo "== [a] single rank against the float64 PyTorch reference"
  run "golden" $PY tests/test_golden.py --build "$BUILD"
  echo "== [a] context parallelism (mpirun -np 1..4)"
  run "cp" $PY tests/test_cp.py --build "$BUILD"
}
lane_b() {
  echo "== [b] DeepSeek V4.1 layer ranges (run --layers): reference, CP, released checkpoint, errors"
  run "v41" $PY tests/test_v41.py --build "$BUILD"
  echo "== [b] PyTorch binding (python/dsv4cp)"
  run "python" $PY tests/test_python.py --build "$BUILD"
  echo "== [b] examples and the README program"
  run "examples" $PY tests/test_examples.py --build "$BUILD"
  echo "== [b] released checkpoints: shards, index, FP8, MTP names (tests/ckptlib.py writes them by hand)"
  run "checkpoint" $PY tests/test_checkpoint.py --build "$BUILD"
  echo "== [b] determinism: the training step's bytes for 1 and 2 threads, with and without recomputation"
  run "determinism" $PY tests/test_determinism.py --build "$BUILD"
}
: > "$LOG.a"
: > "$LOG.b"
(LANE=a lane_a) &
(LANE=b lane_b) &
wait
cat "$LOG.a" "$LOG.b" >> "$LOG"
rm -f "$LOG.a" "$LOG.b"
echo "== command line"
run "cli" $PY tests/test_cli.py --build "$BUILD"
echo "== installed library (pkg-config, exported symbols)"
run "install" $PY tests/test_install.py --build "$BUILD"
echo "== untrusted input: escaped messages, range checks, non-regular files, signals during output"
run "hardening" $PY tests/test_hardening.py --build "$BUILD"
FUZZ_BUILD=${FUZZ_BUILD:-build-fuzz}
if [ "${DSV4_SANITIZED:-0}" != 1 ]; then  # the harnesses are sanitizer builds of their own
  echo "== fuzz harnesses, ${FUZZ_SMOKE_SECONDS:-3} s each ($FUZZ_BUILD; make fuzz for longer runs)"
  if [ -x "$FUZZ_BUILD/fuzz_config" ]; then
    run "fuzz" tests/fuzz/run_fuzz.sh "$FUZZ_BUILD" "${FUZZ_SMOKE_SECONDS:-3}"
  else
    echo "note: $FUZZ_BUILD/fuzz_* not built (make fuzz-build): fuzz step skipped" | tee -a "$LOG"
  fi
fi
echo "== benchmark smoke run"
run "bench smoke" $PY tests/test_bench_smoke.py --build "$BUILD"

passed=$(grep -c '^PASS' "$LOG")
failed=$(grep -c '^FAIL' "$LOG")
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
