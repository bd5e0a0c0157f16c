#!/usr/bin/env bash
# prefill_flow.sh: the Hopper prefill figures in one call on the GPU machine: gpu-test of the
# new build, the prefill rows of two builds alternated, the peers, and ncu beside FA3's kernel.
#
#   tools/prefill_flow.sh B BASE NEW [WHEELS]   e.g. tools/prefill_flow.sh 540 .gpu/main .gpu/new .whl
#
# BASE and NEW are folders holding a gpu-bundle (bundle.tar.xz) and, for NEW, a copy of its
# checkout's Makefile, tests/ and bench/ under src/ (the scripts the bundle's binaries go
# with). WHEELS: a folder of peer wheels (../shared/PEERS.md: fa3-fwd, optionally
# flash-attn-4); they are installed into /tmp/site. Each step is capped to what is left of B
# seconds; logs, CSVs, ncu reports and their SASS-level samples are packed into
# $OUT/prefill_flow.tar.xz.
# Steps: make gpu-test (NEW), fattn-bench prefill of BASE and NEW twice, alternated,
# peers.py prefill and serve, ncu of fattn's and FA3's kernels on each shape of $PF_NCU
# ("D,SEQ,CAUSAL ...", default "128,8192,0"; a report a shape and kernel, 60 s each); with
# PF_SANITIZE=S, make gpu-sanitize of NEW after gpu-test, capped to S seconds.
set -u
B=${1:?usage: prefill_flow.sh B BASE NEW [WHEELS]} base=${2:?usage} new=${3:?usage} wheels=${4:-}
t0=$(date +%s) o=/tmp/prefill_flow
left() { echo $((B - ($(date +%s) - t0))); }
run() { # NAME CAP COMMAND: its output in $o/NAME.txt
  local cap=$2 l s
  l=$(left)
  [ "$l" -lt 20 ] && { echo "$1: skipped ($l s left)"; return; }
  [ "$cap" -gt "$l" ] && cap=$l
  s=$(date +%s)
  timeout -k 5 "$cap" bash -c "$3" > "$o/$1.txt" 2>&1
  echo "$1: exit $?, $(($(date +%s) - s)) s (cap $cap s)"
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
rm -rf "$o" /tmp/pf_base /tmp/pf_new && mkdir -p "$o" /tmp/pf_base /tmp/pf_new || exit 1
cp -r Makefile tests bench /tmp/pf_base/ && cp -r "$new"/src/* /tmp/pf_new/ || exit 1
tar xJf "$base/bundle.tar.xz" -C /tmp/pf_base && tar xJf "$new/bundle.tar.xz" -C /tmp/pf_new || exit 1
if [ -n "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$wheels"/*.whl && export PYTHONPATH=/tmp/site || exit 1
fi
export PYTHONUNBUFFERED=1
run gputest 150 "cd /tmp/pf_new && make gpu-test"
[ -n "${PF_SANITIZE:-}" ] && run sanitize "$PF_SANITIZE" "cd /tmp/pf_new && make gpu-sanitize"
for r in 1 2; do
  run "base$r" 90 "cd /tmp/pf_base && build/fattn-bench prefill --backend fa3 --csv $o/base$r.csv"
  run "new$r" 120 "cd /tmp/pf_new && build/fattn-bench prefill --backend fa3 --csv $o/new$r.csv"
done
cp "$o/new2.csv" /tmp/pf_new/build/prefill_fa3.csv 2>/dev/null
run peers 240 "cd /tmp/pf_new && python3 bench/peers/peers.py prefill && python3 bench/peers/peers.py serve"
NCU="ncu --clock-control none --launch-skip 3 --launch-count 1 --set full --import-source yes -f"
reports=()
for shape in ${PF_NCU:-128,8192,0}; do
  IFS=, read -r d seq causal <<< "$shape"
  n=d${d}_${seq}_$causal
  run "ncu_new_$n" 60 "cd /tmp/pf_new && $NCU -k regex:fa3__attn -o $o/new_$n build/fattn-bench prefill --backend fa3 --only $d,$seq,$causal"
  run "ncu_fa3_$n" 60 "cd /tmp/pf_new && $NCU -k regex:device_kernel -o $o/fa3_$n python3 bench/peers/peers.py one FA3 $d $seq $causal"
  reports+=("new_$n" "fa3_$n")
done
for r in "${reports[@]}"; do
  [ -f "$o/$r.ncu-rep" ] || continue
  ncu --import "$o/$r.ncu-rep" --page details --csv > "$o/${r}_details.csv" 2>&1
  ncu --import "$o/$r.ncu-rep" --page source --csv --print-source sass > "$o/${r}_sass.csv" 2>&1 # samples a SASS line
done
tar cJf "${OUT:-.}/prefill_flow.tar.xz" -C /tmp prefill_flow
echo "==== gpu-test"
grep -h '^tests:\|totals' "$o/gputest.txt" 2>/dev/null
grep -h '^gpu-sanitize:\|FAILED' "$o/sanitize.txt" 2>/dev/null
echo "==== TFLOP/s: mode,bs,kv,page,d, base1 base2 new1 new2"
paste -d, <(cut -d, -f1,2,4,5,8,13 "$o/base1.csv") <(cut -d, -f13 "$o/base2.csv") <(cut -d, -f13 "$o/new1.csv") \
  <(cut -d, -f13 "$o/new2.csv") 2>/dev/null
echo "==== peers"
tail -n 60 "$o/peers.txt" 2>/dev/null
