#!/usr/bin/env python3
# sched_model.py: a model of fa3's persistent grid (docs/performance.md, prefill): how evenly 132 blocks
# share the FA3-paper prefill shapes and varlen causal batches, statically and claimed.
import heapq
import random

BLOCKS = 132


def items(seq, d, causal):
    """Work items in kernel order: (64-row tile, head) pairs, last tile first, the second
    halves of 128-row tiles empty; cost = KV blocks of the 128-row tile + 1 (its epilogue)."""
    bs, heads, bn = 16384 // seq, 2048 // d, 128 if d <= 128 else 64
    t64 = seq // 64
    out = []
    for w in range(bs * t64 * heads):
        local = (bs * t64 - 1 - w // heads) % t64
        if local & 1:
            out.append(0.0)
            continue
        t = local // 2
        out.append((((t + 1) * 128 + bn - 1) // bn if causal else seq // bn) + 1.0)
    return out


def static_walk(costs):
    load = [0.0] * BLOCKS
    for i, c in enumerate(costs):
        load[i % BLOCKS] += c
    return max(load)


def claim_as_free(costs):
    heap = [(0.0, b) for b in range(BLOCKS)]
    for c in costs:
        if c:
            t, b = heapq.heappop(heap)
            heapq.heappush(heap, (t + c, b))
    return max(t for t, _ in heap)


def varlen_items(lens, d=128):
    """Causal items of a varlen batch in kernel order (entries from the last, each entry's
    tiles with most KV first; the empty halves left out)."""
    heads, bn = 2048 // d, 128 if d <= 128 else 64
    tiles = [(L, loc) for L in lens for loc in range((L + 63) // 64)]
    out = []
    for w in range(len(tiles) * heads):
        L, loc = tiles[len(tiles) - 1 - w // heads]
        if not loc & 1:
            out.append((min((loc // 2 + 1) * 128, L) + bn - 1) // bn + 1.0)
    return out


for d in (64, 128, 256):
    for seq in (512, 1024, 2048, 4096, 8192, 16384):
        for causal in (1, 0):
            c = items(seq, d, causal)
            even = sum(c) / BLOCKS
            print(f"d {d:3} seq {seq:5} {'causal    ' if causal else 'non-causal'} "
                  f"static {even / static_walk(c):.2f}  claimed {even / claim_as_free(c):.2f}")

rng = random.Random(1)
for name, lens in (("16k + 8 x 512", [16384] + [512] * 8), ("8 x 512 + 16k", [512] * 8 + [16384]),
                   ("12 random in 200-8k", [rng.randint(200, 8192) for _ in range(12)])):
    c = varlen_items(lens)
    even = sum(c) / BLOCKS
    print(f"varlen causal d 128, {name:20} static {even / static_walk(c):.2f}  claimed {even / claim_as_free(c):.2f}")
