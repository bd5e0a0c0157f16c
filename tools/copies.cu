/* copies.cu: `fattn-bench copies`: how fast each way of copying paged KV into shared memory
 * reads the pool, against whole pages read with plain loads (the decode bench's roofline). */
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" double fattn_bench_median(double *v, size_t n);

#define COPY_ROW 2048u    /* bytes of one token's K: 8 kv heads x d 128, bf16 */
#define COPY_ITEM 512     /* tokens a work item (CP_GRID also runs longer ones) */
#define COPY_PITCH 2064   /* padded smem pitch of a token row: 8 rows of ldmatrix hit 8 bank groups */

/* The copy paths. HEAD kinds copy one kv head's 256-B slice of each token (the decode kernel's
 * blocks are per kv head); the others copy whole 2-KB token rows (all kv heads). */
enum { CP_HEAD, CP_GRID, CP_WARP, BULK_HEAD, BULK_ROW, BULK_RUN, TMA_RUN, COPY_KINDS };
static const char *const copy_names[COPY_KINDS] = {
    "cp.async 16 B, one head (decode kernel's path), 64 tok x 2 stages",
    "the same, a block an item (a grid, as the decode kernel)",
    "the same, a warp a block, 8 tok x 4 stages (a grid)",
    "bulk copy a 256-B head row, 64 tok x 2 stages",
    "bulk copy a 2-KB token row (padded), 16 tok x 2 stages",
    "bulk copy a 16-token run (32 KB), 3 stages",
    "tensor-map TMA of a 16-token run, 128-B swizzle, 3 stages"};
static const int copy_tok[COPY_KINDS] = {64, 64, 8, 64, 16, 16, 16};
static const int copy_st[COPY_KINDS] = {2, 2, 4, 2, 2, 3, 3};
static const int copy_threads[COPY_KINDS] = {128, 128, 32, 128, 128, 128, 128};

typedef struct copy_args {
  const char *k, *v; /* [pages, page_size, 8, 128] bf16 */
  const int *table;  /* [seqs, pages_per_seq] */
  int pages_per_seq, page_size, kv_len, seqs;
  int item;          /* tokens a work item */
  int split;         /* CP_WARP only: > 0, a block a (sequence x 8 + head, split) of this many tokens */
  int chain;         /* CP_WARP only: dependent loads before the first copy, as a decode block's start */
  unsigned *counter; /* work items taken (zeroed before each launch) */
  unsigned *sink;
} copy_args;

/* Bytes of a ring slot, K then V: head rows of 256 B, padded token rows, or whole token rows. */
__host__ __device__ constexpr int slot_bytes(int kind, int tok) {
  return kind <= BULK_HEAD ? tok * 256 * 2 : kind == BULK_ROW ? tok * COPY_PITCH * 2 : tok * (int)COPY_ROW * 2;
}
static int stage_bytes(int kind) { return slot_bytes(kind, copy_tok[kind]); }

