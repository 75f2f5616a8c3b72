// gemm_mma.cu - MMQ-class keep-quant GEMM on int8 tensor cores (mma.sync), MMQ semantics (docs/SEMANTICS.md).
//
// One CTA (8 warps) computes a 128-row x J-token tile of out. K is walked in steps of 128 values (one
// block_q8_1_mmq per token = half a weight super-block). Shared memory per CTA:
//   wq [128][144 B]   int8 weights of the step, natural k order (Q4_K nibble 0..15, Q6_K q6-32), 16 B pad/row.
//   ws [4][128]       float2 per 32-value sub-block and row: Q4_K {A, B} = {half(d*sc), -half(dmin*m)},
//                     Q6_K {sc_lo*d, sc_hi*d} (the two 16-value scales; exact in fp32).
//   xr [2][J][144 B]  raw block_q8_1_mmq of the J tokens (4 scale words, qs[128]), double-buffered.
// A 144 B (36 word) row stride puts the 8 rows of each ldmatrix 8x16 B phase on disjoint bank quads.
// Pipeline per step s: issue the global loads of step s+1's weights into registers and cp.async its activations
// into the other xr buffer; barrier; mma over step s; barrier; dequantize the prefetched weights into wq/ws.
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
#define CIQ_MMA_STRIDE 144  // bytes per staged row: 128 int8 + 16 pad, and the size of a block_q8_1_mmq

// Token tiles: the first config with J >= tokens is used, else the last. warps_m: warp rows of the 8 warps;
// min_ctas: CTAs per SM the registers are budgeted for (__launch_bounds__).
struct mma_tile_config {
    int tokens;
    int warps_m;
    int min_ctas;
};
static constexpr mma_tile_config k_mma_configs[] = {{8, 8, 4}, {16, 8, 4}, {32, 4, 3}, {64, 4, 2}, {128, 4, 2}};
static constexpr int k_mma_config_count = sizeof(k_mma_configs) / sizeof(k_mma_configs[0]);

static constexpr size_t mma_smem_bytes(ciq_weight_type type, int J) {  // wq, xr[2], ws, wraw[2]
    return (size_t)(CIQ_MMA_ROWS + 2 * J) * CIQ_MMA_STRIDE + (size_t)4 * CIQ_MMA_ROWS * sizeof(float2) +
           (size_t)2 * CIQ_MMA_ROWS * (type == CIQ_TYPE_Q4_K ? 20 : 30) * 4;
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

// 4-byte cp.async of the first `bytes` (0..4) bytes at global (the rest zero-filled); nothing when bytes == 0.
static __device__ __forceinline__ void cp_async4(void *smem, const void *global, int bytes = 4) {
    if (bytes > 0)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_u32(smem)), "l"(global), "r"(bytes)
                     : "memory");
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
static __device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

static __device__ __forceinline__ uint32_t load_b2(const uint8_t *p) {  // 4 bytes from a 2-byte aligned address
    return ((const uint16_t *)p)[0] | (uint32_t)((const uint16_t *)p)[1] << 16;
}

// Raw weight bytes of one K step (128 values = half super-block h = step%2) of the CTA's 128 rows, copied with
// cp.async into wraw (words per row: RAW_WORDS) and dequantized from there into wq/ws. Rows past the end
// re-read the last row. In dequant, thread tid handles qs slot tid%16 of rows 16*it + tid/16 (it < 8) and the
// sub-blocks 2*(tid%2) + {0,1} of row tid/2.
template <ciq_weight_type T> struct weight_step;

template <> struct weight_step<CIQ_TYPE_Q4_K> {  // raw row: block words 0..3 (d, dmin, scales), qs words 16h..16h+15
    static constexpr int RAW_WORDS = 20;
    static __device__ __forceinline__ void copy(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t row0,
                                                int64_t rows, int step, uint32_t *wraw) {
#pragma unroll
        for (int it = 0; it < CIQ_MMA_ROWS * RAW_WORDS / CIQ_MMA_THREADS; ++it) {
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x, r = idx / RAW_WORDS, k = idx % RAW_WORDS;
            const uint8_t *blk = w + min(row0 + r, rows - 1) * row_bytes + (int64_t)(step / 2) * Q4_K_BLOCK_BYTES;
            cp_async4(wraw + idx, blk + (k < 4 ? 4 * k : 16 + 64 * (step % 2) + 4 * (k - 4)));
        }
    }
    static __device__ __forceinline__ void dequant(const uint8_t *, int64_t, int64_t, int64_t, int step,
                                                   const uint32_t *wraw, int8_t *wq, float2 *ws) {
        const int l = threadIdx.x % 16;
#pragma unroll
        for (int it = 0; it < 8; ++it) {  // qs word l: low nibbles = values 64(l/8) + 4(l%8) + 0..3, high +32
            const int r = 16 * it + threadIdx.x / 16;
            const uint32_t q = wraw[r * RAW_WORDS + 4 + l];
            int *dst = (int *)(wq + r * CIQ_MMA_STRIDE) + 16 * (l / 8) + l % 8;
            dst[0] = q & 0x0F0F0F0F;
            dst[8] = (q >> 4) & 0x0F0F0F0F;
        }
        const int r = threadIdx.x / 2;
        const uint32_t *hdr = wraw + r * RAW_WORDS, dm = hdr[0], s0 = hdr[1], s1 = hdr[2], s2 = hdr[3];
        const float d = __low2float(*(const __half2 *)&dm), dmin = __high2float(*(const __half2 *)&dm);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {  // get_scale_min_k4 of sub-block j
            const int i = 2 * (threadIdx.x % 2) + jj, j = 4 * (step % 2) + i, sh = 8 * (j % 4);
            const uint32_t sc = j < 4 ? (s0 >> sh) & 63 : ((s2 >> sh) & 15) | (((s0 >> sh) & 0xC0) >> 2);
            const uint32_t m = j < 4 ? (s1 >> sh) & 63 : (((s2 >> sh) & 0xF0) >> 4) | (((s1 >> sh) & 0xC0) >> 2);
            ws[i * CIQ_MMA_ROWS + r] = make_float2(__half2float(__float2half_rn(d * (float)sc)),
                                                   -__half2float(__float2half_rn(dmin * (float)m)));
        }
    }
};

