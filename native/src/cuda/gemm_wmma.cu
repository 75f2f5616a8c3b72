// gemm_wmma.cu - CIQ GEMM on int8 WMMA tensor cores with CPU semantics (Q8_K activations, docs/SEMANTICS.md).
//
// Layouts, said once:
//   weight : [rows][K/256] GGUF blocks; Q4_K (144 B) blocks are 16-byte aligned (cudaMalloc'd base),
//            Q6_K (210 B) blocks only 2-byte aligned, so Q6_K is read in 16-bit pieces.
//   x      : Q8_K [tokens][K/256] blocks of 292 B: float d at 0, int8 qs[256] at 4, int16 bsums[16] at 260.
//   out    : [tokens][rows], f32 or bf16.
//   shared : every 16x256 int8 operand of a super-block (16 weight rows, or 16 tokens) is staged "slice-major":
//            k-slice s (k = 16s..16s+15) is a dense 16x16 tile of 256 B, byte [i][kk] at s*256 + 16*i + kk. Each
//            WMMA operand is then one 32-byte aligned tile with ldm 16: weights as row_major A (rows x k),
//            tokens as col_major B (k x tokens). (Q8_K qs can't feed load_matrix_sync from global memory: they sit
//            at offset 4 of a 292-byte block, neither 32-byte aligned nor at a multiple-of-16 stride.)
//
// Accumulation: which lane holds which accumulator element differs per architecture (wmma_fragment.cuh; opaque
// under nvcuda::wmma), so the int32 tile of each sub-block is stored to a per-warp shared tile and folded from there
// with a fixed ownership: lane l owns weight row l/2 and tokens 8*(l%2)..8*(l%2)+7 of every 16x16 tile. Within a
// super-block the scaled integer sum S = Σ_j sc_j*isum_j is exact in int32 (as in the CPU kernel); the float fold
// happens once per super-block:
//   Q4_K: acc += dy * (d*S - dmin*M),  M = Σ_j m_j*(bsums[2j]+bsums[2j+1])  (the min term never enters the MMA)
//   Q6_K: acc += dy * d*S
// Tails: weight rows >= rows are staged as zeros with zero scales, tokens >= tokens as zeros with dy = 0, and only
// in-range outputs are stored. No thread returns before a barrier.
#include "common.cuh"
#include "wmma_fragment.cuh"

#include <cstddef>

namespace {

using namespace ciq_wmma;  // FragWeights (A), FragTokens (B), FragSum (C) and their frag_* operations

constexpr int TILE = DIM;                              // WMMA m = n = k
constexpr int SLICES = QK_K / TILE;                    // k-slices per super-block
constexpr int SLICE_BYTES = TILE * TILE;               // one 16x16 int8 operand tile
constexpr int OPERAND_BYTES = SLICES * SLICE_BYTES;    // 16 rows (or tokens) x 256 int8
constexpr int STAGED_WARPS = 8;                        // warps per block of the block-staged variants

// ---- shared-memory tiles ----
struct __align__(32) ActivationTile {  // 16 tokens of one super-block
    int8_t qs[OPERAND_BYTES];          // slice-major, token = tile row
    int16_t bsum_pairs[TILE][8];       // Q4_K only: bsums[2j] + bsums[2j+1] per 32-value sub-block j
    float dy[TILE];
};

template <int TOKEN_TILES>
struct __align__(32) WarpTiles {               // private to one warp
    int8_t w[OPERAND_BYTES];                   // its 16 dequantized weight rows, slice-major
    int isum[2][TOKEN_TILES][TILE * TILE];     // int32 results of the two sub-block groups being folded
};

// ---- weight blocks ----
template <ciq_type T>
struct RowScales;

// Scales of one weight row's super-block, the sub-block scales (and Q4_K mins) packed a byte each into 64-bit words:
// a runtime sub-block index then selects one with a shift, in registers.
template <>
struct RowScales<CIQ_TYPE_Q4_K> {
    static constexpr int BLOCK_BYTES = Q4_K_BLOCK_BYTES;
    static constexpr int SLICES_PER_GROUP = 2;  // a sub-block is 32 values = 2 k-slices
    float d = 0.f, dmin = 0.f;
    uint64_t sc_packed = 0, m_packed = 0;  // byte j = sub-block j

