// mmq_stream_k.cuh - llama.cpp MMQ's stream-k decomposition (mmq.cu / mmq.cuh at 0c1e570, sm_80+), said once for
// the kernels that reproduce MMQ's float order (gemm_q32.cu, gemm_mma.cu).
//
// MMQ tiles out by I = 128 rows x J tokens, J the first width of its configs giving the fewest token tiles (rows
// not a multiple of 128 take the "fallback" widths). Unless the tiles fill >= 90% of a wave of one CTA per SM, it
// launches one CTA per SM; CTA b takes the tiles' K iterations [start(b), start(b + 1)) of all tiles' iterations in
// a row (tile t = (row tile) * ntx + token tile), start(b) = b * total / blocks snapped down to its K iteration
// (256 values) within the tile. So a tile's K is summed in segments, each from 0: the one that reaches the tile's end
// goes to out, the others to a fixup buffer, and the fixup adds them as out + (((0 + p[n-2]) + p[n-3]) + ... + p[0]).
#pragma once
#include "common.cuh"

#include <climits>
#include <cstdint>

constexpr int MMQ_ROWS = 128;  // I of every sm_80+ config of the types ciq reproduces

struct MmqStreamK {
    int J, ntx, blocks, k_blocks, iter_blocks;  // k_blocks: quant blocks along K; iter_blocks: per 256-value iteration
    int64_t tiles, total;                       // total = tiles * k_blocks
    __host__ __device__ bool split() const { return blocks != tiles; }
};

// MMQ's grid for rows x K (k_blocks quant blocks, iter_blocks of them per iteration) x tokens on a GPU of `sms` SMs.
inline MmqStreamK mmq_stream_k(int64_t rows, int64_t k_blocks, int iter_blocks, int64_t tokens, int sms) {
    static constexpr int widths[] = {8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128}, fallback[] = {8, 16, 32, 64, 128};
    const bool use_fallback = rows % MMQ_ROWS != 0;
    const int *w = use_fallback ? fallback : widths;
    const int nw = use_fallback ? 5 : 11;
    int J = w[0];
    int64_t best = INT64_MAX;
    for (int i = 0; i < nw; ++i) {
        const int64_t n = (tokens + w[i] - 1) / w[i];
        if (n < best) best = n, J = w[i];
    }
    const int64_t ntx = (tokens + J - 1) / J, tiles = ntx * ((rows + MMQ_ROWS - 1) / MMQ_ROWS);
    const int64_t waves = (tiles + sms - 1) / sms;
    // One CTA per tile (no seams) also where MMQ's own index would overflow: it refuses those GEMMs.
    const int64_t blocks = 100 * tiles / (sms * waves) >= 90 || tiles * k_blocks >= (int64_t)1 << 30 ? tiles : sms;
    return MmqStreamK{J, (int)ntx, (int)blocks, (int)k_blocks, iter_blocks, tiles, tiles * k_blocks};
}

// Where CTA b of MMQ's grid starts (snapped to its K iteration within the tile).
__host__ __device__ inline int64_t mmq_cta_start(const MmqStreamK &m, int64_t b) {
    int64_t start = b * m.total / m.blocks;
    return start - (start % m.k_blocks) % m.iter_blocks;
}

// The segment starts of tile `tile` after its first (block offsets within the tile, ascending, no duplicates): at
// most `cap` into `seams`; returns their count, or -1 when there are more.
__host__ __device__ inline int mmq_tile_seams(const MmqStreamK &m, int64_t tile, int *seams, int cap) {
    const int64_t t0 = tile * m.k_blocks, t1 = t0 + m.k_blocks;
    int n = 0;
    for (int64_t b = t0 * m.blocks / m.total; b < m.blocks; ++b) {
        const int64_t start = mmq_cta_start(m, b);
        if (start >= t1) break;
        if (start <= t0 || (n > 0 && start - t0 == seams[n - 1])) continue;
        if (n == cap) return -1;
        seams[n++] = (int)(start - t0);
    }
    return n;
}
