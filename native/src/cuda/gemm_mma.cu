// gemm_mma.cu - MMQ-class keep-quant GEMM on int8 tensor cores (mma.sync), MMQ semantics (docs/SEMANTICS.md).
//
// One CTA (8 warps) computes a 128-row x J-token tile of out, walking K one 256-value super-block at a time:
// all threads issue their global loads of the super-block (weights and activations) into registers, dequantize
// them into shared memory, barrier, run the mma, barrier. Shared memory (STRIDE = 272 B per staged row):
//   wq [128][STRIDE] int8   weights in natural k order: Q4_K the nibble 0..15, Q6_K q6-32.
//   xq [J][STRIDE]   int8   activations (block_q8_1_mmq qs), natural k order.
//   ws [8][128]      float2 per 32-value sub-block i and row: Q4_K {A_i, B_i} = {half(d*sc_i), -half(dmin*m_i)},
//                           Q6_K {sc_2i*d, sc_2i+1*d} (exact in fp32).
//   xs [8][J]        float2 per sub-block and token: Q4_K {d8, s8} of the DS4 half2, Q6_K {d8, 0}.
// The 16 B pad per 256 B row puts the 8 rows of every ldmatrix 8x16 B phase on disjoint bank quads.
// Warps form a WM x (8/WM) grid: warp w owns rows (w%WM)*TM .. +TM and tokens (w/WM)*TN .. +TN (TM = 128/WM,
// TN = J*WM/8), i.e. (TM/16) x (TN/8) mma tiles of 16 rows x 8 tokens with fp32 accumulators in the C fragment
// layout. Per sub-block: Q4_K one m16n8k32, acc += A*d8*isum + B*s8 (llama.cpp vec_dot_q8_1_q8_1_mma); Q6_K two
// m16n8k16 (one per 16-value scale), acc += d8*(isum_lo*sc_lo*d + isum_hi*sc_hi*d) (vec_dot_q6_K_q8_1_mma with d
// folded into the scales). The int32 accumulators start at 0x4B400000 (1.5*2^23 as float), so that
// float(isum) = as_float(c) - 1.5*2^23 exactly (|isum| <= 32*127*32 < 2^22): one FADD instead of a slow I2F.
#include "common.cuh"

#include <atomic>

#if !defined(GGML_CIQ_HIP)

#define CIQ_MMA_ROWS 128
#define CIQ_MMA_THREADS 256
#define CIQ_MMA_STRIDE 272  // bytes per staged row: 256 int8 + 16 pad

// Token tiles: the first config with J >= tokens is used, else the last. warps_m: warp rows of the 8 warps;
// min_ctas: CTAs per SM the registers are budgeted for (__launch_bounds__).
struct mma_tile_config {
    int tokens;
    int warps_m;
    int min_ctas;
};
static constexpr mma_tile_config k_mma_configs[] = {{8, 8, 4}, {16, 8, 4}, {32, 4, 3}, {64, 4, 2}, {128, 4, 2}};
static constexpr int k_mma_config_count = sizeof(k_mma_configs) / sizeof(k_mma_configs[0]);

static constexpr size_t mma_smem_bytes(int J) {  // wq, xq, ws, xs
    return (size_t)(CIQ_MMA_ROWS + J) * CIQ_MMA_STRIDE + (size_t)8 * (CIQ_MMA_ROWS + J) * sizeof(float2);
}

static constexpr int k_unroll_i = UNROLL_I;
static constexpr int k_magic_bits = 0x4B400000;
static __device__ __forceinline__ float isum_of(int c) { return __int_as_float(c) - 12582912.0f; }

static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// A fragment of m16n8k32 for 16 rows x 32 bytes (row stride CIQ_MMA_STRIDE): lanes 0-15 address rows 0-15 at
// byte 0, lanes 16-31 rows 0-15 at byte 16, giving a0 (row g, k 4t..4t+3), a1 (row g+8), a2 (row g, k 16+4t..), a3.
static __device__ __forceinline__ void ldmatrix_a(int (&a)[4], const int8_t *tile, int lane) {
    const int8_t *p = tile + (lane % 16) * CIQ_MMA_STRIDE + (lane / 16) * 16;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3]) : "r"(smem_u32(p)));
}