__global__ void whole_pages(copy_args a) {
  int page = a.table[blockIdx.y * a.pages_per_seq + blockIdx.x];
  const uint4 *k = (const uint4 *)(a.k + (size_t)page * a.page_size * COPY_ROW);
  const uint4 *v = (const uint4 *)(a.v + (size_t)page * a.page_size * COPY_ROW);
  unsigned acc = 0, n = a.page_size * COPY_ROW / 16;
  for (unsigned i = threadIdx.x; i < n; i += blockDim.x) {
    uint4 x = __ldg(k + i), y = __ldg(v + i);
    acc ^= x.x ^ x.y ^ x.z ^ x.w ^ y.x ^ y.y ^ y.z ^ y.w;
  }
  if (acc == 0x9e3779b9u) a.sink[threadIdx.x] = acc; /* keeps the loads */
}

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ size_t row_offset(const copy_args &a, int seq, int tok) {
  return ((size_t)a.table[seq * a.pages_per_seq + tok / a.page_size] * a.page_size + tok % a.page_size) * COPY_ROW;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void bulk(void *dst, const void *src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma_run(void *dst, const CUtensorMap *m, int row, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
               ::"r"(smem_addr(dst)), "l"(m), "r"(0), "r"(row), "r"(0), "r"(bar) : "memory");
}
#endif

/* Issues stage s (tokens t0 + s * TOK ..) of an item into ring slot `slot`. */
template <int KIND, int TOK>
__device__ __forceinline__ void issue(const copy_args &a, const CUtensorMap *mk, const CUtensorMap *mv, char *slot,
                                      unsigned bar, int seq, int head, int t0) {
  constexpr int SB = slot_bytes(KIND, TOK);
  if constexpr (KIND <= CP_WARP) {
    constexpr int NT = KIND == CP_WARP ? 32 : 128;
#pragma unroll
    for (int j = 0; j < TOK * 16 / NT; j++) { /* 16 chunks of 16 B a row */
      int idx = threadIdx.x + j * NT, tok = t0 + idx / 16;
      size_t off = row_offset(a, seq, tok) + head * 256 + (idx % 16) * 16;
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(slot + idx * 16)), "l"(a.k + off));
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(slot + SB / 2 + idx * 16)), "l"(a.v + off));
    }
    asm volatile("cp.async.commit_group;\n");
  } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int LANDS = TOK * 2 * (KIND == BULK_HEAD ? 256 : (int)COPY_ROW); /* bytes, not slot bytes */
    if (threadIdx.x == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(LANDS));
    __syncwarp();
    if constexpr (KIND == BULK_HEAD || KIND == BULK_ROW) {
      constexpr unsigned BYTES = KIND == BULK_HEAD ? 256u : COPY_ROW, PITCH = KIND == BULK_HEAD ? 256u : COPY_PITCH;
      for (int i = threadIdx.x; i < TOK && threadIdx.x < 32; i += 32) {
        size_t off = row_offset(a, seq, t0 + i) + (KIND == BULK_HEAD ? head * 256 : 0);
        bulk(slot + i * PITCH, a.k + off, BYTES, bar);
        bulk(slot + SB / 2 + i * PITCH, a.v + off, BYTES, bar);
      }
    } else if (threadIdx.x == 0) { /* a run of TOK tokens inside one page */
      size_t off = row_offset(a, seq, t0);
      if constexpr (KIND == BULK_RUN) {
        bulk(slot, a.k + off, SB / 2, bar);
        bulk(slot + SB / 2, a.v + off, SB / 2, bar);
      } else {
        tma_run(slot, mk, (int)(off / COPY_ROW), bar);
        tma_run(slot + SB / 2, mv, (int)(off / COPY_ROW), bar);
      }
    }
#endif
  }
}

/* Persistent blocks take items of a.item tokens (of one head for the HEAD kinds and
 * CP_GRID), stream them through an ST-stage ring, and only touch what lands: the copy path
 * alone. CP_GRID's blocks take one item each, blockIdx.x, as a grid of decode blocks does. */
template <int KIND, int TOK, int ST>
__global__ void __launch_bounds__(128) ring(copy_args a, const __grid_constant__ CUtensorMap mk,
                                            const __grid_constant__ CUtensorMap mv) {
  extern __shared__ __align__(1024) char raw[];
  __shared__ __align__(8) unsigned long long bars[ST];
  __shared__ unsigned item_shared;
  constexpr int SB = slot_bytes(KIND, TOK);
  constexpr int HEADS = KIND <= BULK_HEAD ? 8 : 1;
  char *ring_base = raw + ((1024u - (smem_addr(raw) & 1023u)) & 1023u); /* the swizzle wants 1 KB */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    for (int i = 0; i < ST; i++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(&bars[i])));
    asm volatile("fence.mbarrier_init.release.cluster;\n");
  }
#endif
  __syncthreads();
  const int per_seq = a.kv_len / a.item * HEADS;
  unsigned acc = 0, g = 0; /* g: stages issued so far, for the ring slot and mbarrier phase */
  for (;;) {
    if (threadIdx.x == 0) item_shared = KIND != CP_GRID && KIND != CP_WARP ? atomicAdd(a.counter, 1u) : g == 0 ? blockIdx.x : ~0u;
    __syncthreads();
    const unsigned item = item_shared;
    if (item >= (unsigned)(a.seqs * per_seq)) break;
    int seq = item / per_seq, r = item % per_seq, head = r % HEADS, t0 = r / HEADS * a.item, NS = a.item / TOK;
    if (KIND == CP_WARP && a.split) { /* the decode grid: x = sequence x 8 + head, y = split */
      seq = blockIdx.x / 8, head = blockIdx.x % 8, t0 = blockIdx.y * a.split;
      if (t0 >= a.kv_len) break;
      NS = min(a.split, a.kv_len - t0) / TOK;
    }
    if (KIND == CP_WARP && a.chain) {
      unsigned x = 0;
      for (int i = 0; i < a.chain; i++) x = __ldcg(a.counter + 1 + (x & 1u));
      acc += x;
    }
    for (int s = 0; s < ST - 1; s++)
      issue<KIND, TOK>(a, &mk, &mv, ring_base + (g + s) % ST * SB, smem_addr(&bars[(g + s) % ST]), seq, head, t0 + s * TOK);
    for (int s = 0; s < NS; s++) {
      const unsigned next = g + s + ST - 1, cur = g + s;
      if (s + ST - 1 < NS)
        issue<KIND, TOK>(a, &mk, &mv, ring_base + next % ST * SB, smem_addr(&bars[next % ST]), seq, head,
                         t0 + (s + ST - 1) * TOK);
      else if (KIND <= CP_WARP)
        asm volatile("cp.async.commit_group;\n");
      if constexpr (KIND <= CP_WARP) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 1));
        __syncthreads();
      } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("{\n.reg .pred p;\nW: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra W;\n}\n" ::"r"(
                         smem_addr(&bars[cur % ST])), "r"((cur / ST) & 1u));
