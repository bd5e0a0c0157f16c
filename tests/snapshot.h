/* snapshot.h: the page allocator's whole state as one malloc'd byte string, shared by the tests
 * and the fuzzers: equal snapshots before and after a rejected call prove it changed nothing. */
#ifndef FATTN_TESTS_SNAPSHOT_H
#define FATTN_TESTS_SNAPSHOT_H

#include <stdlib.h>
#include <string.h>

#include "lib/internal.h"

/* fattn_check's scratch and each sequence's duplicate-detection stamp are not state. NULL when
 * out of host memory; the caller frees. */
static inline uint8_t *fattn_test_pages_snapshot(const fattn__pages *p, size_t *bytes) {
  const size_t np = p->num_pages, ms = p->max_seqs, pps = p->pages_per_seq;
  const size_t copies = (size_t)p->cap_copies * sizeof(fattn__page_copy),
               row_copies = (size_t)p->cap_row_copies * sizeof(fattn__row_op);
  const size_t n = sizeof *p + np * 8 + ms * pps * 4 + ms * sizeof(fattn__seq) + ms * 8 + copies + row_copies;
  uint8_t *buf = malloc(n), *w = buf;
  if (!buf) return NULL;
  fattn__pages scalars = *p;
  scalars.scratch = NULL;
  memcpy(w, &scalars, sizeof scalars), w += sizeof scalars;
  memcpy(w, p->free_stack, np * 4), w += np * 4;
  memcpy(w, p->refcount, np * 4), w += np * 4;
  memcpy(w, p->table, ms * pps * 4), w += ms * pps * 4;
  for (size_t i = 0; i < ms; i++) {
    fattn__seq s = p->seqs[i];
    s.stamp = 0;
    memcpy(w, &s, sizeof s), w += sizeof s;
  }
  memcpy(w, p->seq_free, ms * 4), w += ms * 4;
  memcpy(w, p->dirty, ms * 4), w += ms * 4;
  memcpy(w, p->copies, copies), w += copies;
  memcpy(w, p->row_copies, row_copies);
  *bytes = n;
  return buf;
}

#endif /* FATTN_TESTS_SNAPSHOT_H */
