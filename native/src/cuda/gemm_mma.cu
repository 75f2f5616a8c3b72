// gemm_mma.cu - MMQ-class keep-quant GEMM on int8 tensor cores (mma.sync), MMQ semantics (docs/SEMANTICS.md).
//
// One CTA (8 warps) computes a 128-row x J-token tile of out, walking K one 256-value super-block at a time:
// stage (global loads into registers in batches, dequantize into shared memory), barrier, mma, barrier. Latency
// is hidden by batching the loads and by the other CTAs of the SM (cp.async double buffering measured no faster).
// Shared memory (STRIDE = 272 B per staged row):
//   wq [128][STRIDE] int8   weights in natural k order: Q4_K the nibble 0..15, Q5_K nibble | 5th bit 0..31, Q6_K q6-32.
//   xq [J][STRIDE]   int8   activations (block_q8_1_mmq qs), natural k order.
//   ws [8][128]      float2 per 32-value sub-block i and row: Q4_K, Q5_K {A_i, B_i} = {half(d*sc_i), -half(dmin*m_i)},
//                           Q6_K {sc_2i, sc_2i+1} (the int8 scales as floats).
//   xs [8][J]        float2 per sub-block and token: Q4_K, Q5_K {d8, s8} of the DS4 half2, Q6_K {d8, 0}.
//   wd [128]         float per row, Q6_K only: d.
// The 16 B pad per 256 B row puts the 8 rows of every ldmatrix 8x16 B phase on disjoint bank quads.
// Warps form a WM x (8/WM) grid: warp w owns rows (w%WM)*TM .. +TM and tokens (w/WM)*TN .. +TN (TM = 128/WM,
// TN = J*WM/8), i.e. (TM/16) x (TN/8) mma tiles of 16 rows x 8 tokens with fp32 accumulators in the C fragment
// layout. Per sub-block: Q4_K / Q5_K one m16n8k32, acc += A*d8*isum + B*s8 (llama.cpp vec_dot_q8_1_q8_1_mma, which
// MMQ runs for both: Q5_K's load_tiles differs from Q4_K's only in the quants' fifth bit); Q6_K two
// m16n8k16 (one per 16-value scale), tmp = fma(sc_lo*isum_lo + sc_hi*isum_hi, d8, tmp) (MMQ's int32, exact in fp32
// as |.| < 2^24), and per 128-value half (4 sub-blocks, tmp from 0) acc = fma(tmp, d, acc), the float order of
// vec_dot_q6_K_q8_1_mma (Turing/Ampere path). The int32 accumulators start at 0x4B400000 (1.5*2^23 as float), so that
// float(isum) = as_float(c) - 1.5*2^23 exactly (|isum| <= 16*32*127 < 2^22): one FADD instead of a slow I2F.
// MMQ's stream-k seams (mmq_stream_k.cuh): where MMQ splits a tile's K over CTAs, the CTA sums the same segments
// (last first) and adds them as its fixup does; `earlier` in shared memory holds the fixup's running sum.
#include "common.cuh"
#include "mmq_stream_k.cuh"


#if !defined(GGML_CIQ_HIP)

#define CIQ_MMA_ROWS 128
#define CIQ_MMA_THREADS 256
#define CIQ_MMA_STRIDE 272  // bytes per staged row: 256 int8 + 16 pad

// Token tiles: the first config with J >= tokens is used, else the last. warps_m: warp rows of the 8 warps;
// min_ctas: CTAs per SM the registers are budgeted for (__launch_bounds__; J >= 64 gets 255 registers, which
// measured faster on H200 than 2 CTAs/SM at 128 registers).
struct mma_tile_config {
    int tokens;
    int warps_m;
    int min_ctas;
    int weight_batch;  // weight rows per thread whose loads are in flight together (divides 16)
};
static constexpr mma_tile_config k_mma_configs[] = {
    {8, 8, 3, 8}, {16, 8, 3, 8}, {32, 4, 2, 8}, {64, 4, 1, 4}, {128, 4, 1, 4}};
