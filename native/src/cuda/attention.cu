// attention.cu - causal GQA FlashAttention-class kernels over the f16 K/V cache (the C API's ciq_attention).
//
// Layouts, said once:
//   q        : float32 [tokens][heads][D]; query t sits at position n_past + t.
//   k, v     : f16 [cache rows][heads_kv][D]; head h reads kv head h / (heads / heads_kv).
//   out      : float32 [tokens][heads * D].
// One CTA per (64-query tile, head). Key tiles of 64 rows cover positions [first, last]: first = the window start
// of the tile's first query (0 without a window), last = the position of its last query. Each tile is staged in
// shared memory as f16; scores never leave the CTA. Online softmax in float32: per query row the running max m and
// sum l; a new tile with max m' rescales l and the output accumulators by expf(m - m'). Keys masked (causal,
// window, past the cache's filled rows) score -inf, i.e. weight 0; a fully masked tile changes nothing.
//
//   simt: 256 threads, 4 per query row; thread j of a row scores keys j, j+4, ... (float32 FMAs over D) and owns
//         output dims 2j + 8i, 2j + 8i + 1. Q is float32 in shared memory, the weights p go through shared memory
//         within the row's 4 lanes.
//   mma : 128 threads, 16 query rows per warp; S = Q K^T and O += P V with mma.sync m16n8k16 (f16 inputs, f32
//         accumulators). Q is rounded to f16 when staged and P to f16 when fed back as the A operand (register
//         reuse of the S accumulator layout, as FlashAttention-2); V's B operand comes from ldmatrix.trans. For
//         D <= 128 the loads are pipelined through registers: V of tile t lands during S = Q K^T, K of tile t+1
//         during O += P V (three barriers per tile); D = 256 loads K and V at the top of each tile.
//   mma_llamacpp: attention_llamacpp.cu (llama.cpp CUDA's own flash attention, operation for operation).
//
//   wgmma: attention_wgmma.cu (Hopper: TMA, a producer warp, 128-query tiles; 64 at D = 256).
//
// Split over the keys (simt and mma, where the (64-query tile, head) CTAs are fewer than the SMs): attention_split.cuh.
#include "attention_split.cuh"
#include "mma_sync.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

