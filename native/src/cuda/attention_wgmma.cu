// attention_wgmma.cu - Hopper causal GQA flash attention (CIQ_ATTENTION_WGMMA, sm_90a): wgmma for both products, TMA
// for the K/V tiles and a producer warp, in the FlashAttention-3 manner.
//
// Semantics: those of attention.cu's `mma` in another float order: q rounded to f16 once, scores and the online
// softmax in float32 (exp2 of log2e-scaled scores), p rounded to f16 for P V, float32 accumulation. Layouts as
// attention.cu: q float32 [tokens][heads][D]; K/V f16 [cache rows][heads_kv][D]; out float32 [tokens][heads * D].
//
// CTA: QT = 64 CW queries of one head (CW consumer warpgroups: 2 for D <= 128, 1 for D = 256; WgmmaAttn), roles:
//   consumer warpgroup w (warps 4w .. 4w+3): queries 64w .. 64w+63 of the tile;
//   producer (warp 4 CW): its lane 0 issues every TMA copy, a ring of WG_STAGES (K, V) tiles ahead.
// Key tiles of KT keys (128 for D <= 128, 64 for D = 256) walk the tile's key range from `first` (key_range<QT>,
// chunk_range: attention_split.cuh).
// Shared memory (1024-byte aligned; every operand in wgmma's 128-byte-swizzled layout: 16-byte chunk j of 128-byte
// row r at (j ^ r%8) * 16, D cut into D/64 panels of 64 values):
//   Q    : [warpgroup][panel][64 rows][128 B], written by the consumers (float32 -> f16): the K-major A of S = Q K^T
//   ring : WG_STAGES x {K, V}, each [panel][KT keys][128 B], one TMA box (64 values, 1 kv head, KT keys) a panel from
//          the cache's 3-D tensor map (D, heads_kv, n_past + tokens rows; keys past the last row read as zeros).
//          K is the K-major B of S = Q K^T; V the MN-major (transposed) B of O += P V, its panels KT * 128 B apart.
//   barriers: kfull[s], vfull[s] (the TMA bytes of K, of V), empty[s] (4 CW arrivals: each consumer warp once its
//          P V retired).
// Per key tile a consumer warpgroup waits kfull, computes S = Q K^T (D/16 wgmma steps, both operands in shared
// memory), masks where the tile crosses the diagonal, the window or the end, runs the online softmax in registers
// (a thread's rows: lane/4 and lane/4 + 8 of its warp's 16; quad shuffles), rescales O, packs P into f16 A fragments
// (the S accumulator layout is the A fragment layout), waits vfull, O += P V (KT/16 steps, A from registers) and frees
// the stage. The warpgroups run apart: one's softmax overlaps the other's wgmma. Query tiles run in reverse launch
// order (the tiles with the most keys first).
// Split over the keys (where the CTAs are fewer than half the SMs and a tile's keys reach 1024): attention_split.cuh;
// m is written in natural-log units there.
#include "attention_split.cuh"
#include "wgmma_ptx.cuh"

#include <cstring>