    __device__ __forceinline__ void load(const uint8_t *block) {
        const uint4 head = *reinterpret_cast<const uint4 *>(block);  // half d, half dmin, scales[12]
        d = ciq_half_to_float((uint16_t)(head.x & 0xFFFF));
        dmin = ciq_half_to_float((uint16_t)(head.x >> 16));
        const uint32_t words[3] = {head.y, head.z, head.w};
        uint8_t packed[12];
#pragma unroll
        for (int i = 0; i < 12; ++i) packed[i] = (uint8_t)(words[i / 4] >> (8 * (i % 4)));
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            int sc, m;
            ciq_q4_K_scale_min(j, packed, &sc, &m);
            sc_packed |= (uint64_t)sc << (8 * j);
            m_packed |= (uint64_t)m << (8 * j);
        }
    }
    __device__ __forceinline__ int scale(int j) const { return (int)(sc_packed >> (8 * j)) & 0xFF; }
    __device__ __forceinline__ int sub_min(int j) const { return (int)(m_packed >> (8 * j)) & 0xFF; }
};

template <>
struct RowScales<CIQ_TYPE_Q6_K> {
    static constexpr int BLOCK_BYTES = Q6_K_BLOCK_BYTES;
    static constexpr int SLICES_PER_GROUP = 1;  // a sub-block is 16 values = 1 k-slice
    float d = 0.f;
    uint64_t sc_low = 0, sc_high = 0;  // int8 scales: byte j of sc_low is sub-block j, of sc_high sub-block 8 + j

    __device__ __forceinline__ void load(const uint8_t *block) {
        const uint16_t *scales = reinterpret_cast<const uint16_t *>(block + offsetof(block_q6_K, scales));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            sc_low |= (uint64_t)scales[i] << (16 * i);
            sc_high |= (uint64_t)scales[4 + i] << (16 * i);
        }
        d = ciq_half_to_float(*reinterpret_cast<const uint16_t *>(block + offsetof(block_q6_K, d)));
    }
    __device__ __forceinline__ int scale(int j) const { return (int)(int8_t)((j < 8 ? sc_low : sc_high) >> (8 * (j % 8))); }
};

// Scales of the weight row this lane folds (row0 + lane/2); zeros past the last row.
template <ciq_type T>
__device__ __forceinline__ RowScales<T> load_row_scales(const uint8_t *weight, int64_t row_bytes, int64_t rows,
                                                        int64_t row, int sb) {
    RowScales<T> scales;
    if (row < rows) scales.load(weight + row * row_bytes + (int64_t)sb * RowScales<T>::BLOCK_BYTES);
    return scales;
}

__device__ __forceinline__ uint4 nibbles(uint4 q, int shift) {
    return make_uint4((q.x >> shift) & 0x0F0F0F0F, (q.y >> shift) & 0x0F0F0F0F, (q.z >> shift) & 0x0F0F0F0F,
                      (q.w >> shift) & 0x0F0F0F0F);
}

__device__ __forceinline__ uint4 load_16_bytes_align2(const uint8_t *p) {
    const uint16_t *h = reinterpret_cast<const uint16_t *>(p);
    return make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16, h[4] | (uint32_t)h[5] << 16,
                      h[6] | (uint32_t)h[7] << 16);
}

// Four Q6_K values per 32-bit word: low nibbles (ql >> ql_shift), high bits (qh >> qh_shift), minus 32 bytewise.
// Setting bit 7 of every byte first keeps the subtraction from borrowing across bytes; the xor clears it again.
__device__ __forceinline__ uint32_t q6_minus_32(uint32_t ql, int ql_shift, uint32_t qh, int qh_shift) {
    const uint32_t q6 = ((ql >> ql_shift) & 0x0F0F0F0F) | (((qh >> qh_shift) & 0x03030303) << 4);
    return ((q6 | 0x80808080) - 0x20202020) ^ 0x80808080;
}

