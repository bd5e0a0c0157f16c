"""decode.py: kernel-alone times of `fattn-bench decode` from a ktrace file (tools/ktrace):
per shape, medians of the timed calls of the decode kernel, the combine, the span from the
decode kernel's start to the combine's end, and the pure-read kernel; read / decode.

  KTRACE_OUT=k.txt CUDA_INJECTION64_PATH=$PWD/build/libktrace.so build/fattn-bench decode
  python3 tools/ktrace/decode.py k.txt
"""
import statistics
import sys

TIMED = 21  # fattn-bench's timed calls a shape (after 3 warm-ups)


def shapes(lines):
    cur, pending = None, None
    for line in lines:
        start, end, _grid, name = line.split(None, 3)
        start, end = int(start), int(end)
        if "hold_kernel" in name:  # the bench's holding kernel before each timed call
            continue
        if "read_pages" in name or "ring_pages" in name:  # the read column's kernel, either roofline
            if cur is not None:
                cur["read"].append(end - start)
            continue
        if cur is None or cur["read"]:  # a shape starts at the first kernel after its reads
            if cur is not None:
                yield cur
            cur, pending = {"dec": [], "comb": [], "span": [], "read": []}, None
        if "combine" in name and pending:
            cur["comb"].append(end - start)
            cur["span"].append(end - pending)
            pending = None
        elif "attn" in name or "warp" in name or "rows" in name:
            cur["dec"].append(end - start)
            pending = start
    if cur is not None:
        yield cur


def main():
    with open(sys.argv[1]) as f:
        found = [s for s in shapes(f) if s["dec"] and s["read"]]
    print("%-5s %10s %10s %10s %10s %8s" % ("shape", "decode us", "span us", "combine", "read us", "read/dec"))
    for i, s in enumerate(found):
        med = {k: statistics.median(v[-TIMED:]) / 1e3 if v else float("nan") for k, v in s.items()}
        print("%-5d %10.1f %10.1f %10.1f %10.1f %8.3f" % (i, med["dec"], med["span"], med["comb"], med["read"],
                                                          med["read"] / med["dec"]))


if __name__ == "__main__":
    main()
