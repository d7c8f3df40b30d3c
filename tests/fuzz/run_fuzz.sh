#!/bin/sh
# run_fuzz.sh FUZZ_BUILD SECONDS: runs each fuzz harness of FUZZ_BUILD (built by `make fuzz-build`)
# for SECONDS on its seed corpus (tests/fuzz/corpus/NAME) plus what earlier runs found
# (FUZZ_BUILD/corpus/NAME). Prints one PASS/FAIL line per harness; exit status non-zero on a crash.
# A crashing input is kept as FUZZ_BUILD/artifacts/NAME-crash-* (libFuzzer) or NAME-last-input.
BUILD=${1:-build-fuzz}
SECONDS_EACH=${2:-60}
cd "$(dirname "$0")/../.." || exit 2
failed=0
for name in safetensors config index packing; do
  exe="$BUILD/fuzz_$name"
  if [ ! -x "$exe" ]; then
    echo "FAIL fuzz $name: $exe not built (make fuzz-build)"
    failed=$((failed + 1))
    continue
  fi
  mkdir -p "$BUILD/corpus/$name" "$BUILD/artifacts"
  log="$BUILD/fuzz-$name.log"
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$exe" -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=4096 -max_len=65536 \
    -artifact_prefix="$BUILD/artifacts/$name-" "$BUILD/corpus/$name" "tests/fuzz/corpus/$name" > "$log" 2>&1
  rc=$?
  runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -1)
  if [ "$rc" -eq 0 ]; then
    echo "PASS fuzz $name: ${runs:-no summary} in ${SECONDS_EACH} s"
  else
    echo "FAIL fuzz $name: exit $rc (log $log)"
    grep -E 'ERROR|SUMMARY|runtime error|Test unit written' "$log" | head -5
    failed=$((failed + 1))
  fi
done
[ "$failed" -eq 0 ]
