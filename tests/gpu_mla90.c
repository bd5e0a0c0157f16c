/* gpu_mla90.c: the Hopper MLA kernel (attn/mla/mla90.cu) on gpu_mla's kernel cases (every
 * mode, heads 8 to 128, pages 1 to 128, lengths 1, page - 1, page, page + 1 and up to 4097 with
 * split-KV) against the float64 reference, through fattn__mla90_attend (tests/gpu_fa2.c's
 * attend_under_test with FATTN_TEST_MLA90). Skips with a line where sm_90a is not built, and
 * its cases skip on a device other than compute capability 9.0. */
#ifdef FATTN_HAVE_SM90A
#define FATTN_TEST_MLA90 1
#include "tests/gpu_mla.c"
#else
#include <stdio.h>

int main(void) {
  printf("gpu_mla90: 4 cases skipped (mla90 not built: CUDA_ARCHS lacks 90a)\n");
  return 0;
}
#endif
