/* dtype.h: host conversions between float and the storage types bf16, fp16, fp8 e4m3.
 * Round to nearest even, as the CUDA intrinsics do; fp8 saturates to +-448 (satfinite). */
#ifndef FATTN_LIB_DTYPE_H
#define FATTN_LIB_DTYPE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t fattn__f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float fattn__bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static inline uint16_t fattn__f32_to_bf16(float f) {
  uint32_t u = fattn__f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

static inline float fattn__bf16_to_f32(uint16_t h) { return fattn__bits_f32((uint32_t)h << 16); }

static inline uint16_t fattn__f32_to_f16(float f) {
  uint32_t u = fattn__f32_bits(f);
  uint32_t sign = (u >> 16) & 0x8000u;
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds past 65504 */
  if (a < 0x38800000u) {                                  /* subnormal or zero in fp16 */
    float r = fattn__bits_f32(a) * 16777216.0f;          /* exact: scale by 2^24 */
    return (uint16_t)(sign | (uint32_t)lrintf(r));
  }
  uint32_t m = a + 0xc8000fffu + ((a >> 13) & 1u); /* rebias exponent 127 -> 15 and round */
  return (uint16_t)(sign | (m >> 13));
}

static inline float fattn__f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  float v;
  if (e == 0) v = ldexpf((float)m, -24);
  else if (e == 31) v = m ? NAN : INFINITY;
  else v = ldexpf((float)(m | 0x400u), (int)e - 25);
  return fattn__bits_f32(fattn__f32_bits(v) | sign);
}

/* OCP e4m3fn: bias 7, no infinities, 0x7f / 0xff are NaN, largest finite 448. */
static inline uint8_t fattn__f32_to_e4m3(float f) {
  uint32_t u = fattn__f32_bits(f);
  uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
  float a = fabsf(f);
  if (isnan(f)) return (uint8_t)(sign | 0x7fu);
  if (a >= 464.0f) return (uint8_t)(sign | 0x7eu); /* satfinite; 464 is the tie above 448 */
  if (a < 0.015625f) {                           /* subnormal: units of 2^-9 */
    long q = lrintf(a * 512.0f);
    return (uint8_t)(sign | (uint8_t)q);        /* q == 8 is the smallest normal, 0x08 */
  }
  int e;
  float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  long q = lrintf(m * 16.0f); /* 8..16: implicit bit plus 3 mantissa bits */
  if (q == 16) { q = 8; e++; }
  uint32_t be = (uint32_t)(e - 1 + 7);
  uint8_t r = (uint8_t)((be << 3) | ((uint32_t)q & 7u));
  if (r > 0x7eu) r = 0x7eu;
  return (uint8_t)(sign | r);
}

static inline float fattn__e4m3_to_f32(uint8_t b) {
  float s = (b & 0x80u) ? -1.0f : 1.0f;
  uint32_t e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15u && m == 7u) return NAN;
  if (e == 0) return s * ldexpf((float)m, -9);
  return s * ldexpf((float)(m | 8u), (int)e - 10);
}

#endif /* FATTN_LIB_DTYPE_H */