namespace {

constexpr int ATTN_QUERIES = 64;  // queries per CTA
constexpr int ATTN_KEYS = 64;     // keys per shared-memory tile

// ---- simt ---------------------------------------------------------------------------------------------------
template <int D> struct SimtSmem {
    static constexpr int Q_STRIDE = D + 1;        // floats; odd: rows on distinct banks
    static constexpr int KV_STRIDE = D / 2 + 1;   // 32-bit words (half pairs)
    static constexpr int P_STRIDE = ATTN_KEYS + 1;
    static constexpr size_t BYTES = sizeof(float) * (ATTN_QUERIES * Q_STRIDE + ATTN_QUERIES * P_STRIDE) +
                                    sizeof(uint32_t) * ATTN_KEYS * KV_STRIDE;
};

template <int D>
__global__ void __launch_bounds__(256) attention_simt_kernel(AttentionArgs a) {
    using S = SimtSmem<D>;
    extern __shared__ float smem[];
    float *qs = smem;                                              // [64][Q_STRIDE]
    float *ps = qs + ATTN_QUERIES * S::Q_STRIDE;                   // [64][P_STRIDE]
    uint32_t *kv = (uint32_t *)(ps + ATTN_QUERIES * S::P_STRIDE);  // [64][KV_STRIDE], K then V

    const int q0 = blockIdx.x * ATTN_QUERIES, h = blockIdx.y, hkv = h / (a.heads / a.heads_kv);
    const int tid = threadIdx.x, row = tid / 4, sub = tid % 4;
    int first, end, start, stop;
    key_range<ATTN_QUERIES>(a, q0, &first, &end);
    if (!chunk_range(a, first, end, &start, &stop)) return;  // the whole CTA: blockIdx only
    marked_range(a, q0, &start, &stop);
    for (int i = tid; i < ATTN_QUERIES * D; i += 256) {
        const int r = i / D, e = i % D;
        qs[r * S::Q_STRIDE + e] = q0 + r < a.tokens ? a.q[((int64_t)(q0 + r) * a.heads + h) * D + e] : 0.0f;
    }

    float m = -INFINITY, l = 0.0f, o[D / 4];
#pragma unroll
    for (int i = 0; i < D / 4; ++i) o[i] = 0.0f;

    for (int kt = start; kt < stop; kt += ATTN_KEYS) {
        const uint16_t *sources[2] = {a.k, a.v};
        float s[ATTN_KEYS / 4];
        float correction = 1.0f;
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {  // 0: K and the scores; 1: V and the outputs
            __syncthreads();  // the previous pass is done with kv
            for (int i = tid; i < ATTN_KEYS * (D / 2); i += 256) {
                const int j = i / (D / 2), c = i % (D / 2), key = kt + j;
                kv[j * S::KV_STRIDE + c] =
                    key < end ? ((const uint32_t *)sources[pass])[((int64_t)key * a.heads_kv + hkv) * (D / 2) + c] : 0u;
            }
            __syncthreads();
            if (pass == 0) {
#pragma unroll
                for (int jj = 0; jj < ATTN_KEYS / 4; ++jj) s[jj] = 0.0f;
                for (int e = 0; e < D; e += 2) {
                    const float qa = qs[row * S::Q_STRIDE + e], qb = qs[row * S::Q_STRIDE + e + 1];
#pragma unroll
                    for (int jj = 0; jj < ATTN_KEYS / 4; ++jj) {
                        const float2 k2 = __half22float2(*(const __half2 *)&kv[(sub + 4 * jj) * S::KV_STRIDE + e / 2]);
                        s[jj] += qa * k2.x + qb * k2.y;
                    }
                }
                float tile_max = -INFINITY;
#pragma unroll
                for (int jj = 0; jj < ATTN_KEYS / 4; ++jj) {
                    s[jj] = attention_score(a, q0 + row, kt + sub + 4 * jj, end, s[jj]);
                    tile_max = fmaxf(tile_max, s[jj]);
                }
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFF, tile_max, 1));
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFF, tile_max, 2));
                const float m_new = fmaxf(m, tile_max);
                const float base = m_new == -INFINITY ? 0.0f : m_new;  // nothing visible yet: all weights 0
                correction = expf(m - base);
                l *= correction;
#pragma unroll
                for (int jj = 0; jj < ATTN_KEYS / 4; ++jj) {
                    const float p = expf(s[jj] - base);
                    l += p;
                    ps[row * S::P_STRIDE + sub + 4 * jj] = p;
                }
                m = m_new;
            } else {
#pragma unroll
                for (int i = 0; i < D / 4; ++i) o[i] *= correction;
                const int keys = min(ATTN_KEYS, end - kt);
                for (int j = 0; j < keys; ++j) {
                    const float p = ps[row * S::P_STRIDE + j];
#pragma unroll
                    for (int i = 0; i < D / 8; ++i) {
                        const float2 v2 = __half22float2(*(const __half2 *)&kv[j * S::KV_STRIDE + sub + 4 * i]);
                        o[2 * i] += p * v2.x;
                        o[2 * i + 1] += p * v2.y;
                    }
                }
            }
        }
    }
    l += __shfl_xor_sync(0xFFFFFFFF, l, 1);
    l += __shfl_xor_sync(0xFFFFFFFF, l, 2);
    if (a.partial != nullptr) {
        if (q0 + row >= a.tokens) return;
        float *slot = partial_at<ATTN_QUERIES>(a, D), *po = slot + row * D;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            po[2 * sub + 8 * i] = o[2 * i];
            po[2 * sub + 8 * i + 1] = o[2 * i + 1];
        }
        if (sub == 0) {
            slot[ATTN_QUERIES * D + 2 * row] = m;
            slot[ATTN_QUERIES * D + 2 * row + 1] = l;
        }
        return;
    }
    if (q0 + row < a.tokens) {
        float *out = a.out + (int64_t)(q0 + row) * a.heads * D + h * D;
#pragma unroll
        for (int i = 0; i < D / 8; ++i) {
            out[2 * sub + 8 * i] = l > 0.0f ? o[2 * i] / l : 0.0f;  // masked: a row that saw no key
            out[2 * sub + 8 * i + 1] = l > 0.0f ? o[2 * i + 1] / l : 0.0f;
        }
    }
}

