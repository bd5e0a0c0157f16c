/* support_oracle.c: the GPU suites' oracle: both reference runs of a step in one pass a row,
 * rows shared over threads by q heads, then by entries cut into pieces of a few queries. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "tests/support.h"
#include "tests/support_oracle.h"

enum { ORACLE_PIECE = 16, ORACLE_MAX_THREADS = 64 };

/* Entries cut into pieces of at most ORACLE_PIECE queries where that leaves the result
 * unchanged (no splits, no tree): a causal piece ends its KV at its last query. Small pieces
 * keep every thread busy where one entry holds most of the work (a cross entry of 300 queries
 * over 4224 slots, drawn first and so past a group's budget, kept 5 threads of 16 busy for
 * 43-54 s). Caller frees. */
static int oracle_cuts(const fattn__entry *e) {
  return e->num_splits <= 1 && e->mask_row == UINT32_MAX && e->q_len > ORACLE_PIECE;
}
static fattn__entry *oracle_pieces(const fattn__step_hdr *h, const fattn__entry *e, uint32_t *n) {
  uint32_t cnt = 0;
  for (uint32_t i = 0; i < h->num_entries; i++)
    cnt += oracle_cuts(&e[i]) ? (e[i].q_len + ORACLE_PIECE - 1) / ORACLE_PIECE : 1;
  fattn__entry *p = fattn_test_xmalloc(cnt * sizeof *p);
  uint32_t k = 0;
  for (uint32_t i = 0; i < h->num_entries; i++) {
    if (!oracle_cuts(&e[i])) { p[k++] = e[i]; continue; }
    for (uint32_t t0 = 0; t0 < e[i].q_len; t0 += ORACLE_PIECE) {
      uint32_t t1 = t0 + ORACLE_PIECE < e[i].q_len ? t0 + ORACLE_PIECE : e[i].q_len;
      p[k] = e[i];
      p[k].q_len = t1 - t0;
      p[k].q_start = e[i].q_start + t0;
      if (h->causal) p[k].kv_len = e[i].kv_len - (e[i].q_len - t1);
      k++;
    }
  }
  *n = cnt;
  return p;
}

typedef struct oracle_job {
  fattn__layer_params l;
  fattn__step_params s;
  fattn__step_hdr h;
  const void *q;
  fattn__ref_opts opts;
} oracle_job;

static void *oracle_thread(void *arg) {
  oracle_job *j = arg;
  fattn__ref_attend(j->l, j->s, j->q, NULL, NULL, &j->opts);
  return NULL;
}

void fattn_test_oracle(fattn__layer_params l, fattn__step_params s, const void *q, double *o64, double *lse64,
                       void *o_rounded, unsigned threads) {
  fattn__step_hdr h = *s.hdr;
  fattn__entry *e = oracle_pieces(s.hdr, s.entries, &h.num_entries);
  long nt = threads ? (long)threads : sysconf(_SC_NPROCESSORS_ONLN);
  if (nt < 1) nt = 1;
  if (nt > ORACLE_MAX_THREADS) nt = ORACLE_MAX_THREADS;
  /* Every q head costs the same over a step, so heads share the threads out first; the
   * entries, by cost, share what each head range has. */
  const uint32_t parts = (uint32_t)nt < l.num_q_heads ? (uint32_t)nt : l.num_q_heads;
  const long shares = nt / (long)parts;
  double total = 0, *cost = fattn_test_xmalloc(h.num_entries * sizeof *cost);
  for (uint32_t i = 0; i < h.num_entries; i++) {
    cost[i] = (double)e[i].q_len * (e[i].kv_len + 16.0);
    total += cost[i];
  }
  oracle_job jobs[ORACLE_MAX_THREADS];
  pthread_t th[ORACLE_MAX_THREADS];
  int nj = 0;
  for (uint32_t hp = 0; hp < parts; hp++) {
    double left = total;
    uint32_t i = 0;
    for (long t = 0; t < shares && i < h.num_entries; t++) {
      uint32_t start = i, cap = 1;
      double acc = 0, share = left / (double)(shares - t);
      while (i < h.num_entries && (acc < share || i == start)) { acc += cost[i]; i++; }
      if (t == shares - 1) i = h.num_entries;
      left -= acc;
      for (uint32_t k = start; k < i; k++) cap = e[k].kv_len > cap ? e[k].kv_len : cap;
      oracle_job *j = &jobs[nj];
      j->l = l;
      j->s = s;
      j->h = h;
      j->h.num_entries = i - start;
      j->s.hdr = &j->h;
      j->s.entries = e + start;
      j->q = q;
      /* room for the longest range's scores, so that each is computed once */
      j->opts = (fattn__ref_opts){.out_f64 = o64, .lse_f64 = lse64, .out_rounded = o_rounded,
                                  .scores = fattn_test_xmalloc(cap * sizeof(double)), .scores_cap = cap,
                                  .head_lo = l.num_q_heads * hp / parts, .head_hi = l.num_q_heads * (hp + 1) / parts};
      ck_assert_int_eq(pthread_create(&th[nj], NULL, oracle_thread, j), 0);
      nj++;
    }
  }
  for (int t = 0; t < nj; t++) {
    pthread_join(th[t], NULL);
    free(jobs[t].opts.scores);
  }
  free(cost);
  free(e);
}