#if !defined(GGML_CIQ_HIP)
namespace {

constexpr int WG_STAGES = 2;  // (K, V) tiles in flight

// The shape per head_dim. Registers are allocated to a CTA in whole warpgroups (a 288-thread CTA takes 384 threads'
// worth: measured on the H200, where 170 registers x 288 threads failed to launch), so the producer warp costs a
// warpgroup's registers: two consumer warpgroups leave 168 registers a thread (D <= 128: 64 S + D/2 O accumulators),
// one leaves 248 (D = 256: 128 O accumulators).
template <int D> struct WgmmaAttn {
    static constexpr int CW = D <= 128 ? 2 : 1;           // consumer warpgroups
    static constexpr int QT = 64 * CW;                    // queries per CTA
    static constexpr int THREADS = 128 * CW + 32;         // and the producer warp
    static constexpr int MAXNREG = CW == 2 ? 168 : 248;   // <= 65536 / (128 (CW + 1)), a multiple of 8
    static constexpr int KT = D <= 128 ? 128 : 64;  // keys per tile
    static constexpr int PANELS = D / 64;
    static constexpr int Q_BYTES = QT * D * 2;
    static constexpr int TILE_BYTES = KT * D * 2;  // one K or V tile
    static constexpr int SMEM = 1024 + Q_BYTES + WG_STAGES * 2 * TILE_BYTES + 3 * WG_STAGES * 8;
};
static_assert(WgmmaAttn<64>::SMEM <= 232448 && WgmmaAttn<128>::SMEM <= 232448 && WgmmaAttn<256>::SMEM <= 232448,
              "227 KB of shared memory per CTA");

#ifdef CIQ_WGMMA_DEVICE
// Register operands of an asynchronous wgmma pinned in place (CUTLASS's warpgroup_fence_operand): the compiler may not
// move plain arithmetic on them across this point, i.e. read an accumulator before wgmma.wait_group or write one after
// wgmma.fence. Placed after each wait and before each fence.
template <int N> static __device__ __forceinline__ void pin(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> static __device__ __forceinline__ void pin(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
}
#endif

template <int D>
__global__ void __maxnreg__(WgmmaAttn<D>::MAXNREG)
    attention_wgmma_kernel(const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                           AttentionArgs a, float scale_log2) {
#ifdef CIQ_WGMMA_DEVICE
    using L = WgmmaAttn<D>;
    constexpr int KT = L::KT, QT = L::QT;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *qs = smem, *ring = smem + L::Q_BYTES;
    uint64_t *kfull = (uint64_t *)(ring + WG_STAGES * 2 * L::TILE_BYTES), *vfull = kfull + WG_STAGES,
             *empty = vfull + WG_STAGES;

    // Query tiles in reverse launch order: the last tiles, which see the most keys, start first.
    const int tile = gridDim.x - 1 - blockIdx.x, q0 = tile * QT, h = blockIdx.y, hkv = h / (a.heads / a.heads_kv);
    int first, end, start, stop;
    key_range<QT>(a, q0, &first, &end);
    if (!chunk_range(a, first, end, &start, &stop)) return;  // the whole CTA: blockIdx only
    marked_range(a, q0, &start, &stop, QT);
    const int tiles = (stop - start + KT - 1) / KT;
    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(&kfull[s], 1);
            mbar_init(&vfull[s], 1);
            mbar_init(&empty[s], 4 * L::CW);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    if (warp == 4 * L::CW) {  // the producer
        if (lane == 0) {
            for (int i = 0; i < tiles; ++i) {
                const int s = i % WG_STAGES, kt = start + i * KT;
                if (i >= WG_STAGES) mbar_wait(&empty[s], (i / WG_STAGES - 1) & 1);
                uint8_t *kd = ring + s * 2 * L::TILE_BYTES, *vd = kd + L::TILE_BYTES;
                mbar_arrive_expect_tx(&kfull[s], L::TILE_BYTES);
#pragma unroll
                for (int p = 0; p < L::PANELS; ++p) tma_load_3d(kd + p * KT * 128, &kmap, 64 * p, hkv, kt, &kfull[s]);
                mbar_arrive_expect_tx(&vfull[s], L::TILE_BYTES);
#pragma unroll
                for (int p = 0; p < L::PANELS; ++p) tma_load_3d(vd + p * KT * 128, &vmap, 64 * p, hkv, kt, &vfull[s]);
            }
        }
        return;
    }

    // Consumers. Q of this warpgroup's 64 rows: 8-value chunks, f16, into the swizzled panels (rows past the tokens 0).
    const int wg = warp / 4, tid = threadIdx.x % 128;
    uint8_t *qw = qs + wg * (64 * D * 2);
    for (int i = tid; i < 64 * (D / 8); i += 128) {
        const int r = i / (D / 8), c = i % (D / 8), t = q0 + 64 * wg + r;
        uint32_t v[4] = {0u, 0u, 0u, 0u};
        if (t < a.tokens) {
            const float *src = a.q + ((int64_t)t * a.heads + h) * D + 8 * c;
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = h2u(__floats2half2_rn(__ldg(src + 2 * e), __ldg(src + 2 * e + 1)));
        }
        *(uint4 *)(qw + (c / 8) * 64 * 128 + r * 128 + ((c % 8) ^ (r % 8)) * 16) = make_uint4(v[0], v[1], v[2], v[3]);
    }
    fence_proxy_async();  // the stores above, visible to wgmma
    asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");

    const int row0 = 64 * wg + 16 * (warp % 4) + lane / 4;  // the thread's rows of the tile: row0, row0 + 8
    const int pos0 = a.n_past + q0 + row0, pos1 = pos0 + 8;
    float o[D / 2];  // O accumulators: o[4j + e] row row0 + 8(e/2), dim 8j + 2(lane%4) + e%2
#pragma unroll
    for (int j = 0; j < D / 2; ++j) o[j] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // m: log2 units of the scaled scores
    const uint64_t qdesc = smem_desc(qw);

    for (int i = 0; i < tiles; ++i) {
        const int s = i % WG_STAGES, kt = start + i * KT;
        const uint32_t parity = (i / WG_STAGES) & 1;
        const uint8_t *kd = ring + s * 2 * L::TILE_BYTES, *vd = kd + L::TILE_BYTES;

        // S = Q K^T: sc[4j + e] row row0 + 8(e/2), key kt + 8j + 2(lane%4) + e%2.
        float sc[KT / 2];
#pragma unroll
        for (int j = 0; j < KT / 2; ++j) sc[j] = 0.0f;
        mbar_wait(&kfull[s], parity);
        const uint64_t kdesc = smem_desc(kd);
        pin(sc);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)  // panel kk/4 (its descriptor +64 rows x 128 B / 16), +32 B a step
            wgmma_tile<KT>(sc, qdesc + (kk / 4) * (64 * 128 / 16) + 2 * (kk % 4),
                           kdesc + (kk / 4) * (KT * 128 / 16) + 2 * (kk % 4));
        wgmma_commit();
        wgmma_wait<0>();
        pin(sc);

        // Scale (log2 units), mask where the tile is not wholly visible to both rows, online softmax. Masked: the
        // warp's 16 rows lie in one 64-query mark tile; the key tile is whole where its mark tiles are MARK_ZERO.
        bool whole;
        if (a.mask == nullptr) {
            whole = kt + KT - 1 <= pos0 && kt + KT <= end && (a.window == 0 || pos1 - kt < a.window);
        } else {
            whole = kt + KT <= end && q0 + row0 < a.tokens;
#pragma unroll
            for (int k64 = 0; k64 < KT / 64; ++k64) whole = whole && tile_mark(a, q0 + row0, kt + 64 * k64) == MARK_ZERO;
        }
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < KT / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                float v = sc[4 * j + e] * scale_log2;
                const int key = kt + 8 * j + 2 * (lane % 4) + (e & 1);
                if (!whole) {
                    if (a.mask == nullptr) {
                        if (!visible(a, e < 2 ? pos0 : pos1, key, end)) v = -INFINITY;
                    } else {
                        const int t = q0 + row0 + 8 * (e / 2);
                        if (key >= end || t >= a.tokens) {
                            v = -INFINITY;
                        } else {
                            const uint16_t bits = a.mask[(int64_t)t * a.mask_row + key];
                            v = bits == F16_NEG_INF ? -INFINITY
                                                    : v + __half2float(__ushort_as_half(bits)) * 1.4426950408889634f;
                        }
                    }
                }
                sc[4 * j + e] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        }
        float corr[2], base[2];
#pragma unroll
        for (int r = 0; r < 2; ++r)
            base[r] = online_softmax_step(m[r], l[r], mx[r], &corr[r], [](float x) { return exp2f(x); });
        // P as A fragments: register q of k-step kk = the pair sc[8kk + 2q], sc[8kk + 2q + 1] (row row0 + 8(q%2)).
        uint32_t pa[KT / 16][4];
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const float p0 = exp2f(sc[8 * kk + 2 * q] - base[q & 1]), p1 = exp2f(sc[8 * kk + 2 * q + 1] - base[q & 1]);
                l[q & 1] += p0 + p1;
                pa[kk][q] = h2u(__floats2half2_rn(p0, p1));
            }
        }
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            o[4 * j] *= corr[0];
            o[4 * j + 1] *= corr[0];
            o[4 * j + 2] *= corr[1];
            o[4 * j + 3] *= corr[1];
        }

        // O += P V: k-step kk reads keys 16kk .. +15 (two 8-row groups, 2048 B into each panel).
        mbar_wait(&vfull[s], parity);
        const uint64_t vdesc = smem_desc_mn(vd, KT * 128);
        pin(o);
        pin(pa);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) wgmma_rs<D>(o, pa[kk], vdesc + kk * (2048 / 16));
        wgmma_commit();
        wgmma_wait<0>();
        pin(o);
        if (lane == 0) mbar_arrive(&empty[s]);
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 1);
        l[r] += __shfl_xor_sync(0xFFFFFFFF, l[r], 2);
    }
    if (a.partial != nullptr) {
        float *slot = partial_slot_at<QT>(a, blockIdx.z, gridDim.x, tile, h, D);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int row = row0 + 8 * r;
            if (q0 + row >= a.tokens) continue;
            float *po = slot + row * D + 2 * (lane % 4);
#pragma unroll
            for (int j = 0; j < D / 8; ++j) *(float2 *)(po + 8 * j) = make_float2(o[4 * j + 2 * r], o[4 * j + 2 * r + 1]);
            if (lane % 4 == 0)
                *(float2 *)(slot + QT * D + 2 * row) = make_float2(m[r] * 0.69314718055994531f, l[r]);
        }
        return;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int t = q0 + row0 + 8 * r;
        if (t >= a.tokens) continue;
        float *out = a.out + ((int64_t)t * a.heads + h) * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; ++j) {
            out[8 * j] = l[r] > 0.0f ? o[4 * j + 2 * r] / l[r] : 0.0f;  // masked: a row that saw no key
            out[8 * j + 1] = l[r] > 0.0f ? o[4 * j + 2 * r + 1] / l[r] : 0.0f;
        }
    }
