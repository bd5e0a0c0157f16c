#!/usr/bin/env bash
# run.sh SECONDS NAME...: fuzzes each harness for SECONDS (0: not at all), then replays its
# committed corpus as a regression test; one line per fuzzer, non-zero exit on any finding.
set -u
seconds=${1:?usage: run.sh SECONDS NAME...}
shift
build=${BUILD:-build}
# The CUDA runtime maps memory in ASan's shadow gap; leaks are findings too.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:protect_shadow_gap=0"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}print_stacktrace=1"
failed=0
for name in "$@"; do
  bin=$build/fuzz/$name
  corpus=fuzz/corpus/$name
  scratch=$build/fuzz-new/$name   # new inputs land here, never in the committed corpus
  findings=$build/fuzz-findings/$name
  log=$build/fuzz-logs/$name.log
  mkdir -p "$corpus" "$scratch" "$findings" "$(dirname "$log")"
  : >"$log"
  fuzz_part="not fuzzed"
  if [ "$seconds" -gt 0 ]; then
    # libFuzzer writes new inputs into the first corpus directory it is given.
    "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/" \
      "$scratch" "$corpus" >>"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    if [ "$rc" -eq 0 ]; then
      fuzz_part="$seconds s, ${execs:-0} execs, no finding"
    else
      artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
      fuzz_part="$seconds s, ${execs:-?} execs, FINDING (exit $rc) ${artifact:-see $log}"
      grep -m 3 -E 'FUZZ MISMATCH|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" | sed 's/^/  /'
      failed=1
    fi
  fi
  inputs=("$corpus"/*)
  [ -e "${inputs[0]}" ] || inputs=()
  if [ ${#inputs[@]} -eq 0 ]; then
    replay_part="corpus replay: no inputs"
  elif "$bin" -artifact_prefix="$findings/" "${inputs[@]}" >>"$log" 2>&1; then
    replay_part="corpus replay: ${#inputs[@]} inputs ok"
  else
    replay_part="corpus replay: FAILED (see $log)"
    grep -m 3 -E 'FUZZ MISMATCH|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$log" | sed 's/^/  /'
    failed=1
  fi
  echo "$name: $fuzz_part; $replay_part"
done
exit $failed
