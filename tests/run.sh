#!/usr/bin/env bash
# run.sh: runs test binaries one after another and sums their closing lines.
# --require-gpu: a suite that skips for want of a device is a failure (make gpu-test).
set -u
require_gpu=0
if [ "${1:-}" = "--require-gpu" ]; then require_gpu=1; shift; fi
passed=0 failed=0 skipped=0 broken=0 skip_lines=()
for t in "$@"; do
  out=$("$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^[[:alnum:]_-]*: [0-9]* passed, [0-9]* failed$' | grep -v ' cases skipped (.*)$'
  line=$(printf '%s\n' "$out" | grep -E '^[[:alnum:]_-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  skip=$(printf '%s\n' "$out" | grep -E ' cases skipped \(.*\)$' | tail -n 1)
  if [ -n "$skip" ]; then
    n=$(printf '%s\n' "$skip" | sed -E 's/.*: ([0-9]+) cases skipped.*/\1/')
    skipped=$((skipped + n)); skip_lines+=("$(basename "$t")")
  elif [ -n "$line" ]; then
    p=$(printf '%s\n' "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
    passed=$((passed + p)); failed=$((failed + f))
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "$(basename "$t"): exit $rc with no failed case"; broken=$((broken + 1)); }
  else
    echo "$(basename "$t"): crashed or printed no summary (exit $rc)"; broken=$((broken + 1))
  fi
done
failed=$((failed + broken))
if [ "$skipped" -gt 0 ]; then
  echo "GPU suites: $skipped cases skipped (no CUDA device, or a kernel family not built): ${skip_lines[*]}"
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
if [ "$failed" -ne 0 ]; then exit 1; fi
if [ "$require_gpu" -eq 1 ] && [ "$skipped" -ne 0 ]; then echo "gpu-test needs a CUDA device and every kernel family built"; exit 1; fi
exit 0