#else
    __trap();
#endif
}

template <int D> ciq_status launch_wgmma(const AttentionArgs &args, bool split) {
    using L = WgmmaAttn<D>;
    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap maps[2];
    const uint16_t *src[2] = {args.k, args.v};
    for (int i = 0; i < 2; ++i) {  // rows: the positions any query of the call sees (masked: n_kv); TMA reads zeros past
        const cuuint64_t rows = args.mask != nullptr ? (cuuint64_t)args.n_kv : (cuuint64_t)args.n_past + args.tokens;
        const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)args.heads_kv, rows};
        const cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)args.heads_kv * D * 2};
        const cuuint32_t box[3] = {64, 1, (cuuint32_t)L::KT}, unit[3] = {1, 1, 1};
        const CUresult res = encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, const_cast<uint16_t *>(src[i]), dims,
                                    strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
        if (res != CUDA_SUCCESS)
            return ciq_fail(CIQ_ERR_BACKEND, "attention (wgmma): cuTensorMapEncodeTiled (%s) error %d", i ? "V" : "K",
                            (int)res);
    }
    const ciq_status status = ciq_raise_smem_limit<attention_wgmma_kernel<D>>(L::SMEM, "attention (wgmma)");
    if (status != CIQ_OK) return status;
    const float scale_log2 = args.scale * 1.4426950408889634f;
    return launch_split<D, L::QT, L::KT>(args, split, true, 1024, [&](dim3 grid, const AttentionArgs &a) -> ciq_status {
        attention_wgmma_kernel<D><<<grid, L::THREADS, L::SMEM, ciq_stream()>>>(maps[0], maps[1], a, scale_log2);
        CIQ_CUDA_LAUNCH_CHECK("attention (wgmma)");
        return CIQ_OK;
    });
}

}  // namespace