// B fragment of m16n8k32 for 8 tokens x 32 bytes: b0 (token g, k 4t..4t+3), b1 (token g, k 16+4t..).
static __device__ __forceinline__ void ldmatrix_b(int (&b)[2], const int8_t *tile, int lane) {
    const int8_t *p = tile + (lane % 8) * CIQ_MMA_STRIDE + ((lane / 8) % 2) * 16;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(b[0]), "=r"(b[1]) : "r"(smem_u32(p)));
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

// One super-block of the CTA's 128 weight rows: global loads into registers (load), then dequantization into
// wq/ws (store). Warp w reads rows w, w+8, ..., one qs word per lane; thread tid reads the scales of row tid/2
// for sub-blocks 4*(tid%2) .. +3. Rows past the end re-read the last row.
template <ciq_weight_type T> struct weight_tile;

template <> struct weight_tile<CIQ_TYPE_Q4_K> {
    uint32_t qs[16], hdr[4];  // hdr: {d, dmin}, scales[12]
    __device__ __forceinline__ void load(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t row0, int64_t rows,
                                         int kb) {
        const uint8_t *base = w + (int64_t)kb * Q4_K_BLOCK_BYTES;
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int it = 0; it < 16; ++it)
            qs[it] = __ldg((const uint32_t *)(base + min(row0 + 8 * it + warp, rows - 1) * row_bytes + 16) + lane);
        const uint32_t *blk = (const uint32_t *)(base + min(row0 + threadIdx.x / 2, rows - 1) * row_bytes);
#pragma unroll
        for (int l = 0; l < 4; ++l) hdr[l] = __ldg(blk + l);
    }
    __device__ __forceinline__ void store(int8_t *wq, float2 *ws) const {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int it = 0; it < 16; ++it) {  // qs word l: low nibbles = values 64(l/8) + 4(l%8) + 0..3, high +32
            int *dst = (int *)(wq + (8 * it + warp) * CIQ_MMA_STRIDE) + 16 * (lane / 8) + lane % 8;
            dst[0] = qs[it] & 0x0F0F0F0F;
            dst[8] = (qs[it] >> 4) & 0x0F0F0F0F;
        }
        const float d = __low2float(*(const __half2 *)&hdr[0]), dmin = __high2float(*(const __half2 *)&hdr[0]);
        const uint32_t s0 = hdr[1], s1 = hdr[2], s2 = hdr[3];
#pragma unroll
        for (int l = 0; l < 4; ++l) {  // get_scale_min_k4 of sub-block j = 4*(tid%2) + l
            const bool lo = threadIdx.x % 2 == 0;
            const uint32_t sc = lo ? (s0 >> 8 * l) & 63 : ((s2 >> 8 * l) & 15) | (((s0 >> 8 * l) & 0xC0) >> 2);
            const uint32_t m = lo ? (s1 >> 8 * l) & 63 : (((s2 >> 8 * l) & 0xF0) >> 4) | (((s1 >> 8 * l) & 0xC0) >> 2);
            ws[(4 * (threadIdx.x % 2) + l) * CIQ_MMA_ROWS + threadIdx.x / 2] =
                make_float2(__half2float(__float2half_rn(d * (float)sc)), -__half2float(__float2half_rn(dmin * (float)m)));
        }
    }
};

template <> struct weight_tile<CIQ_TYPE_Q6_K> {  // 2-byte loads: Q6_K blocks (210 B) are only 2-byte aligned
    uint16_t ql[16][2], qh[16][2], sc[4], d;
    __device__ __forceinline__ void load(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t row0, int64_t rows,
                                         int kb) {
        const uint8_t *base = w + (int64_t)kb * Q6_K_BLOCK_BYTES;
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int it = 0; it < 16; ++it) {  // ql word l, qh word 8(l/16) + l%8
            const uint16_t *blk = (const uint16_t *)(base + min(row0 + 8 * it + warp, rows - 1) * row_bytes);
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                ql[it][b] = __ldg(blk + 2 * lane + b);
                qh[it][b] = __ldg(blk + 64 + 16 * (lane / 16) + 2 * (lane % 8) + b);
            }
        }
        const uint16_t *blk = (const uint16_t *)(base + min(row0 + threadIdx.x / 2, rows - 1) * row_bytes);
