/* fa3_trios.h: whether, from how many query tokens a sequence and over which rows the Hopper
 * kernels run a table row of three consumer warpgroups (fa3_table.h); C, for the suites too. */
#ifndef FATTN_ATTN_FA3_FA3_TRIOS_H
#define FATTN_ATTN_FA3_FA3_TRIOS_H

#include "attn/meta.h"

/* Query tokens a sequence, on a prefill or cross step's caps, from which the three-consumer
 * rows run where the table has one: below, a causal tile of 192 rows issues up to a third
 * more GEMM work than two of 128. Overridable at build time (host and CUDA flags alike) so
 * that benchmark variants can compare rules. */
#ifndef FATTN__TRIO_MIN_Q
#define FATTN__TRIO_MIN_Q 2048u
#endif

/* Whether the e4m3 policy runs its row of three consumers (fa3_table.h): off until `make
 * gpu-test` and `make gpu-sanitize` have passed on a build that runs it (a build with
 * -DFATTN__E4_TRIOS=1 in the CUDA flags; the row is compiled either way). */
#ifndef FATTN__E4_TRIOS
#define FATTN__E4_TRIOS 0
#endif

/* Query rows a trio: the work unit of three consumers. */
#define FATTN__Q_TRIO (3u * FATTN__Q_TILE)
/* The trio (its index in the entry: rows FATTN__Q_TRIO x it..) that an entry's pair `pair`
 * (0-based, of the ceil(q_len / 128) prep counts) carries, or UINT32_MAX where it carries none:
 * the last trio takes the last pair, the one before it the pair before, and the entry's first
 * pairs are left over. */
FATTN__HD uint32_t fa3__trio_of(uint32_t q_len, uint32_t pair) {
  const uint32_t pairs = (q_len + FATTN__Q_PAIR - 1u) / FATTN__Q_PAIR;
  const uint32_t trios = (q_len + FATTN__Q_TRIO - 1u) / FATTN__Q_TRIO;
  return pair + trios < pairs ? UINT32_MAX : pair + trios - pairs;
}

#endif /* FATTN_ATTN_FA3_FA3_TRIOS_H */
