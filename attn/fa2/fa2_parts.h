/* fa2_parts.h: the parts of the portable kernels' block loop and their end: the score product
 * S = Q K^T, the masked online softmax of a block, the product O += P V, and the epilogue. */
#ifndef FATTN_ATTN_FA2_FA2_PARTS_H
#define FATTN_ATTN_FA2_FA2_PARTS_H

#ifdef __CUDACC__

/* The parts' contract: C is the kind's fa2__cfg; a thread holds the fragments of its warp
 * (wm, wn: row and column warp; g, c4: lane / 4 and lane % 4). sc[C::NS][4] are a block's
 * scores, then its weights P; o[C::NO][4] is O's accumulator; m and ls the running max (log2
 * units) and sum of the thread's two rows. All are forced inline, so the kernel's machine code
 * is the one a single body gave. */

/* S = Q K^T of one block, K from its stage Kt; qf holds Q's fragments where C::QREG, else
 * qfrag(A, ks) loads step ks's from shared memory. sc[nt][k] is slot nt * 8 + 2 c4 + (k & 1)
 * of row k >> 1 (transposed: slot nt * 16 + g + 8 (k >> 1) of row k & 1), of this warp's WN
 * slots. */
template <class C, class QF>
__device__ __forceinline__ void fa2__scores(float (&sc)[C::NS][4], const uint32_t (&qf)[C::QREG ? C::DK / 16 : 1][C::TR ? 2 : 4],
                                            QF &qfrag, const char *Kt, int wn, int lane) {
  using T = typename C::T;
  constexpr int HD = C::DK;
#pragma unroll
  for (int i = 0; i < C::NS; i++) sc[i][0] = sc[i][1] = sc[i][2] = sc[i][3] = 0.f;
  if constexpr (C::TR) {
    /* K as the A operand, 16 slots a tile: the ldmatrix gives a thread slots g and g + 8 of
     * a 16-byte chunk (fp8: 4 of its 16 dims, in the order qfrag's Q^T fragments follow). */
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks += 3 - C::KB) { /* 16-bit: one 16-dim step an ldmatrix; fp8: two */
#pragma unroll
      for (int mt = 0; mt < C::NS; mt++) {
        uint32_t R[4];
        fa2__ldm4(R, Kt + fa2__at<C::KROW, C::SWK>(wn * C::WN + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                   ks * C::KB + (lane >> 4)));
        if constexpr (C::CONV) {
#pragma unroll
          for (int h = 0; h < 2; h++) {
            const uint32_t A[4] = {fa2__e4m3x2<T>((uint16_t)(R[2 * h] & 0xffffu)),
                                   fa2__e4m3x2<T>((uint16_t)(R[2 * h + 1] & 0xffffu)),
                                   fa2__e4m3x2<T>((uint16_t)(R[2 * h] >> 16)),
                                   fa2__e4m3x2<T>((uint16_t)(R[2 * h + 1] >> 16))};
            fa2__mma<T>(sc[mt], A, qf[ks + h]);
          }
        } else {
          fa2__mma<T>(sc[mt], R, qf[ks]);
        }
      }
    }
  } else if constexpr (C::CONV) {
    /* One ldmatrix of raw bytes holds two 16-dim steps of two 8-slot tiles: a thread gets dims
     * 4c..4c+3, which qfrag's permuted Q fragments match. */
#pragma unroll
    for (int k2 = 0; k2 < HD / 32; k2++) {
      uint32_t Aq[2][4];
      const uint32_t *A0 = Aq[0], *A1 = Aq[1];
      if constexpr (C::QREG) { A0 = qf[2 * k2]; A1 = qf[2 * k2 + 1]; }
      else { qfrag(Aq[0], 2 * k2); qfrag(Aq[1], 2 * k2 + 1); }
#pragma unroll
      for (int np = 0; np < C::WN / 16; np++) {
        uint32_t R[4], B[4][2];
        fa2__ldm4(R, Kt + fa2__at<C::KROW, C::SWK>(wn * C::WN + np * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                   2 * k2 + (lane >> 4)));
#pragma unroll
        for (int q = 0; q < 4; q++) {
          B[q][0] = fa2__e4m3x2<T>((uint16_t)(R[q] & 0xffffu));
          B[q][1] = fa2__e4m3x2<T>((uint16_t)(R[q] >> 16));
        }
        fa2__mma<T>(sc[2 * np], A0, B[0]);
        fa2__mma<T>(sc[2 * np + 1], A0, B[1]);
        fa2__mma<T>(sc[2 * np], A1, B[2]);
        fa2__mma<T>(sc[2 * np + 1], A1, B[3]);
      }
    }
  } else {
#pragma unroll
    for (int ks = 0; ks < HD / 16; ks++) {
      uint32_t Aq[4];
      const uint32_t *A = Aq;
      if constexpr (C::QREG) A = qf[ks];
      else qfrag(Aq, ks);
#pragma unroll
      for (int np = 0; np < C::WN / 16; np++) {
        uint32_t B[4];
        fa2__ldm4(B, Kt + fa2__at<C::KROW, C::SWK>(wn * C::WN + np * 16 + (lane & 7) + (lane >> 4) * 8,
                                                   2 * ks + ((lane >> 3) & 1)));
        fa2__mma<T>(sc[2 * np], A, B);
        fa2__mma<T>(sc[2 * np + 1], A, B + 2);
      }
    }
  }
}