static constexpr int k_mma_config_count = sizeof(k_mma_configs) / sizeof(k_mma_configs[0]);

// wq, xq, ws, xs, Q6_K's wd, the split instance's fixup sums
static constexpr size_t mma_smem_bytes(ciq_type T, int J, bool split) {
    return (size_t)(CIQ_MMA_ROWS + J) * CIQ_MMA_STRIDE + (size_t)8 * (CIQ_MMA_ROWS + J) * sizeof(float2) +
           (T == CIQ_TYPE_Q6_K ? CIQ_MMA_ROWS * sizeof(float) : 0) +
           (split ? (size_t)CIQ_MMA_ROWS * J * sizeof(float) : 0);
}
constexpr int CIQ_MMA_MAX_SEAMS = 255;  // MMQ segments a tile may have beyond its first (more: one pass)

static constexpr int k_magic_bits = 0x4B400000;
static __device__ __forceinline__ float isum_of(int c) { return __int_as_float(c) - 12582912.0f; }

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Q4_K and Q5_K share the sub-block formula and the scale layout ({d, dmin}, scales[12]); Q5_K adds qh[32] before qs.
static constexpr __host__ __device__ bool q45_K(ciq_type T) { return T == CIQ_TYPE_Q4_K || T == CIQ_TYPE_Q5_K; }
static constexpr __host__ __device__ int mma_block_bytes(ciq_type T) {
    return T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : T == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES;
}

// A fragment of m16n8k32 for 16 rows x 32 bytes (row stride CIQ_MMA_STRIDE): lanes 0-15 address rows 0-15 at
// byte 0, lanes 16-31 rows 0-15 at byte 16, giving a0 (row g, k 4t..4t+3), a1 (row g+8), a2 (row g, k 16+4t..), a3.
static __device__ __forceinline__ void ldmatrix_a(int (&a)[4], const int8_t *tile, int lane) {
    const uint32_t address = smem_u32(tile + (lane % 16) * CIQ_MMA_STRIDE + (lane / 16) * 16);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(address));
}

// B fragment of m16n8k32 for 8 tokens x 32 bytes: b0 (token g, k 4t..4t+3), b1 (token g, k 16+4t..).
static __device__ __forceinline__ void ldmatrix_b(int (&b)[2], const int8_t *tile, int lane) {
    const uint32_t address = smem_u32(tile + (lane % 8) * CIQ_MMA_STRIDE + ((lane / 8) % 2) * 16);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(address));
}

static __device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%10, %10, %10, %10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(k_magic_bits));
#else
    __trap();
#endif
}

static __device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b), "r"(k_magic_bits));
#else
    __trap();
#endif
}

