/* support_oracle.h: the GPU suites' oracle (tests/support_oracle.c): both float64 reference runs
 * of a step, its rows shared over threads by q heads and by pieces of entries. */
#ifndef FATTN_TESTS_SUPPORT_ORACLE_H
#define FATTN_TESTS_SUPPORT_ORACLE_H

#include "attn/backend.h"

/* O [q_tokens, q_heads, head_dim_v] and LSE [q_tokens, q_heads] in double with exact P, and O
 * in q_dtype with P rounded to q_dtype (o_rounded), over the host step s (its split workspace
 * included): the bytes of one fattn__ref_attend call with out_f64, lse_f64 and out_rounded.
 * threads: 0 for the machine's cores (at most 64). */
void fattn_test_oracle(fattn__layer_params l, fattn__step_params s, const void *q, double *o64, double *lse64,
                       void *o_rounded, unsigned threads);

#endif /* FATTN_TESTS_SUPPORT_ORACLE_H */