/* The scores of block j0 to weights: scaled to log2 units (or softcapped), masked where the
 * block is not inside [lo_f, hif) (rows' queries qp, tree rows mr), each row's max raised
 * (m), O rescaled where a max moved, and P = exp2(s - max) left in sc with its sum in ls. */
template <class C>
__device__ __forceinline__ void fa2__softmax(float (&sc)[C::NS][4], float (&o)[C::NO][4], float *m, float *ls,
                                             const fa2__args &a, int causal, bool tree, const uint64_t *const *mr,
                                             const uint32_t *qp, uint32_t prefix, uint32_t j0, uint32_t lo_f,
                                             uint32_t hif, uint32_t ke, int wn, int g, int c4) {
  const fattn__layer_params &l = a.l;
  /* full: no mask; cut: every row sees the block's slots below ke, so only the range end is
   * masked (the short splits of a bs 1 step end inside a block) */
  const bool full = j0 >= lo_f && j0 + C::SLOTS <= hif, cut = j0 >= lo_f && ke <= hif;
  /* the thread's row of score k (0 or 1) */
  auto row_of = [](int k) { return C::TR ? k & 1 : k >> 1; };
  float mx[2] = {-INFINITY, -INFINITY};
  /* Scores to the exp2 domain. The mask and the softcap are compile-time switches, one copy
   * of the loop for each of the four mixes: with runtime tests inside the unrolled loop, a
   * full block's path jumped over 16 inlined mask bodies spread over 67 KB of code, and
   * verify stalled for instructions (docs/performance.md, decode). */
  auto scale = [&](auto masked, auto capped) {
#pragma unroll
    for (int nt = 0; nt < C::NS; nt++) {
#pragma unroll
      for (int k = 0; k < 4; k++) {
        float x = sc[nt][k];
        if constexpr (decltype(capped)::value) x = l.softcap * tanhf(x * a.cap_scale / l.softcap) * FA2__LOG2E;
        else x *= a.sl2;
        if constexpr (decltype(masked)::value) {
          const uint32_t j = j0 + wn * C::WN + (C::TR ? nt * 16 + g + (k >> 1) * 8 : nt * 8 + 2 * c4 + (k & 1));
          const int h = row_of(k);
          if (!(j < ke && (cut || fa2__vis(l, causal, tree, mr[h], prefix, qp[h], j)))) x = -INFINITY;
        }
        sc[nt][k] = x;
        mx[row_of(k)] = fmaxf(mx[row_of(k)], x);
      }
    }
  };
  if (l.softcap > 0.f) {
    if (full) scale(std::false_type(), std::true_type());
    else scale(std::true_type(), std::true_type());
  } else {
    if (full) scale(std::false_type(), std::false_type());
    else scale(std::true_type(), std::false_type());
  }
  float ms[2], al[2];
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const float mn = fmaxf(m[h], C::TR ? fa2__lanes_max<4, 16>(mx[h]) : fa2__lanes_max<1, 2>(mx[h]));
    ms[h] = fa2__row_step(m[h], ls[h], mn, &al[h]);
  }
  /* Once the running max settles, most blocks leave it unchanged: skip the rescale then. */
  if (__any_sync(0xffffffffu, al[0] != 1.f || al[1] != 1.f)) {
#pragma unroll
    for (int i = 0; i < C::NO; i++)
#pragma unroll
      for (int k = 0; k < 4; k++) o[i][k] *= al[row_of(k)];
  }
#pragma unroll
  for (int nt = 0; nt < C::NS; nt++) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float p = fa2__exp2(sc[nt][k] - ms[row_of(k)]);
      sc[nt][k] = p;
      ls[row_of(k)] += p;
    }
  }
}