// Stages super-block kb of the CTA's 128 weight rows into wq/ws. Warp w handles rows w, w+8, ... with one qs
// word per lane, issuing the global loads of BATCH rows before dequantizing them; thread tid handles the scales
// of row tid/2, sub-blocks 4*(tid%2) .. +3. Rows past the end re-read the last row. Q6_K is read with 2-byte
// loads: its 210 B blocks are only 2-byte aligned.
template <ciq_type T, int BATCH>
static __device__ __forceinline__ void stage_weights(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t row0,
                                                     int64_t rows, int kb, int8_t *wq, float2 *ws, float *wd) {
    constexpr int block_bytes = mma_block_bytes(T);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const uint8_t *base = w + (int64_t)kb * block_bytes;
#pragma unroll
    for (int it0 = 0; it0 < 16; it0 += BATCH) {
        uint32_t raw[BATCH][2];  // Q4_K: qs word lane; Q5_K: that and qh word lane%8; Q6_K: ql word lane, qh word
                                 // 8(lane/16) + lane%8
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            const uint8_t *blk = base + min(row0 + 8 * (it0 + b) + warp, rows - 1) * row_bytes;
            if constexpr (T == CIQ_TYPE_Q4_K) {
                raw[b][0] = __ldg((const uint32_t *)(blk + 16) + lane);
            } else if constexpr (T == CIQ_TYPE_Q5_K) {
                raw[b][0] = __ldg((const uint32_t *)(blk + 48) + lane);
                raw[b][1] = __ldg((const uint32_t *)(blk + 16) + lane % 8);
            } else {
                const uint16_t *ql = (const uint16_t *)blk + 2 * lane;
                const uint16_t *qh = (const uint16_t *)blk + 64 + 16 * (lane / 16) + 2 * (lane % 8);
                raw[b][0] = __ldg(ql) | (uint32_t)__ldg(ql + 1) << 16;
                raw[b][1] = __ldg(qh) | (uint32_t)__ldg(qh + 1) << 16;
            }
        }
#pragma unroll
        for (int b = 0; b < BATCH; ++b) {
            int *dst = (int *)(wq + (8 * (it0 + b) + warp) * CIQ_MMA_STRIDE);
            if constexpr (T == CIQ_TYPE_Q4_K) {  // qs word l: low nibbles = values 64(l/8) + 4(l%8) + 0..3, high +32
                dst[16 * (lane / 8) + lane % 8] = raw[b][0] & 0x0F0F0F0F;
                dst[16 * (lane / 8) + lane % 8 + 8] = (raw[b][0] >> 4) & 0x0F0F0F0F;
            } else if constexpr (T == CIQ_TYPE_Q5_K) {  // the same, each byte's fifth bit from qh: bit 2(l/8) (low
                const uint32_t qh = raw[b][1] >> (2 * (lane / 8));  // nibbles) and 2(l/8)+1 (high) of qh byte e%32
                dst[16 * (lane / 8) + lane % 8] = (raw[b][0] & 0x0F0F0F0F) | ((qh << 4) & 0x10101010);
                dst[16 * (lane / 8) + lane % 8 + 8] = ((raw[b][0] >> 4) & 0x0F0F0F0F) | ((qh << 3) & 0x10101010);
            } else {  // ql word l: values 128(l/16) + 32((l/8)%2) + 4(l%8) + 0..3, high nibbles +64
                const uint32_t ql = raw[b][0], qh = raw[b][1] >> (2 * ((lane / 8) % 2));
                dst[2 * lane - lane % 16] = __vsub4((ql & 0x0F0F0F0F) | ((qh << 4) & 0x30303030), 0x20202020);
                dst[2 * lane - lane % 16 + 16] = __vsub4(((ql >> 4) & 0x0F0F0F0F) | (qh & 0x30303030), 0x20202020);
            }
        }
    }
    const int r = threadIdx.x / 2, h = threadIdx.x % 2;
    const uint8_t *blk = base + min(row0 + r, rows - 1) * row_bytes;
    if constexpr (q45_K(T)) {
        const uint32_t *hdr = (const uint32_t *)blk;  // {d, dmin}, scales[12]
        const uint32_t dm = __ldg(hdr), s0 = __ldg(hdr + 1), s1 = __ldg(hdr + 2), s2 = __ldg(hdr + 3);
        const float d = __low2float(*(const __half2 *)&dm), dmin = __high2float(*(const __half2 *)&dm);
#pragma unroll
        for (int l = 0; l < 4; ++l) {  // get_scale_min_k4 of sub-block j = 4h + l
            const uint32_t sc = h == 0 ? (s0 >> 8 * l) & 63 : ((s2 >> 8 * l) & 15) | (((s0 >> 8 * l) & 0xC0) >> 2);
            const uint32_t m = h == 0 ? (s1 >> 8 * l) & 63 : (((s2 >> 8 * l) & 0xF0) >> 4) | (((s1 >> 8 * l) & 0xC0) >> 2);
            ws[(4 * h + l) * CIQ_MMA_ROWS + r] = make_float2(__half2float(__float2half_rn(d * (float)sc)),
                                                             -__half2float(__float2half_rn(dmin * (float)m)));
        }
    } else {
        const uint16_t *b16 = (const uint16_t *)blk;
        if (h == 0) wd[r] = ciq_half_to_float(__ldg(b16 + 104));
#pragma unroll
        for (int l = 0; l < 4; ++l) {  // scales 8h + 2l, 8h + 2l + 1
            const uint16_t sc = __ldg(b16 + 96 + 4 * h + l);
            ws[(4 * h + l) * CIQ_MMA_ROWS + r] = make_float2((float)(int8_t)sc, (float)(int8_t)(sc >> 8));
        }
    }
}

