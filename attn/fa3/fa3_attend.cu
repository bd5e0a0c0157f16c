/* fa3_attend.cu: the fa3 entry points: device and shape checks, the tensor maps made once per
 * layer, and host dispatch (fa3's kernel for query-tiled steps, mla90's for MLA, fa2 for the rest). */
#include "attn/fa3/fa3.h"

extern "C" int fattn__fa3_available(void) {
  static fattn__device_facts avail; /* per device (attn/devices.h) */
  return fattn__device_fact(avail, [](int dev) {
    int major = 0, minor = 0;
    const int yes = dev >= 0 && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    major == 9 && minor == 0;
    cudaGetLastError();
    return yes;
  });
}

/* Every layer shape fa2 runs, MLA aside. */
extern "C" int fattn__fa3_supports(const fattn__layer_params *l) { return fattn__fa2_supports(l) && !l->mla; }

extern "C" int fattn__fa3_encode_maps(const fattn__layer_params *l, void *maps) {
  if (l->mla) return fattn__mla90_encode_map(l, maps);
  /* fp8 KV widened to fp16 is gathered raw by the producer: no maps. Under the e4m3 policy
   * fp8 rows travel as they are. */
  const int e4m3 = l->kv_dtype == FATTN_DTYPE_FP8_E4M3 && l->compute_dtype == FATTN_DTYPE_FP8_E4M3;
  if (!fattn__fa3_supports(l) || (l->kv_dtype == FATTN_DTYPE_FP8_E4M3 && !e4m3) || l->page_size < FA3__TMA_MIN_PAGE)
    return (int)cudaErrorNotSupported;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = fa3__tmap_encoder();
  if (!encode) return (int)cudaErrorNotSupported;
  /* [slots, kv_heads, d] with slots = pages * page_size; a box is one 128-byte slab of a row
   * (64 dims, e4m3 128) x 1 head x one page of a tile (the part of a box past d, at d 96 and
   * e4m3's d 64 / 192, is filled with zeros). V alike with d_v. */
  const uint32_t bn = fa3__tile_slots(l->head_dim, l->head_dim_v, e4m3), eb = e4m3 ? 1u : 2u;
  const cuuint32_t box[3] = {128u / eb, 1u, (cuuint32_t)(l->page_size < bn ? l->page_size : bn)}, unit[3] = {1u, 1u, 1u};
  const CUtensorMapDataType dt = e4m3                             ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                 : l->q_dtype == FATTN_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                  : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  CUtensorMap *m = (CUtensorMap *)maps;
  void *pools[2] = {l->k_pool, l->v_pool};
  const uint32_t dim[2] = {l->head_dim, l->head_dim_v};
  for (int i = 0; i < 2; i++) {
    const cuuint64_t dims[3] = {dim[i], l->num_kv_heads, (cuuint64_t)l->num_pages * l->page_size};
    const cuuint64_t strides[2] = {(cuuint64_t)dim[i] * eb, (cuuint64_t)l->num_kv_heads * dim[i] * eb};
    if (encode(&m[i], dt, 3, pools[i], dims, strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) /* e4m3 at d 64: a box wider than the */
      return e4m3 ? (int)cudaErrorNotSupported : (int)cudaErrorInvalidValue; /* row may be refused: gathered */
  }
  return (int)cudaSuccess;
}

/* Build knob for a measurement (docs/performance.md, decode): 1 runs fa3's own kernel on
 * decode-like steps as well, which otherwise go to fa2's decode kernels. */
#ifndef FA3_TAKES_DECODE
#define FA3_TAKES_DECODE 0
#endif

extern "C" int fattn__fa3_attend(fattn__layer_params l, fattn__step_params s, const void *q, void *out,
                                 float *lse, void *stream) {
  if (l.mla) /* every MLA mode the context gives fa3 (all but CROSS); what mla90 lacks goes to fa2 */
    return fattn__fa3_available() && fattn__mla90_supports(&l) ? fattn__mla90_attend(l, s, q, out, lse, stream)
                                                               : fattn__fa2_attend(l, s, q, out, lse, stream);
  if (!fattn__fa3_supports(&l) || !fattn__fa3_available() || (!FA3_TAKES_DECODE && fattn__decode_kind(&l, &s)))
    return fattn__fa2_attend(l, s, q, out, lse, stream);
  if (s.cap_entries == 0u || s.cap_q_tokens == 0u || s.cap_tiles == 0u) return (int)cudaSuccess;
  fa3__args a;
  a.k = fa2__args_for(l, s, q, out, lse);
  CUtensorMap none[2];
  const CUtensorMap *maps = (const CUtensorMap *)l.tmaps;
  a.use_tma = maps != NULL; /* fattn__fa3_encode_maps makes them only where TMA serves */
  a.trios = fa3__trios(l.head_dim, l.head_dim_v, l.kv_dtype, l.compute_dtype, s.mode, s.cap_q_tokens, s.cap_entries);
  if (!a.use_tma) {
    memset(none, 0, sizeof none);
    maps = none;
  }
  const uint64_t work = (uint64_t)s.cap_tiles * l.num_q_heads;
  const int grid = (int)(work < a.k.num_sms ? work : a.k.num_sms); /* the SM count fa2__args_for read */
  cudaStream_t st = (cudaStream_t)stream;
  switch (FA3__DK(l.head_dim)) {
    case 64u: return fa3__launch_hd64(&a, maps, grid, st);
    case 128u: return fa3__launch_hd128(&a, maps, grid, st);
    case 192u: return fa3__launch_hd192(&a, maps, grid, st);
    default: return fa3__launch_hd256(&a, maps, grid, st);
  }
}
