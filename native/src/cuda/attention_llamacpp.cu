// attention_llamacpp.cu - the attention kernel `mma_llamacpp` (CIQ_ATTENTION_MMA_LLAMACPP): llama.cpp CUDA's flash
// attention for prefill (ggml-cuda/fattn-mma-f16.cuh and fattn-common.cuh at 0c1e570, the "mma" kernel it runs on
// sm_80+), reproduced operation for operation so that the same inputs give the same bits. Built with llama.cpp's
// -use_fast_math (CMakeLists.txt): expf and x / y compile to what they compile to there.
//
// Layouts (ciq_attention's): q float32 [tokens][heads][D]; k, v f16 [cache rows][heads_kv][D]; out float32
// [tokens][heads * D], which also holds the partial results while the segments are combined.
// Roles, with llama.cpp's names:
//   tile    : one CTA = llama.cpp's output tile: NCOLS1 queries x NCOLS2 q heads of one kv head, 64 columns;
//             column jc is query jt * NCOLS1 + jc / NCOLS2 of head zt_gqa * NCOLS2 + jc % NCOLS2 (NCOLS2 = 8, 4, 2, 1
//             for a group of > 4, > 2, > 1, 1 heads per kv head: llama.cpp's GQA packing). Warp w owns columns
//             16w..16w+15; thread (g, tig) columns 16w + g and 16w + g + 8, keys 2tig, 2tig + 1 of each 8.
//   chunk   : nbatch_fa keys (32 for D = 256, 64 below), stepped from key 0 over the padded cache length n_kv
//             (a multiple of 256, as llama.cpp pads its K/V view). Per chunk: S = Q K^T (mma f32 over D in steps
//             of 16), + 3 ln 2 into the running max, p = expf(s - max), the chunk's p summed by each thread in key
//             order, l = scale * l + sum, O (f16, mma f16 accumulation) *= half(scale), O += P V.
//   segment : llama.cpp's stream-k split. Its grid has `blocks` CTAs (blocks per SM x SMs, rounded to a multiple of
//             the tile count when that loses <= 5%) over iter_k * tiles chunk iterations; CTA b runs iterations
//             [b * total / blocks, (b + 1) * total / blocks), so a tile's chunks fall into segments, each summed from
//             a fresh state. Its fixup combines the segments in float32, from the last back to the first. Here one
//             CTA runs every segment of its tile, last first, and folds each into `out` in that order.
// Fully masked chunks change nothing in llama.cpp (scale expf(0) = 1, p = 0; a -0 they could turn into +0 is made +0
// on both sides when a partial is written), so only the tile's visible chunks run. The cache is llama.cpp's as its
// C API's defaults keep it (swa_full): key index = position, n_kv = max(256, the filled length rounded up to 256);
// with swa_full = false (its CLI tools' default) sliding-window layers keep a ring of cells in another order.
// Not reproduced: llama.cpp's vector kernel for one token, its narrower configurations for <= 32 / NCOLS2 tokens (8,
// 16 or 32 columns, some with warps splitting a chunk) and its sparse gather for 8 heads per kv head at D = 256 on
// >= 4096 keys: there this kernel keeps the 64-column arithmetic (the same rounding kinds, not the same bits).
#include "common.cuh"
#include "mma_sync.cuh"

#include <cfloat>
#include <cstdlib>