// Super-block kb of the J tokens' activations (block_q8_1_mmq [k/128][tokens], two blocks per super-block), in
// batches: batch c covers qs words (c*CHUNK + it)*256 + tid of the J x 64 and, in batch 0, the scale words
// it*256 + tid of the J x 8. Tokens past the end re-read the last token.
template <ciq_type T, int J> struct act_tile {
    static constexpr int QW = J * 64 / CIQ_MMA_THREADS, CHUNK = QW < 8 ? QW : 8, BATCHES = QW / CHUNK;
    static constexpr int SW = (J * 8 + CIQ_MMA_THREADS - 1) / CIQ_MMA_THREADS;
    uint32_t q[CHUNK], s[SW];
    static __device__ __forceinline__ const uint32_t *block(const uint8_t *x, int64_t tokens, int64_t tok0, int t,
                                                            int kb, int half) {
        return (const uint32_t *)(x + ((2 * (int64_t)kb + half) * tokens + min(tok0 + t, tokens - 1)) * Q8_1_MMQ_BLOCK_BYTES);
    }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ x, int64_t tokens, int64_t tok0, int kb, int c) {
#pragma unroll
        for (int it = 0; it < CHUNK; ++it) {  // token t, qs word wd of 64
            const int idx = (c * CHUNK + it) * CIQ_MMA_THREADS + threadIdx.x, t = idx / 64, wd = idx % 64;
            q[it] = __ldg(block(x, tokens, tok0, t, kb, wd / 32) + 4 + wd % 32);
        }
#pragma unroll
        for (int it = 0; it < SW; ++it) {  // token t, sub-block i
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x, t = idx / 8, i = idx % 8;
            if (c == 0 && idx < J * 8) s[it] = __ldg(block(x, tokens, tok0, t, kb, i / 4) + i % 4);
        }
    }
    __device__ __forceinline__ void store(int8_t *xq, float2 *xs, int c) const {
#pragma unroll
        for (int it = 0; it < CHUNK; ++it) {
            const int idx = (c * CHUNK + it) * CIQ_MMA_THREADS + threadIdx.x;
            ((uint32_t *)(xq + idx / 64 * CIQ_MMA_STRIDE))[idx % 64] = q[it];
        }
#pragma unroll
        for (int it = 0; it < SW; ++it) {
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x;
            if (c == 0 && idx < J * 8)
                xs[idx % 8 * J + idx / 8] = q45_K(T) ? __half22float2(*(const __half2 *)&s[it])
                                                     : make_float2(__uint_as_float(s[it]), 0.0f);
        }
    }
};

