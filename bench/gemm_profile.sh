#!/bin/sh
# gemm_profile.sh [dsv4cp bench options]: where a forward + backward spends its time, by GEMM call
# site: every cblas_sgemm call of the last timed run, grouped by the library function that made it
# and its shape, against the same-run reference sgemm, and what is left outside the GEMMs. Builds a
# frame-pointer copy of the library and CLI in build-prof/ (bench/gemmprof.c wraps cblas_sgemm),
# runs `dsv4cp bench` with the given options (default: CSA, 1024 tokens, CP = 1, one thread) and
# prints bench/gemm_profile.py's table. Not part of `make bench` (the timers add nothing measurable,
# but the frame-pointer build is not the shipped one). NP=2 (or more) runs it under mpirun, one thread
# per rank, and prints rank 0's calls (each rank writes its own file).
#   bench/gemm_profile.sh --layer 2 --seq 4096
#   NP=2 bench/gemm_profile.sh --layer 3 --seq 4096 --split zigzag
cd "$(dirname "$0")/.." || exit 2
. bench/common.sh
P=build-prof
mkdir -p $P && make --no-print-directory BUILD=$P OPT="-O3 -march=native -fno-omit-frame-pointer -g" $P/dsv4cp > $P/build.log 2>&1 ||
  { tail -n 20 $P/build.log; exit 1; }
CFLAGS_P="-O2 -g -fno-omit-frame-pointer -fopenmp -I/usr/include/x86_64-linux-gnu/openblas-openmp"
mpicc $CFLAGS_P -c bench/gemmprof.c -o $P/gemmprof.o || exit 1
mpicc -o $P/dsv4cp-gemmprof $P/obj/tools/*.o $P/libdsv4cp.a $P/gemmprof.o -Wl,--wrap=cblas_sgemm \
  -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas \
  $(mpicc --showme:link) -lcjson -lm -ldl -fopenmp || exit 1
[ $# -eq 0 ] && set -- --layer 2 --seq 1024
OUT=bench/out/gemmprof
mkdir -p "$OUT"
rm -f "$OUT"/sites.txt* "$OUT"/run.jsonl
RUN=""
[ "${NP:-1}" -gt 1 ] && RUN="$MPIRUN_ANY -np $NP"
DSV4_GEMMPROF="$OUT/sites.txt" $RUN "$P/dsv4cp-gemmprof" bench --threads 1 --reps 2 "$@" --json "$OUT/run.jsonl" || exit 1
/usr/bin/python3 bench/gemm_profile.py "$P/dsv4cp-gemmprof" "$OUT/sites.txt" "$OUT/run.jsonl"