#if !defined(GGML_CIQ_HIP)
namespace {

constexpr int LC_COLUMNS = 64;       // columns per tile (llama.cpp's ncols = ncols1 * ncols2 for prefill)
constexpr int LC_THREADS = 128;      // 4 warps of 16 columns (llama.cpp: nthreads 128, np = 1)
constexpr int LC_PAD = 256;          // llama.cpp pads n_kv to a multiple of 256 (llama_kv_cache::get_n_kv)
constexpr float LC_KQ_MAX_OFFSET = 3.0f * 0.6931f;   // fattn-common.cuh FATTN_KQ_MAX_OFFSET
constexpr float LC_SOFTMAX_FTZ_THRESHOLD = -20.0f;   // fattn-common.cuh SOFTMAX_FTZ_THRESHOLD

// llama.cpp's nbatch_fa for 64 columns on sm_80+ (ggml_cuda_fattn_mma_get_config_ampere).
__host__ __device__ constexpr int lc_chunk_keys(int d) { return d == 256 ? 32 : 64; }

template <int D> struct LcSmem {
    static constexpr int STRIDE = D + 8;  // halves: 16-byte rows for ldmatrix
    static constexpr size_t BYTES = sizeof(__half) * (LC_COLUMNS + 2 * lc_chunk_keys(D)) * STRIDE;  // Q, K, V
};

struct LcArgs : AttentionProblem {
    int ncols1, ncols2, iter_k, iter_j, iter_z;  // llama.cpp's tile shape and iteration counts
    int64_t blocks, total;                         // its stream-k grid and total chunk iterations
};

__device__ __forceinline__ uint32_t lc_scale_half2(uint32_t x, float s) {  // VKQ *= make_half2(s, s)
    const __half2 h = __hmul2(*(const __half2 *)&x, __float2half2_rn(s));
    return *(const uint32_t *)&h;
}

template <int D>
__global__ void __launch_bounds__(LC_THREADS) attention_llamacpp_kernel(LcArgs a) {
    using S = LcSmem<D>;
    constexpr int NB = lc_chunk_keys(D);
    extern __shared__ __align__(16) __half smem_h[];
    __half *qs = smem_h, *ks = qs + LC_COLUMNS * S::STRIDE, *vs = ks + NB * S::STRIDE;

    const int jt = blockIdx.x, zt = blockIdx.y, z_kv = zt / a.iter_z, zt_gqa = zt % a.iter_z;
    const int gqa = a.heads / a.heads_kv;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tig = lane % 4;

    // Q: scale_h2 * make_half2(q): both rounded to f16, their product rounded again.
    const __half scale_h = __float2half_rn(a.scale);
    for (int i = tid; i < LC_COLUMNS * D; i += LC_THREADS) {
        const int jc = i / D, e = i % D;
        const int j = jt * a.ncols1 + jc / a.ncols2, c = zt_gqa * a.ncols2 + jc % a.ncols2;
        __half qh = __float2half_rn(0.0f);
        if (j < a.tokens && c < gqa) {
            qh = __hmul(scale_h, __float2half_rn(a.q[((int64_t)j * a.heads + z_kv * gqa + c) * D + e]));
        }
        qs[jc * S::STRIDE + e] = qh;
    }

    // The thread's two columns (r = 0: 16w + g, r = 1: 16w + g + 8).
    int pos[2], query[2], head[2];
    bool valid[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int jc = 16 * warp + g + 8 * r;
        query[r] = jt * a.ncols1 + jc / a.ncols2;
        const int c = zt_gqa * a.ncols2 + jc % a.ncols2;
        head[r] = z_kv * gqa + c;
        valid[r] = query[r] < a.tokens && c < gqa;
        pos[r] = a.n_past + query[r];
    }
    // The keys any query of the tile sees: [first, end); its chunks [chunk_first, chunk_end).
    const int end = a.n_past + min((jt + 1) * a.ncols1, a.tokens);
    const int first = a.window > 0 ? max(0, a.n_past + jt * a.ncols1 - a.window + 1) : 0;
    const int chunk_first = first / NB, chunk_end = (end + NB - 1) / NB;

    // The tile's chunk iterations [t0, t1) in llama.cpp's continuous index; CTA b of its grid starts at start(b).
    const int64_t tile = (int64_t)zt * a.iter_j + jt, t0 = tile * a.iter_k, t1 = t0 + a.iter_k;
    auto start = [&](int64_t b) { return b * a.total / a.blocks; };
    int64_t b = (t1 * a.blocks + a.total - 1) / a.total - 1;  // the CTA that runs chunk t1 - 1
    while (b + 1 < a.blocks && start(b + 1) <= t1 - 1) ++b;
    while (b > 0 && start(b) > t1 - 1) --b;

    float fold_max[2] = {0.0f, 0.0f}, fold_sum[2] = {0.0f, 0.0f};
    for (bool last_segment = true;; last_segment = false, --b) {
        const int c0 = max((int)(max(start(b), t0) - t0), chunk_first);
        const int c1 = min((int)(min(start(b + 1), t1) - t0), chunk_end);

        float m[2] = {-FLT_MAX / 2.0f, -FLT_MAX / 2.0f}, l[2] = {0.0f, 0.0f};
        uint32_t o[D / 8][2];  // VKQ: two half2 (columns g, g + 8) of each 8-dim n-tile
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = 0u;

        for (int kb = c0; kb < c1; ++kb) {
            __syncthreads();  // Q is staged; every warp is done with the previous chunk
            for (int i = tid; i < 2 * NB * (D / 8); i += LC_THREADS) {  // 16-byte pieces of the K then V rows
                const int which = i / (NB * (D / 8)), j = (i / (D / 8)) % NB, c = i % (D / 8), key = kb * NB + j;
                uint4 piece = make_uint4(0, 0, 0, 0);
                if (key < end) piece = ((const uint4 *)((which ? a.v : a.k) + ((int64_t)key * a.heads_kv + z_kv) * D))[c];
                *(uint4 *)((which ? vs : ks) + j * S::STRIDE + 8 * c) = piece;
            }
            __syncthreads();

            // KQ = Q K^T: the warp's 16 columns x the chunk's NB keys (n-tiles of 8 keys), f32, D in steps of 16.
            float s[NB / 8][4];
            warp_scores<D, NB, S::STRIDE>(s, qs + 16 * warp * S::STRIDE, ks, lane);

            // The mask (-inf where llama.cpp's KQ mask is), the new max over s + offset, p, the chunk's row sums.
            float max_new[2] = {m[0], m[1]}, rowsum_add[2] = {0.0f, 0.0f};
#pragma unroll
            for (int n = 0; n < NB / 8; ++n) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int key = kb * NB + 8 * n + 2 * tig + (c & 1), p = pos[c / 2];
                    const bool seen = key < end && key <= p && (a.window == 0 || p - key < a.window);
                    if (!seen) s[n][c] = -INFINITY;
                    max_new[c / 2] = fmaxf(max_new[c / 2], s[n][c] + LC_KQ_MAX_OFFSET);
                }
            }
#pragma unroll
            for (int r = 0; r < 2; ++r) {  // a column's values are spread over the 4 lanes of its quad
                max_new[r] = fmaxf(max_new[r], __shfl_xor_sync(0xFFFFFFFF, max_new[r], 2));
                max_new[r] = fmaxf(max_new[r], __shfl_xor_sync(0xFFFFFFFF, max_new[r], 1));
            }
#pragma unroll
            for (int n = 0; n < NB / 8; ++n) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    s[n][c] = expf(s[n][c] - max_new[c / 2]);
                    rowsum_add[c / 2] += s[n][c];
                }
            }
            float scale[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float diff = m[r] - max_new[r];
                scale[r] = diff >= LC_SOFTMAX_FTZ_THRESHOLD ? expf(diff) : 0.0f;
                m[r] = max_new[r];
                l[r] = scale[r] * l[r] + rowsum_add[r];
            }
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                o[n][0] = lc_scale_half2(o[n][0], scale[0]);
                o[n][1] = lc_scale_half2(o[n][1], scale[1]);
            }

            // VKQ += P V in f16 (P: the KQ accumulators as half2).
            warp_pv<D, NB, S::STRIDE>(o, s, vs, lane);
        }

        // The segment's row sums over the quad (llama.cpp: xor 2, then 1), then its fold into `out`: the last
        // segment is the start value; each earlier one is combined as flash_attn_stream_k_fixup does.
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 2);
            l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 1);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (!valid[r]) continue;
            float *out = a.out + ((int64_t)query[r] * a.heads + head[r]) * D + 2 * tig;
            // llama.cpp writes each partial as 0 + VKQ (its sum over parallel warps: -0 becomes +0), and nvcc
            // contracts its fold to fma(scale_val, dst_val, scale_add * dst_add): spelled out here, as this file's
            // own expression contracts the other way (PTX compared, CUDA 13.0).
            if (last_segment) {
#pragma unroll
                for (int n = 0; n < D / 8; ++n) {
                    const float2 v = __half22float2(*(const __half2 *)&o[n][r]);
                    out[8 * n] = 0.0f + v.x;
                    out[8 * n + 1] = 0.0f + v.y;
                }
                fold_max[r] = m[r];
                fold_sum[r] = l[r];
                continue;
            }
            const float max_val_new = fmaxf(fold_max[r], m[r]);
            const float diff_val = fold_max[r] - max_val_new;
            const float diff_add = m[r] - max_val_new;
            const float scale_val = diff_val >= LC_SOFTMAX_FTZ_THRESHOLD ? expf(diff_val) : 0.0f;
            const float scale_add = diff_add >= LC_SOFTMAX_FTZ_THRESHOLD ? expf(diff_add) : 0.0f;