template <ciq_type T, int J, int WM, int MIN_CTAS, int WBATCH, bool SPLIT>
__global__ void __launch_bounds__(CIQ_MMA_THREADS, MIN_CTAS)
    gemm_mma_kernel(const uint8_t *__restrict__ w, int64_t rows, int nb, const uint8_t *__restrict__ x,
                    int64_t tokens, void *__restrict__ out, ciq_out_type out_type, MmqStreamK mmq) {
    constexpr int TM = CIQ_MMA_ROWS / WM, TN = J * WM / 8, MT = TM / 16, NT = TN / 8;
    static_assert(MT >= 1 && NT >= 1 && TN * (8 / WM) == J, "bad tile config");
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *wq = (int8_t *)smem;
    int8_t *xq = wq + CIQ_MMA_ROWS * CIQ_MMA_STRIDE;
    float2 *ws = (float2 *)(xq + J * CIQ_MMA_STRIDE);
    float2 *xs = ws + 8 * CIQ_MMA_ROWS;
    float *wd = (float *)(xs + 8 * J);  // Q6_K only
    float *earlier = wd + (T == CIQ_TYPE_Q6_K ? CIQ_MMA_ROWS : 0);  // SPLIT: [MT*NT*4][256], the fixup's sums
    __shared__ int seg_start[CIQ_MMA_MAX_SEAMS + 1];
    __shared__ int seg_count;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int wr = (warp % WM) * TM, wt = (warp / WM) * TN;  // warp's first row and token in the tile
    const int64_t row0 = (int64_t)blockIdx.x * CIQ_MMA_ROWS, tok0 = (int64_t)blockIdx.y * J;
    const int64_t row_bytes = (int64_t)nb * mma_block_bytes(T);

    // MMQ's segments of this CTA's tile (mmq_stream_k.cuh): when its tokens lie in one MMQ token tile (its rows are
    // one MMQ row tile) and out is float32, the segments run last first: the last into out, the others summed into
    // `earlier` from the nearest back, out += earlier at the end, as MMQ's fixup. Else one pass over K.
    // SPLIT: the instance launched where MMQ splits K (it holds the segment loop's registers only there).
    if (SPLIT && threadIdx.x == 0) {
        const int64_t jt = tok0 / mmq.J, last = (min(tok0 + J, tokens) - 1) / mmq.J;
        const int n = out_type == CIQ_OUT_F32 && jt == last
                          ? mmq_tile_seams(mmq, (row0 / MMQ_ROWS) * mmq.ntx + jt, seg_start + 1, CIQ_MMA_MAX_SEAMS)
                          : 0;
        seg_count = n < 0 ? 1 : n + 1;
    }
    if (SPLIT && threadIdx.x == 0) seg_start[0] = 0;
    if (SPLIT) __syncthreads();
    const int segments = SPLIT ? seg_count : 1;

    float acc[MT][NT][4];
    // Each accumulator with its `earlier` slot and its output row and token.
    auto each_element = [&](auto &&f) {
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    f(acc[m][n][e], earlier[((m * NT + n) * 4 + e) * CIQ_MMA_THREADS + threadIdx.x],
                      row0 + wr + 16 * m + g + 8 * (e / 2), tok0 + wt + 8 * n + 2 * t4 + e % 2);
    };
    for (int segment = segments - 1; segment >= 0; --segment) {
        const int kb_first = SPLIT ? seg_start[segment] : 0;
        const int kb_stop = SPLIT && segment + 1 < segments ? seg_start[segment + 1] : nb;
        each_element([](float &a, float &, int64_t, int64_t) { a = 0.0f; });
        for (int kb = kb_first; kb < kb_stop; ++kb) {
            act_tile<T, J> atile;
            atile.load(x, tokens, tok0, kb, 0);  // in flight while the weights are staged
            stage_weights<T, WBATCH>(w, row_bytes, row0, rows, kb, wq, ws, wd);
            atile.store(xq, xs, 0);
            for (int c = 1; c < atile.BATCHES; ++c) {
                atile.load(x, tokens, tok0, kb, c);
                atile.store(xq, xs, c);
            }
            __syncthreads();
            float tmp[MT][NT][4] = {};  // Q6_K: the 128-value half's sum over its sub-blocks of d8 * isc
#pragma unroll 2
            for (int i = 0; i < 8; ++i) {  // 32-value sub-block
                int a[MT][4];
                float2 wsc[MT][2];  // rows g and g+8 of each m tile
#pragma unroll
                for (int m = 0; m < MT; ++m) {
                    ldmatrix_a(a[m], wq + (wr + 16 * m) * CIQ_MMA_STRIDE + 32 * i, lane);
                    wsc[m][0] = ws[i * CIQ_MMA_ROWS + wr + 16 * m + g];
                    wsc[m][1] = ws[i * CIQ_MMA_ROWS + wr + 16 * m + g + 8];
                }
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    int b[2];
                    ldmatrix_b(b, xq + (wt + 8 * n) * CIQ_MMA_STRIDE + 32 * i, lane);
                    const float4 xsc = *(const float4 *)&xs[i * J + wt + 8 * n + 2 * t4];  // tokens 2t4, 2t4+1
#pragma unroll
                    for (int m = 0; m < MT; ++m) {
                        int c0[4], c1[4];
                        if constexpr (q45_K(T)) {
                            mma_k32(c0, a[m], b[0], b[1]);
                        } else {
                            mma_k16(c0, a[m][0], a[m][1], b[0]);
                            mma_k16(c1, a[m][2], a[m][3], b[1]);
                        }
#pragma unroll
                        for (int e = 0; e < 4; ++e) {  // C element e: row g + 8(e/2), token 2t4 + e%2
                            const float2 wv = wsc[m][e / 2];
                            const float d8 = e % 2 ? xsc.z : xsc.x, s8 = e % 2 ? xsc.w : xsc.y;
                            float &sum = acc[m][n][e];
                            if constexpr (q45_K(T)) {
                                sum = fmaf(wv.x * d8, isum_of(c0[e]), sum);
                                sum = fmaf(wv.y, s8, sum);
                            } else {  // sc_lo*isum_lo + sc_hi*isum_hi, exact (MMQ's int32)
                                const float isc = fmaf(isum_of(c1[e]), wv.y, isum_of(c0[e]) * wv.x);
                                tmp[m][n][e] = fmaf(isc, d8, tmp[m][n][e]);
                            }
                        }
                    }
                }
                if constexpr (T == CIQ_TYPE_Q6_K) {
                    if (i % 4 == 3) {  // end of a 128-value half: acc += tmp * d, tmp from 0 again
#pragma unroll
                        for (int m = 0; m < MT; ++m) {
                            const float d0 = wd[wr + 16 * m + g], d1 = wd[wr + 16 * m + g + 8];
#pragma unroll
                            for (int n = 0; n < NT; ++n) {
#pragma unroll
                                for (int e = 0; e < 4; ++e) {
                                    acc[m][n][e] = fmaf(tmp[m][n][e], e / 2 ? d1 : d0, acc[m][n][e]);
                                    tmp[m][n][e] = 0.0f;
                                }
                            }
                        }
                    }
                }
            }
            __syncthreads();
        }
        if (segments > 1) {  // the last segment to out; each earlier one into the fixup's sum (from 0: -0 becomes +0)
            each_element([&](float &a, float &sum, int64_t r, int64_t t) {
                if (segment == segments - 1) {
                    if (r < rows && t < tokens) ((float *)out)[t * rows + r] = a;
                } else {
                    sum = __fadd_rn(segment == segments - 2 ? 0.0f : sum, a);
                }
            });
        }
    }
    each_element([&](float &a, float &sum, int64_t r, int64_t t) {
        if (r >= rows || t >= tokens) return;
        if (segments > 1) {
            float *o = (float *)out + t * rows + r;
            *o = __fadd_rn(*o, sum);
        } else {
            ciq_store_out(out, t * rows + r, a, out_type);
        }
    });
}

