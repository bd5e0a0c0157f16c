#!/usr/bin/env bash
# run.sh: runs test binaries side by side (their host references are the slow part, the GPU
# is shared), then prints each one's output in the order given and sums their closing lines.
# --require-gpu: a suite that skips for want of a device or a kernel family is a failure (make
# gpu-test); cases that need what this machine lacks (a second GPU) are counted as skipped.
set -u
require_gpu=0
if [ "${1:-}" = "--require-gpu" ]; then require_gpu=1; shift; fi
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
i=0
for t in "$@"; do
  ( s=$(date +%s); "$t" > "$logs/$i.out" 2>&1; echo "$? $(( $(date +%s) - s ))" > "$logs/$i.rc" ) &
  i=$((i + 1))
done
wait
passed=0 failed=0 skipped=0 missing=0 broken=0 skip_lines=() i=0
for t in "$@"; do
  out=$(cat "$logs/$i.out"); read -r rc secs < "$logs/$i.rc"; i=$((i + 1))
  printf '%s\n' "$out" | grep -v '^[[:alnum:]_-]*: [0-9]* passed, [0-9]* failed$' | grep -v ' cases skipped (.*)$'
  line=$(printf '%s\n' "$out" | grep -E '^[[:alnum:]_-]+: [0-9]+ passed, [0-9]+ failed$' | tail -n 1)
  skip=$(printf '%s\n' "$out" | grep -E ' cases skipped \(.*\)$' | tail -n 1)
  if [ -n "$skip" ]; then
    n=$(printf '%s\n' "$skip" | sed -E 's/.*: ([0-9]+) cases skipped.*/\1/')
    skipped=$((skipped + n)); skip_lines+=("$(basename "$t")")
    case "$skip" in *"no CUDA device"* | *"not built"*) missing=$((missing + n)) ;; *) echo "$skip" ;; esac
  fi
  if [ -n "$line" ]; then
    echo "$line ($secs s)"
    p=$(printf '%s\n' "$line" | sed -E 's/.*: ([0-9]+) passed.*/\1/')
    f=$(printf '%s\n' "$line" | sed -E 's/.* ([0-9]+) failed$/\1/')
    passed=$((passed + p)); failed=$((failed + f))
    [ "$rc" -ne 0 ] && [ "$f" -eq 0 ] && { echo "$(basename "$t"): exit $rc with no failed case"; broken=$((broken + 1)); }
  elif [ -z "$skip" ]; then
    echo "$(basename "$t"): crashed or printed no summary (exit $rc)"; broken=$((broken + 1))
  fi
done
failed=$((failed + broken))
if [ "$skipped" -gt 0 ]; then
  echo "skipped: $skipped cases in ${skip_lines[*]} ($missing for want of a CUDA device or a kernel family not built)"
fi
echo "tests: $passed passed, $failed failed, $skipped skipped"
if [ "$failed" -ne 0 ]; then exit 1; fi
if [ "$require_gpu" -eq 1 ] && [ "$missing" -ne 0 ]; then echo "gpu-test needs a CUDA device and every kernel family built"; exit 1; fi
exit 0
