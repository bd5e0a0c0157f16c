#!/usr/bin/env bash
# gpu_flow.sh: the decode and serving figures and the GPU suites in one call on the GPU machine,
# from a gpu-bundle (docs/performance.md). Each step is capped to what is left of B seconds;
# logs and a summary land in $OUT.
#
#   tools/gpu_flow.sh B BUNDLE [CARD]   e.g. tools/gpu_flow.sh 300 .gpu/c/main.tar.xz H200
#
# With CARD, a card whose name lacks it exits at once (status 3), so an unwanted start costs
# little device time. Steps: fattn-bench decode, peers.py decode, make gpu-test, make
# gpu-sanitize, the bs 1 decode shapes four times, tools/ab.sh 3 serve.
set -u
B=${1:?usage: gpu_flow.sh B BUNDLE [CARD]} bundle=${2:?usage: gpu_flow.sh B BUNDLE [CARD]} want=${3:-}
t0=$(date +%s) dir=/tmp/gpu-flow
out=$(mkdir -p "${OUT:-gpu-flow-out}" && cd "${OUT:-gpu-flow-out}" && pwd) || exit 1
sum=$out/summary.txt
: > "$sum"
note() { echo "$*" | tee -a "$sum"; }
step() { # NAME CAP COMMAND: runs in $dir, its output in $out/NAME.log
  local name=$1 cap=$2 left=$((B - ($(date +%s) - t0))) s rc
  [ "$left" -lt 15 ] && { note "$name: skipped ($left s left)"; return; }
  [ "$cap" -gt "$left" ] && cap=$left
  s=$(date +%s)
  (cd "$dir" && timeout -k 5 "$cap" bash -c "$3") > "$out/$name.log" 2>&1
  rc=$?
  note "$name: exit $rc, $(($(date +%s) - s)) s (cap $cap s)"
}
card=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)
note "card: $card; $(nproc) CPUs; $(lscpu | grep -c '^NUMA node[0-9]') NUMA nodes"
case "$card" in *"$want"*) ;; *) echo "gpu_flow: not a $want card: exit"; exit 3 ;; esac
rm -rf "$dir" && mkdir -p "$dir" && cp -r Makefile tests bench tools "$dir"/ && tar xJf "$bundle" -C "$dir" || exit 1
step decode 120 "build/fattn-bench decode"
step peers 150 "PYTHONUNBUFFERED=1 python3 bench/peers/peers.py decode"
step gputest 120 "make gpu-test"
step sanitize 150 "make gpu-sanitize"
step bs1 90 "build/fattn-bench decode --bs 1 --repeat 4"
step serve 100 "OUT=$out tools/ab.sh 3 serve main=."
[ -d "$out/ab" ] && tar cJf "$out/ab.tar.xz" -C "$out" ab && rm -rf "$out/ab"
echo "==== summary"
cat "$sum"
grep -h '^tests:\|^gpu-sanitize:' "$out/gputest.log" "$out/sanitize.log" 2>/dev/null
tail -n 14 "$out/decode.log" 2>/dev/null
tail -n 16 "$out/peers.log" 2>/dev/null
grep -h '^decode' "$out/bs1.log" 2>/dev/null
grep -v '^round' "$out/serve.log" 2>/dev/null
