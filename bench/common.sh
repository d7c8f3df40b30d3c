# common.sh: what every benchmark script sets up (sourced by run_bench.sh and run_bench_long.sh):
# one thread per rank, passive OpenMP waits, the same OpenBLAS kernels for dsv4cp and the PyTorch
# peer (dsv4cp picks the AVX-512/AVX2 kernels itself: Debian's OpenBLAS 0.3.21 falls back to SSE3 on
# this CPU; the peer runs on the system OpenBLAS too and gets the same choice through the
# environment), and the mpirun line for two ranks.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -q avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -q avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell; fi
fi
# A user's OPENBLAS_CORETYPE is kept; say at the start when it selects narrower kernels than this CPU
# runs (`dsv4cp info`'s note: an inherited Haswell on AVX-512 halves every figure of a two-hour run).
[ -x "${BUILD:-build}/dsv4cp" ] && { "${BUILD:-build}/dsv4cp" info 2>/dev/null | grep '^note:' >&2 || true; }
# MPIRUN_ANY: the same line without the rank count (bench/gemm_profile.sh's NP); ranks inherit the
# environment set here
MPIRUN_ANY="mpirun --quiet --oversubscribe --bind-to none"
[ "$(id -u)" -eq 0 ] && MPIRUN_ANY="$MPIRUN_ANY --allow-run-as-root"
MPIRUN="$MPIRUN_ANY -np 2"
