#!/usr/bin/env bash
# ab.sh: times builds or options against each other on the GPU machine, alternated round by
# round so that the host's and the card's drift falls on every side alike (docs/performance.md).
#
#   tools/ab.sh ROUNDS COMMAND NAME=DIR[,ARG...] ...
#
# Each side runs `DIR/build/fattn-bench COMMAND ARG...` from DIR (a checkout, or a folder where
# a gpu-bundle was unpacked), once a round; its log and CSV land in $OUT/ab (./ab-out without
# $OUT), with the card's clocks, temperature and power read just before. Then
# tools/ab_table.py prints each side's median and range of every CSV figure.
#   tools/ab.sh 3 serve main=/tmp/main branch=. clustered=.,--max-splits,16
#   tools/ab.sh 4 decode main=/tmp/main,--bs,1 branch=.,--bs,1,--max-splits,16
set -u
rounds=${1:?usage: ab.sh ROUNDS COMMAND NAME=DIR[,ARG...] ...}
cmd=${2:?usage: ab.sh ROUNDS COMMAND NAME=DIR[,ARG...] ...}
shift 2
[ $# -ge 1 ] || { echo "ab.sh: no side to run" >&2; exit 2; }
case "$cmd" in serve | decode | prefill) ;; *) echo "ab.sh: COMMAND is serve, decode or prefill (those write a CSV)" >&2; exit 2 ;; esac
out=${OUT:-ab-out}/ab
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for side in "$@"; do
  name=${side%%=*} spec=${side#*=}
  dir=${spec%%,*}
  [ "$name" != "$side" ] && [ -x "$dir/build/fattn-bench" ] || { echo "ab.sh: $side: no $dir/build/fattn-bench" >&2; exit 2; }
done
failed=0
for r in $(seq 1 "$rounds"); do
  for side in "$@"; do
    name=${side%%=*} spec=${side#*=}
    dir=${spec%%,*} args=()
    [ "$spec" != "$dir" ] && IFS=, read -r -a args <<< "${spec#*,}"
    log=$out/$name.$r.log
    { echo "# ab.sh round $r: $name: (cd $dir && build/fattn-bench $cmd ${args[*]})"
      nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv 2>/dev/null | sed 's/^/# card: /'
    } > "$log"
    start=$(date +%s)
    (cd "$dir" && build/fattn-bench "$cmd" "${args[@]}") >> "$log" 2>&1
    rc=$?
    csv=$dir/build/$cmd.csv
    [ "$rc" -eq 0 ] && [ -f "$csv" ] && cp "$csv" "$out/$name.$r.csv"
    echo "round $r/$rounds: $name: exit $rc, $(( $(date +%s) - start )) s"
    [ "$rc" -eq 0 ] || { failed=1; tail -n 3 "$log" | sed 's/^/  /'; }
  done
done
python3 "$here/ab_table.py" "$out" "$@" | tee "$out/table.txt"
exit $failed