#pragma unroll
        for (int l = 0; l < 4; ++l) sc[l] = __ldg(blk + 96 + 4 * (threadIdx.x % 2) + l);  // scales 8(tid%2) + 0..7
        d = __ldg(blk + 104);
    }
    __device__ __forceinline__ void store(int8_t *wq, float2 *ws) const {
        const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
        for (int it = 0; it < 16; ++it) {  // ql word l: values 128(l/16) + 32((l/8)%2) + 4(l%8) + 0..3, high nibbles +64
            const uint32_t q = ql[it][0] | (uint32_t)ql[it][1] << 16;
            const uint32_t hb = (qh[it][0] | (uint32_t)qh[it][1] << 16) >> (2 * ((lane / 8) % 2));
            int *dst = (int *)(wq + (8 * it + warp) * CIQ_MMA_STRIDE) + 2 * lane - lane % 16;
            dst[0] = __vsub4((q & 0x0F0F0F0F) | ((hb << 4) & 0x30303030), 0x20202020);
            dst[16] = __vsub4(((q >> 4) & 0x0F0F0F0F) | (hb & 0x30303030), 0x20202020);
        }
        const float df = ciq_half_to_float(d);
#pragma unroll
        for (int l = 0; l < 4; ++l)
            ws[(4 * (threadIdx.x % 2) + l) * CIQ_MMA_ROWS + threadIdx.x / 2] =
                make_float2((float)(int8_t)sc[l] * df, (float)(int8_t)(sc[l] >> 8) * df);
    }
};

// One super-block of the J tokens' activations (block_q8_1_mmq [k/128][tokens], two blocks per super-block):
// thread tid reads qs words it*256 + tid of the J x 64 words and scale words of the J x 8. Tokens past the end
// re-read the last token.
template <ciq_weight_type T, int J> struct act_tile {
    static constexpr int QW = J * 64 / CIQ_MMA_THREADS, SW = (J * 8 + CIQ_MMA_THREADS - 1) / CIQ_MMA_THREADS;
    uint32_t q[QW], s[SW];
    static __device__ __forceinline__ const uint32_t *block(const uint8_t *x, int64_t tokens, int64_t tok0, int t,
                                                            int kb, int half) {
        return (const uint32_t *)(x + ((2 * (int64_t)kb + half) * tokens + min(tok0 + t, tokens - 1)) * Q8_1_MMQ_BLOCK_BYTES);
    }
    __device__ __forceinline__ void load(const uint8_t *__restrict__ x, int64_t tokens, int64_t tok0, int kb) {
#pragma unroll
        for (int it = 0; it < QW; ++it) {  // token t, qs word wd of 64
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x, t = idx / 64, wd = idx % 64;
            q[it] = __ldg(block(x, tokens, tok0, t, kb, wd / 32) + 4 + wd % 32);
        }
#pragma unroll
        for (int it = 0; it < SW; ++it) {  // token t, sub-block i
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x, t = idx / 8, i = idx % 8;
            if (idx < J * 8) s[it] = __ldg(block(x, tokens, tok0, t, kb, i / 4) + i % 4);
        }
    }
    __device__ __forceinline__ void store(int8_t *xq, float2 *xs) const {
#pragma unroll
        for (int it = 0; it < QW; ++it) {
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x;
            ((uint32_t *)(xq + idx / 64 * CIQ_MMA_STRIDE))[idx % 64] = q[it];
        }
#pragma unroll
        for (int it = 0; it < SW; ++it) {
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x;
            if (idx < J * 8)
                xs[idx % 8 * J + idx / 8] = T == CIQ_TYPE_Q4_K ? __half22float2(*(const __half2 *)&s[it])
                                                               : make_float2(__uint_as_float(s[it]), 0.0f);
        }
    }
};

