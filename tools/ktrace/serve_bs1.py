"""serve_bs1.py: the bs 1 decode steps of `fattn-bench serve` from ktrace files (tools/ktrace):
per file, quartiles of a step's device span (prep start to the last layer's end), the prep
kernel, and a layer (store start to the next store start), graph steps and eager apart; then
the graph layers' chain: each kernel's median start and end after its layer's store starts.

  KTRACE_OUT=k.txt CUDA_INJECTION64_PATH=$PWD/build/libktrace.so build/fattn-bench serve
  python3 tools/ktrace/serve_bs1.py k.txt [k2.txt ...]
"""
import statistics
import sys

LAYERS = 32
LAYER_GRIDS = [1, 256, 32, 16]  # bs 1, context 512: store, decode kernel, the WIDE combine (a block a row), the bench's mix
GRAPH_SPAN_US = 420  # eager bs 1 steps take the host's issue time, well above this


def kernels(path):
    out = []
    for line in open(path):
        p = line.split(None, 3)
        if len(p) == 4:
            out.append((int(p[0]), int(p[1]), int(p[2]), p[3]))
    out.sort()
    return out


def steps(ks):
    n = LAYERS * len(LAYER_GRIDS)
    for i, (start, end, _grid, name) in enumerate(ks):
        body = ks[i + 1:i + 1 + n]
        if "prep_kernel" not in name or len(body) < n:
            continue
        if any(k[2] != LAYER_GRIDS[j % len(LAYER_GRIDS)] for j, k in enumerate(body)):
            continue
        w = len(LAYER_GRIDS)
        layers = [(body[j + w][0] - body[j][0]) / 1e3 for j in range(0, n - w, w)]
        chains = [[((k[0] - body[j][0]) / 1e3, (k[1] - body[j][0]) / 1e3) for k in body[j:j + w]]
                  for j in range(0, n - w, w)]
        yield (body[-1][1] - start) / 1e3, (end - start) / 1e3, statistics.median(layers), chains


def quartiles(xs):
    if len(xs) < 2:
        return " ".join("%.2f" % x for x in xs)
    q = statistics.quantiles(xs, n=4)
    return "%.2f / %.2f / %.2f" % (q[0], statistics.median(xs), q[2])


for path in sys.argv[1:]:
    found = list(steps(kernels(path)))
    for kind, pick in (("graph", lambda s: s[0] < GRAPH_SPAN_US), ("eager", lambda s: s[0] >= GRAPH_SPAN_US)):
        sel = [s for s in found if pick(s)]
        print("%s %s steps %d: span %s us, prep %s us, layer %s us" % (
            path, kind, len(sel), quartiles([s[0] for s in sel]), quartiles([s[1] for s in sel]),
            quartiles([s[2] for s in sel])))
    chains = [c for s in found if s[0] < GRAPH_SPAN_US for c in s[3]]
    if chains:
        print("  graph layer chain (us after the store starts, start-end): " + ", ".join(
            "%s %.2f-%.2f" % (name, statistics.median(c[k][0] for c in chains), statistics.median(c[k][1] for c in chains))
            for k, name in enumerate(["store", "decode", "combine", "mix"])))
