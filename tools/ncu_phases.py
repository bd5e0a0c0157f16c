# ncu_phases.py: where a Hopper attention kernel's warp samples fall, from ncu's SASS-level
# export (`ncu --import R.ncu-rep --page source --csv --print-source sass > R_sass.csv`).
#
#   python3 tools/ncu_phases.py R_sass.csv [COUNT]
#
# Prints the stall reasons over the kernel, its hottest SASS lines, and, for the consumers'
# block loop (the lines executed COUNT times, default: the largest count of a wgmma line), the
# samples of each phase: stage waits, turn and GEMM issue, the wait for S,
# the softmax, and what follows the P V wait.
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
hdr = rows[1]
col = {h: i for i, h in enumerate(hdr)}
data = [r for r in rows[2:] if len(r) == len(hdr)]
SAMPLES, EXEC = "Warp Stall Sampling (All Samples)", "Instructions Executed"
reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
num = lambda r, c: int(r[col[c]] or 0)

total = sum(num(r, SAMPLES) for r in data)
by_reason = collections.Counter()
for r in data:
    for c in reasons:
        by_reason[c[6:]] += num(r, c)
print(f"{total} samples, {sum(num(r, EXEC) for r in data)} warp instructions")
print("stalls: " + ", ".join(f"{k} {100 * v / total:.1f}%" for k, v in by_reason.most_common(8)))
for r in sorted(data, key=lambda r: -num(r, SAMPLES))[:12]:
    top = max(reasons, key=lambda c: num(r, c))
    print(f"  {100 * num(r, SAMPLES) / total:5.1f}%  x{num(r, EXEC):<9} {r[1][:64]:64s} {top[6:]}")

if len(sys.argv) > 2:
    count = int(sys.argv[2])
else:
    count = max(num(r, EXEC) for r in data if "GMMA" in r[1])
loop = [r for r in data if num(r, EXEC) == count]
phase, phases = "stage waits", collections.OrderedDict()
for r in loop:
    src = r[1]
    if "BAR.SYNC" in src:
        phase = "turn and issue"
    if "DEPBAR.LE gsb0, 0x1" in src:
        phase = "wait for S"
    phases.setdefault(phase, [0, 0])
    phases[phase][0] += 1
    phases[phase][1] += num(r, SAMPLES)
    if "DEPBAR.LE gsb0, 0x1" in src:
        phase = "softmax"
    if "DEPBAR.LE gsb0, 0x0" in src:
        phase = "after the P V wait"
in_loop = sum(v[1] for v in phases.values())
print(f"block loop (lines run {count} times): {len(loop)} instructions a warp, {in_loop} samples")
for k, (n, s) in phases.items():
    print(f"  {k:20s} {n:4d} instructions  {100 * s / max(in_loop, 1):5.1f}% of the samples")
