/* support.h: helpers every test binary links (tests/support.c): call counters for the
 * hot-path contract and fault injection for create's allocations. */
#ifndef FATTN_TESTS_SUPPORT_H
#define FATTN_TESTS_SUPPORT_H

#include <stdint.h>
#include <string.h>

#include "tests/harness.h"

typedef struct fattn_call_counts {
  long malloc;       /* malloc, calloc, realloc, posix_memalign, aligned_alloc */
  long free;         /* free, cudaFree, cudaFreeHost, cudaFreeAsync */
  long device_alloc; /* cudaMalloc, cudaMallocManaged, cudaMallocAsync */
  long host_alloc;   /* cudaHostAlloc, cudaMallocHost */
  long sync;         /* cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize,
                        cudaMemcpy, cudaMemset */
} fattn_call_counts;

/* Counts since the last fattn_calls_reset, over every object linked statically (fattn,
 * cudart, jemalloc, Check): keep assertions out of a counting window, Check allocates. */
extern fattn_call_counts fattn_calls;
void fattn_calls_reset(void);
long fattn_calls_forbidden(void); /* every counter added up */

typedef enum fattn_fault_kind {
  FATTN_FAULT_HOST = 0, /* malloc family */
  FATTN_FAULT_PINNED,   /* cudaHostAlloc, cudaMallocHost */
  FATTN_FAULT_DEVICE,   /* cudaMalloc */
  FATTN_FAULT_KINDS
} fattn_fault_kind;

/* Fail the nth call (1-based) of kind from now on; nth 0 disarms. Resets every count. */
void fattn_fault_arm(fattn_fault_kind kind, long nth);
/* Calls of kind since the last arm. */
long fattn_fault_seen(fattn_fault_kind kind);


/* A small CPU-backend model and config most suites start from: 2 layers, 4 q / 2 kv heads,
 * d 64, bf16, page 4, 64 pages, max_batch 8, max_seq_len 64. */
void fattn_test_small(fattn_config *cfg, fattn_model *model);
/* malloc that fails the test rather than return NULL. */
void *fattn_test_xmalloc(size_t n);
/* splitmix64: the next value of the stream *state seeds; cases set the seed, so failures repeat. */
static inline uint64_t fattn_test_splitmix(uint64_t *state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* A deterministic generator (LCG), so that failing runs repeat. */
static inline uint32_t fattn_test_rand(uint64_t *s) {
  *s = *s * 6364136223846793005ull + 1442695040888963407ull;
  return (uint32_t)(*s >> 33);
}

/* Six random page operations (fork, reserve, truncate, close) on the *n sequences in open
 * (at most cap, the first never closed), each followed by fattn_check: what a speculative
 * scheduler does between plans. Reserves may run out of pages (then change nothing). */
void fattn_test_page_ops(fattn_ctx *ctx, uint64_t *rng, uint32_t *open, uint32_t *n, uint32_t cap,
                         uint32_t max_len);

/* Everything the page allocator owns, as one malloc'd byte string (free it): equal
 * snapshots before and after a rejected call prove it changed nothing. */
size_t fattn_test_snapshot(const fattn_ctx *ctx, uint8_t **out);

#endif /* FATTN_TESTS_SUPPORT_H */