// ---- mma (CUDA sm_80+) --------------------------------------------------------------------------------------
#if !defined(GGML_CIQ_HIP)

template <int D> struct MmaSmem {
    static constexpr int STRIDE = D + 8;  // halves: 16-byte rows for ldmatrix, rows 4 banks apart
    static constexpr size_t BYTES = sizeof(__half) * 3 * ATTN_QUERIES * STRIDE;  // Q, K, V tiles
};

template <int D>
__global__ void __launch_bounds__(128) attention_mma_kernel(AttentionArgs a) {
    using S = MmaSmem<D>;
    extern __shared__ __align__(16) __half smem_h[];
    __half *qs = smem_h, *ks = qs + ATTN_QUERIES * S::STRIDE, *vs = ks + ATTN_KEYS * S::STRIDE;

    const int q0 = blockIdx.x * ATTN_QUERIES, h = blockIdx.y, hkv = h / (a.heads / a.heads_kv);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;
    int first, end, start, stop;
    key_range<ATTN_QUERIES>(a, q0, &first, &end);
    if (!chunk_range(a, first, end, &start, &stop)) return;  // the whole CTA: blockIdx only
    marked_range(a, q0, &start, &stop);
    for (int i = tid; i < ATTN_QUERIES * D; i += 128) {
        const int r = i / D, e = i % D;
        qs[r * S::STRIDE + e] = __float2half_rn(q0 + r < a.tokens ? a.q[((int64_t)(q0 + r) * a.heads + h) * D + e] : 0.0f);
    }
    const int row0 = 16 * warp;  // the warp's rows: row0 + g and row0 + g + 8

    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    float o[D / 8][4];  // O's float32 accumulators c0..c3 of each n-tile of 8 dims
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

    // K and V tiles move in 16-byte chunks, CHUNKS per thread and matrix: chunk i is row i / (D/8), bytes 16 (i % (D/8)).
    // PIPELINED (D <= 128): the current tile's V and the next tile's K are loaded into registers while the tensor
    // cores work on S = Q K^T and on O += P V respectively; D = 256 (whose accumulators leave no registers for that)
    // loads both tiles in place at the top of each iteration.
    constexpr int CHUNKS = ATTN_KEYS * (D / 8) / 128;
    constexpr bool PIPELINED = D <= 128;
    uint4 chunks[PIPELINED ? CHUNKS : 1];
    auto fetch = [&](const uint16_t *src, int kt) {
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int i = tid + 128 * c, key = kt + i / (D / 8);
            chunks[c] = key < end ? ((const uint4 *)(src + ((int64_t)key * a.heads_kv + hkv) * D))[i % (D / 8)]
                                  : make_uint4(0, 0, 0, 0);
        }
    };
    auto put = [&](__half *tile) {
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) {
            const int i = tid + 128 * c;
            *(uint4 *)(tile + (i / (D / 8)) * S::STRIDE + 8 * (i % (D / 8))) = chunks[c];
        }
    };
    if constexpr (PIPELINED) {
        if (start < stop) {
            fetch(a.k, start);
            put(ks);
        }
    }
    for (int kt = start; kt < stop; kt += ATTN_KEYS) {
        if constexpr (PIPELINED) {
            __syncthreads();     // ks holds tile kt; every warp is done with the previous V tile
            fetch(a.v, kt);      // lands while S is computed
        } else {
            __syncthreads();  // every warp is done with the previous K and V tiles
            for (int i = tid; i < 2 * ATTN_KEYS * (D / 8); i += 128) {  // 16-byte chunks of K then V rows
                const int which = i / (ATTN_KEYS * (D / 8)), j = (i / (D / 8)) % ATTN_KEYS, c = i % (D / 8);
                const int key = kt + j;
                uint4 chunk = make_uint4(0, 0, 0, 0);
                if (key < end) chunk = ((const uint4 *)((which ? a.v : a.k) + ((int64_t)key * a.heads_kv + hkv) * D))[c];
                *(uint4 *)((which ? vs : ks) + j * S::STRIDE + 8 * c) = chunk;
            }
            __syncthreads();
        }

        // S = Q K^T for the warp's 16 rows and the tile's 64 keys (8 n-tiles of 8 keys).
        float s[ATTN_KEYS / 8][4];
        warp_scores<D, ATTN_KEYS, S::STRIDE>(s, qs + row0 * S::STRIDE, ks, lane);

        // Mask, scale, online softmax. s[n][0..1]: row g, keys 8n + 2tig, +1; s[n][2..3]: row g + 8.
        float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < ATTN_KEYS / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int key = kt + 8 * n + 2 * tig + (c & 1);
                s[n][c] = attention_score(a, q0 + row0 + g + 8 * (c / 2), key, end, s[n][c]);
                tile_max[c / 2] = fmaxf(tile_max[c / 2], s[n][c]);
            }
        }
        float correction[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) base[r] = online_softmax_step(m[r], l[r], tile_max[r], &correction[r],
                                                                [](float x) { return expf(x); });
