/* gpu_fa3.c: the whole fa2 sweep (tests/gpu_fa2.c) with attention forced through the fa3
 * backend, plus long prefill on fa3's own kernel. Skips with a line where fa3 is not built. */
#define FATTN_TEST_FA3 1
#include "tests/gpu_fa2.c"