#pragma unroll
            for (int n = 0; n < D / 8; ++n) {
                const float2 v = __half22float2(*(const __half2 *)&o[n][r]);
                out[8 * n] = __fmaf_rn(scale_val, out[8 * n], __fmul_rn(scale_add, 0.0f + v.x));
                out[8 * n + 1] = __fmaf_rn(scale_val, out[8 * n + 1], __fmul_rn(scale_add, 0.0f + v.y));
            }
            fold_sum[r] = __fmaf_rn(scale_val, fold_sum[r], __fmul_rn(scale_add, l[r]));
            fold_max[r] = max_val_new;
        }
        if (start(b) <= t0) break;  // this segment began the tile
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (!valid[r]) continue;
        float *out = a.out + ((int64_t)query[r] * a.heads + head[r]) * D + 2 * tig;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) {
            out[8 * n] = out[8 * n] / fold_sum[r];
            out[8 * n + 1] = out[8 * n + 1] / fold_sum[r];
        }
    }
}

// llama.cpp's flash-attention CTAs per SM on this GPU for the 64-column kernel: what cudaOccupancy reports for its
// kernel (registers bind: 214..254 registers x 128 threads, bench/results/cpu/llamacpp-fattn-mma-registers.txt from
// tools/llamacpp_fattn_registers.sh): 2, the default of ciq_attention_switches.llamacpp_blocks_per_sm, which
// GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM overrides for a GPU or build where it differs (switches.cpp).