template <ciq_weight_type T, int J, int WM, int MIN_CTAS>
__global__ void __launch_bounds__(CIQ_MMA_THREADS, MIN_CTAS)
    gemm_mma_kernel(const uint8_t *__restrict__ w, int64_t rows, int nb, const uint8_t *__restrict__ x,
                    int64_t tokens, void *__restrict__ out, ciq_out_type out_type) {
    constexpr int TM = CIQ_MMA_ROWS / WM, TN = J * WM / 8, MT = TM / 16, NT = TN / 8;
    static_assert(MT >= 1 && NT >= 1 && TN * (8 / WM) == J, "bad tile config");
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *wq = (int8_t *)smem;
    int8_t *xq = wq + CIQ_MMA_ROWS * CIQ_MMA_STRIDE;
    float2 *ws = (float2 *)(xq + J * CIQ_MMA_STRIDE);
    float2 *xs = ws + 8 * CIQ_MMA_ROWS;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int wr = (warp % WM) * TM, wt = (warp / WM) * TN;  // warp's first row and token in the tile
    const int64_t row0 = (int64_t)blockIdx.x * CIQ_MMA_ROWS, tok0 = (int64_t)blockIdx.y * J;
    const int64_t row_bytes = (int64_t)nb * (T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES);

    float acc[MT][NT][4] = {};
    for (int kb = 0; kb < nb; ++kb) {
        weight_tile<T> wtile;
        act_tile<T, J> atile;
        wtile.load(w, row_bytes, row0, rows, kb);
        atile.load(x, tokens, tok0, kb);
        wtile.store(wq, ws);
        atile.store(xq, xs);
        __syncthreads();
#pragma unroll k_unroll_i
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
                    if constexpr (T == CIQ_TYPE_Q4_K) {
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
                        if constexpr (T == CIQ_TYPE_Q4_K) {
                            sum = fmaf(wv.x * d8, isum_of(c0[e]), sum);
                            sum = fmaf(wv.y, s8, sum);
                        } else {
                            sum = fmaf(d8, fmaf(isum_of(c0[e]), wv.x, isum_of(c1[e]) * wv.y), sum);
                        }
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int m = 0; m < MT; ++m) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t r = row0 + wr + 16 * m + g + 8 * (e / 2), t = tok0 + wt + 8 * n + 2 * t4 + e % 2;
                if (r < rows && t < tokens) ciq_store_out(out, t * rows + r, acc[m][n][e], out_type);
            }
        }
    }
}

template <ciq_weight_type T, int C>
static ciq_status launch_mma(const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens, void *out,
                             ciq_out_type out_type) {
    constexpr mma_tile_config cfg = k_mma_configs[C];
    constexpr size_t smem = mma_smem_bytes(cfg.tokens);
    const auto kernel = gemm_mma_kernel<T, cfg.tokens, cfg.warps_m, cfg.min_ctas>;
    if (smem > 48 * 1024) {  // raise the dynamic shared memory limit once per device
        static std::atomic<uint64_t> raised{0};
        int device = 64;
        cudaGetDevice(&device);
        const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;  // else raise on every call
        if (!bit || !(raised.load() & bit)) {
            const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
            if (err != cudaSuccess)
                return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_mma: cudaFuncSetAttribute: %s", cudaGetErrorString(err));
            raised.fetch_or(bit);
        }
    }
    const dim3 grid((unsigned)((rows + CIQ_MMA_ROWS - 1) / CIQ_MMA_ROWS), (unsigned)((tokens + cfg.tokens - 1) / cfg.tokens));
    kernel<<<grid, CIQ_MMA_THREADS, smem>>>((const uint8_t *)weight, rows, (int)(k / QK_K), (const uint8_t *)x,
                                            tokens, out, out_type);
    CIQ_CUDA_LAUNCH_CHECK("ciq_cuda_gemm_mma");
    return CIQ_OK;
}

template <ciq_weight_type T, int C = 0>
static ciq_status dispatch_mma(int config, const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens,
                               void *out, ciq_out_type out_type) {
    if constexpr (C < k_mma_config_count) {
        if (config == C) return launch_mma<T, C>(weight, rows, k, x, tokens, out, out_type);
        return dispatch_mma<T, C + 1>(config, weight, rows, k, x, tokens, out, out_type);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: bad tile config %d", config);
    }
}