// Q6_K blocks (210 B) are only 2-byte aligned: each needed byte range of half h (ql 64h+[0,64), qh 128+32h+[0,32),
// scales 192+8h+[0,8), d 208+[0,2)) is copied as the 4-byte words that cover it, starting p = block address & 2
// bytes early, into segments of 17, 9, 3 and 1 words (never reading outside [block-p, block+210)).
template <> struct weight_step<CIQ_TYPE_Q6_K> {
    static constexpr int RAW_WORDS = 30;
    static __device__ __forceinline__ const uint8_t *block(const uint8_t *w, int64_t row_bytes, int64_t row0,
                                                           int64_t rows, int r, int step) {
        return w + min(row0 + r, rows - 1) * row_bytes + (int64_t)(step / 2) * Q6_K_BLOCK_BYTES;
    }
    static __device__ __forceinline__ void copy(const uint8_t *__restrict__ w, int64_t row_bytes, int64_t row0,
                                                int64_t rows, int step, uint32_t *wraw) {
        const int h = step % 2;
#pragma unroll
        for (int it = 0; it < CIQ_MMA_ROWS * RAW_WORDS / CIQ_MMA_THREADS; ++it) {
            const int idx = it * CIQ_MMA_THREADS + threadIdx.x, r = idx / RAW_WORDS, k = idx % RAW_WORDS;
            const int start = k < 17 ? 64 * h : k < 26 ? 128 + 32 * h : k < 29 ? 192 + 8 * h : 208;
            const int len = k < 17 ? 64 : k < 26 ? 32 : k < 29 ? 8 : 2;
            const int kk = k < 17 ? k : k < 26 ? k - 17 : k < 29 ? k - 26 : 0;
            const uint8_t *blk = block(w, row_bytes, row0, rows, r, step);
            const int p = (int)((uintptr_t)blk & 2);
            cp_async4(wraw + idx, blk + start - p + 4 * kk, min(4, max(0, len + p - 4 * kk)));
        }
    }
    static __device__ __forceinline__ void dequant(const uint8_t *w, int64_t row_bytes, int64_t row0, int64_t rows,
                                                   int step, const uint32_t *wraw, int8_t *wq, float2 *ws) {
        const int l = threadIdx.x % 16;
#pragma unroll
        for (int it = 0; it < 8; ++it) {  // ql word l: values 32((l/8)%2) + 4(l%8) + 0..3 (low nibbles), +64 (high)
            const int r = 16 * it + threadIdx.x / 16;
            const uint8_t *raw = (const uint8_t *)(wraw + r * RAW_WORDS) + ((uintptr_t)block(w, row_bytes, row0, rows, r, step) & 2);
            const uint32_t q = load_b2(raw + 4 * l), hb = load_b2(raw + 4 * 17 + 4 * (l % 8)) >> (2 * (l / 8));
            int *dst = (int *)(wq + r * CIQ_MMA_STRIDE) + l;
            dst[0] = __vsub4((q & 0x0F0F0F0F) | ((hb << 4) & 0x30303030), 0x20202020);
            dst[16] = __vsub4(((q >> 4) & 0x0F0F0F0F) | (hb & 0x30303030), 0x20202020);
        }
        const int r = threadIdx.x / 2;
        const uint8_t *raw = (const uint8_t *)(wraw + r * RAW_WORDS) + ((uintptr_t)block(w, row_bytes, row0, rows, r, step) & 2);
        const uint32_t sc = load_b2(raw + 4 * 26 + 4 * (threadIdx.x % 2));  // scales 8h + 4(tid%2) + 0..3
        const float d = ciq_half_to_float(*(const uint16_t *)(raw + 4 * 29));
#pragma unroll
        for (int jj = 0; jj < 2; ++jj)
            ws[(2 * (threadIdx.x % 2) + jj) * CIQ_MMA_ROWS + r] =
                make_float2((float)(int8_t)(sc >> 16 * jj) * d, (float)(int8_t)(sc >> (16 * jj + 8)) * d);
    }
};