#pragma unroll
        for (int n = 0; n < ATTN_KEYS / 8; ++n) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s[n][c] = expf(s[n][c] - base[c / 2]);
                l[c / 2] += s[n][c];
            }
        }
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            o[n][0] *= correction[0];
            o[n][1] *= correction[0];
            o[n][2] *= correction[1];
            o[n][3] *= correction[1];
        }

        if constexpr (PIPELINED) {
            put(vs);
            __syncthreads();  // vs holds tile kt; every warp is done with ks
            if (kt + ATTN_KEYS < stop) fetch(a.k, kt + ATTN_KEYS);  // lands while O += P V runs
        }

        // O += P V (P: the S accumulators rounded to f16), float32 accumulators.
        warp_pv<D, ATTN_KEYS, S::STRIDE>(o, s, vs, lane);
        if constexpr (PIPELINED) {
            if (kt + ATTN_KEYS < stop) put(ks);  // every warp passed the barrier above: none reads ks any more
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 1);
        l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 2);
    }
    if (a.partial != nullptr) {
        float *slot = partial_at<ATTN_QUERIES>(a, D);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + g + 8 * r;
            if (q0 + row >= a.tokens) continue;
            float *po = slot + row * D + 2 * tig;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) *(float2 *)(po + 8 * n) = make_float2(o[n][2 * r], o[n][2 * r + 1]);
            if (tig == 0) *(float2 *)(slot + ATTN_QUERIES * D + 2 * row) = make_float2(m[r], l[r]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int t = q0 + row0 + g + 8 * r;
        if (t >= a.tokens) continue;
        float *out = a.out + (int64_t)t * a.heads * D + h * D + 2 * tig;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            out[8 * n] = l[r] > 0.0f ? o[n][2 * r] / l[r] : 0.0f;  // masked: a row that saw no key
            out[8 * n + 1] = l[r] > 0.0f ? o[n][2 * r + 1] / l[r] : 0.0f;
        }
    }
}

#endif  // !GGML_CIQ_HIP

template <int D> ciq_status launch_simt(dim3 grid, const AttentionArgs &args) {
#if !defined(GGML_CIQ_HIP)
    ciq_status status = ciq_raise_smem_limit<attention_simt_kernel<D>>((int)SimtSmem<D>::BYTES, "attention (simt)");
    if (status != CIQ_OK) return status;
#endif
    attention_simt_kernel<D><<<grid, 256, SimtSmem<D>::BYTES, ciq_stream()>>>(args);
    CIQ_CUDA_LAUNCH_CHECK("attention (simt)");
    return CIQ_OK;
}