__device__ __forceinline__ uint4 q6_minus_32(uint4 ql, int ql_shift, uint4 qh, int qh_shift) {
    return make_uint4(q6_minus_32(ql.x, ql_shift, qh.x, qh_shift), q6_minus_32(ql.y, ql_shift, qh.y, qh_shift),
                      q6_minus_32(ql.z, ql_shift, qh.z, qh_shift), q6_minus_32(ql.w, ql_shift, qh.w, qh_shift));
}

// Warp-cooperative: super-block sb of weight rows row0..row0+15 into w (slice-major int8). Q4_K keeps the raw
// nibbles 0..15 (scales and mins are applied in the fold), Q6_K stores q6-32. Rows past the end are zeros.
// Lane l always handles row row0 + l%16, so 8 consecutive lanes store one contiguous 128 B of shared memory.
template <ciq_type T>
__device__ __forceinline__ void dequantize_weight_tile(const uint8_t *weight, int64_t row_bytes, int64_t rows,
                                                       int64_t row0, int sb, int8_t *w, int lane) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const int r = lane % TILE, part = lane / TILE;
    const bool valid = row0 + r < rows;
    const uint8_t *block = weight + (valid ? (row0 + r) * row_bytes + (int64_t)sb * RowScales<T>::BLOCK_BYTES : 0);
    if constexpr (T == CIQ_TYPE_Q4_K) {
        // 16 bytes of qs = chunk c (0..7). Byte i holds value 64*(c/2) + 16*(c%2) + i in its low nibble and the
        // value 32 higher in its high nibble: slices 4*(c/2) + c%2 and that + 2.
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int chunk = part + 2 * i;
            const uint4 q = valid ? *reinterpret_cast<const uint4 *>(block + offsetof(block_q4_K, qs) + 16 * chunk) : zero;
            const int slice = 4 * (chunk / 2) + chunk % 2;
            *reinterpret_cast<uint4 *>(w + slice * SLICE_BYTES + r * TILE) = nibbles(q, 0);
            *reinterpret_cast<uint4 *>(w + (slice + 2) * SLICE_BYTES + r * TILE) = nibbles(q, 4);
        }
    } else {
        // Half n (values 128n..128n+127), l-range 16h..16h+15 with h = part. Quarter g of the half (values
        // 128n + 32g + l) comes from ql[64n + 32*(g%2) + l] (nibble g/2) and qh[32n + l] (bits 2g): slice 8n+2g+h.
        const int h = part;
#pragma unroll
        for (int n = 0; n < 2; ++n) {
            uint4 ql_even = zero, ql_odd = zero, qh = zero;
            if (valid) {
                ql_even = load_16_bytes_align2(block + offsetof(block_q6_K, ql) + 64 * n + 16 * h);
                ql_odd = load_16_bytes_align2(block + offsetof(block_q6_K, ql) + 64 * n + 32 + 16 * h);
                qh = load_16_bytes_align2(block + offsetof(block_q6_K, qh) + 32 * n + 16 * h);
            }
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                const uint4 q = valid ? q6_minus_32(g % 2 ? ql_odd : ql_even, 4 * (g / 2), qh, 2 * g) : zero;
                *reinterpret_cast<uint4 *>(w + (8 * n + 2 * g + h) * SLICE_BYTES + r * TILE) = q;
            }
        }
    }
}

