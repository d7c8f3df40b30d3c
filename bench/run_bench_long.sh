#!/bin/sh
# run_bench_long.sh BUILD: the long-context row (make bench-long): V4-Flash CSA (layer 2) and HCA
# (layer 3) layers at 65,536 tokens, CP = 2, with recomputation, on this 2-core machine; one timed
# forward + backward each without a warm-up (~10 and ~7 minutes). Records time, tokens/s, peak
# memory per rank and the planner's prediction for it (dsv4cp plan --recompute) in
# bench/out/results_long.jsonl; bench/report.py adds the table to the report.
#   BENCH_LONG_SEQ=65536   the length
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 2
OUT=bench/out
mkdir -p "$OUT"
rm -f "$OUT/results_long.jsonl"
SEQ=${BENCH_LONG_SEQ:-65536}
. bench/common.sh
for layer in 2 3; do
  echo "[long] layer $layer, $SEQ tokens, CP = 2, recomputation: planned memory per rank"
  "$BUILD/dsv4cp" plan --seq "$SEQ" --ranks 2 --recompute --layer "$layer" | sed -n 's/^  memory/  memory/p;/= /p'
  echo "[long] layer $layer: running (no warm-up, one timed forward + backward)"
  $MPIRUN "$BUILD/dsv4cp" bench --layer "$layer" --seq "$SEQ" --reps 1 --warmup 0 --threads 1 --recompute \
    --json "$OUT/results_long.jsonl" || echo "  failed"
done
/usr/bin/python3 bench/report.py "$OUT"
