/* fa3_trios.h: whether, and from how many query tokens a sequence, the Hopper kernels run a
 * table row of three consumer warpgroups (fa3_table.h); C, so that the GPU suites can steer to it. */
#ifndef FATTN_ATTN_FA3_FA3_TRIOS_H
#define FATTN_ATTN_FA3_FA3_TRIOS_H

/* Query tokens a sequence, on a prefill or cross step's caps, from which the three-consumer
 * rows run where the table has one: below, a causal tile of 192 rows issues up to a third
 * more GEMM work than two of 128. Overridable at build time (host and CUDA flags alike) so
 * that benchmark variants can compare rules. */
#ifndef FATTN__TRIO_MIN_Q
#define FATTN__TRIO_MIN_Q 2048u
#endif

/* Whether the three-consumer rows run at all: off until `make gpu-test` and `make
 * gpu-sanitize` have passed on a build that runs them. A build with -DFATTN__TRIOS=1 (host and
 * CUDA flags alike) runs them, for those gates and for measurement (docs/performance.md); the
 * rows are compiled either way. */
#ifndef FATTN__TRIOS
#define FATTN__TRIOS 0
#endif

#endif /* FATTN_ATTN_FA3_FA3_TRIOS_H */
