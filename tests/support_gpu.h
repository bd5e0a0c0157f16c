/* support_gpu.h: GPU helpers for the GPU test suites (tests/support_gpu.cu), as C functions:
 * fresh random normal data, NaN poisoning of whole buffers or of unused pool rows. */
#ifndef FATTN_TESTS_SUPPORT_GPU_H
#define FATTN_TESTS_SUPPORT_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* dtype: a fattn_dtype (BF16, FP16, FP8_E4M3) or 0 for float. Each returns a cudaError_t
 * value and works on the default stream (asynchronously). */

/* n elements of N(0, stddev^2) from a Philox stream keyed by seed (cuRAND device API);
 * fp8 saturates to +-448. Exact zeros are replaced by stddev / 64, so no value is 0. */
int fattn_test_gpu_randn(void *dev, size_t n, uint32_t dtype, float stddev, uint64_t seed);

/* n elements set to a quiet NaN of dtype. */
int fattn_test_gpu_nan(void *dev, size_t n, uint32_t dtype);

/* Rows r in [0, rows) of row_elems elements each, with used_dev[r] == 0, set to NaN.
 * used_dev is a device array of rows bytes. */
int fattn_test_gpu_nan_rows(void *dev, const uint8_t *used_dev, size_t rows, size_t row_elems,
                            uint32_t dtype);

/* Keeps stream busy for about us microseconds (one block spinning on the global timer), so
 * that work queued behind it waits: back-pressure on demand. */
int fattn_test_gpu_hold(void *stream, uint32_t us);

/* Copies bytes from src to dst in a kernel launched on stream the way a serving engine's next
 * kernel is: programmatic dependent launch where the device has it, waiting on the grid
 * before it in the kernel (griddepcontrol.wait) and nowhere else. */
int fattn_test_gpu_copy_after(void *stream, void *dst, const void *src, size_t bytes);

/* The same copy by a kernel that lets the kernels after it launch at its first instruction
 * (griddepcontrol.launch_dependents, as PDL-aware serving kernels do), then waits on the grid
 * before it, spins for us microseconds and only then writes dst. */
int fattn_test_gpu_copy_late(void *stream, void *dst, const void *src, size_t bytes, uint32_t us);

/* Number of elements of x (host, dtype) that are NaN. */
size_t fattn_test_count_nan(const void *x, size_t n, uint32_t dtype);

#ifdef __cplusplus
}
#endif
#endif /* FATTN_TESTS_SUPPORT_GPU_H */
