/* support.c: what every test binary links: device count, and counting wrappers over the
 * allocation and synchronising calls the hot path must never make, with fault injection. */
#include "tests/support.h"
#include "tests/snapshot.h"

#include "lib/internal.h"

#include <cuda_runtime_api.h>
#include <stdlib.h>

fattn_call_counts fattn_calls;
static long fail_at[FATTN_FAULT_KINDS]; /* 1-based call to fail, 0: none */
static long seen[FATTN_FAULT_KINDS];

/* The wrappers count atomically: threads of one test (tests/test_threads.c) allocate at once. */
#define COUNT(counter) __atomic_fetch_add(&(counter), 1, __ATOMIC_RELAXED)

int fattn_test_cuda_devices(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  return n;
}

void *fattn_test_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

void fattn_test_small(fattn_config *cfg, fattn_model *model) {
  const fattn_config c = FATTN_CONFIG_INIT;
  const fattn_model m = FATTN_MODEL_INIT;
  *cfg = c;
  *model = m;
  model->num_layers = 2;
  model->num_q_heads = 4;
  model->num_kv_heads = 2;
  model->head_dim = 64;
  cfg->device = FATTN_DEVICE_CPU;
  cfg->page_size = 4;
  cfg->kv_budget_pages = 64;
  cfg->max_batch = 8;
  cfg->max_seq_len = 64;
  cfg->max_q_tokens = 256;
}

void fattn_fault_arm(fattn_fault_kind kind, long nth) {
  for (int k = 0; k < FATTN_FAULT_KINDS; k++) { fail_at[k] = 0; seen[k] = 0; }
  if (nth > 0) fail_at[kind] = nth;
}

long fattn_fault_seen(fattn_fault_kind kind) { return seen[kind]; }

static int fault_now(fattn_fault_kind kind) {
  const long at = __atomic_load_n(&fail_at[kind], __ATOMIC_RELAXED);
  const long n = __atomic_add_fetch(&seen[kind], 1, __ATOMIC_RELAXED);
  return at != 0 && n == at;
}

void fattn_calls_reset(void) { memset(&fattn_calls, 0, sizeof fattn_calls); }

long fattn_calls_forbidden(void) {
  return fattn_calls.malloc + fattn_calls.device_alloc + fattn_calls.host_alloc +
         fattn_calls.sync + fattn_calls.free;
}

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);

void *__wrap_malloc(size_t n) {
  COUNT(fattn_calls.malloc);
  return fault_now(FATTN_FAULT_HOST) ? NULL : __real_malloc(n);
}
void *__wrap_calloc(size_t a, size_t b) {
  COUNT(fattn_calls.malloc);
  return fault_now(FATTN_FAULT_HOST) ? NULL : __real_calloc(a, b);
}
void *__wrap_realloc(void *p, size_t n) {
  COUNT(fattn_calls.malloc);
  return fault_now(FATTN_FAULT_HOST) ? NULL : __real_realloc(p, n);
}
void __wrap_free(void *p) {
  if (p) COUNT(fattn_calls.free);
  __real_free(p);
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  COUNT(fattn_calls.malloc);
  return fault_now(FATTN_FAULT_HOST) ? 12 /* ENOMEM */ : __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
  COUNT(fattn_calls.malloc);
  return fault_now(FATTN_FAULT_HOST) ? NULL : __real_aligned_alloc(a, n);
}

cudaError_t __real_cudaMalloc(void **p, size_t n);
cudaError_t __real_cudaFree(void *p);
cudaError_t __real_cudaHostAlloc(void **p, size_t n, unsigned int flags);
cudaError_t __real_cudaMallocHost(void **p, size_t n);
cudaError_t __real_cudaFreeHost(void *p);
cudaError_t __real_cudaMallocManaged(void **p, size_t n, unsigned int flags);
cudaError_t __real_cudaMallocAsync(void **p, size_t n, cudaStream_t s);
cudaError_t __real_cudaFreeAsync(void *p, cudaStream_t s);
cudaError_t __real_cudaDeviceSynchronize(void);
cudaError_t __real_cudaStreamSynchronize(cudaStream_t s);
cudaError_t __real_cudaEventSynchronize(cudaEvent_t e);
cudaError_t __real_cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k);
cudaError_t __real_cudaMemset(void *d, int v, size_t n);