template <int D> ciq_status launch_mma(dim3 grid, const AttentionArgs &args) {
#if !defined(GGML_CIQ_HIP)
    ciq_status status = ciq_raise_smem_limit<attention_mma_kernel<D>>((int)MmaSmem<D>::BYTES, "attention (mma)");
    if (status != CIQ_OK) return status;
    attention_mma_kernel<D><<<grid, 128, MmaSmem<D>::BYTES, ciq_stream()>>>(args);
    CIQ_CUDA_LAUNCH_CHECK("attention (mma)");
    return CIQ_OK;
#else
    (void)grid;
    (void)args;
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (mma) is not built for HIP");
#endif
}

// ciq_attention_masked's marks: one CTA of 128 threads per (key tile, query tile) of 64 x 64 mask values; marked[query
// tile][key tile]: MARK_NONE where none of its values (rows < tokens, keys < n_kv) is above -inf, MARK_ZERO where the
// tile lies inside the tokens and keys and every value is +-0 (a causal mask's tiles below the diagonal), else
// MARK_MIXED.
__global__ void __launch_bounds__(128) attention_mark_kernel(const uint16_t *__restrict__ mask, int64_t mask_row,
                                                             int tokens, int n_kv, int key_tiles,
                                                             uint8_t *__restrict__ marked) {
    const int kt = blockIdx.x, qt = blockIdx.y;
    int any = 0, zero = 64 * qt + 64 <= tokens && 64 * kt + 64 <= n_kv;
    for (int i = threadIdx.x; i < 64 * 64; i += 128) {
        const int t = 64 * qt + i / 64, key = 64 * kt + i % 64;
        if (t < tokens && key < n_kv) {
            const uint16_t bits = mask[(int64_t)t * mask_row + key];
            any |= bits != F16_NEG_INF;
            zero &= (bits & 0x7FFF) == 0;
        }
    }
    any = __syncthreads_or(any);
    zero = __syncthreads_and(zero);
    if (threadIdx.x == 0) marked[(int64_t)qt * key_tiles + kt] = !any ? MARK_NONE : zero ? MARK_ZERO : MARK_MIXED;
}

template <int D> ciq_status launch(ciq_attention_kernel kernel, const AttentionArgs &args, bool split) {
    return launch_split<D, ATTN_QUERIES, ATTN_KEYS>(args, split, false, 0, [kernel](dim3 grid, const AttentionArgs &a) {
        return kernel == CIQ_ATTENTION_MMA ? launch_mma<D>(grid, a) : launch_simt<D>(grid, a);
    });
}

// simt or mma at the call's head_dim.
ciq_status launch_head_dim(ciq_attention_kernel kernel, const AttentionArgs &args, int64_t head_dim, bool split) {
    switch (head_dim) {
        case 64: return launch<64>(kernel, args, split);
        case 96: return launch<96>(kernel, args, split);
        case 128: return launch<128>(kernel, args, split);
        case 256: return launch<256>(kernel, args, split);
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention: head_dim %lld is not built", (long long)head_dim);
    }
}

}  // namespace