template <ciq_type T, int C>
static ciq_status launch_mma(const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens, void *out,
                             ciq_out_type out_type, const MmqStreamK &mmq) {
    constexpr mma_tile_config cfg = k_mma_configs[C];
    constexpr size_t smem = mma_smem_bytes(T, cfg.tokens, false), smem_split = mma_smem_bytes(T, cfg.tokens, true);
    constexpr auto kernel = gemm_mma_kernel<T, cfg.tokens, cfg.warps_m, cfg.min_ctas, cfg.weight_batch, false>;
    constexpr auto split = gemm_mma_kernel<T, cfg.tokens, cfg.warps_m, cfg.min_ctas, cfg.weight_batch, true>;
    const bool use_split = mmq.split() && out_type == CIQ_OUT_F32;
    if ((use_split ? smem_split : smem) > 48 * 1024) {
        const ciq_status status = use_split ? ciq_raise_smem_limit<split>((int)smem_split, "ciq_cuda_gemm_mma")
                                            : ciq_raise_smem_limit<kernel>((int)smem, "ciq_cuda_gemm_mma");
        if (status != CIQ_OK) return status;
    }
    const dim3 grid((unsigned)((rows + CIQ_MMA_ROWS - 1) / CIQ_MMA_ROWS), (unsigned)((tokens + cfg.tokens - 1) / cfg.tokens));
    if (use_split) {
        split<<<grid, CIQ_MMA_THREADS, smem_split, ciq_stream()>>>((const uint8_t *)weight, rows, (int)(k / QK_K), (const uint8_t *)x,
                                               tokens, out, out_type, mmq);
    } else {
        kernel<<<grid, CIQ_MMA_THREADS, smem, ciq_stream()>>>((const uint8_t *)weight, rows, (int)(k / QK_K), (const uint8_t *)x,
                                                tokens, out, out_type, mmq);
    }
    CIQ_CUDA_LAUNCH_CHECK("ciq_cuda_gemm_mma");
    return CIQ_OK;
}

