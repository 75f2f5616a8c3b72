// attention_split.cuh - what the flash-attention kernels of attention.cu (simt, mma: 64-query tiles) and
// attention_wgmma.cu (64- or 128-query tiles) share: their arguments, the key range a query tile sees, and the split over the
// keys with its combine kernel. QT (queries per CTA) is a template parameter throughout.
//
// Split over the keys (GGML_CIQ_ATTENTION_SPLIT=0 turns it off): where the (query tile, head) CTAs are too few to fill
// the GPU (Gemma 3 270M: 8 x 4 at 512 tokens on 132 SMs), each CTA's key range is cut into chunks of chunk_keys (a
// multiple of the kernel's key tile, from `first`) and grid.z runs one chunk per CTA. A chunk's CTA writes its rows'
// unnormalized O and (m, l) to scratch slot 1:
//   partial  : float32 [chunk][query tile][head] slots of partial_slot<QT>(D) floats: O [QT][D], then (m, l) [QT][2],
//              m in natural-log units of the scaled scores (l and O relative to exp(m)).
// A CTA whose chunk starts past the range writes nothing; attention_combine_kernel merges the chunks a row has:
//   out = sum_c O_c exp(m_c - M) / sum_c l_c exp(m_c - M), M = max_c m_c (a chunk where the row saw no key: m = -inf,
// weight 0; every row sees its own position, so M is finite; ciq_attention_masked's rows that saw no key: zeros). The split is a function of (tokens, heads, the key
// ranges): the same call splits the same way every time, eager or in a graph.
#pragma once
#include "common.cuh"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int MAX_SPLITS = 16;  // chunks a query tile's keys are split into at most (splits_cap)
constexpr int MAX_QT = 128;     // the widest query tile: the split's scratch is sized for it whichever kernel runs

struct AttentionArgs : AttentionProblem {
    float *partial;  // split over the keys: the chunks' partial results (nullptr: one CTA per tile, out written)
    int chunk_keys;  // keys per chunk, a multiple of the kernel's key tile (with partial)
};

template <int QT> __host__ __device__ constexpr int64_t partial_slot(int64_t d) { return QT * (d + 2); }  // floats

// The key range [first, end) the queries of the tile from q0 can see (the kernels', and the host's split plan).
template <int QT>
__host__ __device__ __forceinline__ void key_range(const AttentionArgs &a, int q0, int *first, int *end) {
    if (a.mask != nullptr) {  // ciq_attention_masked: every key; the mask decides
        *first = 0;
        *end = a.n_kv;
        return;
    }
    const int last_query = (q0 + QT < a.tokens ? q0 + QT : a.tokens) - 1;
    const int window_first = a.n_past + q0 - a.window + 1;
    *end = a.n_past + last_query + 1;
    *first = a.window > 0 && window_first > 0 ? window_first : 0;
}

// The keys [*start, *stop) this CTA walks: the whole range, or its chunk blockIdx.z of it. False: the chunk starts past
// the range (the CTA has nothing to do and writes nothing).
__device__ __forceinline__ bool chunk_range(const AttentionArgs &a, int first, int end, int *start, int *stop) {
    *start = first;
    *stop = end;
    if (a.partial == nullptr) return true;
    *start = first + (int)blockIdx.z * a.chunk_keys;
    *stop = min(end, *start + a.chunk_keys);
    return *start < end;
}

// Chunk `chunk`'s slot of query tile `tile` (of `tiles`) and head `head` in the partial buffer.
template <int QT>
__device__ __forceinline__ float *partial_slot_at(const AttentionArgs &a, int chunk, int tiles, int tile, int head,
                                                  int64_t d) {
    return a.partial + (((int64_t)chunk * tiles + tile) * a.heads + head) * partial_slot<QT>(d);
}

// This CTA's slot (its chunk blockIdx.z, tile blockIdx.x, head blockIdx.y).
template <int QT> __device__ __forceinline__ float *partial_at(const AttentionArgs &a, int64_t d) {
    return partial_slot_at<QT>(a, blockIdx.z, gridDim.x, blockIdx.x, blockIdx.y, d);
}

__device__ __forceinline__ bool visible(const AttentionArgs &a, int query_pos, int key, int end) {
    return key < end && key <= query_pos && (a.window == 0 || query_pos - key < a.window);
}

constexpr uint16_t F16_NEG_INF = 0xFC00;

// ciq_attention_masked's marks of a 64 x 64 mask tile (attention.cu's attention_mark_kernel).
constexpr uint8_t MARK_NONE = 0;   // every key at -inf (or past the keys / tokens): skipped
constexpr uint8_t MARK_MIXED = 1;  // read the mask key by key
constexpr uint8_t MARK_ZERO = 2;   // every value 0, inside the keys and tokens: scores as they are, no mask read