ciq_status ciq_cuda_gemm_mma(ciq_weight_type type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                             int64_t tokens, void *out, ciq_out_type out_type) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q6_K)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: unknown weight type %d", (int)type);
    if (!weight || !x_q8_1_mmq || !out || rows < 1 || tokens < 1 || k < QK_K || k % QK_K != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: bad arguments (rows %lld, k %lld, tokens %lld)",
                        (long long)rows, (long long)k, (long long)tokens);
    if (((uintptr_t)x_q8_1_mmq | (type == CIQ_TYPE_Q4_K ? (uintptr_t)weight : 0)) % 4 != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_mma: activations (and Q4_K weights) must be 4-byte aligned");
    int config = 0;
    while (config + 1 < k_mma_config_count && k_mma_configs[config].tokens < tokens) ++config;
    if ((tokens + k_mma_configs[config].tokens - 1) / k_mma_configs[config].tokens > 65535 || k / QK_K > INT32_MAX / 2)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_mma: problem too large (k %lld, tokens %lld)", (long long)k,
                        (long long)tokens);
    return type == CIQ_TYPE_Q4_K ? dispatch_mma<CIQ_TYPE_Q4_K>(config, weight, rows, k, x_q8_1_mmq, tokens, out, out_type)
                                 : dispatch_mma<CIQ_TYPE_Q6_K>(config, weight, rows, k, x_q8_1_mmq, tokens, out, out_type);
}

#else  // HIP: no mma.sync

ciq_status ciq_cuda_gemm_mma(ciq_weight_type, const void *, int64_t, int64_t, const void *, int64_t, void *,
                             ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_mma: the mma.sync kernel is CUDA-only");
}

#endif

#ifdef CIQ_GEMM_MMA_SELFTEST  // TEMPORARY self-test (removed before hand-off)
#include <cstdarg>
#include <cstdio>
#include <cmath>
#include <random>
#include <vector>
#include <chrono>
ciq_status ciq_fail(ciq_status status, const char *format, ...) {
    va_list ap; va_start(ap, format); fprintf(stderr, "ciq_fail: "); vfprintf(stderr, format, ap); fprintf(stderr, "\n"); va_end(ap);
    return status;
}
static uint16_t f2h(float f) { return __half_as_ushort(__float2half_rn(f)); }
static float h2f(uint16_t h) { return __half2float(__ushort_as_half(h)); }
static std::mt19937 rng(1234);
static float urand(float a, float b) { return std::uniform_real_distribution<float>(a, b)(rng); }
static int irand(int a, int b) { return std::uniform_int_distribution<int>(a, b)(rng); }