template <int D> ciq_status launch_llamacpp(const LcArgs &args) {
    const char *what = "attention (mma_llamacpp)";
    ciq_status status = ciq_raise_smem_limit<attention_llamacpp_kernel<D>>((int)LcSmem<D>::BYTES, what);
    if (status != CIQ_OK) return status;
    const dim3 grid(args.iter_j, args.iter_z * args.heads_kv);
    attention_llamacpp_kernel<D><<<grid, LC_THREADS, LcSmem<D>::BYTES, ciq_stream()>>>(args);
    CIQ_CUDA_LAUNCH_CHECK(what);
    return CIQ_OK;
}

}  // namespace

size_t ciq_cuda_attention_llamacpp_smem(int64_t head_dim) {
    switch (head_dim) {
        case 64: return LcSmem<64>::BYTES;
        case 96: return LcSmem<96>::BYTES;
        case 128: return LcSmem<128>::BYTES;
        case 256: return LcSmem<256>::BYTES;
        default: return SIZE_MAX;
    }
}

ciq_status ciq_cuda_attention_llamacpp(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                       int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                       int64_t window, float *out, int blocks_per_sm) {
    if (tokens < 1) return CIQ_OK;
    // llama.cpp's launch (fattn.cu ggml_cuda_flash_attn_ext_mma_f16_switch_ncols2, fattn-common.cuh launch_fattn).
    const int64_t gqa = heads / heads_kv;
    const int ncols2 = gqa > 4 ? 8 : gqa > 2 ? 4 : gqa > 1 ? 2 : 1;
    const int ncols1 = LC_COLUMNS / ncols2;
    const int64_t n_kv = std::max<int64_t>(LC_PAD, (n_past + tokens + LC_PAD - 1) / LC_PAD * LC_PAD);
    const int nb = lc_chunk_keys((int)head_dim);
    const int64_t iter_k = (n_kv + nb - 1) / nb, iter_j = (tokens + ncols1 - 1) / ncols1;
    const int64_t iter_z = (gqa + ncols2 - 1) / ncols2, tiles = iter_j * iter_z * heads_kv;
    int device, sms, major = 0, minor = 0;
    const ciq_status status = ciq_current_gpu_sms("attention (mma_llamacpp)", &device, &sms);
    if (status != CIQ_OK) return status;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError();
        return ciq_fail(CIQ_ERR_BACKEND, "attention (mma_llamacpp): cannot read GPU %d's attributes", device);
    }
    const int64_t max_blocks = (int64_t)blocks_per_sm * sms;
    // Stream-k on Ada and newer always; before, when whole tiles would fill the waves to < 75%.
    const int64_t waves = (tiles + max_blocks - 1) / max_blocks;
    const bool stream_k = major * 10 + minor >= 89 || 100 * tiles / (max_blocks * waves) < 75;
    int64_t blocks = tiles;
    if (stream_k) {
        const int64_t raw = std::min(max_blocks, iter_k * tiles), rounded = raw / tiles * tiles;
        const int64_t loss = rounded > 0 ? 100 * (raw - rounded) / raw : 100;
        blocks = loss <= 5 ? rounded : raw;
    }
    if (iter_j > 65535 || iter_z * heads_kv > 65535 || iter_k * tiles > INT32_MAX) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (mma_llamacpp): %lld tokens x %lld heads exceed the grid",
                        (long long)tokens, (long long)heads);
    }
    const LcArgs args{attention_problem(q, k_cache, v_cache, out, tokens, heads, heads_kv, n_past, window, scale),
                      ncols1, ncols2, (int)iter_k, (int)iter_j, (int)iter_z, blocks, iter_k * tiles};
    switch (head_dim) {
        case 64: return launch_llamacpp<64>(args);
        case 96: return launch_llamacpp<96>(args);
        case 128: return launch_llamacpp<128>(args);
        case 256: return launch_llamacpp<256>(args);
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention: head_dim %lld is not built", (long long)head_dim);
    }
}
#endif  // !GGML_CIQ_HIP
