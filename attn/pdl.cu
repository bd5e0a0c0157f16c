/* pdl.cu: whether the device takes programmatic dependent launch, read once per process
 * (fattn drives one device a process, as fa2's SM count and fa3's availability assume). */
#include "attn/pdl.h"

extern "C" int fattn__pdl_on(void) {
  static int on = -1;
  if (on < 0) {
    int dev = 0, major = 0;
    on = cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 9;
    cudaGetLastError();
  }
  return on;
}
