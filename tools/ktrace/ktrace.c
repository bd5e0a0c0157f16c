/* ktrace.c: a CUDA_INJECTION64_PATH library that writes each kernel's start and end (ns), grid
 * size and name, one line a kernel, to $KTRACE_OUT (default ktrace.txt): kernel-alone times. */
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#define KTRACE_BUFFER (16u << 20)

static FILE *ktrace_out;

static void CUPTIAPI ktrace_buffer(uint8_t **buf, size_t *size, size_t *max_records) {
  *buf = aligned_alloc(8, KTRACE_BUFFER);
  *size = *buf ? KTRACE_BUFFER : 0;
  *max_records = 0;
}

static void CUPTIAPI ktrace_done(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *r = NULL;
  while (ktrace_out && cuptiActivityGetNextRecord(buf, valid, &r) == CUPTI_SUCCESS)
    if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)r;
      fprintf(ktrace_out, "%llu %llu %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
              k->gridX * k->gridY * k->gridZ, k->name);
    }
  free(buf);
}

static void ktrace_flush(void) {
  cuptiActivityFlushAll(1);
  if (ktrace_out) fclose(ktrace_out);
  ktrace_out = NULL;
}

int InitializeInjection(void) {
  const char *path = getenv("KTRACE_OUT");
  ktrace_out = fopen(path ? path : "ktrace.txt", "w");
  if (!ktrace_out) return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityRegisterCallbacks(ktrace_buffer, ktrace_done) != CUPTI_SUCCESS) {
    fprintf(stderr, "ktrace: CUPTI activity tracing unavailable\n");
    return 0;
  }
  atexit(ktrace_flush);
  return 1;
}