/* O += P V of one block, V from its stage Vt, P the weights in sc. */
template <class C>
__device__ __forceinline__ void fa2__pv(float (&o)[C::NO][4], const float (&sc)[C::NS][4], const char *Vt, int wn,
                                        int lane) {
  using T = typename C::T;
  constexpr int HDV = C::DV;
  if constexpr (C::TR) {
    /* O^T += V^T P^T a 16-slot tile: P^T, the B operand, is the scores' tile transposed (slots
     * 2 c4, 2 c4 + 1 and 8 on of row g); V^T, the A operand, a transposed ldmatrix of V. */
#pragma unroll
    for (int mt = 0; mt < C::NS; mt++) {
      const uint32_t B[2] = {fa2__transpose8(fa2__pack<T>(sc[mt][0], sc[mt][1])),
                             fa2__transpose8(fa2__pack<T>(sc[mt][2], sc[mt][3]))};
#pragma unroll
      for (int dp = 0; dp < HDV / 16; dp += 3 - C::KB) {
        uint32_t R[4];
        fa2__ldm4t(R, Vt + fa2__at<C::VROW, C::SWV>(wn * C::WN + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                    dp * C::KB + (lane >> 4)));
        if constexpr (C::CONV) {
          /* A thread gets slots 2 c4, 2 c4 + 1 of dims 2g, 2g + 1 (and 16 on): byte permutes
           * split them into an even-dim and an odd-dim tile, so o[dp + t] holds dims
           * dp * 16 + 2g + t and 16 on (the epilogue undoes the order). */
#pragma unroll
          for (int t = 0; t < 2; t++) {
            const uint32_t sel = t ? 0x0031u : 0x0020u;
            const uint32_t A[4] = {fa2__e4m3x2<T>((uint16_t)__byte_perm(R[0], 0u, sel)),
                                   fa2__e4m3x2<T>((uint16_t)__byte_perm(R[2], 0u, sel)),
                                   fa2__e4m3x2<T>((uint16_t)__byte_perm(R[1], 0u, sel)),
                                   fa2__e4m3x2<T>((uint16_t)__byte_perm(R[3], 0u, sel))};
            fa2__mma<T>(o[dp + t], A, B);
          }
        } else {
          const uint32_t A[4] = {R[0], R[2], R[1], R[3]};
          fa2__mma<T>(o[dp], A, B);
        }
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < C::WN / 16; kk++) {
      uint32_t A[4] = {fa2__pack<T>(sc[2 * kk][0], sc[2 * kk][1]), fa2__pack<T>(sc[2 * kk][2], sc[2 * kk][3]),
                       fa2__pack<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                       fa2__pack<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
      if constexpr (C::CONV) {
        /* A transposed ldmatrix of raw bytes gives each thread slots 2c, 2c+1 of dims 2g, 2g+1;
         * byte permutes split them into an even-dim and an odd-dim fragment, so o[4 * dq + t]
         * holds dims 32 dq + 16 (t >> 1) + 2 n + (t & 1) (the epilogue undoes the order). */
#pragma unroll
        for (int dq = 0; dq < HDV / 32; dq++) {
          uint32_t R[4];
          fa2__ldm4t(R, Vt + fa2__at<C::VROW, C::SWV>(wn * C::WN + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                      2 * dq + (lane >> 4)));
#pragma unroll
          for (int hh = 0; hh < 2; hh++) {
            uint32_t Be[2], Bo[2];
#pragma unroll
            for (int q = 0; q < 2; q++) {
              Be[q] = fa2__e4m3x2<T>((uint16_t)__byte_perm(R[2 * hh + q], 0u, 0x0020u));
              Bo[q] = fa2__e4m3x2<T>((uint16_t)__byte_perm(R[2 * hh + q], 0u, 0x0031u));
            }
            fa2__mma<T>(o[4 * dq + 2 * hh], A, Be);
            fa2__mma<T>(o[4 * dq + 2 * hh + 1], A, Bo);
          }
        }
      } else {
#pragma unroll
        for (int dp = 0; dp < HDV / 16; dp++) {
          uint32_t B[4];
          fa2__ldm4t(B, Vt + fa2__at<C::VROW, C::SWV>(wn * C::WN + kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                      2 * dp + (lane >> 4)));
          fa2__mma<T>(o[2 * dp], A, B);
          fa2__mma<T>(o[2 * dp + 1], A, B + 2);
        }
      }
    }
  }
}

/* The end of a tile: each column warp's partial rows (O, max, sum) to shared memory at kv,
 * merged over the C::NCOL column warps, then per row O / l and LSE with the sink's mass (or,
 * for split sp, the split's partial O and LSE into the workspace). Rows R0..Rend of the
 * packed tile: row R is query R / G of q head hbase + R % G. */
template <class C, typename TQ>
__device__ __forceinline__ void fa2__epilogue(const fa2__args &a, const fattn__entry &e, char *kv,
                                              const float (&o)[C::NO][4], const float *m, const float *ls, uint32_t R0,
                                              uint32_t Rend, uint32_t G, uint32_t hbase, uint32_t sp, bool split,
                                              int tid, int wm, int wn, int g, int c4) {
  const fattn__layer_params &l = a.l;
  constexpr int NW = C::NCOL, HDV = C::DV;
  float *eo = (float *)kv, *em = eo + NW * C::BM * C::LDO, *el = em + NW * C::BM;
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int row = C::TR ? 2 * c4 + h : wm * 16 + g + h * 8;
    const float lt = C::TR ? fa2__lanes_sum<4, 16>(ls[h]) : fa2__lanes_sum<1, 2>(ls[h]);
    if ((C::TR ? g : c4) == 0) { em[wn * C::BM + row] = m[h]; el[wn * C::BM + row] = lt; }
    float *d = eo + (wn * C::BM + row) * C::LDO;
    if constexpr (C::TR) {
#pragma unroll
      for (int i = 0; i < C::NO; i++) {
        const int dim = C::CONV ? (i & ~1) * 16 + 2 * g + (i & 1) : i * 16 + g;
        d[dim] = o[i][h];
        d[dim + (C::CONV ? 16 : 8)] = o[i][2 + h];
      }
    } else if constexpr (C::CONV) {
#pragma unroll
      for (int i = 0; i < HDV / 16; i++)
        *(float4 *)(d + i * 16 + 4 * c4) = make_float4(o[2 * i][2 * h], o[2 * i + 1][2 * h], o[2 * i][2 * h + 1],
                                                       o[2 * i + 1][2 * h + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < HDV / 8; i++) *(float2 *)(d + i * 8 + 2 * c4) = make_float2(o[i][2 * h], o[i][2 * h + 1]);
    }
  }
  __syncthreads();
  for (int ci = tid; ci < C::BM * (HDV / 4); ci += C::NT) {
    int row = ci / (HDV / 4), c = (ci % (HDV / 4)) * 4;
    uint32_t R = R0 + row;
    if (R >= Rend) continue;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < NW; w++) M = fmaxf(M, em[w * C::BM + row]);
    float L = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (M != -INFINITY) {
#pragma unroll
      for (int w = 0; w < NW; w++) {
        float wt = exp2f(em[w * C::BM + row] - M);
        L += wt * el[w * C::BM + row];
        float4 v = *(const float4 *)(eo + (w * C::BM + row) * C::LDO + c);
        acc.x += wt * v.x; acc.y += wt * v.y; acc.z += wt * v.z; acc.w += wt * v.w;
      }
    }
    uint32_t t = R / G, hq = hbase + R % G;
    float lse2 = -INFINITY, inv = 0.f; /* a row that sees nothing: O = 0, LSE = sink or -inf */
    if (split) {
      if (M != -INFINITY) { inv = 1.f / L; lse2 = M + log2f(L); }
      size_t row_o = ((size_t)(e.split_row + t * e.num_splits + sp)) * l.num_q_heads + hq;
      *(float4 *)(a.s.split_o + row_o * HDV + c) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (c == 0) a.s.split_lse[row_o] = lse2 * FA2__LN2;
    } else {
      const float sink2 = l.sinks ? l.sinks[hq] * FA2__LOG2E : -INFINITY;
      if (M != -INFINITY) inv = fa2__sink_join<true>(M, L, sink2, a.o_mul, lse2);
      else lse2 = sink2;
      size_t row_o = (size_t)(e.q_start + t) * l.num_q_heads + hq;
      uint2 pk = make_uint2(fa2__pack<TQ>(acc.x * inv, acc.y * inv), fa2__pack<TQ>(acc.z * inv, acc.w * inv));
      *(uint2 *)((TQ *)a.out + row_o * HDV + c) = pk;
      if (a.lse && c == 0) a.lse[row_o] = lse2 * FA2__LN2;
    }
  }
  __syncthreads();
}

#endif /* __CUDACC__ */
#endif /* FATTN_ATTN_FA2_FA2_PARTS_H */