cudaError_t __wrap_cudaMalloc(void **p, size_t n) {
  COUNT(fattn_calls.device_alloc);
  return fault_now(FATTN_FAULT_DEVICE) ? cudaErrorMemoryAllocation : __real_cudaMalloc(p, n);
}
cudaError_t __wrap_cudaFree(void *p) {
  if (p) COUNT(fattn_calls.free);
  return __real_cudaFree(p);
}
cudaError_t __wrap_cudaHostAlloc(void **p, size_t n, unsigned int flags) {
  COUNT(fattn_calls.host_alloc);
  return fault_now(FATTN_FAULT_PINNED) ? cudaErrorMemoryAllocation : __real_cudaHostAlloc(p, n, flags);
}
cudaError_t __wrap_cudaMallocHost(void **p, size_t n) {
  COUNT(fattn_calls.host_alloc);
  return fault_now(FATTN_FAULT_PINNED) ? cudaErrorMemoryAllocation : __real_cudaMallocHost(p, n);
}
cudaError_t __wrap_cudaFreeHost(void *p) {
  if (p) COUNT(fattn_calls.free);
  return __real_cudaFreeHost(p);
}
cudaError_t __wrap_cudaMallocManaged(void **p, size_t n, unsigned int flags) {
  COUNT(fattn_calls.device_alloc);
  return __real_cudaMallocManaged(p, n, flags);
}
cudaError_t __wrap_cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
  COUNT(fattn_calls.device_alloc);
  return __real_cudaMallocAsync(p, n, s);
}
cudaError_t __wrap_cudaFreeAsync(void *p, cudaStream_t s) {
  COUNT(fattn_calls.free);
  return __real_cudaFreeAsync(p, s);
}
cudaError_t __wrap_cudaDeviceSynchronize(void) {
  COUNT(fattn_calls.sync);
  return __real_cudaDeviceSynchronize();
}
cudaError_t __wrap_cudaStreamSynchronize(cudaStream_t s) {
  COUNT(fattn_calls.sync);
  return __real_cudaStreamSynchronize(s);
}
cudaError_t __wrap_cudaEventSynchronize(cudaEvent_t e) {
  COUNT(fattn_calls.sync);
  return __real_cudaEventSynchronize(e);
}
cudaError_t __wrap_cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
  COUNT(fattn_calls.sync);
  return __real_cudaMemcpy(d, s, n, k);
}
cudaError_t __wrap_cudaMemset(void *d, int v, size_t n) {
  COUNT(fattn_calls.sync);
  return __real_cudaMemset(d, v, n);
}

void fattn_test_page_ops(fattn_ctx *ctx, uint64_t *rng, uint32_t *open, uint32_t *n, uint32_t cap,
                         uint32_t max_len) {
  for (int op = 0; op < 6; op++) {
    const uint32_t pick = (uint32_t)(fattn_test_splitmix(rng) % *n), s = open[pick];
    const uint32_t arg = (uint32_t)(fattn_test_splitmix(rng) % (max_len + 1));
    uint32_t len, id;
    ck_assert_ok(fattn_seq_length(ctx, s, &len));
    switch (fattn_test_splitmix(rng) % 4) {
    case 0:
      if (*n < cap && fattn_seq_fork(ctx, s, arg % (len + 1), &id) == FATTN_OK) open[(*n)++] = id;
      break;
    case 1: fattn_seq_reserve(ctx, s, arg); break;
    case 2: ck_assert_ok(fattn_seq_truncate(ctx, s, arg % (len + 1))); break;
    default:
      if (pick) {
        ck_assert_ok(fattn_seq_close(ctx, s));
        open[pick] = open[--*n];
      }
    }
    ck_assert_ok(fattn_check(ctx));
  }
}

size_t fattn_test_snapshot(const fattn_ctx *ctx, uint8_t **out) {
  size_t n = 0;
  *out = fattn_test_pages_snapshot(&ctx->pages, &n);
  ck_assert_ptr_nonnull(*out);
  return n;
}