// ---- activations ----
// Cooperative over THREADS threads (a warp or the block): super-block sb of tokens tok0..tok0+15 into tile.
// Thread i always handles token tok0 + i%16, so consecutive threads store consecutive 16 B of shared memory.
template <ciq_type T, int THREADS>
__device__ __forceinline__ void stage_activations(const uint8_t *x, int64_t x_row_bytes, int64_t tokens,
                                                  int64_t tok0, int sb, ActivationTile &tile, int thread) {
    constexpr int PARTS = THREADS / TILE;  // threads per token
    static_assert(THREADS % TILE == 0 && SLICES % PARTS == 0, "threads must split the slices evenly");
    const int t = thread % TILE, part = thread / TILE;
    const bool valid = tok0 + t < tokens;
    const uint8_t *block = x + (valid ? (tok0 + t) * x_row_bytes + (int64_t)sb * Q8_K_BLOCK_BYTES : 0);
#pragma unroll
    for (int i = 0; i < SLICES / PARTS; ++i) {
        const int slice = part + i * PARTS;
        int4 q = make_int4(0, 0, 0, 0);
        if (valid) {
            const int *src = reinterpret_cast<const int *>(block + offsetof(block_q8_K, qs) + TILE * slice);
            q = make_int4(src[0], src[1], src[2], src[3]);
        }
        *reinterpret_cast<int4 *>(tile.qs + slice * SLICE_BYTES + t * TILE) = q;
    }
    if (part == 0) tile.dy[t] = valid ? *reinterpret_cast<const float *>(block + offsetof(block_q8_K, d)) : 0.f;
    if constexpr (T == CIQ_TYPE_Q4_K) {
        for (int j = part; j < 8; j += PARTS) {
            int pair = 0;
            if (valid) {
                const uint32_t word = *reinterpret_cast<const uint32_t *>(block + offsetof(block_q8_K, bsums) + 4 * j);
                pair = (int16_t)(word & 0xFFFF) + (int16_t)(word >> 16);
            }
            tile.bsum_pairs[t][j] = (int16_t)pair;
        }
    }
}

// ---- the shared per-warp super-block step ----
// One warp, its 16 weight rows (tiles.w) against TOKEN_TILES staged 16-token tiles (act). Q4_K's min term is
// folded first, from the bsums alone. Then per sub-block group (Q4_K: 32 values, 2 MMAs summed; Q6_K: 16 values,
// 1 MMA) one int32 tile per token tile, two groups per __syncwarp, folded with the sub-block scales into the exact
// int32 sum S; finally the float fold of S into acc (which still reads act: callers sync before restaging).
template <ciq_type T, int TOKEN_TILES>
__device__ __forceinline__ void warp_multiply_superblock(WarpTiles<TOKEN_TILES> &tiles, const ActivationTile *act,
                                                         const RowScales<T> &scales, int lane,
                                                         float (&acc)[TOKEN_TILES][8]) {
    constexpr int SLICES_PER_GROUP = RowScales<T>::SLICES_PER_GROUP;
    constexpr int GROUPS = SLICES / SLICES_PER_GROUP;
    const int own_row = lane / 2, own_token = 8 * (lane % 2);

    if constexpr (T == CIQ_TYPE_Q4_K) {
#pragma unroll
        for (int nt = 0; nt < TOKEN_TILES; ++nt) {
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const int t = own_token + i;
                const int4 p = *reinterpret_cast<const int4 *>(act[nt].bsum_pairs[t]);  // 8 x int16
                const int words[4] = {p.x, p.y, p.z, p.w};
                int min_sum = 0;
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    min_sum += scales.sub_min(j) * (j % 2 ? words[j / 2] >> 16 : (int)(int16_t)words[j / 2]);
                }
                acc[nt][i] -= act[nt].dy[t] * (scales.dmin * (float)min_sum);
            }
        }
    }

    int sum[TOKEN_TILES][8] = {};