static void make_weights(ciq_weight_type type, int64_t rows, int64_t k, std::vector<uint8_t> &w) {
    const int64_t nb = k / 256;
    const int bb = type == CIQ_TYPE_Q4_K ? 144 : 210;
    w.resize(rows * nb * bb);
    for (auto &b : w) b = (uint8_t)irand(0, 255);
    for (int64_t i = 0; i < rows * nb; ++i) {
        uint8_t *blk = w.data() + i * bb;
        if (type == CIQ_TYPE_Q4_K) {
            uint16_t d = f2h(urand(1e-4f, 2e-2f)), dm = f2h(urand(1e-4f, 2e-2f));
            memcpy(blk, &d, 2); memcpy(blk + 2, &dm, 2);
        } else {
            uint16_t d = f2h(urand(-2e-3f, 2e-3f)); memcpy(blk + 208, &d, 2);
        }
    }
}
static void make_acts(ciq_weight_type type, int64_t tokens, int64_t k, std::vector<uint8_t> &x) {
    x.resize(tokens * (k / 128) * 144);
    for (size_t b = 0; b < x.size() / 144; ++b) {
        uint8_t *blk = x.data() + b * 144;
        for (int i = 0; i < 128; ++i) ((int8_t *)blk)[16 + i] = (int8_t)irand(-127, 127);
        for (int g = 0; g < 4; ++g) {
            uint32_t s;
            if (type == CIQ_TYPE_Q4_K) s = f2h(urand(1e-3f, 5e-2f)) | ((uint32_t)f2h(urand(-20.f, 20.f)) << 16);
            else { float d = urand(1e-3f, 5e-2f); memcpy(&s, &d, 4); }
            memcpy(blk + 4 * g, &s, 4);
        }
    }
}
static void reference(ciq_weight_type type, const uint8_t *w, int64_t rows, int64_t k, const uint8_t *x, int64_t tokens, std::vector<double> &ref) {
    const int64_t nb = k / 256;
    const int bb = type == CIQ_TYPE_Q4_K ? 144 : 210;
    ref.assign(rows * tokens, 0.0);
    std::vector<int> q(256);
    for (int64_t r = 0; r < rows; ++r) for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *blk = w + (r * nb + b) * bb;
        double wa[16], wb[16];
        if (type == CIQ_TYPE_Q4_K) {
            const float d = h2f(blk[0] | blk[1] << 8), dmin = h2f(blk[2] | blk[3] << 8);
            const uint8_t *s = blk + 4;
            for (int j = 0; j < 8; ++j) {
                int sc, m;
                if (j < 4) { sc = s[j] & 63; m = s[j + 4] & 63; } else { sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4); m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4); }
                wa[j] = h2f(f2h(d * sc)); wb[j] = -(double)h2f(f2h(dmin * m));
            }
            for (int e = 0; e < 256; ++e) { int c = e / 64, rr = e % 64; q[e] = rr < 32 ? blk[16 + 32 * c + rr] & 15 : blk[16 + 32 * c + rr - 32] >> 4; }
        } else {
            const float d = h2f(blk[208] | blk[209] << 8);
            for (int j = 0; j < 16; ++j) wa[j] = (double)d * (int8_t)blk[192 + j];
            for (int e = 0; e < 256; ++e) {
                int n = e / 128, lp = e % 128, g = lp / 32, l = lp % 32;
                int low = g < 2 ? blk[64 * n + l + 32 * g] & 15 : blk[64 * n + l + 32 * (g - 2)] >> 4;
                int high = (blk[128 + 32 * n + l] >> (2 * g)) & 3;
                q[e] = (low | high << 4) - 32;
            }
        }
        for (int64_t t = 0; t < tokens; ++t) {
            double sum = 0;
            for (int i = 0; i < 8; ++i) {
                const uint8_t *xb = x + ((2 * b + i / 4) * tokens + t) * 144;
                const int8_t *xq = (const int8_t *)(xb + 16) + 32 * (i % 4);
                uint32_t s; memcpy(&s, xb + 4 * (i % 4), 4);
                if (type == CIQ_TYPE_Q4_K) {
                    long isum = 0; for (int v = 0; v < 32; ++v) isum += q[32 * i + v] * xq[v];
                    sum += wa[i] * h2f(s & 0xFFFF) * isum + wb[i] * h2f(s >> 16);
                } else {
                    long i0 = 0, i1 = 0; for (int v = 0; v < 16; ++v) { i0 += q[32 * i + v] * xq[v]; i1 += q[32 * i + 16 + v] * xq[16 + v]; }
                    float d8; memcpy(&d8, &s, 4);
                    sum += d8 * (wa[2 * i] * i0 + wa[2 * i + 1] * i1);
                }
            }
            ref[t * rows + r] += sum;
        }
    }
}
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)
static int run_case(ciq_weight_type type, int64_t rows, int64_t k, int64_t tokens) {
    std::vector<uint8_t> w, x; make_weights(type, rows, k, w); make_acts(type, tokens, k, x);
    std::vector<double> ref; reference(type, w.data(), rows, k, x.data(), tokens, ref);
    void *dw, *dx, *df, *dh;
    CK(cudaMalloc(&dw, w.size())); CK(cudaMalloc(&dx, x.size())); CK(cudaMalloc(&df, rows * tokens * 4)); CK(cudaMalloc(&dh, rows * tokens * 2));
    CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice));
    if (ciq_cuda_gemm_mma(type, dw, rows, k, dx, tokens, df, CIQ_OUT_F32) != CIQ_OK) return 1;
    if (ciq_cuda_gemm_mma(type, dw, rows, k, dx, tokens, dh, CIQ_OUT_BF16) != CIQ_OK) return 1;
    CK(cudaDeviceSynchronize());
    std::vector<float> of(rows * tokens); std::vector<uint16_t> oh(rows * tokens);
    CK(cudaMemcpy(of.data(), df, of.size() * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(oh.data(), dh, oh.size() * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0; long bfbad = 0;
    for (size_t i = 0; i < of.size(); ++i) {
        num += (of[i] - ref[i]) * (of[i] - ref[i]); den += ref[i] * ref[i];
        if (__bfloat16_as_ushort(__float2bfloat16(of[i])) != oh[i]) ++bfbad;
    }
    const double nmse = num / den;
    const bool ok = nmse <= 1e-10 && bfbad == 0 && std::isfinite(nmse);
    printf("%s %s rows %lld k %lld tokens %lld nmse %.3e bf16-mismatch %ld\n", ok ? "ok  " : "FAIL", type == CIQ_TYPE_Q4_K ? "Q4_K" : "Q6_K", (long long)rows, (long long)k, (long long)tokens, nmse, bfbad);
    cudaFree(dw); cudaFree(dx); cudaFree(df); cudaFree(dh);
    return ok ? 0 : 1;
}
static void bench(ciq_weight_type type, int64_t rows, int64_t k, int64_t tokens) {
    std::vector<uint8_t> w, x; make_weights(type, rows, k, w); make_acts(type, tokens, k, x);
    void *dw, *dx, *df;
    CK(cudaMalloc(&dw, w.size())); CK(cudaMalloc(&dx, x.size())); CK(cudaMalloc(&df, rows * tokens * 4));
    CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice)); CK(cudaMemcpy(dx, x.data(), x.size(), cudaMemcpyHostToDevice));
    for (int i = 0; i < 3; ++i) ciq_cuda_gemm_mma(type, dw, rows, k, dx, tokens, df, CIQ_OUT_F32);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    const int iters = 20;
    cudaEventRecord(a);
    for (int i = 0; i < iters; ++i) ciq_cuda_gemm_mma(type, dw, rows, k, dx, tokens, df, CIQ_OUT_F32);
    cudaEventRecord(b); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); ms /= iters;
    printf("bench %s rows %lld k %lld tokens %lld: %.1f us, %.1f TOPS, %.0f GB/s weights\n", type == CIQ_TYPE_Q4_K ? "Q4_K" : "Q6_K", (long long)rows, (long long)k, (long long)tokens,
           ms * 1e3, 2.0 * rows * k * tokens / ms / 1e9, w.size() / ms / 1e6);
    cudaFree(dw); cudaFree(dx); cudaFree(df);
}
int main(int argc, char **argv) {
    const int mode = argc > 1 ? atoi(argv[1]) : 0;
    int fails = 0;
    if (mode == 0 || mode == 1) {
        const int64_t toks[] = {1, 5, 8, 9, 16, 17, 31, 33, 64, 65, 100, 128, 129, 200, 300};
        for (ciq_weight_type type : {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K}) {
            for (int64_t t : toks) fails += run_case(type, 300, 512, t);
            fails += run_case(type, 1, 256, 1);
            fails += run_case(type, 127, 768, 7);
            fails += run_case(type, 257, 1024, 130);
        }
    }
    if (mode == 2) {  // small cases for the sanitizers
        for (ciq_weight_type type : {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K}) { fails += run_case(type, 130, 512, 3); fails += run_case(type, 129, 256, 70); fails += run_case(type, 200, 256, 129); fails += run_case(type, 100, 256, 20); fails += run_case(type, 100, 256, 40); fails += run_case(type, 100, 256, 12); }
    }
    if (mode == 0 || mode == 3) {
        for (ciq_weight_type type : {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K})
            for (int64_t t : {8, 16, 32, 64, 128, 512, 2048}) bench(type, 4096, 4096, t);
        bench(CIQ_TYPE_Q4_K, 14336, 4096, 2048);
        bench(CIQ_TYPE_Q6_K, 128256, 4096, 16);
    }
    printf("%s (%d failures)\n", fails ? "FAILED" : "PASSED", fails);
    return fails != 0;
}
#endif
