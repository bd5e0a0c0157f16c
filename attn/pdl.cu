/* pdl.cu: whether the current device takes programmatic dependent launch, read once per device
 * (attn/devices.h) so that launches and captures never ask the device again. */
#include "attn/pdl.h"

extern "C" int fattn__pdl_on(void) {
  static fattn__device_facts on;
  return fattn__device_fact(on, [](int dev) {
    int major = 0;
    const int yes = dev >= 0 && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    major >= 9;
    cudaGetLastError();
    return yes;
  });
}