__device__ __forceinline__ uint8_t tile_mark(const AttentionArgs &a, int t, int key) {
    return a.marked[(int64_t)(t / 64) * a.key_tiles + key / 64];
}

// Query t's score of `key` from its raw q.k: scale * raw where visible, else -inf; masked (a.mask): scale * raw plus
// the mask's value (-inf: -inf), -inf past the keys or the tokens (a tile marked MARK_ZERO: no mask read). `unit`
// scales the mask's value (1; wgmma's log2-unit scores: log2(e)).
__device__ __forceinline__ float attention_score(const AttentionArgs &a, int t, int key, int end, float raw,
                                                 float unit = 1.0f) {
    if (a.mask == nullptr) return visible(a, a.n_past + t, key, end) ? raw * a.scale : -INFINITY;
    if (key >= end || t >= a.tokens) return -INFINITY;
    if (tile_mark(a, t, key) == MARK_ZERO) return raw * a.scale;
    const uint16_t bits = a.mask[(int64_t)t * a.mask_row + key];
    return bits == F16_NEG_INF ? -INFINITY : raw * a.scale + __half2float(__ushort_as_half(bits)) * unit;
}

// Masked: [*start, *stop) narrowed to the key tiles (of 64) from the first marked one of the CTA's query tile (q0,
// `rows` queries: a multiple of 64) to the last (none marked: empty). Uniform over the CTA (it reads only a.marked
// and blockIdx).
__device__ __forceinline__ void marked_range(const AttentionArgs &a, int q0, int *start, int *stop, int rows = 64) {
    if (a.mask == nullptr || *start >= *stop) return;
    auto marked = [&](int kt) {
        for (int r = q0; r < q0 + rows && r < a.tokens; r += 64)
            if (a.marked[(int64_t)(r / 64) * a.key_tiles + kt] != MARK_NONE) return true;
        return false;
    };
    int lo = *start / 64, hi = (*stop + 63) / 64 - 1;
    while (lo <= hi && !marked(lo)) ++lo;
    while (hi >= lo && !marked(hi)) --hi;
    if (lo > hi) {
        *stop = *start;
        return;
    }
    *start = max(*start, 64 * lo);
    *stop = min(*stop, 64 * (hi + 1));
}

// One online-softmax step of a thread's query row whose tile scores are spread over a quad (4 lanes, as the mma.sync
// and wgmma accumulators lay them out): the running max m takes the tile's; returns the base the tile's weights are
// taken against (m, or 0 while nothing is visible: every weight 0) and sets *correction = exp(m_old - base), by which
// l (here) and the row's O accumulators (the caller) are scaled. exp: the kernel's exponential of its score units
// (expf for natural scores: mma; exp2f for log2(e)-scaled ones: wgmma).
template <typename Exp>
__device__ __forceinline__ float online_softmax_step(float &m, float &l, float tile_max, float *correction, Exp exp) {
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFF, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFF, tile_max, 2));
    const float m_new = fmaxf(m, tile_max);
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    *correction = exp(m - base);
    l *= *correction;
    m = m_new;
    return base;
}

// One CTA of 64 threads per (token, head); thread i owns dims i, i + 64, ... The chunks a row has: those starting
// inside its query tile's key range (the same key_range and chunk_keys as the chunks' CTAs).
template <int D, int QT>
__global__ void __launch_bounds__(64) attention_combine_kernel(AttentionArgs a) {
    const int t = blockIdx.x, h = blockIdx.y, tile = t / QT, row = t % QT;
    const int tiles = (a.tokens + QT - 1) / QT;
    int first, end;
    key_range<QT>(a, tile * QT, &first, &end);
    const int chunks = (end - first + a.chunk_keys - 1) / a.chunk_keys;  // <= MAX_SPLITS
    auto slot = [&](int c) { return partial_slot_at<QT>(a, c, tiles, tile, h, D); };
    __shared__ float weight[MAX_SPLITS];  // exp(m_c - M) per chunk, computed once
    float big = -INFINITY;
    for (int c = 0; c < chunks; ++c) big = fmaxf(big, slot(c)[QT * D + 2 * row]);
    if (threadIdx.x < chunks) weight[threadIdx.x] = expf(slot(threadIdx.x)[QT * D + 2 * row] - big);
    __syncthreads();
    float sum = 0.0f;
    for (int c = 0; c < chunks; ++c) sum += slot(c)[QT * D + 2 * row + 1] * weight[c];
    float *out = a.out + ((int64_t)t * a.heads + h) * D;
    for (int e = threadIdx.x; e < D; e += 64) {
        float acc = 0.0f;
        for (int c = 0; c < chunks; ++c) acc += slot(c)[row * D + e] * weight[c];
        out[e] = big == -INFINITY ? 0.0f : acc / sum;  // masked: a row that saw no key (weights NaN) gets zeros
    }
}

