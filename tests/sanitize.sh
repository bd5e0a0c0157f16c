#!/usr/bin/env bash
# sanitize.sh: compute-sanitizer memcheck and racecheck over the representative GPU cases
# listed in tests/sanitize.cases ("suite case" per line); a finding fails the run.
set -u
build=$(dirname "$1")
command -v compute-sanitizer >/dev/null || { echo "gpu-sanitize: compute-sanitizer not found"; exit 1; }
fail=0 runs=0
while read -r suite case; do
  [ -z "$suite" ] || [ "${suite:0:1}" = "#" ] && continue
  for tool in memcheck racecheck; do
    log=$(mktemp)
    # API errors are not findings here: some cases provoke them on purpose (a failing capture).
    extra=(); [ "$tool" = memcheck ] && extra=(--report-api-errors no)
    FATTN_TEST_QUICK=1 compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 99 "$build/$suite" "$case" >"$log" 2>&1
    rc=$?
    runs=$((runs + 1))
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
    if [ $rc -ne 0 ]; then
      fail=$((fail + 1)); echo "$tool $suite $case: FAILED (exit $rc) $summary"; tail -n 30 "$log"
    else
      echo "$tool $suite $case: clean ($summary)"
    fi
    rm -f "$log"
  done
done < tests/sanitize.cases
echo "gpu-sanitize: $((runs - fail)) passed, $fail failed"
[ $fail -eq 0 ]