#pragma unroll 1  // each round is serialized by its __syncwarp anyway; unrolling only costs registers (and spills)
    for (int g0 = 0; g0 < GROUPS; g0 += 2) {
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {  // group g0 + gi
            FragWeights a[SLICES_PER_GROUP];
#pragma unroll
            for (int kk = 0; kk < SLICES_PER_GROUP; ++kk) {
                frag_load(a[kk], tiles.w + ((g0 + gi) * SLICES_PER_GROUP + kk) * SLICE_BYTES);
            }
#pragma unroll
            for (int nt = 0; nt < TOKEN_TILES; ++nt) {
                FragSum c;
                frag_zero(c);
#pragma unroll
                for (int kk = 0; kk < SLICES_PER_GROUP; ++kk) {
                    FragTokens b;
                    frag_load(b, act[nt].qs + ((g0 + gi) * SLICES_PER_GROUP + kk) * SLICE_BYTES);
                    frag_mma(c, a[kk], b);
                }
                frag_store(tiles.isum[gi][nt], c);
            }
        }
        __syncwarp();
#pragma unroll
        for (int gi = 0; gi < 2; ++gi) {
            const int sc = scales.scale(g0 + gi);
#pragma unroll
            for (int nt = 0; nt < TOKEN_TILES; ++nt) {
                const int4 *src = reinterpret_cast<const int4 *>(tiles.isum[gi][nt] + own_row * TILE + own_token);
                const int4 lo = src[0], hi = src[1];
                sum[nt][0] += sc * lo.x;
                sum[nt][1] += sc * lo.y;
                sum[nt][2] += sc * lo.z;
                sum[nt][3] += sc * lo.w;
                sum[nt][4] += sc * hi.x;
                sum[nt][5] += sc * hi.y;
                sum[nt][6] += sc * hi.z;
                sum[nt][7] += sc * hi.w;
            }
        }
        __syncwarp();
    }

#pragma unroll
    for (int nt = 0; nt < TOKEN_TILES; ++nt) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[nt][i] += act[nt].dy[own_token + i] * (scales.d * (float)sum[nt][i]);
    }
}

// Lane l writes row row0 + l/2, tokens tok0 + 16*nt + 8*(l%2) + i, in range only.
template <int TOKEN_TILES>
__device__ __forceinline__ void store_outputs(const float (&acc)[TOKEN_TILES][8], void *out, int64_t rows,
                                              int64_t tokens, int64_t row0, int64_t tok0, int lane,
                                              ciq_out_type out_type) {
    const int64_t row = row0 + lane / 2;
    if (row >= rows) return;
#pragma unroll
    for (int nt = 0; nt < TOKEN_TILES; ++nt) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int64_t token = tok0 + nt * TILE + 8 * (lane % 2) + i;
            if (token < tokens) ciq_store_out(out, token * rows + row, acc[nt][i], out_type);
        }
    }
}

extern __shared__ __align__(32) unsigned char gemm_smem[];

// CIQ_VARIANT_WMMA (WARPS = 4) and CIQ_VARIANT_WMMA_WIDE (WARPS = 8). Grid: x = row tiles of 16*WARPS rows,
// y = token tiles of 16. Each warp owns the 16x16 output tile (rows row0.., tokens tok0..) and stages both of its
// operands privately (the block's warps load the same 16 tokens independently); only __syncwarp is needed.
template <ciq_type T, int WARPS>
__global__ void __launch_bounds__(WARPS * CIQ_WARP_SIZE)
gemm_wmma_warp_private(const uint8_t *__restrict__ weight, int64_t rows, int64_t row_bytes, int superblocks,
                       const uint8_t *__restrict__ x, int64_t tokens, void *__restrict__ out, ciq_out_type out_type) {
    const int warp = threadIdx.x / CIQ_WARP_SIZE, lane = threadIdx.x % CIQ_WARP_SIZE;
    WarpTiles<1> &tiles = reinterpret_cast<WarpTiles<1> *>(gemm_smem)[warp];
    ActivationTile &act = reinterpret_cast<ActivationTile *>(gemm_smem + WARPS * sizeof(WarpTiles<1>))[warp];
    const int64_t row0 = ((int64_t)blockIdx.x * WARPS + warp) * TILE;
    const int64_t tok0 = (int64_t)blockIdx.y * TILE;
    const int64_t x_row_bytes = (int64_t)superblocks * Q8_K_BLOCK_BYTES;

    float acc[1][8] = {};
    for (int sb = 0; sb < superblocks; ++sb) {
        __syncwarp();  // every lane is done with the previous super-block's tiles
        dequantize_weight_tile<T>(weight, row_bytes, rows, row0, sb, tiles.w, lane);
        stage_activations<T, CIQ_WARP_SIZE>(x, x_row_bytes, tokens, tok0, sb, act, lane);
        const RowScales<T> scales = load_row_scales<T>(weight, row_bytes, rows, row0 + lane / 2, sb);
        __syncwarp();
        warp_multiply_superblock<T, 1>(tiles, &act, scales, lane, acc);
    }
    store_outputs<1>(acc, out, rows, tokens, row0, tok0, lane, out_type);
}

