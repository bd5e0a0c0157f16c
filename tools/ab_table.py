"""ab_table.py: the table of tools/ab.sh: for every figure of the runs' CSVs, each side's
median, range and count over its rounds, and its median over the first side's.

  python3 tools/ab_table.py OUT_DIR NAME=... NAME=...   (the sides as ab.sh was given them)

serve.csv rows give `metric eager` and `metric graph` (ms; the host's issue and launch times
and the kernel sum among them) and, for the sweep's rows, the graph's speed-up over eager;
decode.csv and prefill.csv rows give ms, GB/s and the SM clock (MHz) of each shape, every
repeat of a shape counted as a round.
"""
import csv
import glob
import os
import statistics
import sys


def figures(path):
    """(figure, value) pairs of one run's CSV, in file order."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        if "metric" in r:  # serve.csv
            e = float(r["eager_ms"]) if r["eager_ms"] else None
            g = float(r["graph_ms"]) if r["graph_ms"] else None
            if e:
                yield f"{r['metric']} eager ms", e
            if g:
                yield f"{r['metric']} graph ms", g
            if e and g and r["metric"].startswith("decode_bs"):
                yield f"{r['metric']} speed-up", e / g
        else:  # decode.csv, prefill.csv
            shape = f"{r['mode']} {r['bs']}x{r['kv']} q{r['q']} p{r['page']} d{r['d']} {r['kv_dtype']}"
            yield f"{shape} ms", float(r["ms"])
            yield f"{shape} GB/s", float(r["gbps"])
            if r.get("mhz"):
                yield f"{shape} MHz", float(r["mhz"])


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: ab_table.py OUT_DIR NAME=DIR[,ARG...] ...")
    out, names = sys.argv[1], [s.split("=", 1)[0] for s in sys.argv[2:]]
    order, seen = [], {}  # figure -> side -> values
    for name in names:
        for path in sorted(glob.glob(os.path.join(out, f"{name}.*.csv"))):
            for fig, v in figures(path):
                if fig not in seen:
                    seen[fig] = {}
                    order.append(fig)
                seen[fig].setdefault(name, []).append(v)
    if not order:
        sys.exit(f"ab_table.py: no CSV of {', '.join(names)} in {out}")
    width = max(len(f) for f in order)
    print(f"{'figure':<{width}} " + " ".join(f"{n + ' median [min, max] n':>36}" for n in names)
          + "".join(f" {n + '/' + names[0]:>12}" for n in names[1:]))
    for fig in order:
        cells, meds = [], []
        for n in names:
            v = seen[fig].get(n)
            if not v:
                cells.append(f"{'-':>36}")
                meds.append(None)
                continue
            m = statistics.median(v)
            meds.append(m)
            cells.append(f"{m:>10.4f} [{min(v):>9.4f}, {max(v):>9.4f}] {len(v):>2}")
        ratios = [f" {m / meds[0]:>12.3f}" if m and meds[0] else f" {'-':>12}" for m in meds[1:]]
        print(f"{fig:<{width}} " + " ".join(cells) + "".join(ratios))


if __name__ == "__main__":
    main()
