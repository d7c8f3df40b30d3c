#!/bin/sh
# run_bench.sh BUILD: the benchmark report (make bench). For each layer kind of V4-Flash (SWA layer 0,
# CSA layer 2, HCA layer 3) and length 1024, 4096, 8192: dsv4cp with CP = 1 and CP = 2 (contiguous
# and zigzag), CP = 1 with recomputation, CP = 2 on randomly packed documents of 50..3000 tokens
# (4096 and up), one thread per rank, and the PyTorch peer (bench/peer.py) with one thread; each
# configuration in its own process so that peak memory is per configuration. Then bench/report.py
# writes bench/out/report.txt, report.json and the plots. At 4096 tokens also two V4.1-Flash source
# groups (kv source 14, r = 2, with its reuse layers 15 and 16; kv source 20, r = 1, with 21 and 22),
# CP = 1 and 2. (make bench-long: bench/run_bench_long.sh.)
#   BENCH_SEQS="1024 4096"  lengths to run (default 1024 4096 8192)
#   BENCH_PEER=0            skip the PyTorch peer
#   BENCH_REPS=3            timed repetitions (lengths >= 8192 use 1)
BUILD=${1:-build}
cd "$(dirname "$0")/.." || exit 2
OUT=bench/out
mkdir -p "$OUT"
rm -f "$OUT/results.jsonl" "$OUT/peer.jsonl" "$OUT/plan.txt"
SEQS=${BENCH_SEQS:-"1024 4096 8192"}
PEER=${BENCH_PEER:-1}
. bench/common.sh
total=0
for s in $SEQS; do total=$((total + 3 * (4 + PEER))); [ "$s" -ge 4096 ] && total=$((total + 3)); done
case " $SEQS " in *" 4096 "*) total=$((total + 4)) ;; esac
k=0
step() { k=$((k + 1)); printf '[%2d/%2d] %s\n' "$k" "$total" "$*"; }
"$BUILD/dsv4cp" bench --header --layer 0 --seq 64 --reps 1 --preset tiny > /dev/null 2>&1 # warm caches
for s in $SEQS; do
  reps=${BENCH_REPS:-3}
  [ "$s" -ge 8192 ] && reps=1
  for kind in "0 0" "4 2" "128 3"; do
    set -- $kind
    r=$1; layer=$2
    step "dsv4cp CP=1 ratio $r seq $s"
    "$BUILD/dsv4cp" bench --layer "$layer" --seq "$s" --reps "$reps" --threads 1 --json "$OUT/results.jsonl" || echo "  failed"
    step "dsv4cp CP=2 ratio $r seq $s"
    $MPIRUN "$BUILD/dsv4cp" bench --layer "$layer" --seq "$s" --reps "$reps" --threads 1 --json "$OUT/results.jsonl" || echo "  failed"
    step "dsv4cp CP=2 zigzag ratio $r seq $s"
    $MPIRUN "$BUILD/dsv4cp" bench --layer "$layer" --seq "$s" --reps "$reps" --threads 1 --split zigzag \
      --json "$OUT/results.jsonl" || echo "  failed"
    step "dsv4cp CP=1 recomputation ratio $r seq $s"
    "$BUILD/dsv4cp" bench --layer "$layer" --seq "$s" --reps "$reps" --threads 1 --recompute \
      --json "$OUT/results.jsonl" || echo "  failed"
    if [ "$s" -ge 4096 ]; then
      step "dsv4cp CP=2 packed documents of 50..3000 tokens ratio $r seq $s"
      $MPIRUN "$BUILD/dsv4cp" bench --layer "$layer" --seq "$s" --reps "$reps" --threads 1 --doc-lengths 50:3000 \
        --json "$OUT/results.jsonl" || echo "  failed"
    fi
    if [ "$PEER" = 1 ]; then
      step "PyTorch peer ratio $r seq $s"
      /usr/bin/python3 bench/peer.py bench --preset flash --ratio "$r" --seq "$s" --threads 1 --reps "$reps" \
        --json "$OUT/peer_${r}_${s}.json" > /dev/null || echo "  failed"
      cat "$OUT/peer_${r}_${s}.json" | /usr/bin/python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' \
        >> "$OUT/peer.jsonl" 2> /dev/null
    fi
  done
done
case " $SEQS " in *" 4096 "*)
  for group in 14-16 20-22; do
    step "dsv4cp CP=1 V4.1-Flash layers $group seq 4096"
    "$BUILD/dsv4cp" bench --preset flash41 --layers "$group" --seq 4096 --reps "${BENCH_REPS:-3}" --threads 1 \
      --json "$OUT/results.jsonl" || echo "  failed"
    step "dsv4cp CP=2 V4.1-Flash layers $group seq 4096"
    $MPIRUN "$BUILD/dsv4cp" bench --preset flash41 --layers "$group" --seq 4096 --reps "${BENCH_REPS:-3}" \
      --threads 1 --json "$OUT/results.jsonl" || echo "  failed"
  done ;;
esac
"$BUILD/dsv4cp" plan --preset flash --seq 4096 --ranks 2 > "$OUT/plan.txt"
/usr/bin/python3 bench/report.py "$OUT"