bool ciq_cuda_attention_supports(int device, ciq_attention_kernel kernel, int64_t head_dim) {
    const bool built = head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
#if defined(GGML_CIQ_HIP)
    // 64 KB of LDS per workgroup on RDNA; no mma.
    static_assert(SimtSmem<96>::BYTES <= 65536, "simt tiles for head_dim <= 96 fit 64 KB");
    (void)device;
    return built && kernel == CIQ_ATTENTION_SIMT && head_dim <= 96;
#else
    const size_t simt[] = {SimtSmem<64>::BYTES, SimtSmem<96>::BYTES, SimtSmem<128>::BYTES, SimtSmem<256>::BYTES};
    const size_t mma[] = {MmaSmem<64>::BYTES, MmaSmem<96>::BYTES, MmaSmem<128>::BYTES, MmaSmem<256>::BYTES};
    const int i = head_dim == 64 ? 0 : head_dim == 96 ? 1 : head_dim == 128 ? 2 : 3;
    size_t bytes = 0;  // 0: not built for this kernel and head_dim (wgmma: nor without sm_90a machine code)
    if (kernel == CIQ_ATTENTION_WGMMA) bytes = ciq_cuda_attention_wgmma_smem(head_dim);
    else if (built && kernel == CIQ_ATTENTION_SIMT) bytes = simt[i];
    else if (built && kernel == CIQ_ATTENTION_MMA) bytes = mma[i];
    else if (built && kernel == CIQ_ATTENTION_MMA_LLAMACPP) bytes = ciq_cuda_attention_llamacpp_smem(head_dim);
    int optin = 0;  // the shared memory a block may opt into: 227 KB on sm_90, 163 KB sm_80, 99 KB sm_86/89
    if (bytes == 0 || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    return bytes <= (size_t)optin;
#endif
}

ciq_status ciq_cuda_attention_masked(ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                                     const uint16_t *v_cache, const uint16_t *mask, int64_t mask_row, int64_t tokens,
                                     int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale,
                                     float *out, const ciq_attention_switches &sw) {
    if (kernel != CIQ_ATTENTION_SIMT && kernel != CIQ_ATTENTION_MMA && kernel != CIQ_ATTENTION_WGMMA) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "masked attention runs the simt, mma and wgmma kernels only");
    }
    static_assert(ATTN_QUERIES == 64 && ATTN_KEYS == 64, "the marks are 64 x 64 tiles, the kernels' own");
    const int64_t query_tiles = (tokens + 63) / 64, key_tiles = (n_kv + 63) / 64;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "masked attention: no current GPU");
    // At least 64 KB, so that a graph captured at one micro-batch's size stays valid for the larger ones after it
    // (a moved scratch buffer makes earlier graphs stale).
    void *marked = nullptr;
    ciq_status status = ciq_cuda_scratch(device, 4, std::max<size_t>(65536, (size_t)(query_tiles * key_tiles)), &marked);
    if (status != CIQ_OK) return status;
    attention_mark_kernel<<<dim3((unsigned)key_tiles, (unsigned)query_tiles), 128, 0, ciq_stream()>>>(
        mask, mask_row, (int)tokens, (int)n_kv, (int)key_tiles, (uint8_t *)marked);
    CIQ_CUDA_LAUNCH_CHECK("attention (mask marks)");
    AttentionArgs args{attention_problem(q, k_cache, v_cache, out, tokens, heads, heads_kv, 0, 0, scale), nullptr, 0};
    args.mask = mask;
    args.mask_row = mask_row;
    args.marked = (const uint8_t *)marked;
    args.n_kv = (int)n_kv;
    args.key_tiles = (int)key_tiles;
#if !defined(GGML_CIQ_HIP)
    if (kernel == CIQ_ATTENTION_WGMMA) {
        return ciq_cuda_attention_wgmma_masked(q, k_cache, v_cache, mask, mask_row, (const uint8_t *)marked, key_tiles,
                                               n_kv, tokens, heads, heads_kv, head_dim, scale, out, sw.split);
    }
#endif
    return launch_head_dim(kernel, args, head_dim, sw.split);
}

ciq_status ciq_cuda_attention(ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                              const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv,
                              int64_t head_dim, int64_t n_past, float scale, int64_t window, float *out,
                              const ciq_attention_switches &sw) {
    if (tokens + n_past > INT32_MAX / 2 || heads > 65535) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention: %lld positions, %lld heads exceed the kernel's limits",
                        (long long)(tokens + n_past), (long long)heads);
    }
#if !defined(GGML_CIQ_HIP)
    if (kernel == CIQ_ATTENTION_WGMMA) {
        return ciq_cuda_attention_wgmma(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window, out,
                                        sw.split);
    }
    if (kernel == CIQ_ATTENTION_MMA_LLAMACPP) {
        return ciq_cuda_attention_llamacpp(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window,
                                           out, sw.llamacpp_blocks_per_sm);
    }
#endif
    const AttentionArgs args{attention_problem(q, k_cache, v_cache, out, tokens, heads, heads_kv, n_past, window, scale),
                             nullptr, 0};
    return launch_head_dim(kernel, args, head_dim, sw.split);
}