// The split over the keys for this call: chunks (grid.z) and keys per chunk, or 1 chunk (no split). A function of
// (tokens, heads, n_past, window) and the GPU's SMs only. Only where the (tile, head) CTAs are fewer than `fill`
// (mma and simt: the SMs. Measured on the H200 at 512 tokens: Gemma 3 270M's 32 CTAs, attention 76 -> 28 + 14 us a
// layer and the prefill 1.17x; Llama-3-8B's 256 CTAs split in 2 made its prefill 3% slower. wgmma: half the SMs, its
// CTA being one a SM): splits = enough CTAs for about 3 a SM, at most MAX_SPLITS. split false
// (GGML_CIQ_ATTENTION_SPLIT=0, ciq_attention_switches): 1.
inline int splits_cap(bool split, int64_t tiles, int64_t heads, int sms, int fill) {
    if (!split) return 1;
    const int64_t ctas = tiles * heads;
    if (ctas >= fill) return 1;
    return (int)std::min<int64_t>(MAX_SPLITS, (3 * (int64_t)sms + ctas - 1) / ctas);
}

// Plans the split for a kernel of QT queries and KT keys per tile (the chunk = the longest key range / splits, rounded
// up to whole key tiles), launches it through launch(grid, args) and, split, the combine. The scratch the split needs,
// fewer than 4 x SMs slots of the widest query tile, is allocated at that size for every D and kernel wherever a split
// may come, split or not: a prefill's first micro-batch (n_past 0, often one chunk) sizes it for the later ones, so
// their eager runs move no scratch under the graphs captured before them (ciq_cuda_scratch: a moved buffer makes every
// earlier graph stale). Slots used: cap * ctas <= ceil(3 sms / ctas) * ctas < 3 sms + ctas < 4 sms (ctas < sms).
// wgmma (fill_half) splits only where the longest key range reaches min_keys: its unsplit CTAs are fast enough that
// the chunks and the combine cost more on short ranges (bench attention on the H200, Gemma 3 270M's 512-query
// micro-batches, bench/results/h200/attention-2b2bad3: 512 keys 22.2 us unsplit vs 28.5 split, a 512-key window after
// 3584 cached keys 26.6 vs 37.9, 4096 keys 87.7 vs 63.0; the two lines cross near 1200 keys).
template <int D, int QT, int KT, typename Launch>
ciq_status launch_split(AttentionArgs args, bool split, bool fill_half, int min_keys, Launch launch) {
    const int64_t tiles = (args.tokens + QT - 1) / QT;
    int chunks = 1;
    int device = 0, sms = 0;
    ciq_status status = ciq_current_gpu_sms("attention", &device, &sms);
    if (status != CIQ_OK) return status;
    const int cap = splits_cap(split, tiles, args.heads, sms, fill_half ? sms / 2 : sms);
    if (cap > 1) {
        int longest = 0;  // the longest key range of a query tile, in key tiles
        for (int64_t t = 0; t < tiles; ++t) {
            int first, end;
            key_range<QT>(args, (int)t * QT, &first, &end);
            longest = std::max(longest, (end - first + KT - 1) / KT);
        }
        const int per_chunk = (longest + cap - 1) / cap;
        chunks = longest * KT >= min_keys ? (longest + per_chunk - 1) / per_chunk : 1;
        args.chunk_keys = per_chunk * KT;
        void *scratch = nullptr;  // allocated even where this call does not split (min_keys): see above
        status = ciq_cuda_scratch(device, 1, sizeof(float) * 4 * sms * partial_slot<MAX_QT>(D), &scratch);
        if (status != CIQ_OK) return status;
        if (chunks > 1) args.partial = (float *)scratch;
    }
    const dim3 grid((unsigned)tiles, args.heads, chunks);
    status = launch(grid, args);
    if (status != CIQ_OK || chunks == 1) return status;
    attention_combine_kernel<D, QT><<<dim3(args.tokens, args.heads), 64, 0, ciq_stream()>>>(args);
    CIQ_CUDA_LAUNCH_CHECK("attention (combine)");
    return CIQ_OK;
}

}  // namespace
