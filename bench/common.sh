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
MPIRUN="mpirun --quiet --oversubscribe --bind-to none -np 2"
[ "$(id -u)" -eq 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