template <ciq_type T, int C = 0>
static ciq_status dispatch_mma(int config, const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens,
                               void *out, ciq_out_type out_type, const MmqStreamK &mmq) {
    if constexpr (C < k_mma_config_count) {
        if (config == C) return launch_mma<T, C>(weight, rows, k, x, tokens, out, out_type, mmq);
        return dispatch_mma<T, C + 1>(config, weight, rows, k, x, tokens, out, out_type, mmq);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: bad tile config %d", config);
    }
}

ciq_status ciq_cuda_gemm_mma(ciq_type type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                             int64_t tokens, void *out, ciq_out_type out_type) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q5_K && type != CIQ_TYPE_Q6_K)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: unknown weight type %d", (int)type);
    if (!weight || !x_q8_1_mmq || !out || rows < 1 || tokens < 1 || k < QK_K || k % QK_K != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: bad arguments (rows %lld, k %lld, tokens %lld)",
                        (long long)rows, (long long)k, (long long)tokens);
    if (((uintptr_t)x_q8_1_mmq | (q45_K(type) ? (uintptr_t)weight : 0)) % 4 != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_cuda_gemm_mma: activations (and Q4_K/Q5_K weights) must be 4-byte aligned");
    int device, sms;
    const ciq_status status = ciq_current_gpu_sms("ciq_cuda_gemm_mma", &device, &sms);
    if (status != CIQ_OK) return status;
    const MmqStreamK mmq = mmq_stream_k(rows, k / QK_K, 1, tokens, sms);  // K-quants: one super-block an iteration
    int config = 0;
    while (config + 1 < k_mma_config_count && k_mma_configs[config].tokens < tokens) ++config;
    // Where MMQ splits K over more token tiles than one, our CTAs must not straddle its tiles' seams: the widest
    // config whose token width divides MMQ's J (J = 112 at 200 tokens: 16-token CTAs). Measured exact at 512 and 88
    // tokens (one MMQ token tile or J = 128); the narrower configs' seams are not yet measured on a GPU.
    if (mmq.split() && out_type == CIQ_OUT_F32 && mmq.ntx > 1 && mmq.J % k_mma_configs[config].tokens != 0) {
        while (config > 0 && mmq.J % k_mma_configs[config].tokens != 0) --config;
    }
    if ((tokens + k_mma_configs[config].tokens - 1) / k_mma_configs[config].tokens > 65535 || k / QK_K > INT32_MAX)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_mma: problem too large (k %lld, tokens %lld)", (long long)k,
                        (long long)tokens);
    const void *x = x_q8_1_mmq;
    switch (type) {
        case CIQ_TYPE_Q4_K: return dispatch_mma<CIQ_TYPE_Q4_K>(config, weight, rows, k, x, tokens, out, out_type, mmq);
        case CIQ_TYPE_Q5_K: return dispatch_mma<CIQ_TYPE_Q5_K>(config, weight, rows, k, x, tokens, out, out_type, mmq);
        default: return dispatch_mma<CIQ_TYPE_Q6_K>(config, weight, rows, k, x, tokens, out, out_type, mmq);
    }
}

#else  // HIP: no mma.sync

ciq_status ciq_cuda_gemm_mma(ciq_type, const void *, int64_t, int64_t, const void *, int64_t, void *,
                             ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_mma: the mma.sync kernel is CUDA-only");
}

#endif