// CIQ_VARIANT_WMMA_SHARED (TOKEN_TILES = 1) and CIQ_VARIANT_WMMA_BIGTILE (TOKEN_TILES = 3). 8 warps; grid: x = row
// tiles of 128 rows, y = token tiles of 16*TOKEN_TILES. The block's 16*TOKEN_TILES tokens are staged once per
// super-block by all threads and shared by the 8 warps; each warp owns 16 weight rows x 16*TOKEN_TILES tokens.
// The register cap matches the occupancy shared memory allows anyway (53 KB -> 4 blocks per SM, 93 KB -> 2).
template <ciq_type T, int TOKEN_TILES>
__global__ void __launch_bounds__(STAGED_WARPS * CIQ_WARP_SIZE, TOKEN_TILES == 1 ? 4 : 2)
gemm_wmma_block_staged(const uint8_t *__restrict__ weight, int64_t rows, int64_t row_bytes, int superblocks,
                       const uint8_t *__restrict__ x, int64_t tokens, void *__restrict__ out, ciq_out_type out_type) {
    const int warp = threadIdx.x / CIQ_WARP_SIZE, lane = threadIdx.x % CIQ_WARP_SIZE;
    WarpTiles<TOKEN_TILES> &tiles = reinterpret_cast<WarpTiles<TOKEN_TILES> *>(gemm_smem)[warp];
    ActivationTile *act = reinterpret_cast<ActivationTile *>(gemm_smem + STAGED_WARPS * sizeof(WarpTiles<TOKEN_TILES>));
    const int64_t row0 = ((int64_t)blockIdx.x * STAGED_WARPS + warp) * TILE;
    const int64_t tok0 = (int64_t)blockIdx.y * TOKEN_TILES * TILE;
    const int64_t x_row_bytes = (int64_t)superblocks * Q8_K_BLOCK_BYTES;

    float acc[TOKEN_TILES][8] = {};
    for (int sb = 0; sb < superblocks; ++sb) {
        __syncthreads();  // every warp is done with the previous super-block's activations
#pragma unroll
        for (int nt = 0; nt < TOKEN_TILES; ++nt) {
            stage_activations<T, STAGED_WARPS * CIQ_WARP_SIZE>(x, x_row_bytes, tokens, tok0 + nt * TILE, sb, act[nt],
                                                                threadIdx.x);
        }
        dequantize_weight_tile<T>(weight, row_bytes, rows, row0, sb, tiles.w, lane);
        const RowScales<T> scales = load_row_scales<T>(weight, row_bytes, rows, row0 + lane / 2, sb);
        __syncthreads();
        warp_multiply_superblock<T, TOKEN_TILES>(tiles, act, scales, lane, acc);
    }
    store_outputs<TOKEN_TILES>(acc, out, rows, tokens, row0, tok0, lane, out_type);
}

using GemmKernel = void (*)(const uint8_t *, int64_t, int64_t, int, const uint8_t *, int64_t, void *, ciq_out_type);

struct LaunchShape {
    GemmKernel kernel;
    int warps;             // 16 weight rows per warp
    int tokens_per_block;  // grid y covers tokens in steps of this
    size_t shared_bytes;
};