size_t ciq_cuda_attention_wgmma_smem(int64_t head_dim) {
    if (std::strstr(GGML_CIQ_CUDA_ARCHS, "90a") == nullptr) return 0;  // no sm_90a machine code in this build
    return head_dim == 64 ? WgmmaAttn<64>::SMEM : head_dim == 128 ? WgmmaAttn<128>::SMEM
                                              : head_dim == 256 ? WgmmaAttn<256>::SMEM
                                                                : 0;
}

ciq_status ciq_cuda_attention_wgmma(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                    int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                    int64_t window, float *out, bool split) {
    if ((uintptr_t)k_cache % 16 != 0 || (uintptr_t)v_cache % 16 != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "attention (wgmma): the K/V caches must be 16-byte aligned");
    const AttentionArgs args{attention_problem(q, k_cache, v_cache, out, tokens, heads, heads_kv, n_past, window, scale),
                             nullptr, 0};
    switch (head_dim) {
        case 64: return launch_wgmma<64>(args, split);
        case 128: return launch_wgmma<128>(args, split);
        case 256: return launch_wgmma<256>(args, split);
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (wgmma): head_dim %lld is not built", (long long)head_dim);
    }
}
ciq_status ciq_cuda_attention_wgmma_masked(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                           const uint16_t *mask, int64_t mask_row, const uint8_t *marked,
                                           int64_t key_tiles, int64_t n_kv, int64_t tokens, int64_t heads,
                                           int64_t heads_kv, int64_t head_dim, float scale, float *out, bool split) {
    if ((uintptr_t)k_cache % 16 != 0 || (uintptr_t)v_cache % 16 != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "attention (wgmma): the K/V caches must be 16-byte aligned");
    AttentionArgs args{attention_problem(q, k_cache, v_cache, out, tokens, heads, heads_kv, 0, 0, scale), nullptr, 0};
    args.mask = mask;
    args.mask_row = mask_row;
    args.marked = marked;
    args.n_kv = (int)n_kv;
    args.key_tiles = (int)key_tiles;
    switch (head_dim) {
        case 64: return launch_wgmma<64>(args, split);
        case 128: return launch_wgmma<128>(args, split);
        case 256: return launch_wgmma<256>(args, split);
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (wgmma): head_dim %lld is not built", (long long)head_dim);
    }
}
#endif  // !GGML_CIQ_HIP
