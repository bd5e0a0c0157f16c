/* support_ref.h: the fixture of the reference tests (tests/test_ref*.c, tests/support_ref.c):
 * data, one layer's pools and a hand-built step, and the dense oracle they are checked against. */
#ifndef FATTN_TESTS_SUPPORT_REF_H
#define FATTN_TESTS_SUPPORT_REF_H

#include <math.h>
#include <stdint.h>

#include "attn/backend.h"
#include "tests/support.h"


#define ck_close(got, want, tol)                                                       \
  do {                                                                                 \
    double g_ = (got), w_ = (want);                                                    \
    ck_assert_msg(fabs(g_ - w_) <= (tol) * fmax(1.0, fabs(w_)), "%s = %.17g, want %.17g", \
                  #got, g_, w_);                                                       \
  } while (0)

/* ---------------------------------------------------------------- data */

extern uint64_t ref_seed; /* each case sets it first, so a failure repeats alone */
double rng_unit(void);
float *rnd(size_t n);
uint16_t bits16(uint32_t dtype, float x);
uint16_t *enc(uint32_t dtype, const float *x, size_t n);

/* ------------------------------------------------------------- fixture */

enum { ROWS = 8, MAX_ENTRIES = 8 }; /* page-table rows, entries of one step */

typedef struct shape {
  uint32_t qh, kvh, d, dv, ps, len; /* dv 0: d; len: longest sequence */
  uint32_t q_dtype, kv_dtype, mla;  /* 0: bf16, bf16, no */
} shape;

/* One layer's pools and page table, and the step being built. */
typedef struct fx {
  fattn__layer_params l;
  fattn__step_hdr h;
  fattn__entry e[MAX_ENTRIES];
  uint64_t mask[64];
  fattn__step_params s;
  uint32_t *perm, next_page; /* page ids are handed out in this order */
} fx;

/* Results of one fx_run: O in q_dtype and float LSE, O and LSE in double. */
typedef struct res {
  uint16_t *out;
  float *lse;
  double *o, *lse64;
  size_t no, nl;
} res;

void *nan_pool(uint32_t dtype, size_t n);
void fx_init(fx *f, shape sh);
void fx_free(fx *f);
void res_free(res *r);
void fx_map(fx *f, uint32_t seq, uint32_t len);
void fx_store_step(fx *f, fattn__step_params s, const float *k, const float *v);
void fx_fill(fx *f, uint32_t seq, uint32_t lo, uint32_t n, const float *k, const float *v);
fattn__entry *fx_add(fx *f, uint32_t seq, uint32_t q_len, uint32_t kv_len, uint32_t new_len);
void fx_plan(fx *f, uint32_t mode);
/* The step becomes one TARGET_VERIFY entry of sequence seq: 6 draft tokens over kv_len slots,
 * masked by a branching tree, with max_splits 1. Returns the entry. */
fattn__entry *fx_tree_verify(fx *f, uint32_t seq, uint32_t kv_len);
void fx_store(fx *f, const float *k, const float *v);
res fx_run(fx *f, const float *q, uint32_t p_dtype, uint32_t ignore_splits);

/* What the GPU suites compare against: O and LSE in double with exact P, the workspace's
 * partials, and O in q_dtype with P rounded to q_dtype. */
typedef struct both {
  double *o, *lse;
  uint16_t *rounded;
  float *split_o, *split_lse;
  size_t no, nl, nw;
} both;

both both_run(fx *f, const uint16_t *qb, int one_call, double *scores, uint32_t cap);
void both_free(both *b);

/* ----------------------------------------------------------- dense oracle */

typedef int (*vis_fn)(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j);
int vis_all(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j);
int vis_causal(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j);
int vis_tree(const fx *f, const fattn__entry *e, uint32_t t, uint32_t j);
double dense(const fx *f, const float *qr, uint32_t hq, const float *k, const float *v, const uint8_t *vis,
             uint32_t n, double *o);
void expect_dense(const fx *f, const res *r, uint32_t i, const float *q, const float *k, const float *v,
                  vis_fn vis, double tol);
void expect_same(const res *a, const res *b);
size_t k_at(const fx *f, uint32_t seq, uint32_t j, uint32_t h, uint32_t c, uint32_t d);
double qk(const fx *f, const float *qr, const float *kr);

#endif /* FATTN_TESTS_SUPPORT_REF_H */