#endif
      }
      acc ^= *(const unsigned *)(ring_base + cur % ST * SB + threadIdx.x * 16);
      __syncthreads(); /* the slot is refilled next */
    }
    g += NS;
  }
  if (acc == 0x9e3779b9u) a.sink[threadIdx.x] = acc;
}

typedef void (*ring_fn)(copy_args, const CUtensorMap, const CUtensorMap);
static const ring_fn ring_kernels[COPY_KINDS] = {ring<CP_HEAD, 64, 2>, ring<CP_GRID, 64, 2>, ring<CP_WARP, 8, 4>, ring<BULK_HEAD, 64, 2>, ring<BULK_ROW, 16, 2>,
                                                 ring<BULK_RUN, 16, 3>, ring<TMA_RUN, 16, 3>};

/* The pool as 3-D for the tensor map: 64 elements (128 B), token rows (2 KB apart), 16
 * head-halves (128 B apart), so that a box lands as [head-half][token][64] and the swizzle
 * runs across tokens, which is what ldmatrix over 8 tokens of one head needs. */
static int run_map(CUtensorMap *m, const char *base, size_t rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode;
  if (!encode) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || !fn)
      return -1;
    encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
  }
  cuuint64_t dims[3] = {64, rows, 16}, strides[2] = {COPY_ROW, 128};
  cuuint32_t box[3] = {64, 16, 16}, unit[3] = {1, 1, 1};
  return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, (void *)base, dims, strides, box, unit,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS ? 0 : -1;
}

/* Median of 21 event-timed launches after 3 warm-ups; kind -1 is the whole-page read. */
static double time_kind(int kind, copy_args a, const CUtensorMap *mk, const CUtensorMap *mv, dim3 blocks, int smem) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  double t[21];
  for (int r = -3; r < 21; r++) {
    cudaMemsetAsync(a.counter, 0, sizeof(unsigned));
    cudaEventRecord(e0);
    if (kind < 0) whole_pages<<<dim3(a.pages_per_seq, a.seqs), 256>>>(a);
    else ring_kernels[kind]<<<blocks, copy_threads[kind], smem>>>(a, *mk, *mv);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (r >= 0) t[r] = ms;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return fattn_bench_median(t, 21);
}