// cp.async of step `step` of the J tokens' activations (block_q8_1_mmq [step][tokens]) into xr; tokens past the
// end re-read the last token.
template <int J>
static __device__ __forceinline__ void copy_acts(const uint8_t *__restrict__ x, int64_t tokens, int64_t tok0, int step,
                                                 int8_t *xr) {
    constexpr int words = J * Q8_1_MMQ_BLOCK_BYTES / 4;
#pragma unroll
    for (int it = 0; it < (words + CIQ_MMA_THREADS - 1) / CIQ_MMA_THREADS; ++it) {
        const int idx = it * CIQ_MMA_THREADS + threadIdx.x, t = idx / 36, word = idx % 36;
        if (words % CIQ_MMA_THREADS == 0 || idx < words)
            cp_async4(xr + idx * 4,
                      x + ((int64_t)step * tokens + min(tok0 + t, tokens - 1)) * Q8_1_MMQ_BLOCK_BYTES + 4 * word);
    }
}

template <ciq_weight_type T, int J, int WM, int MIN_CTAS>
__global__ void __launch_bounds__(CIQ_MMA_THREADS, MIN_CTAS)
    gemm_mma_kernel(const uint8_t *__restrict__ w, int64_t rows, int nb, const uint8_t *__restrict__ x,
                    int64_t tokens, void *__restrict__ out, ciq_out_type out_type) {
    constexpr int TM = CIQ_MMA_ROWS / WM, TN = J * WM / 8, MT = TM / 16, NT = TN / 8;
    static_assert(MT >= 1 && NT >= 1 && TN * (8 / WM) == J, "bad tile config");
    using WS = weight_step<T>;
    extern __shared__ __align__(16) uint8_t smem[];
    int8_t *wq = (int8_t *)smem;
    int8_t *xr = wq + CIQ_MMA_ROWS * CIQ_MMA_STRIDE;  // two buffers of J * CIQ_MMA_STRIDE
    float2 *ws = (float2 *)(xr + 2 * J * CIQ_MMA_STRIDE);
    uint32_t *wraw = (uint32_t *)(ws + 4 * CIQ_MMA_ROWS);  // two buffers of CIQ_MMA_ROWS * WS::RAW_WORDS

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
    const int wr = (warp % WM) * TM, wt = (warp / WM) * TN;  // warp's first row and token in the tile
    const int64_t row0 = (int64_t)blockIdx.x * CIQ_MMA_ROWS, tok0 = (int64_t)blockIdx.y * J;
    const int64_t row_bytes = (int64_t)nb * (T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES);
    const int steps = 2 * nb;

    WS::copy(w, row_bytes, row0, rows, 0, wraw);
    copy_acts<J>(x, tokens, tok0, 0, xr);
    cp_async_commit();
    float acc[MT][NT][4] = {};
    for (int s = 0; s < steps; ++s) {
        const int buf = s % 2;
        cp_async_wait_all();
        __syncthreads();  // step s has landed; everyone is done with step s-1
        if (s + 1 < steps) {
            WS::copy(w, row_bytes, row0, rows, s + 1, wraw + (1 - buf) * CIQ_MMA_ROWS * WS::RAW_WORDS);
            copy_acts<J>(x, tokens, tok0, s + 1, xr + (1 - buf) * J * CIQ_MMA_STRIDE);
        }
        cp_async_commit();
        WS::dequant(w, row_bytes, row0, rows, s, wraw + buf * CIQ_MMA_ROWS * WS::RAW_WORDS, wq, ws);
        __syncthreads();  // wq/ws of step s are complete
        const int8_t *xs = xr + buf * J * CIQ_MMA_STRIDE;
#pragma unroll k_unroll_i
        for (int i = 0; i < 4; ++i) {  // 32-value sub-block
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
                const int8_t *xt = xs + (wt + 8 * n) * CIQ_MMA_STRIDE;
                int b[2];
                ldmatrix_b(b, xt + 16 + 32 * i, lane);
                float2 ds[2];  // Q4_K {d8, s8}, Q6_K {d8, -} of tokens 2t4 and 2t4+1
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const uint32_t word = *(const uint32_t *)(xt + (2 * t4 + e) * CIQ_MMA_STRIDE + 4 * i);
                    ds[e] = T == CIQ_TYPE_Q4_K ? __half22float2(*(const __half2 *)&word)
                                               : make_float2(__uint_as_float(word), 0.0f);
                }
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
                        const float2 wv = wsc[m][e / 2], xv = ds[e % 2];
                        float &sum = acc[m][n][e];
                        if constexpr (T == CIQ_TYPE_Q4_K) {
                            sum = fmaf(wv.x * xv.x, isum_of(c0[e]), sum);
                            sum = fmaf(wv.y, xv.y, sum);
                        } else {
                            sum = fmaf(xv.x, fmaf(isum_of(c0[e]), wv.x, isum_of(c1[e]) * wv.y), sum);
                        }
                    }
                }
            }
        }
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
    constexpr size_t smem = mma_smem_bytes(T, cfg.tokens);
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