template <ciq_type T>
ciq_status launch_shape(ciq_variant variant, LaunchShape *shape) {
    switch (variant) {
        case CIQ_VARIANT_WMMA:
            *shape = {gemm_wmma_warp_private<T, 4>, 4, TILE, 4 * (sizeof(WarpTiles<1>) + sizeof(ActivationTile))};
            return CIQ_OK;
        case CIQ_VARIANT_WMMA_WIDE:
            *shape = {gemm_wmma_warp_private<T, 8>, 8, TILE, 8 * (sizeof(WarpTiles<1>) + sizeof(ActivationTile))};
            return CIQ_OK;
        case CIQ_VARIANT_WMMA_SHARED:
            *shape = {gemm_wmma_block_staged<T, 1>, STAGED_WARPS, TILE,
                      STAGED_WARPS * sizeof(WarpTiles<1>) + sizeof(ActivationTile)};
            return CIQ_OK;
        case CIQ_VARIANT_WMMA_BIGTILE:
            *shape = {gemm_wmma_block_staged<T, 3>, STAGED_WARPS, 3 * TILE,
                      STAGED_WARPS * sizeof(WarpTiles<3>) + 3 * sizeof(ActivationTile)};
            return CIQ_OK;
        default:
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wmma: variant %d is not a WMMA variant", (int)variant);
    }
}

constexpr int64_t MAX_GRID_Y = 65535;
#if defined(GGML_CIQ_HIP)
constexpr size_t HIP_MAX_LDS_BYTES = 64 * 1024;  // per workgroup on RDNA3/RDNA4: wmma-wide and wmma-bigtile don't fit
#endif

}  // namespace

ciq_status ciq_cuda_gemm_wmma(ciq_variant variant, ciq_type type, const void *weight, int64_t rows, int64_t k,
                              const void *x_q8_K, int64_t tokens, void *out, ciq_out_type out_type) {
    LaunchShape shape{};
    ciq_status status;
    switch (type) {
        case CIQ_TYPE_Q4_K: status = launch_shape<CIQ_TYPE_Q4_K>(variant, &shape); break;
        case CIQ_TYPE_Q6_K: status = launch_shape<CIQ_TYPE_Q6_K>(variant, &shape); break;
        default: return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wmma: unsupported weight type %d", (int)type);
    }
    if (status != CIQ_OK) return status;
#if defined(GGML_CIQ_HIP)
    if (shape.shared_bytes > HIP_MAX_LDS_BYTES) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wmma: variant %d needs %zu B of LDS, an RDNA workgroup gets %zu B",
                        (int)variant, shape.shared_bytes, HIP_MAX_LDS_BYTES);
    }
#endif

    const cudaError_t err = cudaFuncSetAttribute(reinterpret_cast<const void *>(shape.kernel),
                                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shape.shared_bytes);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wmma: %zu B of shared memory: %s", shape.shared_bytes,
                        cudaGetErrorString(err));
    }

    const int superblocks = (int)(k / QK_K);
    const int64_t row_bytes = (int64_t)ciq_weight_row_bytes(type, k);
    const int64_t rows_per_block = (int64_t)shape.warps * TILE;
    const int64_t out_elem_bytes = out_type == CIQ_OUT_F32 ? 4 : 2;
    const int64_t tokens_per_launch = MAX_GRID_Y * shape.tokens_per_block;  // grid y is limited to 65535
    for (int64_t first = 0; first < tokens; first += tokens_per_launch) {
        const int64_t launch_tokens = tokens - first < tokens_per_launch ? tokens - first : tokens_per_launch;
        const dim3 grid((unsigned)((rows + rows_per_block - 1) / rows_per_block),
                        (unsigned)((launch_tokens + shape.tokens_per_block - 1) / shape.tokens_per_block));
        shape.kernel<<<grid, shape.warps * CIQ_WARP_SIZE, shape.shared_bytes, ciq_stream()>>>(
            static_cast<const uint8_t *>(weight), rows, row_bytes, superblocks,
            static_cast<const uint8_t *>(x_q8_K) + first * superblocks * Q8_K_BLOCK_BYTES, launch_tokens,
            static_cast<char *>(out) + first * rows * out_elem_bytes, out_type);
        CIQ_CUDA_LAUNCH_CHECK("gemm_wmma");
    }
    return CIQ_OK;
}