extern "C" int fattn_bench_copies(int argc, char **argv) {
  (void)argv;
  if (argc > 1) { fprintf(stderr, "fattn-bench copies: no options\n"); return 2; }
  int dev = 0, major = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) {
    fprintf(stderr, "fattn-bench copies: needs a CUDA device\n");
    return 1;
  }
  if (major < 9) { fprintf(stderr, "fattn-bench copies: bulk copies and TMA need sm_90\n"); return 1; }
  static const int shapes[][3] = {{64, 4096, 16}, {64, 4096, 128}, {128, 8192, 16}, {128, 8192, 128}};
  FILE *csv = fopen("build/copies.csv", "w");
  if (!csv) { fprintf(stderr, "build/copies.csv: cannot write\n"); return 1; }
  fprintf(csv, "seqs,kv,page,path,blocks_per_sm,ring_kb_per_sm,gbps,of_whole_pages\n");
  printf("paged KV [pages, page, 8 heads, 128] bf16, K and V, pages in random order; median of 21; KB: ring bytes an SM\n");
  copy_args a;
  memset(&a, 0, sizeof a);
  cudaMalloc((void **)&a.counter, 4 * sizeof(unsigned)); /* [0] the work counter, [1..2] zeros to chase */
  cudaMemset(a.counter, 0, 4 * sizeof(unsigned));
  cudaMalloc((void **)&a.sink, 4096);
  for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
    a.seqs = shapes[si][0], a.kv_len = shapes[si][1], a.page_size = shapes[si][2];
    a.pages_per_seq = a.kv_len / a.page_size;
    int pages = a.seqs * a.pages_per_seq;
    size_t bytes = (size_t)pages * a.page_size * COPY_ROW;
    int *table = (int *)malloc(pages * sizeof(int));
    char *k = NULL, *v = NULL;
    if (!table || cudaMalloc((void **)&k, bytes) || cudaMalloc((void **)&v, bytes) ||
        cudaMalloc((void **)&a.table, pages * sizeof(int))) {
      fprintf(stderr, "fattn-bench copies: out of memory at %d x %d\n", a.seqs, a.kv_len);
      return 1;
    }
    cudaMemset(k, 1, bytes);
    cudaMemset(v, 2, bytes);
    srand(7); /* a random permutation of the pages, as a long-running pool holds them */
    for (int i = 0; i < pages; i++) table[i] = i;
    for (int i = pages - 1; i > 0; i--) { int j = rand() % (i + 1), t = table[i]; table[i] = table[j]; table[j] = t; }
    cudaMemcpy((void *)a.table, table, pages * sizeof(int), cudaMemcpyHostToDevice);
    a.k = k, a.v = v;
    CUtensorMap mk, mv;
    if (run_map(&mk, k, (size_t)pages * a.page_size) || run_map(&mv, v, (size_t)pages * a.page_size)) {
      fprintf(stderr, "fattn-bench copies: cuTensorMapEncodeTiled failed\n");
      return 1;
    }
    double whole = time_kind(-1, a, &mk, &mv, 0, 0);
    double gb_whole = 2.0 * bytes / whole / 1e6;
    printf("\n%d seqs x %d tokens, page %d: whole pages, plain loads: %.1f GB/s\n", a.seqs, a.kv_len, a.page_size, gb_whole);
    /* Every kind at its own residency with items of COPY_ITEM tokens; then the decode
     * kernel's path held to 1 and 2 blocks an SM by unused shared memory (how the bytes a ring
     * may hold in flight set the rate); then the grid kinds with items as long as a decode
     * split or longer (how a grid's last wave does). */
    static const struct { int kind, smem_kb, item; } extra[] = {
        {CP_HEAD, 120, COPY_ITEM}, {CP_HEAD, 80, COPY_ITEM}, {CP_GRID, 0, 1024}, {CP_GRID, 0, 2048},
        {CP_GRID, 0, 4096},        {CP_WARP, 0, 1024},       {CP_WARP, 0, 2048}};
    const int nextra = (int)(sizeof extra / sizeof extra[0]);
    for (int run = 0; run < COPY_KINDS + nextra; run++) {
      const int kind = run < COPY_KINDS ? run : extra[run - COPY_KINDS].kind;
      const int ring_bytes = copy_st[kind] * stage_bytes(kind);
      const int smem = run >= COPY_KINDS && extra[run - COPY_KINDS].smem_kb ? extra[run - COPY_KINDS].smem_kb * 1024
                                                                             : ring_bytes + 1024;
      a.item = run < COPY_KINDS ? COPY_ITEM : extra[run - COPY_KINDS].item;
      if (a.item > a.kv_len) continue;
      int occ = 0;
      cudaFuncSetAttribute(ring_kernels[kind], cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, ring_kernels[kind], copy_threads[kind], smem);
      const int blocks = kind == CP_GRID || kind == CP_WARP ? a.seqs * (a.kv_len / a.item) * 8 : sms * occ;
      double gb = 2.0 * bytes / time_kind(kind, a, &mk, &mv, blocks, smem) / 1e6;
      char name[96];
      if (a.item == COPY_ITEM) snprintf(name, sizeof name, "%s", copy_names[kind]);
      else snprintf(name, sizeof name, "%s, items of %d tokens", kind == CP_GRID ? "the same (a grid)" : "the same (a warp a block)", a.item);
      printf("  %-62s %d/SM %4d KB %7.1f GB/s %6.3f\n", name, occ, occ * ring_bytes / 1024, gb, gb / gb_whole);
      fflush(stdout);
      fprintf(csv, "%d,%d,%d,\"%s\",%d,%d,%.1f,%.4f\n", a.seqs, a.kv_len, a.page_size, name, occ,
              occ * ring_bytes / 1024, gb, gb / gb_whole);
    }
    /* The same pool with its pages in the order fattn-bench decode grows them, round robin over
     * the sequences (page p of sequence s at p * seqs + s): the decode kernels are timed on it. */
    for (int sq = 0; sq < a.seqs; sq++)
      for (int pg = 0; pg < a.pages_per_seq; pg++) table[sq * a.pages_per_seq + pg] = pg * a.seqs + sq;
    cudaMemcpy((void *)a.table, table, pages * sizeof(int), cudaMemcpyHostToDevice);
    const double gb_rr = 2.0 * bytes / time_kind(-1, a, &mk, &mv, 0, 0) / 1e6;
    printf("  pages grown round robin: whole pages, plain loads %.1f GB/s (%.3f of random order)\n", gb_rr, gb_rr / gb_whole);
    static const struct { int kind, item; } rr[] = {{CP_GRID, COPY_ITEM}, {CP_WARP, COPY_ITEM}, {CP_WARP, 2048}};
    for (size_t i = 0; i < sizeof rr / sizeof rr[0]; i++) {
      const int kind = rr[i].kind, smem = copy_st[kind] * stage_bytes(kind) + 1024;
      a.item = rr[i].item;
      if (a.item > a.kv_len) continue;
      const int blocks = a.seqs * (a.kv_len / a.item) * 8;
      const double gb = 2.0 * bytes / time_kind(kind, a, &mk, &mv, blocks, smem) / 1e6;
      printf("  round robin: %-49s items of %4d %7.1f GB/s %6.3f\n", copy_names[kind], a.item, gb, gb / gb_rr);
      fprintf(csv, "%d,%d,%d,\"round robin: %s, items of %d\",0,0,%.1f,%.4f\n", a.seqs, a.kv_len, a.page_size,
              copy_names[kind], a.item, gb, gb / gb_rr);
    }
    /* The warp ring placed as the decode kernels place their blocks (grid entries x 8 heads by
     * splits, the planner's split of a bs 64 / 128 step, two more rows of blocks that exit),
     * then with a start of 6 dependent loads before the first copy. */
    {
      const int ns = a.seqs >= 128 ? 2 : 3, len = (a.kv_len / ns + 127) / 128 * 128;
      const int smem = copy_st[CP_WARP] * stage_bytes(CP_WARP) + 1024;
      for (int chain = 0; chain <= 6; chain += 6) {
        a.item = COPY_ITEM, a.split = len, a.chain = chain;
        const double gb = 2.0 * bytes / time_kind(CP_WARP, a, &mk, &mv, dim3(a.seqs * 8, ns + 2), smem) / 1e6;
        printf("  round robin: the warp ring on the decode grid, %d splits of %d, start chain %d: %7.1f GB/s %6.3f\n",
               ns, len, chain, gb, gb / gb_rr);
        fprintf(csv, "%d,%d,%d,\"round robin: warp ring on the decode grid, chain %d\",0,0,%.1f,%.4f\n", a.seqs,
                a.kv_len, a.page_size, chain, gb, gb / gb_rr);
      }
      /* K and V in one allocation, V a page past K's end, as a context's arena holds them */
      char *kv = NULL;
      if (cudaMalloc((void **)&kv, 2 * bytes + 65536) == cudaSuccess) {
        copy_args b = a;
        b.k = kv, b.v = kv + bytes + 32768, b.chain = 0;
        cudaMemcpy(kv, k, bytes, cudaMemcpyDeviceToDevice);
        cudaMemcpy(kv + bytes + 32768, v, bytes, cudaMemcpyDeviceToDevice);
        const double gb_arena = 2.0 * bytes / time_kind(-1, b, &mk, &mv, 0, 0) / 1e6;
        const double gb = 2.0 * bytes / time_kind(CP_WARP, b, &mk, &mv, dim3(a.seqs * 8, ns + 2), smem) / 1e6;
        printf("  one allocation, V 32 KB past K: whole pages %.1f GB/s, the warp ring on the decode grid %.1f GB/s %6.3f\n",
               gb_arena, gb, gb / gb_arena);
        cudaFree(kv);
      }
      a.split = 0, a.chain = 0;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) { fprintf(stderr, "fattn-bench copies: %s\n", cudaGetErrorString(e)); return 1; }
    cudaFree(k), cudaFree(v), cudaFree((void *)a.table);
    free(table);
  }
  fclose(csv);
  printf("csv: build/copies.csv\n");
  return 0;
}
