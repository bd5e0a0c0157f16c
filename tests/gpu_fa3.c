/* gpu_fa3.c: the fa2 sweep (tests/gpu_fa2.c) with attention forced through the fa3
 * backend, plus long prefill and fp8 compute on fa3's own kernel. Skips with a line where fa3 is
 * not built. */
#ifdef FATTN_HAVE_SM90A
#define FATTN_TEST_FA3 1
#include "tests/gpu_fa2.c"
#else
#include <stdio.h>

int main(void) {
  printf("gpu_fa3: 7 cases skipped (fa3 not built: CUDA_ARCHS lacks 90a)\n");
  return 0;
}
#endif
