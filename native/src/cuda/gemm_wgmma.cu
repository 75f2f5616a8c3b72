// gemm_wgmma.cu - Hopper keep-quant GEMM on f16 tensor cores (wgmma, sm_90a), f16 semantics (docs/SEMANTICS.md).
//
// out[t][r] = scale_t * sum_k W16[r][k] * X16[t][k] with fp32 accumulation over the whole K, where
//   X16 = f16(x * 2^-e_t), scale_t = 2^e_t: activations converted once per call (convert_f16.cu), each
//         token with the power of two that puts its largest |x| in (2^14, 2^15] (no f16 overflow, 11-bit mantissa);
//   W16 = the GGUF blocks dequantized in the kernel, one f16 rounding per weight:
//         Q4_K  fma(q, half(d*sc), -half(dmin*m))   (MMQ's fp16 sub-block scale and min)
//         Q6_K  (q - 32) * half(d*sc)
//         Q4_0 (q - 8) * d, Q5_0 (q - 16) * d, Q8_0 q * d   (the 32-value blocks: d their fp16 scale)
// so the block scales are applied while dequantizing and nothing is rescaled per sub-block.
// A weight "unit" is what one split-K share counts in: a K-quant super-block (256 values, 4 pipeline stages) or a
// pair of 32-value blocks (64 values, one stage; K a multiple of 64).
//
// One CTA = PW producer + 2 consumer warpgroups computes a 128-row x BN-token tile over a range of super-blocks
// (split-K when there are fewer tiles than SMs: the CTAs of one tile form a cluster and reduce through distributed
// shared memory). Tiles are numbered row tile first, grid.x from a first tile: a plan may run whole waves unsplit
// and the last, partial wave's tiles split-K in a second launch (wgmma_plan's tail), or stream-K (staged weights
// only): one CTA an SM, each a contiguous range of the tiles' K units, segment by segment, a tile's partial sums handed
// to the CTA that finishes it through global slots and flags (wgmma_stream_k, wgmma_handover; GGML_CIQ_WGMMA_STREAMK).
// A pipeline stage is 64 K values: A = 128 x 64 f16 (16 KB), B = BN x 64 f16, both in wgmma's 128-byte-swizzled
// K-major layout (row r at r*128 B, 16-byte chunk j at (j ^ r%8)*16), STAGES deep.
//   producers (warpgroups 0 .. PW-1): thread 0 issues the TMA copy of the B tile (cp.async.bulk.tensor, zero-filled
//     past the last token); all 128*PW threads dequantize the A tile from the raw GGUF blocks, which either
//     - TMA_W: thread 0 stages in shared memory, one super-block x 128 rows per box, WSLOTS super-blocks ahead
//       (every Q4_K matrix; Q6_K when its 210 B rows have a 16-byte pitch, K % 2048 == 0), or
//     - each thread loads from global memory into registers, PREFETCH stages ahead (other Q6_K matrices, and
//       the 32-value block types, whose 18/22/34-byte blocks no TMA box fits).
//   consumers: rows 64c .. +63, 4 x wgmma m64nBNk16 per stage, one group in flight.
// The RS form (staged weights, every tile; GGML_CIQ_WGMMA_RS, default on): no A tile. Two producer
// threads issue the TMA copies (the B stages; the staged super-blocks), and each consumer thread
// dequantizes its rows' quants from the staged block straight into wgmma's register operand (rs_frag: the same f16
// weights, so the same products): shared memory then carries B and the raw blocks only, which the SS form's A tiles
// (written by the producers, read by every wgmma) exceed at full tensor rate.
// Epilogue: the accumulators go through shared memory (the ring, reused) so that rows are stored coalesced, into
// the tile's output (wgmma_outputs: a stacked weight's rows split among outputs, each with an optional addend).
// Barriers: full[s] (128*PW + 1 arrivals: the producers after their A stores + the TMA thread's expect_tx, plus the
// TMA bytes), empty[s] (one arrival per consumer warp once its wgmma reading slot s retired), wfull[w] (staged
// weights' TMA bytes); producer-only named barrier 2 before a weight slot is refilled.
// Files: the PTX wrappers in wgmma_ptx.cuh; here the tile constants, the producer's dequantizer (raw_stage), the
// kernel as wgmma_produce / wgmma_consume / wgmma_epilogue, and the host planner (pick_plan) and launch.
#include "../counters.h"
#include "wgmma_ptx.cuh"

#include <atomic>
#include <mutex>
#include <vector>

#if !defined(GGML_CIQ_HIP)
#include <cudaTypedefs.h>

#define CIQ_WGMMA_ROWS 128
#define CIQ_WGMMA_KSTAGE 64  // K values per pipeline stage (one 128-byte swizzle atom of f16)
static_assert(CIQ_WGMMA_KSTAGE == F16_K_UNIT, "the f16 layout's K multiple (blocks.h) is one stage");

#define RED_STRIDE (CIQ_WGMMA_ROWS + 4)  // floats per token row of the epilogue's red[] (bank-conflict-free stores)
#define CIQ_WGMMA_MAX_SPLITS 8          // split-K runs inside one cluster (portable cluster size)

#define WSLOTS 2                          // super-blocks of weights staged in shared memory (TMA_W kernels)

// A measurement build, never the default (tools/gpu_run.sh gemm-diag builds it apart): CIQ_WGMMA_DIAG=1 leaves out the
// producers' dequantization (the A tiles keep what the ring holds), 2 the consumers' wgmma (the outputs are 0): the
// time of either side alone, so that a change is aimed at the side that bounds the kernel.
#ifndef CIQ_WGMMA_DIAG
#define CIQ_WGMMA_DIAG 0
#endif

static constexpr __host__ __device__ int wgmma_stage_bytes(int BN) { return CIQ_WGMMA_ROWS * 128 + BN * 128; }
// A staged weight row: one GGUF block in a TMA box of 16-byte multiples. TMA boxes start at 16-byte multiples, so a
// Q6_K block (210 B) lands at offset (210 kb) % 16 <= 14 of its 224-byte box row.
static constexpr __host__ __device__ int wgmma_wbox(ciq_type T) { return T == CIQ_TYPE_Q4_K ? 144 : 224; }
// Pipeline stages (64 K values each) per weight unit, and a unit's bytes in one row.
static constexpr __host__ __device__ bool wgmma_kquant(ciq_type T) { return T == CIQ_TYPE_Q4_K || T == CIQ_TYPE_Q6_K; }
static constexpr __host__ __device__ int wgmma_unit_stages(ciq_type T) { return wgmma_kquant(T) ? 4 : 1; }
static constexpr __host__ __device__ int wgmma_block32_bytes(ciq_type T) {
    return T == CIQ_TYPE_Q4_0 ? Q4_0_BLOCK_BYTES : T == CIQ_TYPE_Q5_0 ? Q5_0_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
}
static constexpr __host__ __device__ int wgmma_unit_bytes(ciq_type T) {
    return T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : T == CIQ_TYPE_Q6_K ? Q6_K_BLOCK_BYTES : 2 * wgmma_block32_bytes(T);
}
static constexpr __host__ __device__ int wgmma_smem_bytes(ciq_type T, int BN, int stages, bool tma_w) {
    return 1024 + stages * wgmma_stage_bytes(BN) + (tma_w ? WSLOTS * CIQ_WGMMA_ROWS * wgmma_wbox(T) : 0) +
           (2 * stages + WSLOTS) * 8;
}

// Tile shapes, as data: BN tokens per CTA and pipeline depth (each fills ~192 KB of shared memory). The host picks
// the shape and the split-K factor per problem (pick_config).
struct wgmma_tile_config {
    int bn;
    int stages;    // weights read from global memory into registers
    int stages_w;  // weights staged in shared memory by TMA (WSLOTS super-blocks take the room of the rest)
    int producers; // producer warpgroups (the consumers are always 2)
    int stages_rs; // the RS form (staged weights, A from registers): B-only stages
};
static constexpr wgmma_tile_config k_wgmma_configs[] = {{64, 8, 7, 2, 16}, {128, 6, 5, 2, 8}, {256, 4, 3, 1, 4}};
static constexpr int k_wgmma_config_count = sizeof(k_wgmma_configs) / sizeof(k_wgmma_configs[0]);
static_assert(wgmma_smem_bytes(CIQ_TYPE_Q6_K, 64, 7, true) <= 232448 && wgmma_smem_bytes(CIQ_TYPE_Q6_K, 128, 5, true) <= 232448 &&
                  wgmma_smem_bytes(CIQ_TYPE_Q6_K, 256, 3, true) <= 232448 && wgmma_smem_bytes(CIQ_TYPE_Q6_K, 64, 8, false) <= 232448,
              "227 KB of shared memory per CTA");
// The RS form (A from registers; GGML_CIQ_WGMMA_RS): no A tiles in the ring, RS_WSLOTS staged super-blocks whose rows
// are wgmma_rs_wbox bytes apart (Q6_K: 240, so that 8 rows' 16-bit loads fall in distinct banks; 224 would put rows r and
// r + 4 in the same ones).
#define RS_WSLOTS 3
static constexpr __host__ __device__ int wgmma_rs_wbox(ciq_type T) { return T == CIQ_TYPE_Q4_K ? 144 : 240; }
static constexpr __host__ __device__ int wgmma_rs_smem_bytes(ciq_type T, int BN, int stages) {
    return 1024 + stages * BN * 128 + RS_WSLOTS * CIQ_WGMMA_ROWS * wgmma_rs_wbox(T) + (2 * stages + 2 * RS_WSLOTS) * 8;
}
static_assert(wgmma_rs_smem_bytes(CIQ_TYPE_Q6_K, 64, 16) <= 232448 && wgmma_rs_smem_bytes(CIQ_TYPE_Q6_K, 128, 8) <= 232448 &&
                  wgmma_rs_smem_bytes(CIQ_TYPE_Q6_K, 256, 4) <= 232448,
              "227 KB of shared memory per CTA (RS)");
// The RS epilogue's red[BN][RED_STRIDE] reuses the B ring and, at 256 tokens, the staged-weight slots after it (all
// consumed by then: no TMA writes them until the next segment, after the CTA-wide barrier between segments).
static_assert(64 * RED_STRIDE * 4 <= 16 * 64 * 128 && 128 * RED_STRIDE * 4 <= 8 * 128 * 128 &&
                  256 * RED_STRIDE * 4 <= 4 * 256 * 128 + RS_WSLOTS * CIQ_WGMMA_ROWS * wgmma_rs_wbox(CIQ_TYPE_Q4_K),
              "the RS epilogue's red[BN][RED_STRIDE] fits the ring and the weight slots");
static_assert(256 * RED_STRIDE * 4 <= 3 * wgmma_stage_bytes(256) && 128 * RED_STRIDE * 4 <= 5 * wgmma_stage_bytes(128) &&
                  64 * RED_STRIDE * 4 <= 7 * wgmma_stage_bytes(64),
              "the epilogue's red[BN][RED_STRIDE] reuses the pipeline ring");

// Where the epilogue stores: the product's rows split among up to CIQ_GEMM_OUTPUTS_MAX outputs (ciq_gemm_output),
// output s holding rows row_end[s-1] .. row_end[s]-1 as [tokens][its rows], each plus an optional float32 addend. Every
// boundary but the last is a multiple of CIQ_WGMMA_ROWS, so a tile writes to one output. vec bit s: float4 stores
// (float32, rows % 4 == 0, out and add 16-byte aligned). glu (1 silu, 2 gelu; n 1, no addend): the product's rows
// interleave gate's and up's 64 at a time (ciq_gemm_quantized_glu), so a tile's rows 0..63 are gate's and 64..127
// up's same rows; out [tokens][rows/2] float32 = ciq_glu_value of the two (vec: out 16-byte aligned).
struct wgmma_outputs {
    int n, vec, glu;
    int64_t row_end[CIQ_GEMM_OUTPUTS_MAX];
    void *out[CIQ_GEMM_OUTPUTS_MAX];
    const float *add[CIQ_GEMM_OUTPUTS_MAX];
};

// Stream-K's hand-over of a tile between CTAs (wgmma_stream_k): a CTA that ends inside a tile (its owner) adds the
// partial sums of the `peers` CTAs after it, which covered the rest of the tile's K at the start of their ranges and
// stored them in their slots of `partial` (BN x 128 floats, [token][row]) before raising their flags. The owner adds
// them in CTA order (deterministic) and lowers the flags for the next launch.
struct wgmma_handover {
    bool contribute;  // this segment's sums go to the CTA's slot of partial (and its flag), not to the output
    int peers;        // owner: the CTAs blockIdx.x + 1 .. + peers whose partials it adds
    float *partial;
    int *flags;
};

// A stream-K launch (wgmma_plan's tail_ctas): `tiles` tiles from the launch's first, their units (tile after tile, K
// within a tile) cut into gridDim.x near-equal contiguous ranges, one a CTA; tiles 0: an ordinary launch (one tile a
// CTA, split-K over a cluster on grid.z). partial: BN x 128 floats a CTA, flags: one int a CTA, all 0 between launches.
struct wgmma_stream_k {
    int64_t tiles;
    float *partial;
    int *flags;
};

#ifdef CIQ_WGMMA_DEVICE
// ---- producer: raw blocks -> f16 A tile -------------------------------------------------------------------------

static __device__ __forceinline__ void sts128(uint8_t *p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(smem_u32(p)), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// Chunks i and i + 4 of row r (o[0], o[1]) into the swizzled tile.
static __device__ __forceinline__ void store_pair(uint8_t *a_tile, int r, int i, const uint32_t (&o)[2][4]) {
    uint8_t *row = a_tile + r * 128;
    sts128(row + ((i ^ (r & 7)) << 4), o[0][0], o[0][1], o[0][2], o[0][3]);
    sts128(row + (((i + 4) ^ (r & 7)) << 4), o[1][0], o[1][1], o[1][2], o[1][3]);
}

// Bytes 0..3 of v as f16 (1024 + v_n) pairs {v0, v1} and {v2, v3}, minus `bias`: exact small integers.
static __device__ __forceinline__ void bytes_to_half2(uint32_t v, __half2 bias, __half2 &lo, __half2 &hi) {
    const uint32_t a = __byte_perm(v, 0x64646464u, 0x4140), b = __byte_perm(v, 0x64646464u, 0x4342);
    lo = __hsub2(*(const __half2 *)&a, bias);
    hi = __hsub2(*(const __half2 *)&b, bias);
}

// 8 bytes at a 2-byte-aligned address (Q6_K blocks are 210 B): three aligned words, funnel-shifted. (Deferring the
// shifts to dequantization keeps the loads in flight longer but costs 1.5x the registers: measured slower.)
static __device__ __forceinline__ uint2 ldg8_a2(const uint8_t *p) {
    const uint32_t *a = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
    const uint32_t sh = 8 * ((uintptr_t)p & 3);
    const uint32_t w0 = __ldg(a), w1 = __ldg(a + 1), w2 = __ldg(a + 2);
    return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// R rows per producer thread, RSTEP apart. SMEM: the blocks were staged in shared memory by TMA (each row's block
// at a 16-byte-aligned offset); otherwise they are read from global memory.
template <ciq_type T, int R, bool SMEM> struct raw_stage;

static __device__ __forceinline__ uint2 lds8_a2(const uint8_t *p) {  // ldg8_a2 from shared memory
    const uint32_t *a = (const uint32_t *)(p - ((uintptr_t)p & 3));
    const uint32_t sh = 8 * ((uintptr_t)p & 3);
    return make_uint2(__funnelshift_r(a[0], a[1], sh), __funnelshift_r(a[1], a[2], sh));
}

template <bool SMEM, typename V> static __device__ __forceinline__ V ld(const uint8_t *p) {
    if constexpr (SMEM) return *(const V *)p;
    else return __ldg((const V *)p);
}

// Q4_K: per row p the 8 qs bytes 32c + 8i .. +7 (low nibbles: chunk i, sub-block 2c; high: chunk i+4, 2c+1) and
// the 16-byte header {d, dmin, scales[12]}.
template <int R, bool SMEM> struct raw_stage<CIQ_TYPE_Q4_K, R, SMEM> {  // staged only: Q4_K rows always allow TMA
    static_assert(SMEM, "Q4_K blocks are read from shared memory");
    static constexpr int RSTEP = CIQ_WGMMA_ROWS / R;
    uint2 qs[R];
    uint4 hdr[R];
    __device__ __forceinline__ void load(const uint8_t *const (&blk)[R], int c, int i) {
#pragma unroll
        for (int p = 0; p < R; ++p) {
            qs[p] = ld<true, uint2>(blk[p] + 16 + 32 * c + 8 * i);
            hdr[p] = ld<true, uint4>(blk[p]);
        }
    }
    static __device__ __forceinline__ uint32_t scale_byte(const uint4 &h, int n) {  // scales[n]
        const uint32_t w = n < 4 ? h.y : n < 8 ? h.z : h.w;
        return (w >> 8 * (n % 4)) & 0xFF;
    }
    static __device__ __forceinline__ void scale_min(const uint4 &h, int j, __half2 &s, __half2 &nm) {
        uint32_t sc, m;  // ggml's get_scale_min_k4
        if (j < 4) {
            sc = scale_byte(h, j) & 63;
            m = scale_byte(h, j + 4) & 63;
        } else {
            sc = (scale_byte(h, j + 4) & 0xF) | (scale_byte(h, j - 4) >> 6) << 4;
            m = (scale_byte(h, j + 4) >> 4) | (scale_byte(h, j) >> 6) << 4;
        }
        const __half2 dm = *(const __half2 *)&h.x;
        s = __half2half2(__float2half_rn(__low2float(dm) * (float)sc));
        nm = __half2half2(__hneg(__float2half_rn(__high2float(dm) * (float)m)));
    }
    __device__ __forceinline__ void dequant(uint8_t *a_tile, int c, int i, int r0) const {
        const __half2 bias = __half2half2(__ushort_as_half(0x6400));  // 1024
#pragma unroll
        for (int p = 0; p < R; ++p) {
            const int r = r0 + RSTEP * p;
            __half2 s0, nm0, s1, nm1;
            scale_min(hdr[p], 2 * c, s0, nm0);
            scale_min(hdr[p], 2 * c + 1, s1, nm1);
            uint32_t o[2][4];
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const uint32_t q = w ? qs[p].y : qs[p].x;
                __half2 l0, l1, h0, h1;
                bytes_to_half2(q & 0x0F0F0F0F, bias, l0, l1);
                bytes_to_half2((q >> 4) & 0x0F0F0F0F, bias, h0, h1);
                o[0][2 * w] = h2u(__hfma2(l0, s0, nm0));
                o[0][2 * w + 1] = h2u(__hfma2(l1, s0, nm0));
                o[1][2 * w] = h2u(__hfma2(h0, s1, nm1));
                o[1][2 * w + 1] = h2u(__hfma2(h1, s1, nm1));
            }
            store_pair(a_tile, r, i, o);
        }
    }
};

// Q6_K, stage c = half h (c/2), nibble (c%2): per row p the ql bytes 64h + 8i .. +7 (chunk i) and 64h + 32 + 8i
// (chunk i+4), the qh bytes 32h + 8i .. +7 (both chunks: bit pairs 2(2(c%2)) and 2(2(c%2)+1)), the two scales
// 8h + 4(c%2) + i/2 (+2) and d.
template <int R, bool SMEM> struct raw_stage<CIQ_TYPE_Q6_K, R, SMEM> {
    static constexpr int RSTEP = CIQ_WGMMA_ROWS / R;
    uint2 ql[R][2], qh[R];
    int sc[R][2];
    uint16_t d[R];
    __device__ __forceinline__ void load(const uint8_t *const (&blk)[R], int c, int i) {
        const int h = c / 2, odd = c % 2;
#pragma unroll
        for (int p = 0; p < R; ++p) {
            if constexpr (SMEM) {  // 2-byte aligned in shared memory too (TMA boxes start at 16-byte multiples)
                ql[p][0] = lds8_a2(blk[p] + 64 * h + 8 * i);
                ql[p][1] = lds8_a2(blk[p] + 64 * h + 32 + 8 * i);
                qh[p] = lds8_a2(blk[p] + 128 + 32 * h + 8 * i);
            } else {
                ql[p][0] = ldg8_a2(blk[p] + 64 * h + 8 * i);
                ql[p][1] = ldg8_a2(blk[p] + 64 * h + 32 + 8 * i);
                qh[p] = ldg8_a2(blk[p] + 128 + 32 * h + 8 * i);
            }
            sc[p][0] = (int8_t)ld<SMEM, uint8_t>(blk[p] + 192 + 8 * h + 4 * odd + i / 2);
            sc[p][1] = (int8_t)ld<SMEM, uint8_t>(blk[p] + 192 + 8 * h + 4 * odd + 2 + i / 2);
            d[p] = ld<SMEM, uint16_t>(blk[p] + 208);
        }
    }
    __device__ __forceinline__ void dequant(uint8_t *a_tile, int c, int i, int r0) const {
        const int odd = c % 2;
        const __half2 bias = __half2half2(__ushort_as_half(0x6420));  // 1024 + 32
#pragma unroll
        for (int p = 0; p < R; ++p) {
            const int r = r0 + RSTEP * p;
            const float df = __half2float(__ushort_as_half(d[p]));
            const uint2 hb2 = qh[p];
            uint32_t o[2][4];
#pragma unroll
            for (int ch = 0; ch < 2; ++ch) {
                const __half2 s = __half2half2(__float2half_rn(df * (float)sc[p][ch]));
                const int shift = 2 * (2 * odd + ch);
                const uint2 q2 = ql[p][ch];
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const uint32_t q = w ? q2.y : q2.x, hb = w ? hb2.y : hb2.x;
                    const uint32_t v = ((odd ? q >> 4 : q) & 0x0F0F0F0F) | ((hb >> shift) & 0x03030303) << 4;
                    __half2 v0, v1;
                    bytes_to_half2(v, bias, v0, v1);
                    o[ch][2 * w] = h2u(__hmul2(v0, s));
                    o[ch][2 * w + 1] = h2u(__hmul2(v1, s));
                }
            }
            store_pair(a_tile, r, i, o);
        }
    }
};

// The 32-value block types, read from global memory: a stage is blocks b = 0, 1 of the unit; chunk i of the stage
// (values 8i .. 8i+7 of block 0) and chunk i + 4 (the same of block 1). Per row p and block b: the 8 quant bytes,
// Q5_0's high-bit byte and the fp16 d. Bytes become f16 (1024 + byte) less a bias (exact small integers), times d:
// one f16 rounding of q * d, as dequantize_f16 in ggml_ciq/quants.py.
//   Q8_0 {d, qs[32]}: value j = int8 qs[j]                          (byte ^ 0x80 less 1152)
//   Q4_0 {d, qs[16]}: value j = nibble j of qs (low: j < 16) - 8     (less 1032)
//   Q5_0 {d, qh[4], qs[16]}: the same nibble | bit j of qh << 4, - 16 (less 1040)
// 8 bytes at a 2-byte-aligned address as four 16-bit loads: never a byte past them (ldg8_a2's three aligned words
// may read up to 4 bytes past, beyond a buffer that ends with the block: a Q4_0/Q5_0/Q8_0 block's last chunk is its
// last 8 bytes).
static __device__ __forceinline__ uint2 ldg8_u16(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return make_uint2(__ldg(h) | (uint32_t)__ldg(h + 1) << 16, __ldg(h + 2) | (uint32_t)__ldg(h + 3) << 16);
}

template <ciq_type T, int R> struct raw_stage_block32 {
    static constexpr int RSTEP = CIQ_WGMMA_ROWS / R, BYTES = wgmma_block32_bytes(T);
    static constexpr int QS = T == CIQ_TYPE_Q5_0 ? 6 : 2;  // offset of qs in the block
    uint2 q[R][2];
    uint16_t d[R][2];
    uint8_t h[R][2];  // Q5_0: qh byte i (the high bits of chunk i's 8 values)
    __device__ __forceinline__ void load(const uint8_t *const (&blk)[R], int, int i) {
#pragma unroll
        for (int p = 0; p < R; ++p)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const uint8_t *bp = blk[p] + BYTES * b;
                q[p][b] = ldg8_u16(bp + QS + (T == CIQ_TYPE_Q8_0 ? 8 * i : 8 * (i & 1)));
                d[p][b] = __ldg((const uint16_t *)bp);
                if constexpr (T == CIQ_TYPE_Q5_0) h[p][b] = __ldg(bp + 2 + i);
            }
    }
    // Bit n of the 4 bits hb4 to bit 4 of byte n.
    static __device__ __forceinline__ uint32_t spread4(uint32_t hb4) {
        return (hb4 & 1) << 4 | (hb4 & 2) << 11 | (hb4 & 4) << 18 | (hb4 & 8) << 25;
    }
    __device__ __forceinline__ void dequant(uint8_t *a_tile, int, int i, int r0) const {
        const __half2 bias = __half2half2(__ushort_as_half(T == CIQ_TYPE_Q8_0 ? 0x6480 : T == CIQ_TYPE_Q5_0 ? 0x6410 : 0x6408));
        const int shift = T == CIQ_TYPE_Q8_0 ? 0 : 4 * (i >> 1);  // chunks 2, 3: the high nibbles
#pragma unroll
        for (int p = 0; p < R; ++p) {
            uint32_t o[2][4];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const __half2 d2 = __half2half2(__ushort_as_half(d[p][b]));
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const uint32_t word = w ? q[p][b].y : q[p][b].x;
                    uint32_t v;
                    if constexpr (T == CIQ_TYPE_Q8_0) v = word ^ 0x80808080u;
                    else v = (word >> shift) & 0x0F0F0F0Fu;
                    if constexpr (T == CIQ_TYPE_Q5_0) v |= spread4((uint32_t)(h[p][b] >> (4 * w)) & 0xF);
                    __half2 v0, v1;
                    bytes_to_half2(v, bias, v0, v1);
                    o[b][2 * w] = h2u(__hmul2(v0, d2));
                    o[b][2 * w + 1] = h2u(__hmul2(v1, d2));
                }
            }
            store_pair(a_tile, r0 + RSTEP * p, i, o);
        }
    }
};
template <int R> struct raw_stage<CIQ_TYPE_Q4_0, R, false> : raw_stage_block32<CIQ_TYPE_Q4_0, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q5_0, R, false> : raw_stage_block32<CIQ_TYPE_Q5_0, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q8_0, R, false> : raw_stage_block32<CIQ_TYPE_Q8_0, R> {};

// ---- the RS form: a consumer thread's A fragments from the staged blocks ----------------------------------------
// wgmma's register A operand is, per warp, the m16k16 fragment of its 16 rows: thread (g, q) = (lane/4, lane%4) holds
// a[0] = row g, K 2q and 2q+1 of the slice; a[1] row g+8; a[2] row g, K 2q+8, 2q+9; a[3] row g+8, K 2q+8, 2q+9. A
// stage (64 K values) is four such slices, a[j] slice j = K 16j .. 16j+15 of the stage. Each weight is the f16 value
// raw_stage gives it (the same operations), so an RS kernel's products are the SS kernel's bits. blk[p]: the staged
// block of row g + 8p (2-byte aligned: Q6_K blocks land at even offsets of their box rows).
static __device__ __forceinline__ uint32_t lds16(const uint8_t *p) { return *(const uint16_t *)p; }
static __device__ __forceinline__ uint32_t lds16x2(const uint8_t *p, int apart) {  // {p[0..1], p[apart..apart+1]}
    return lds16(p) | lds16(p + apart) << 16;
}
template <ciq_type T> struct rs_frag;

// Q4_K stage c: qs bytes 32c .. 32c+31; slice j takes the bytes 16(j%2) + 2q (+1) and + 8, low nibbles for j < 2
// (sub-block 2c), high for j >= 2 (2c+1).
template <> struct rs_frag<CIQ_TYPE_Q4_K> {
    uint4 hdr[2];
    __device__ __forceinline__ void header(const uint8_t *const (&blk)[2]) {
        hdr[0] = *(const uint4 *)blk[0];
        hdr[1] = *(const uint4 *)blk[1];
    }
    __device__ __forceinline__ void build(const uint8_t *const (&blk)[2], int c, int q, uint32_t (&a)[4][4]) const {
        using raw = raw_stage<CIQ_TYPE_Q4_K, 4, true>;
        const __half2 bias = __half2half2(__ushort_as_half(0x6400));  // 1024
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint8_t *qs = blk[p] + 16 + 32 * c + 2 * q;
            const uint32_t w[2] = {lds16x2(qs, 8), lds16x2(qs + 16, 8)};
            __half2 s[2], nm[2];
            raw::scale_min(hdr[p], 2 * c, s[0], nm[0]);
            raw::scale_min(hdr[p], 2 * c + 1, s[1], nm[1]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                __half2 lo, hi;
                bytes_to_half2((j < 2 ? w[j % 2] : w[j % 2] >> 4) & 0x0F0F0F0F, bias, lo, hi);
                a[j][p] = h2u(__hfma2(lo, s[j / 2], nm[j / 2]));
                a[j][p + 2] = h2u(__hfma2(hi, s[j / 2], nm[j / 2]));
            }
        }
    }
};

// Q6_K stage c = half h (c/2), nibble odd (c%2): slice j takes the ql bytes 64h + 16j + 2q (+1) and + 8, the qh bytes
// 32h + 16(j%2) + 2q (+1) and + 8 (bit pair 2(2 odd + j/2)), and scale 8h + 4 odd + j.
template <> struct rs_frag<CIQ_TYPE_Q6_K> {
    float df[2];
    __device__ __forceinline__ void header(const uint8_t *const (&blk)[2]) {
        df[0] = __half2float(__ushort_as_half((uint16_t)lds16(blk[0] + 208)));
        df[1] = __half2float(__ushort_as_half((uint16_t)lds16(blk[1] + 208)));
    }
    __device__ __forceinline__ void build(const uint8_t *const (&blk)[2], int c, int q, uint32_t (&a)[4][4]) const {
        const int h = c / 2, odd = c % 2;
        const __half2 bias = __half2half2(__ushort_as_half(0x6420));  // 1024 + 32
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint8_t *ql = blk[p] + 64 * h + 2 * q, *qh = blk[p] + 128 + 32 * h + 2 * q;
            const uint32_t hb[2] = {lds16x2(qh, 8), lds16x2(qh + 16, 8)};
            const uint32_t sc = lds16x2(blk[p] + 192 + 8 * h + 4 * odd, 2);  // the stage's 4 scales
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const uint32_t l = lds16x2(ql + 16 * j, 8);
                const uint32_t v = ((odd ? l >> 4 : l) & 0x0F0F0F0F) | ((hb[j % 2] >> (2 * (2 * odd + j / 2))) & 0x03030303) << 4;
                const __half2 sj = __half2half2(__float2half_rn(df[p] * (float)(int8_t)(sc >> 8 * j)));
                __half2 lo, hi;
                bytes_to_half2(v, bias, lo, hi);
                a[j][p] = h2u(__hmul2(lo, sj));
                a[j][p + 2] = h2u(__hmul2(hi, sj));
            }
        }
    }
};

// ---- the kernel: produce, consume, epilogue ----------------------------------------------------------------------
// Shared memory of one CTA (1024-byte aligned): the ring of STAGES stages (A tile, then B tile), then TMA_W's WSLOTS
// staged weight slots, then the barriers full[STAGES], empty[STAGES], wfull[WSLOTS].

// Producer warpgroups (threads 0 .. 128 PW - 1): per stage the B tile by TMA and the A tile dequantized, then
// full[slot]; a slot is refilled after empty[slot]. Ends with the CTA-wide barrier 1 that frees the ring.
// One segment of the CTA's work (units kb0 .. of one tile): it0 ring stages and sb0 staged super-blocks went before it
// in this CTA (stream-K runs several segments; the barriers' phases continue).
template <ciq_type T, int BN, int STAGES, int PW, bool TMA_W>
static __device__ __forceinline__ void wgmma_produce(const CUtensorMap &xmap, const CUtensorMap &wmap,
                                                     const uint8_t *w, int64_t rows, int nb,
                                                     uint8_t *smem, uint8_t *wraw, uint64_t *full, uint64_t *empty,
                                                     uint64_t *wfull, int kb0, int iters, int64_t row0, int tok0,
                                                     int it0, int sb0) {
    constexpr int A_BYTES = CIQ_WGMMA_ROWS * 128, STAGE = wgmma_stage_bytes(BN);
    constexpr int block_bytes = wgmma_unit_bytes(T), SPU = wgmma_unit_stages(T);
    static_assert(wgmma_kquant(T) || !TMA_W, "32-value blocks are read from global memory");
    constexpr int R = 4 / PW;  // rows per thread, 128 / R apart
    // Thread t: 8-byte column group i = t % 4 of rows r0 + (128 / R) p. The 8 threads of a 128-bit store phase
    // take rows r and r + 4 (row swizzles differing in bit 2), so their chunks fall in 8 distinct bank groups.
    const int t = threadIdx.x, i = t % 4, g = t / 4, r0 = (g & ~7) | (g & 1) << 2 | (g >> 1 & 3);
    // One pipeline stage: the B tile by TMA (thread 0), the A tile dequantized from `raw`.
    auto stage = [&](const raw_stage<T, R, TMA_W> &raw, int it, int c) {
        const int ring = it0 + it, slot = ring % STAGES;
        if (ring >= STAGES) mbar_wait(&empty[slot], ((ring / STAGES) + 1) & 1);
        uint8_t *a_tile = smem + slot * STAGE;
        if (t == 0) {
            mbar_arrive_expect_tx(&full[slot], BN * 128);
            // K of this stage: the same value either way; the K-quants' expression kept (their SASS unchanged)
            const int kx = SPU == 4 ? (kb0 + it / 4) * QK_K + CIQ_WGMMA_KSTAGE * c : (kb0 + it) * CIQ_WGMMA_KSTAGE;
            tma_load_2d(a_tile + A_BYTES, &xmap, kx, tok0, &full[slot]);
        }
        if constexpr (CIQ_WGMMA_DIAG != 1) raw.dequant(a_tile, c, i, r0);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // A stores -> visible to wgmma
        mbar_arrive(&full[slot]);
    };
    if constexpr (TMA_W) {  // super-block sb's 128 rows staged by TMA in wraw slot sb % WSLOTS, WSLOTS - 1 ahead
        constexpr int WB = wgmma_wbox(T);
        const int nsb = iters / 4;
        auto issue = [&](int sb) {  // sb: this segment's; its slot and phase count the CTA's staged super-blocks
            uint64_t *bar = &wfull[(sb0 + sb) % WSLOTS];
            mbar_arrive_expect_tx(bar, CIQ_WGMMA_ROWS * WB);
            tma_load_2d(wraw + ((sb0 + sb) % WSLOTS) * CIQ_WGMMA_ROWS * WB, &wmap, (kb0 + sb) * block_bytes & ~15,
                        (int)row0, bar);
        };
        if (t == 0) {  // weights: nothing before writes them (a later segment: the slots' last readers passed barrier 2)
            if (sb0 > 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            for (int sb = 0; sb < WSLOTS && sb < nsb; ++sb) issue(sb);
        }
        wait_for_previous_grid();
        for (int sb = 0; sb < nsb; ++sb) {
            const int slot = (sb0 + sb) % WSLOTS;
            const uint8_t *wslot = wraw + slot * CIQ_WGMMA_ROWS * WB + ((kb0 + sb) * block_bytes & 15);
            const uint8_t *blk[R];
#pragma unroll
            for (int p = 0; p < R; ++p) blk[p] = wslot + (r0 + CIQ_WGMMA_ROWS / R * p) * WB;
            mbar_wait(&wfull[slot], ((sb0 + sb) / WSLOTS) & 1);
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                raw_stage<T, R, true> raw;
                raw.load(blk, c, i);
                stage(raw, 4 * sb + c, c);
            }
            asm volatile("bar.sync 2, %0;" ::"n"(128 * PW) : "memory");  // every producer is done with the slot
            if (t == 0 && sb + WSLOTS < nsb) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(sb + WSLOTS);
            }
        }
    } else {  // raw blocks from global memory into registers, PREFETCH stages ahead
        // 2, except Q6_K and Q5_0 with one producer warpgroup (4 rows per thread), whose third raw set spills
        // (ptxas -v; cuobjdump --dump-resource-usage: Q5_0 at 168 registers and an 8-byte stack with 2).
        constexpr int PREFETCH = (T == CIQ_TYPE_Q6_K || T == CIQ_TYPE_Q5_0) && PW == 1 ? 1 : 2;
        static_assert(SPU == 4 || SPU == 1, "K-quant super-blocks (4 stages) or 32-value block pairs (1)");
        const int64_t row_bytes = (int64_t)nb * block_bytes;
        const uint8_t *rowp[R];
#pragma unroll
        for (int p = 0; p < R; ++p) rowp[p] = w + min(row0 + r0 + 128 / R * p, rows - 1) * row_bytes;  // tail: last row
        auto load = [&](raw_stage<T, R, false> &raw, int it) {
            const uint8_t *blk[R];
#pragma unroll
            for (int p = 0; p < R; ++p) blk[p] = rowp[p] + (int64_t)(kb0 + it / SPU) * block_bytes;
            raw.load(blk, it % SPU, i);
        };
        // Raw sets in a ring whose slots are compile-time: K-quants unroll a super-block (RING divides its 4 stages),
        // the 32-value types PREFETCH + 1 stages at a time (iters need not be a multiple).
        constexpr int RING = SPU == 1 ? PREFETCH + 1 : 4 % (PREFETCH + 1) == 0 ? PREFETCH + 1 : 4;
        constexpr int UNROLL = SPU == 1 ? RING : 4;
        raw_stage<T, R, false> raw[RING];  // stage it lives in raw[it % UNROLL % RING]
#pragma unroll
        for (int c = 0; c < PREFETCH; ++c)
            if (c < iters) load(raw[c], c);
        wait_for_previous_grid();
        for (int base = 0; base < iters; base += UNROLL) {  // the stage index c is a constant
#pragma unroll
            for (int c = 0; c < UNROLL; ++c) {
                if (SPU == 1 && base + c >= iters) break;
                if (base + c + PREFETCH < iters) load(raw[(c + PREFETCH) % RING], base + c + PREFETCH);
                stage(raw[c % RING], base + c, c % SPU);
            }
        }
    }
    bar_sync_all();  // the ring is reused for the epilogue once every wgmma has retired
}

// Consumer warpgroup cw (rows 64 cw .. +63 of the tile): per stage waits full[slot], 4 wgmma steps, and frees the
// previous stage's slot (empty) once its group retired; then the accumulators into red[token][row] (the ring).
// acc is the kernel's array (declared at the call): the machine code is then byte-identical to the one-body kernel.
// D fragment: acc[4j + e] = row 16*warp + lane/4 + 8(e/2), token 8j + 2(lane%4) + e%2 -> red[token][row] (the ring)
template <int BN> static __device__ __forceinline__ void acc_to_red(uint8_t *smem, int cw, const float (&acc)[BN / 2]) {
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    float *red = (float *)smem;
    const int rl = 64 * cw + 16 * warp + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) red[(8 * j + 2 * (lane % 4) + e % 2) * RED_STRIDE + rl + 8 * (e / 2)] = acc[4 * j + e];
}

template <int BN, int STAGES, int PW>
static __device__ __forceinline__ void wgmma_consume(uint8_t *smem, uint64_t *full, uint64_t *empty, int iters,
                                                     int it0, float (&acc)[BN / 2]) {
    constexpr int A_BYTES = CIQ_WGMMA_ROWS * 128, STAGE = wgmma_stage_bytes(BN);
    wait_for_previous_grid();
    const int cw = threadIdx.x / 128 - PW, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
    for (int it = 0; it < iters; ++it) {
        const int ring = it0 + it, slot = ring % STAGES;  // it0: stages of this CTA's earlier segments
        mbar_wait(&full[slot], (ring / STAGES) & 1);
        const uint8_t *a_tile = smem + slot * STAGE;
        const uint64_t da = smem_desc(a_tile + cw * 64 * 128), db = smem_desc(a_tile + A_BYTES);
        wgmma_fence();
        if constexpr (CIQ_WGMMA_DIAG != 2) {
#pragma unroll
            for (int kk = 0; kk < CIQ_WGMMA_KSTAGE / 16; ++kk) wgmma_tile<BN>(acc, da + 2 * kk, db + 2 * kk);  // +32 B
        }
        wgmma_commit();
        wgmma_wait<1>();  // the group of it-1 has retired: its slot is free
        if (it > 0 && lane == 0) mbar_arrive(&empty[(ring - 1) % STAGES]);
    }
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(&empty[(it0 + iters - 1) % STAGES]);  // the last stage's slot (a next segment refills it)
    bar_sync_all();
    acc_to_red<BN>(smem, cw, acc);
}

// ---- the RS form (GGML_CIQ_WGMMA_RS): the consumers dequantize into wgmma's register operand ---------------------
// Shared memory traffic per product is what bounds the SS form (A written by the producers, then read by wgmma);
// here the producer warpgroup (after the two consumer warpgroups, its registers given to them) only issues TMA copies:
// thread 256 the B stages (after the PDL wait), thread 288 (another warp: neither's waits hold up the other) the staged
// super-blocks (RS_WSLOTS slots; wempty: the 8 consumer warps' reads of a slot done); the consumers read their rows'
// quants from the staged block, build the A fragments (rs_frag) and issue wgmma with A from registers. Fragments
// alternate between two register sets: a stage's wgmma group may still run while the next stage's set is built, and a
// set is rebuilt only after wait_group(1) retired the group that read it. SLOT: the bytes between staged-weight slots
// (a grouped kernel's two types share the larger type's slots).
template <ciq_type T, int BN, int STAGES, int SLOT = CIQ_WGMMA_ROWS * wgmma_rs_wbox(T)>
static __device__ __forceinline__ void wgmma_produce_rs(const CUtensorMap &xmap, const CUtensorMap &wmap, uint8_t *smem,
                                                        uint8_t *wraw, uint64_t *full, uint64_t *empty, uint64_t *wfull,
                                                        uint64_t *wempty, int kb0, int nsb, int64_t wrow0, int tok0,
                                                        int it0, int sb0) {
    constexpr int WB = wgmma_rs_wbox(T), block_bytes = wgmma_unit_bytes(T);  // wrow0: the tile's first row in wmap
    if (threadIdx.x == 288) {  // weights (warp 9): no kernel writes them, so before the PDL wait
        for (int sb = 0; sb < nsb; ++sb) {
            const int n = sb0 + sb, ws = n % RS_WSLOTS;
            if (n >= RS_WSLOTS) mbar_wait(&wempty[ws], ((n / RS_WSLOTS) + 1) & 1);
            mbar_arrive_expect_tx(&wfull[ws], CIQ_WGMMA_ROWS * WB);
            tma_load_2d(wraw + ws * SLOT, &wmap, (kb0 + sb) * block_bytes & ~15, (int)wrow0, &wfull[ws]);
        }
    } else if (threadIdx.x == 256) {  // activations (warp 8)
        wait_for_previous_grid();
        for (int it = 0; it < 4 * nsb; ++it) {
            const int ring = it0 + it, slot = ring % STAGES;
            if (ring >= STAGES) mbar_wait(&empty[slot], ((ring / STAGES) + 1) & 1);
            mbar_arrive_expect_tx(&full[slot], BN * 128);
            tma_load_2d(smem + slot * BN * 128, &xmap, (kb0 + it / 4) * QK_K + CIQ_WGMMA_KSTAGE * (it % 4), tok0, &full[slot]);
        }
    }
    bar_sync_all();  // the ring is reused for the epilogue once every wgmma has retired
}

template <ciq_type T, int BN, int STAGES, int SLOT = CIQ_WGMMA_ROWS * wgmma_rs_wbox(T)>
static __device__ __forceinline__ void wgmma_consume_rs(uint8_t *smem, const uint8_t *wraw, uint64_t *full,
                                                        uint64_t *empty, uint64_t *wfull, uint64_t *wempty, int kb0,
                                                        int nsb, int it0, int sb0, float (&acc)[BN / 2]) {
    constexpr int WB = wgmma_rs_wbox(T), block_bytes = wgmma_unit_bytes(T);
    wait_for_previous_grid();
    const int cw = threadIdx.x / 128, warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;  // warpgroups 0, 1
    const int row = 64 * cw + 16 * warp + lane / 4;
#pragma unroll
    for (int j = 0; j < BN / 2; ++j) acc[j] = 0.0f;
    uint32_t a[2][4][4];
    for (int sb = 0; sb < nsb; ++sb) {
        const int n = sb0 + sb, ws = n % RS_WSLOTS;
        const uint8_t *base = wraw + ws * SLOT + ((kb0 + sb) * block_bytes & 15);
        const uint8_t *blk[2] = {base + row * WB, base + (row + 8) * WB};
        mbar_wait(&wfull[ws], (n / RS_WSLOTS) & 1);
        rs_frag<T> f;
        f.header(blk);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            if constexpr (CIQ_WGMMA_DIAG != 1) f.build(blk, c, lane % 4, a[c % 2]);
            else {
#pragma unroll
                for (int j = 0; j < 16; ++j) a[c % 2][j / 4][j % 4] = 0;
            }
            if (c == 3 && lane == 0) mbar_arrive(&wempty[ws]);  // this warp is done reading the slot
            const int it = 4 * sb + c, ring = it0 + it, slot = ring % STAGES;
            mbar_wait(&full[slot], (ring / STAGES) & 1);
            const uint64_t db = smem_desc(smem + slot * BN * 128);
            wgmma_fence();
            if constexpr (CIQ_WGMMA_DIAG != 2) {
#pragma unroll
                for (int kk = 0; kk < CIQ_WGMMA_KSTAGE / 16; ++kk) wgmma_rsk<BN>(acc, a[c % 2][kk], db + 2 * kk);  // +32 B
            }
            wgmma_commit();
            wgmma_wait<1>();  // the group of it-1 has retired: its slot and its register set are free
            if (it > 0 && lane == 0) mbar_arrive(&empty[(ring - 1) % STAGES]);
        }
    }
    wgmma_wait<0>();
    if (lane == 0) mbar_arrive(&empty[(it0 + 4 * nsb - 1) % STAGES]);
    bar_sync_all();
    acc_to_red<BN>(smem, cw, acc);
}

static __device__ __forceinline__ void flag_release(int *flag) {
    asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(flag), "r"(1) : "memory");
}
static __device__ __forceinline__ int flag_acquire(const int *flag) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    return v;
}

// Epilogue, every thread: red[] summed over the split-K cluster (or stream-K's peers), times the token scale, plus the
// addend where the output has one (one more rounding: the values of ciq_add after the GEMM), stored as rows of the
// tile's output; a stream-K contribution is stored as it is to the CTA's partial slot instead.
template <int BN>
static __device__ __forceinline__ void wgmma_epilogue(uint8_t *smem, const float *tscale, int tokens,
                                                      const wgmma_outputs &outs, ciq_out_type out_type,
                                                      int64_t row0, int tok0, const wgmma_handover &hand) {
    int s = 0;  // the tile's output (CTA-uniform)
    while (s + 1 < outs.n && row0 >= outs.row_end[s]) ++s;
    const int64_t first = s ? outs.row_end[s - 1] : 0, rows = outs.row_end[s] - first;
    void *out = outs.out[s];
    const float *add = outs.add[s];
    const bool vec = (outs.vec >> s) & 1;
    // Split-K over the cluster's CTAs (blockIdx.z = cluster rank): each CTA sums its share of the tile's tokens over
    // every CTA's red[] through distributed shared memory, in rank order (deterministic), then stores coalesced rows.
    const int splits = gridDim.z, rank = blockIdx.z;
    if (splits > 1) cluster_sync();
    else __syncthreads();
    const uint32_t red_addr = smem_u32(smem);
    constexpr int TILE = BN * CIQ_WGMMA_ROWS;  // floats of a partial slot
    if (hand.contribute) {  // stream-K: the sums as they are, [token][row], then the flag
        const float *red = (const float *)smem;
        float *slot = hand.partial + (int64_t)blockIdx.x * TILE;
        for (int idx = threadIdx.x; idx < BN * 32; idx += blockDim.x) {
            const int tl = idx / 32, rl = 4 * (idx % 32);
            __stcg((float4 *)(slot + tl * CIQ_WGMMA_ROWS + rl), *(const float4 *)(red + tl * RED_STRIDE + rl));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            flag_release(hand.flags + blockIdx.x);
        }
        return;
    }
    if (hand.peers > 0) {  // stream-K owner: wait for the peers' partials
        if (threadIdx.x == 0)
            for (int q = 1; q <= hand.peers; ++q) {
                // the peers run beside this CTA (one CTA an SM, no more CTAs than SMs): a wait of ~10 s means one
                // cannot (SMs taken away), an error rather than a hang
                for (uint32_t spins = 0; flag_acquire(hand.flags + blockIdx.x + q) == 0; ++spins) {
                    if (spins == (1u << 27)) __trap();
                    __nanosleep(64);
                }
                hand.flags[blockIdx.x + q] = 0;  // read once: ready for the next launch (which waits for this grid)
            }
        __syncthreads();
    }
    const int my_tokens = (BN - rank + splits - 1) / splits;
    // the sums of rows rl .. rl+3 of token tl: every rank's red[] in rank order, then stream-K's peers in CTA order
    auto gather = [&](int tl, int rl) {
        const uint32_t own = red_addr + 4 * (tl * RED_STRIDE + rl);  // the same offset in every rank's red[]
        float4 sum = ld_dsmem4(splits > 1 ? mapa(own, 0) : own);
#pragma unroll
        for (int q = 1; q < CIQ_WGMMA_MAX_SPLITS; ++q) {
            if (q >= splits) break;
            const float4 v = ld_dsmem4(mapa(own, q));
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        for (int q = 1; q <= hand.peers; ++q) {  // stream-K: in CTA order
            const float4 v = __ldcg((const float4 *)(hand.partial + (int64_t)(blockIdx.x + q) * TILE + tl * CIQ_WGMMA_ROWS + rl));
            sum.x += v.x, sum.y += v.y, sum.z += v.z, sum.w += v.w;
        }
        return sum;
    };
    if (outs.glu) {  // gate rows rl .. rl+3 and up's (rl + 64 ..): the GLU of the products, the values ciq_glu gives
        const bool gelu = outs.glu == 2;
        const int64_t half = rows / 2;
        for (int idx = threadIdx.x; idx < my_tokens * 16; idx += blockDim.x) {
            const int tl = rank + splits * (idx / 16), rl = 4 * (idx % 16), tok = tok0 + tl;
            if (tok >= tokens) break;
            const float4 g = gather(tl, rl), u = gather(tl, rl + CIQ_WGMMA_ROWS / 2);
            const float ts = __ldg(tscale + tok);
            // __fmul_rn: the product's value as the other path stores it, never contracted into the GLU's arithmetic
            auto glu = [&](float gv, float uv) { return ciq_glu_value(gelu, __fmul_rn(gv, ts), __fmul_rn(uv, ts)); };
            const float4 h = make_float4(glu(g.x, u.x), glu(g.y, u.y), glu(g.z, u.z), glu(g.w, u.w));
            float *o = (float *)out + (int64_t)tok * half + (row0 - first) / 2 + rl;
            if (vec) *(float4 *)o = h;
            else o[0] = h.x, o[1] = h.y, o[2] = h.z, o[3] = h.w;
        }
        if (splits > 1) cluster_sync();
        return;
    }
    for (int idx = threadIdx.x; idx < my_tokens * 32; idx += blockDim.x) {
        const int tl = rank + splits * (idx / 32), rl = 4 * (idx % 32), tok = tok0 + tl;
        if (tok >= tokens) break;
        const float4 sum = gather(tl, rl);
        const float ts = __ldg(tscale + tok);
        const int64_t r = row0 - first + rl, base = (int64_t)tok * rows + r;
        if (vec && r + 3 < rows) {
            float4 o = make_float4(sum.x * ts, sum.y * ts, sum.z * ts, sum.w * ts);
            if (add) {  // __fadd_rn: never contracted with the product's rounding
                const float4 a = __ldg((const float4 *)(add + base));
                o = make_float4(__fadd_rn(a.x, o.x), __fadd_rn(a.y, o.y), __fadd_rn(a.z, o.z), __fadd_rn(a.w, o.w));
            }
            *(float4 *)((float *)out + base) = o;
        } else {
            const float v4[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
            for (int n = 0; n < 4; ++n)
                if (r + n < rows) {
                    const float v = v4[n] * ts;
                    ciq_store_out(out, base + n, add ? __fadd_rn(__ldg(add + base + n), v) : v, out_type);
                }
        }
    }
    if (splits > 1) cluster_sync();  // peers may still be reading this CTA's red[]
}

#endif  // CIQ_WGMMA_DEVICE

// Threads: SS 128 PW producers then 256 consumers; RS 256 consumers then a producer warpgroup (wgmma_produce_rs).
static constexpr __host__ __device__ int wgmma_threads(int PW, bool RS) { return RS ? 384 : 128 * (PW + 2); }

// The kernel's body, for the SS kernel and the RS kernel (launch bounds of their threads, one CTA an SM).
#define CIQ_WGMMA_KERNEL_PARAMS                                                                                        \
    const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, const uint8_t *__restrict__ w, \
        int64_t rows, int nb, const float *__restrict__ tscale, int tokens, int kb_per_split, int tile0, int row_tiles, \
        const __grid_constant__ wgmma_outputs outs, ciq_out_type out_type, wgmma_stream_k sk,                        \
        const __grid_constant__ CUtensorMap wmap1, int row_tiles0
// T1 != T: a grouped kernel (RS only): row tiles 0 .. row_tiles0-1 are weight 0's (type T, wmap), the rest weight 1's
// (type T1, wmap1, its rows from row_tiles0 * 128 of the product); one kernel otherwise gets wmap and row_tiles there.
template <ciq_type T, int BN, int STAGES, int PW, bool TMA_W, bool RS, ciq_type T1 = T>
static __device__ __forceinline__ void gemm_wgmma_body(const CUtensorMap &xmap, const CUtensorMap &wmap,
                                                       const uint8_t *__restrict__ w, int64_t rows, int nb,
                                                       const float *__restrict__ tscale, int tokens, int kb_per_split,
                                                       int tile0, int row_tiles, const wgmma_outputs &outs,
                                                       ciq_out_type out_type, const wgmma_stream_k &sk,
                                                       const CUtensorMap &wmap1, int row_tiles0) {
#ifdef CIQ_WGMMA_DEVICE
    static_assert(!RS || (TMA_W && PW == 1), "the RS form: staged weights (PW unused: one producer warp)");
    constexpr bool GROUPED = T1 != T;
    static_assert(!GROUPED || RS, "a grouped kernel is of the RS form");
    constexpr int STAGE = RS ? BN * 128 : wgmma_stage_bytes(BN), NW = RS ? RS_WSLOTS : WSLOTS;
    constexpr int WB = RS ? (wgmma_rs_wbox(T) > wgmma_rs_wbox(T1) ? wgmma_rs_wbox(T) : wgmma_rs_wbox(T1)) : wgmma_wbox(T);
    constexpr int SLOT = CIQ_WGMMA_ROWS * WB;  // bytes of a staged-weight slot (either type's, grouped)
    extern __shared__ uint8_t smem_raw[];
    // Swizzle atoms need 1024-byte alignment; offsetting the array (not casting an integer) keeps loads ld.shared.
    uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    uint8_t *wraw = smem + STAGES * STAGE;  // TMA_W: NW super-blocks of 128 staged rows, WB bytes each
    uint64_t *full = (uint64_t *)(wraw + (TMA_W ? NW * SLOT : 0)), *empty = full + STAGES,
             *wfull = empty + STAGES, *wempty = wfull + NW;

    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(&full[s], RS ? 1 : 128 * PW + 1);
            mbar_init(&empty[s], 8);
        }
        for (int s = 0; s < NW; ++s) {
            mbar_init(&wfull[s], 1);
            if (RS) mbar_init(&wempty[s], 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    static_assert(RS || PW == 1 || BN <= 128, "512 threads leave 128 registers per thread: too few for 256 accumulators");
    constexpr int SPU = wgmma_unit_stages(T);
    // Units kb0 .. kb1-1 of tile `tile` (tiles row tile first: wgmma_plan); it0 / sb0: this CTA's earlier segments
    auto segment = [&](int tile, int kb0, int kb1, int it0, int sb0, const wgmma_handover &hand) {
        const int64_t row0 = (int64_t)(tile % row_tiles) * CIQ_WGMMA_ROWS;
        const int tok0 = tile / row_tiles * BN, iters = SPU * (kb1 - kb0);
        if (threadIdx.x < 128 * PW) {
            wgmma_produce<T, BN, STAGES, PW, TMA_W>(xmap, wmap, w, rows, nb, smem, wraw, full, empty, wfull, kb0, iters,
                                                    row0, tok0, it0, sb0);
        } else {
            float acc[BN / 2];
            wgmma_consume<BN, STAGES, PW>(smem, full, empty, iters, it0, acc);
        }
        wgmma_epilogue<BN>(smem, tscale, tokens, outs, out_type, row0, tok0, hand);
    };
    // The CTA's segments, each through `run`: one (grid.x's tile, grid.z's share of its K), or stream-K's
    auto each_segment = [&](auto &&run) {
        if (!TMA_W || sk.tiles == 0) {  // one tile (grid.x), its share of K (grid.z: the cluster's split)
            const int kb0 = blockIdx.z * kb_per_split;
            run(tile0 + (int)blockIdx.x, kb0, min(nb, kb0 + kb_per_split), 0, 0, wgmma_handover{false, 0, nullptr, nullptr});
            return;
        }
        // Stream-K (staged weights only: the producers' register ring spills in a loop of segments): this CTA's range
        // of the launch's units, segment by segment (a segment: the range's part in one tile)
        const int64_t total = sk.tiles * nb, cta = blockIdx.x, ctas = gridDim.x;
        const int64_t end = total * (cta + 1) / ctas;
        int it0 = 0, sb0 = 0;
        for (int64_t u = total * cta / ctas; u < end;) {
            const int64_t tile = u / nb;
            const int kb0 = (int)(u % nb), kb1 = (int)(end - u < nb - kb0 ? kb0 + (end - u) : nb);
            wgmma_handover hand{kb0 > 0, 0, sk.partial, sk.flags};  // a range that starts inside a tile hands it over
            if (kb0 == 0 && kb1 < nb)  // ends inside the tile: its owner; the peers: the CTAs that start before its end
                while (cta + hand.peers + 1 < ctas && total * (cta + hand.peers + 1) / ctas < (tile + 1) * nb) ++hand.peers;
            run(tile0 + (int)tile, kb0, kb1, it0, sb0, hand);
            it0 += SPU * (kb1 - kb0);
            sb0 += kb1 - kb0;
            u += kb1 - kb0;
            // the ring held red[] (generic stores); the next segment's TMA writes it (async proxy)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            __syncthreads();
        }
    };
    if constexpr (RS) {
        // The producer warpgroup gives registers to the consumers (56 / 224 a thread: 128 accumulators and two
        // fragment sets at 256 tokens); each role runs its own copy of the segment loop and epilogue, so that no code
        // is shared between the two register budgets.
        auto tile_of = [&](int tile, int64_t &row0, int &tok0) {
            row0 = (int64_t)(tile % row_tiles) * CIQ_WGMMA_ROWS, tok0 = tile / row_tiles * BN;
        };
        // grouped: whether the tile is weight 1's (CTA-uniform), and its first row there
        const int64_t rows0 = (int64_t)row_tiles0 * CIQ_WGMMA_ROWS;
        auto second = [&](int64_t row0) { return GROUPED && row0 >= rows0; };
        if (threadIdx.x >= 256) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
            each_segment([&](int tile, int kb0, int kb1, int it0, int sb0, const wgmma_handover &hand) {
                int64_t row0;
                int tok0;
                tile_of(tile, row0, tok0);
                if (second(row0))
                    wgmma_produce_rs<T1, BN, STAGES, SLOT>(xmap, wmap1, smem, wraw, full, empty, wfull, wempty, kb0,
                                                           kb1 - kb0, row0 - rows0, tok0, it0, sb0);
                else
                    wgmma_produce_rs<T, BN, STAGES, SLOT>(xmap, wmap, smem, wraw, full, empty, wfull, wempty, kb0,
                                                          kb1 - kb0, row0, tok0, it0, sb0);
                wgmma_epilogue<BN>(smem, tscale, tokens, outs, out_type, row0, tok0, hand);
            });
        } else {
            asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
            each_segment([&](int tile, int kb0, int kb1, int it0, int sb0, const wgmma_handover &hand) {
                int64_t row0;
                int tok0;
                tile_of(tile, row0, tok0);
                float acc[BN / 2];
                if (second(row0))
                    wgmma_consume_rs<T1, BN, STAGES, SLOT>(smem, wraw, full, empty, wfull, wempty, kb0, kb1 - kb0, it0,
                                                           sb0, acc);
                else
                    wgmma_consume_rs<T, BN, STAGES, SLOT>(smem, wraw, full, empty, wfull, wempty, kb0, kb1 - kb0, it0,
                                                          sb0, acc);
                wgmma_epilogue<BN>(smem, tscale, tokens, outs, out_type, row0, tok0, hand);
            });
        }
    } else {
        each_segment(segment);
    }
#else
    __trap();
#endif
}

template <ciq_type T, int BN, int STAGES, int PW, bool TMA_W>
__global__ void __launch_bounds__(wgmma_threads(PW, false), 1) gemm_wgmma_kernel(CIQ_WGMMA_KERNEL_PARAMS) {
    gemm_wgmma_body<T, BN, STAGES, PW, TMA_W, false>(xmap, wmap, w, rows, nb, tscale, tokens, kb_per_split, tile0,
                                                     row_tiles, outs, out_type, sk, wmap1, row_tiles0);
}
// T1 != T: the grouped kernel (two weights' tiles in one grid: gemm_wgmma_body)
template <ciq_type T, int BN, int STAGES, ciq_type T1>
__global__ void __launch_bounds__(wgmma_threads(1, true), 1) gemm_wgmma_rs_kernel(CIQ_WGMMA_KERNEL_PARAMS) {
    gemm_wgmma_body<T, BN, STAGES, 1, true, true, T1>(xmap, wmap, w, rows, nb, tscale, tokens, kb_per_split, tile0,
                                                      row_tiles, outs, out_type, sk, wmap1, row_tiles0);
}

// ---- host -----------------------------------------------------------------------------------------------------------

// Time model for choosing the tile and the split: waves of one CTA per SM, each CTA's super-blocks plus one for
// pipeline fill and epilogue, at the tile's throughput per SM (3.4 TFLOP/s for 256-token tiles, times the relative
// efficiencies below: pinned A/B runs on the H200, bench/results/h200/wgmma-ab-*.json; 64-token tiles estimated),
// plus, for split-K, each CTA reading its share of the cluster's partial tiles (128 x BN floats) at ~100 GB/s.
static constexpr float k_wgmma_efficiency[k_wgmma_config_count] = {0.4f, 0.69f, 1.0f};

// A plan: tile config, and the tiles (row tile fastest) as `main` tiles split `splits` ways (kb_per_split units
// each), then the rest - the last, partial wave of an unsplit plan - as a second launch that fills the SMs the partial
// wave would leave idle: split tail_splits ways (tail_kb_per_split), or, tail_ctas > 0, stream-K on tail_ctas CTAs
// (wgmma_stream_k; the rest may then also be all the tiles, main 0).
struct wgmma_plan {
    int config, splits, kb_per_split;
    int64_t main = -1;  // tiles of the first launch (-1: all)
    int tail_splits = 1, tail_kb_per_split = 0;
    int tail_ctas = 0;
    float *partial = nullptr;  // stream-K's hand-over slots and flags (wgmma_stream_k)
    int *flags = nullptr;
    bool pdl = true;  // launched as programmatic dependents (ciq_wgmma_switches.pdl)
    double model_s = 0;  // the time model's seconds for it (pick_plan)
};

// The kernel of tile config C: RS asks for the RS form, which every staged-weight (TMA_W) kernel has; T1 != T the
// grouped kernel (RS), whose staged-weight slots are the larger type's.
template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T> static constexpr auto wgmma_kernel() {
    constexpr wgmma_tile_config cfg = k_wgmma_configs[C];
    static_assert(T1 == T || (RS && TMA_W), "grouped kernels are of the RS form");
    if constexpr (RS && TMA_W) return gemm_wgmma_rs_kernel<T, cfg.bn, cfg.stages_rs, T1>;
    else return gemm_wgmma_kernel<T, cfg.bn, TMA_W ? cfg.stages_w : cfg.stages, cfg.producers, TMA_W>;
}
template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T> static constexpr int wgmma_kernel_smem() {
    constexpr wgmma_tile_config cfg = k_wgmma_configs[C];
    constexpr ciq_type WIDE = wgmma_rs_wbox(T) >= wgmma_rs_wbox(T1) ? T : T1;
    if constexpr (RS && TMA_W) return wgmma_rs_smem_bytes(WIDE, cfg.bn, cfg.stages_rs);
    else return wgmma_smem_bytes(T, cfg.bn, TMA_W ? cfg.stages_w : cfg.stages, TMA_W);
}

// wgmma's switches (GGML_CIQ_WGMMA_*: switches.cpp's table says what each takes), read by the caller once a call and
// passed down; a pinned tile config outside k_wgmma_configs pins none.
static ciq_wgmma_switches wgmma_plan_switches(const ciq_wgmma_switches &sw) {
    ciq_wgmma_switches out = sw;
    if (out.config >= k_wgmma_config_count) out.config = -1;
    return out;
}

template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T>
static void wgmma_launch_config(cudaLaunchConfig_t &config, cudaLaunchAttribute (&attrs)[2], dim3 grid, bool pdl) {
    constexpr wgmma_tile_config cfg = k_wgmma_configs[C];
    config = {};
    config.gridDim = grid;
    config.stream = ciq_stream();
    config.blockDim = dim3(wgmma_threads(cfg.producers, RS && TMA_W));
    config.dynamicSmemBytes = wgmma_kernel_smem<T, C, TMA_W, RS, T1>();
    config.attrs = attrs;
    if (grid.z > 1) {  // the split-K CTAs of a tile form one cluster
        cudaLaunchAttribute &cluster = attrs[config.numAttrs++];
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = grid.z;
    }
    if (pdl) {
        cudaLaunchAttribute &dependent = attrs[config.numAttrs++];
        dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        dependent.val.programmaticStreamSerializationAllowed = 1;
    }
}

// CTAs of one kernel that run at once as clusters of `splits` (-1: none): a cluster's CTAs must share a GPC, so not
// every SM is usable for every cluster size (cudaOccupancyMaxActiveClusters; cached: all GPUs are taken to be alike).
template <ciq_type T, int C, bool TMA_W, bool RS> static int wave_ctas(int splits, int sms) {
    if (splits == 1) return sms;
    static std::atomic<int> cached[CIQ_WGMMA_MAX_SPLITS + 1] = {};
    int n = cached[splits].load();
    if (n == 0) {
        constexpr auto kernel = wgmma_kernel<T, C, TMA_W, RS>();
        int clusters = 0;
        cudaLaunchConfig_t config;
        cudaLaunchAttribute attrs[2];
        wgmma_launch_config<T, C, TMA_W, RS>(config, attrs, dim3(1, 1, splits), false);  // cached: never with PDL
        if (ciq_raise_smem_limit<kernel>((int)config.dynamicSmemBytes, "ciq_cuda_gemm_wgmma") != CIQ_OK ||
            cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess)
            clusters = 0;
        cudaGetLastError();
        n = clusters > 0 ? clusters * splits : -1;
        cached[splits].store(n);
    }
    return n;
}

// The plan of the least modelled time (sw.config pins the tile shape; sw.tail, sw.stream_k: ciq_wgmma_switches).
template <ciq_type T, bool TMA_W, bool RS>
static wgmma_plan pick_plan(int64_t rows, int64_t tokens, int nb, int sms, int64_t l2_bytes, const ciq_wgmma_switches &sw) {
    static constexpr int (*k_wave_ctas[])(int, int) = {wave_ctas<T, 0, TMA_W, RS>, wave_ctas<T, 1, TMA_W, RS>,
                                                       wave_ctas<T, 2, TMA_W, RS>};
    static_assert(sizeof(k_wave_ctas) / sizeof(k_wave_ctas[0]) == k_wgmma_config_count, "one entry per tile config");
    wgmma_plan best{1, 1, nb};
    double best_s = 1e30;
    const int64_t row_tiles = (rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS;
    for (int c = 0; c < k_wgmma_config_count; ++c) {
        if (sw.config >= 0 && c != sw.config) continue;
        const int bn = k_wgmma_configs[c].bn;
        const int64_t tiles = row_tiles * ((tokens + bn - 1) / bn);
        // seconds per K value of a tile; a unit is 64 values per stage, and pipeline fill + epilogue one super-block
        const double value_s = 2.0 * CIQ_WGMMA_ROWS * bn / (3.4e12 * k_wgmma_efficiency[c]);
        constexpr int unit_values = CIQ_WGMMA_KSTAGE * wgmma_unit_stages(T);
        // seconds of one wave of CTAs that each run `per` units (+ the split-K reduction's reads)
        auto wave_s = [&](int splits, int per) {
            return ((double)per * unit_values + QK_K) * value_s + (splits > 1 ? 4.0 * CIQ_WGMMA_ROWS * bn / 1.0e11 : 0.0);
        };
        for (int splits = 1; splits <= CIQ_WGMMA_MAX_SPLITS && splits <= nb; ++splits) {
            const int per = (nb + splits - 1) / splits, used = (nb + per - 1) / per;
            const int wave = used == splits ? k_wave_ctas[c](splits, sms) : -1;
            if (wave <= 0) continue;
            const int64_t waves = (tiles * splits + wave - 1) / wave;
            const double s = waves * wave_s(splits, per);
            if (s < best_s * 0.999) {
                best_s = s;
                best = {c, splits, per};
            }
        }
        // Full unsplit waves, then the partial wave's tiles split so that they fill one wave (sw.tail off: never)
        const int64_t wave1 = k_wave_ctas[c](1, sms), main = tiles / wave1 * wave1, rest = tiles - main;
        if (main > 0 && rest > 0 && sw.tail) {
            for (int splits = 2; splits <= CIQ_WGMMA_MAX_SPLITS && splits <= nb; ++splits) {
                const int per = (nb + splits - 1) / splits, used = (nb + per - 1) / per;
                const int wave = used == splits ? k_wave_ctas[c](splits, sms) : -1;
                if (wave <= 0 || rest * splits > wave) continue;
                const double s = main / wave1 * wave_s(1, nb) + wave_s(splits, per);
                if (s < best_s * 0.999) {
                    best_s = s;
                    best = {c, 1, nb, main, splits, per};
                }
            }
        }
        // Stream-K over the tiles after the full waves, or after all but one (GGML_CIQ_WGMMA_STREAMK=0: never): one CTA
        // an SM, each ~units/CTAs units in up to ceil(U/nb) + 1 segments (each a pipeline fill and an epilogue), and an
        // owner reads up to ceil(nb/U) peers' partial tiles (written once, read once: the split-K reduction's rate)
        // Measured (bench/results/h200/streamk-*): a range shorter than a tile lost (seed6's 12288 x 2048, 6 units of 8:
        // +7%), and so did activations beyond a quarter of the L2 (4096 x 14336 at 2048 tokens, 59 MB: +15%; the CTAs'
        // ranges start at other K, so the activations no longer pass through the L2 once per wave)
        const bool fits_l2 = (double)tokens * nb * unit_values * 2 <= l2_bytes / 4.0;
        if (TMA_W && sw.stream_k == 1 && fits_l2) {  // (kernels reading weights into registers: never)
            const int64_t full_waves = tiles / wave1;
            for (int64_t mw = full_waves; mw >= 0 && mw >= full_waves - 1; --mw) {
                const int64_t rest = tiles - mw * wave1, units = rest * nb;
                if (rest <= 0 || units <= 0) continue;
                const int64_t ctas = std::min<int64_t>(sms, units), per = (units + ctas - 1) / ctas;
                if (units % ctas == 0 && per % nb == 0) continue;  // whole tiles a CTA: the unsplit plan
                if (per < nb) continue;  // less than a tile a CTA
                const int64_t segments = (per + nb - 1) / nb + 1, peers = (nb + per - 1) / per;
                const double s = mw * wave_s(1, nb) + ((double)per * unit_values + segments * QK_K) * value_s +
                                 peers * 8.0 * CIQ_WGMMA_ROWS * bn / 1.0e11;
                if (s < best_s * 0.999) {
                    best_s = s;
                    best = {c, 1, nb, mw * wave1, 1, 0, (int)ctas};
                }
            }
        }
    }
    if (TMA_W && sw.stream_k == 2) {  // every tile of the chosen tile shape streamed
        const int bn = k_wgmma_configs[best.config].bn;
        const int64_t units = row_tiles * ((tokens + bn - 1) / bn) * nb;
        best = {best.config, 1, nb, 0, 1, 0, (int)std::min<int64_t>(sms, units)};
    }
    best.model_s = best_s;
    return best;
}

// A grouped launch (T1 != T) gets weight 1's map and the row tiles of weight 0 in `group`; one weight's, wmap and
// row_tiles there (unread).
struct wgmma_group {
    const CUtensorMap *wmap1 = nullptr;
    int row_tiles0 = 0;
};

template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T>
static ciq_status launch_wgmma(const CUtensorMap &xmap, const CUtensorMap &wmap, const void *weight, int64_t rows,
                               int nb, const float *scales, int64_t tokens, const wgmma_plan &plan,
                               const wgmma_outputs &outs, ciq_out_type out_type, const wgmma_group &group) {
    constexpr auto kernel = wgmma_kernel<T, C, TMA_W, RS, T1>();
    const ciq_status status = ciq_raise_smem_limit<kernel>(wgmma_kernel_smem<T, C, TMA_W, RS, T1>(), "ciq_cuda_gemm_wgmma");
    if (status != CIQ_OK) return status;
    const int row_tiles = (int)((rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS);
    const int64_t tiles = (int64_t)row_tiles * ((tokens + k_wgmma_configs[C].bn - 1) / k_wgmma_configs[C].bn);
    const int64_t main = plan.main < 0 ? tiles : plan.main;
    // the main tiles, then (a tail plan) the rest as a second launch, a programmatic dependent of the first
    for (int part = 0; part < 2; ++part) {
        const int64_t first = part ? main : 0, count = part ? tiles - main : main;
        if (count <= 0) continue;
        const int splits = part ? plan.tail_splits : plan.splits, per = part ? plan.tail_kb_per_split : plan.kb_per_split;
        const bool stream_k = part && plan.tail_ctas > 0;
        const wgmma_stream_k sk{stream_k ? count : 0, plan.partial, plan.flags};
        cudaLaunchConfig_t config;
        cudaLaunchAttribute attrs[2];
        wgmma_launch_config<T, C, TMA_W, RS, T1>(config, attrs, dim3((unsigned)(stream_k ? plan.tail_ctas : count), 1,
                                                                 (unsigned)splits), plan.pdl);
        const cudaError_t err = cudaLaunchKernelEx(&config, kernel, xmap, wmap, (const uint8_t *)weight, rows, nb,
                                                   scales, (int)tokens, per, (int)first, row_tiles, outs, out_type, sk,
                                                   group.wmap1 ? *group.wmap1 : wmap,
                                                   group.wmap1 ? group.row_tiles0 : row_tiles);
        if (err != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: %s", cudaGetErrorString(err));
        ciq_counters_wgmma_launch(RS && TMA_W ? CIQ_WGMMA_FORM_RS : CIQ_WGMMA_FORM_SS);
        if (stream_k) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_STREAM_K);
        if (T1 != T) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_GROUPED);
        if (outs.glu) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_GLU);
    }
    return CIQ_OK;
}

template <ciq_type T, bool TMA_W, bool RS, ciq_type T1 = T, int C = 0>
static ciq_status dispatch_wgmma(const CUtensorMap &xmap, const CUtensorMap &wmap, const void *weight, int64_t rows,
                                 int nb, const float *scales, int64_t tokens, const wgmma_plan &plan,
                                 const wgmma_outputs &outs, ciq_out_type out_type, const wgmma_group &group = {}) {
    if constexpr (C < k_wgmma_config_count) {
        if (plan.config == C)
            return launch_wgmma<T, C, TMA_W, RS, T1>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type,
                                                     group);
        return dispatch_wgmma<T, TMA_W, RS, T1, C + 1>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs,
                                                       out_type, group);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: bad tile config %d", plan.config);
    }
}

// The activations' tensor map: 64 K values x bn tokens per box, 128-byte swizzle, zeros past the last token.
static ciq_status wgmma_x_map(encode_tiled_fn encode, const void *x_f16, int64_t k, int64_t tokens, int bn,
                              CUtensorMap *xmap) {
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)tokens}, strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {CIQ_WGMMA_KSTAGE, (cuuint32_t)bn}, unit[2] = {1, 1};
    const CUresult res = encode(xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void *>(x_f16), dims, strides, box,
                                unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS)
        return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: cuTensorMapEncodeTiled (activations) error %d", (int)res);
    return CIQ_OK;
}
// A staged weight's tensor map: bytes, one block (wbox bytes) x 128 rows per box, zeros past the last row.
static ciq_status wgmma_w_map(encode_tiled_fn encode, const void *weight, int64_t row_bytes, int64_t rows, int wbox,
                              CUtensorMap *wmap) {
    const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)wbox, CIQ_WGMMA_ROWS}, unit[2] = {1, 1};
    const CUresult res = encode(wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(weight), dims, strides, box,
                                unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS)
        return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: cuTensorMapEncodeTiled (weights) error %d", (int)res);
    return CIQ_OK;
}

// Weights go through TMA into shared memory when the rows allow a tensor map (16-byte-aligned base and row pitch:
// every Q4_K matrix, Q6_K with K a multiple of 2048); otherwise the producers read them into registers.
template <ciq_type T>
static ciq_status run_wgmma(const void *x_f16, int64_t k, const void *weight, int64_t row_bytes, int64_t rows, int nb,
                            const float *scales, int64_t tokens, int sms, int64_t l2_bytes, const ciq_wgmma_switches &sw,
                            const wgmma_stream_k &ws, const wgmma_outputs &outs, ciq_out_type out_type) {
    // Q4_K rows (144 B blocks, 16-byte-aligned weights) always allow it; Q6_K rows (210 B) when K % 2048 == 0; the
    // 32-value block types never (their blocks straddle any 16-byte box).
    const bool tma_w = wgmma_kquant(T) && (uintptr_t)weight % 16 == 0 && row_bytes % 16 == 0;
    wgmma_plan plan;
    if constexpr (T == CIQ_TYPE_Q4_K || T == CIQ_TYPE_Q6_K) {
        if (tma_w) plan = sw.rs ? pick_plan<T, true, true>(rows, tokens, nb, sms, l2_bytes, sw)
                                : pick_plan<T, true, false>(rows, tokens, nb, sms, l2_bytes, sw);
    }
    if constexpr (T != CIQ_TYPE_Q4_K) {  // Q4_K rows always allow TMA
        if (!tma_w) plan = pick_plan<T, false, false>(rows, tokens, nb, sms, l2_bytes, sw);
    }
    plan.partial = ws.partial, plan.flags = ws.flags;
    plan.pdl = sw.pdl;

    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap xmap, wmap;
    CIQ_TRY(wgmma_x_map(encode, x_f16, k, tokens, k_wgmma_configs[plan.config].bn, &xmap));
    if constexpr (wgmma_kquant(T)) {
        if (tma_w) {
            CIQ_TRY(wgmma_w_map(encode, weight, row_bytes, rows, sw.rs ? wgmma_rs_wbox(T) : wgmma_wbox(T), &wmap));
            return sw.rs ? dispatch_wgmma<T, true, true>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type)
                      : dispatch_wgmma<T, true, false>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type);
        }
    }
    if constexpr (T != CIQ_TYPE_Q4_K) {
        return dispatch_wgmma<T, false, false>(xmap, xmap, weight, rows, nb, scales, tokens, plan, outs, out_type);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: Q4_K weights must be 16-byte aligned");
    }
}

// What the planner and stream-K need of a device, once: its SMs, its L2, and stream-K's hand-over slots (the widest
// tile's partial sums, a CTA of one an SM) and flags in scratch slot 3 (nothing else asks for that slot, always this
// size: it never moves, so no graph captured after a first call goes stale), the flags zeroed once (each launch leaves
// them 0). A first call inside a graph capture fails as any first scratch allocation there does.
struct wgmma_device {
    bool ready = false;
    int sms = 132;
    int64_t l2_bytes = 50 << 20;
    wgmma_stream_k ws{};
};
static ciq_status wgmma_device_state(int device, wgmma_device &out) {
    static std::mutex mutex;
    static std::vector<wgmma_device> states;  // [device]
    std::lock_guard<std::mutex> lock(mutex);
    if ((size_t)device >= states.size()) states.resize(device + 1);
    wgmma_device &d = states[device];
    if (!d.ready) {
        int sms = 0, l2 = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
        d.sms = sms > 0 ? sms : 132;
        d.l2_bytes = l2 > 0 ? l2 : 50 << 20;
        const size_t slots = (size_t)d.sms * 256 * CIQ_WGMMA_ROWS * sizeof(float);
        void *p = nullptr;
        CIQ_TRY(ciq_cuda_scratch(device, 3, slots + (size_t)d.sms * sizeof(int), &p));
        CIQ_TRY(ciq_cuda_memset(device, (uint8_t *)p + slots, 0, (size_t)d.sms * sizeof(int)));
        d.ws.partial = (float *)p;
        d.ws.flags = (int *)((uint8_t *)p + slots);
        d.ready = true;
    }
    out = d;
    return CIQ_OK;
}

// Problems whose tile and K counts fit the kernels' int arithmetic (tiles: an int grid.x); larger: unsupported.
static ciq_status wgmma_check_size(const char *fn, int64_t rows, int64_t k, int64_t tokens) {
    if (tokens > INT32_MAX / 2 || k > INT32_MAX / 2 ||
        (rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS * ((tokens + 63) / 64) > INT32_MAX)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: problem too large (k %lld, tokens %lld)", fn, (long long)k,
                        (long long)tokens);
    return CIQ_OK;
}

static ciq_status gemm_wgmma(int device, const ciq_wgmma_switches &switches, ciq_type type, const void *weight,
                             int64_t rows, int64_t k, const void *x_f16, int64_t tokens, const wgmma_outputs &outs,
                             ciq_out_type out_type) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q6_K && type != CIQ_TYPE_Q4_0 && type != CIQ_TYPE_Q5_0 &&
        type != CIQ_TYPE_Q8_0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: unknown weight type %d", (int)type);
    const int64_t unit_values = type == CIQ_TYPE_Q4_K || type == CIQ_TYPE_Q6_K ? QK_K : CIQ_WGMMA_KSTAGE;
    if (k <= 0 || k % unit_values != 0)  // whole super-blocks; the 32-value blocks two to a stage
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: K must be a multiple of %lld for weight type %d, "
                        "got %lld", (long long)unit_values, (int)type, (long long)k);
    CIQ_TRY(wgmma_check_size("ciq_cuda_gemm_wgmma", rows, k, tokens));
    if ((uintptr_t)x_f16 % 16 != 0 || (uintptr_t)weight % (type == CIQ_TYPE_Q4_K ? 16 : 2) != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_cuda_gemm_wgmma: activations (and Q4_K weights) must be 16-byte aligned, other weights "
                        "2-byte");
    const ciq_wgmma_switches sw = wgmma_plan_switches(switches);
    wgmma_device dev;
    CIQ_TRY(wgmma_device_state(device, dev));
    const float *scales = (const float *)((const uint8_t *)x_f16 + ciq_f16_scale_offset(tokens, k));
    switch (type) {  // nb: weight units per row (super-blocks, or pairs of 32-value blocks)
#define CIQ_WGMMA_RUN(T)                                                                                             \
    case T: {                                                                                                         \
        const int nb = (int)(k / (CIQ_WGMMA_KSTAGE * wgmma_unit_stages(T)));                                          \
        return run_wgmma<T>(x_f16, k, weight, (int64_t)nb * wgmma_unit_bytes(T), rows, nb, scales, tokens, dev.sms,   \
                            dev.l2_bytes, sw, dev.ws, outs, out_type);                                                \
    }
        CIQ_WGMMA_RUN(CIQ_TYPE_Q4_K)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q6_K)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q4_0)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q5_0)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q8_0)
#undef CIQ_WGMMA_RUN
        default: return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: unknown weight type %d", (int)type);
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

ciq_status ciq_cuda_gemm_wgmma(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                               int64_t rows, int64_t k, const void *x_f16, int64_t tokens, void *out,
                               ciq_out_type out_type) {
    wgmma_outputs outs{};
    outs.n = 1;
    outs.vec = out_type == CIQ_OUT_F32 && rows % 4 == 0 && aligned16(out);
    outs.row_end[0] = rows;
    outs.out[0] = out;
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, out_type);
}

// The epilogue's outputs of ciq_gemm_output[n_outputs] over a product of `rows` rows (unsupported: a boundary inside
// a tile).
static ciq_status wgmma_make_outputs(const ciq_gemm_output *outputs, int n_outputs, int64_t rows, ciq_out_type out_type,
                                     wgmma_outputs &outs) {
    if (n_outputs < 1 || n_outputs > CIQ_GEMM_OUTPUTS_MAX)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_outputs: %d outputs", n_outputs);
    outs = {};
    outs.n = n_outputs;
    int64_t end = 0;
    for (int s = 0; s < n_outputs; ++s) {
        const ciq_gemm_output &o = outputs[s];
        if (s + 1 < n_outputs && o.rows % CIQ_WGMMA_ROWS != 0)  // a tile would straddle two outputs
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_outputs: output %d has %lld rows, not a multiple "
                            "of %d", s, (long long)o.rows, CIQ_WGMMA_ROWS);
        end += o.rows;
        outs.row_end[s] = end;
        outs.out[s] = o.out;
        outs.add[s] = o.add;
        if (out_type == CIQ_OUT_F32 && o.rows % 4 == 0 && aligned16(o.out) && aligned16(o.add)) outs.vec |= 1 << s;
    }
    if (end != rows) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_outputs: outputs of %lld rows for %lld",
                                     (long long)end, (long long)rows);
    return CIQ_OK;
}

ciq_status ciq_cuda_gemm_wgmma_outputs(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                       int64_t rows, int64_t k, const void *x_f16, int64_t tokens,
                                       const ciq_gemm_output *outputs, int n_outputs, ciq_out_type out_type) {
    wgmma_outputs outs;
    CIQ_TRY(wgmma_make_outputs(outputs, n_outputs, rows, out_type, outs));
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, out_type);
}

ciq_status ciq_cuda_gemm_wgmma_glu(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                   int64_t rows, int64_t k, const void *x_f16, int64_t tokens, bool gelu, float *out) {
    if (rows % (2 * CIQ_GLU_INTERLEAVE) != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_glu: %lld rows, not a multiple of %d",
                        (long long)rows, 2 * CIQ_GLU_INTERLEAVE);
    static_assert(2 * CIQ_GLU_INTERLEAVE == CIQ_WGMMA_ROWS, "a tile is one interleaved block of gate and up rows");
    wgmma_outputs outs{};
    outs.n = 1;
    outs.glu = gelu ? 2 : 1;
    outs.vec = aligned16(out);
    outs.row_end[0] = rows;
    outs.out[0] = out;
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, CIQ_OUT_F32);
}

ciq_status ciq_cuda_gemm_wgmma_group(int device, const ciq_wgmma_switches &switches, const ciq_type types[2],
                                     const void *const weights[2], const int64_t rows[2], int64_t k, const void *x_f16,
                                     int64_t tokens, const ciq_gemm_output *outputs, int n_outputs,
                                     ciq_out_type out_type) {
    constexpr ciq_type T0 = CIQ_TYPE_Q4_K, T1 = CIQ_TYPE_Q6_K;  // the one grouped kernel built (8B's q+k and v)
    if (types[0] != T0 || types[1] != T1)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: weights of types %d, %d (grouped: Q4_K, then "
                        "Q6_K)", (int)types[0], (int)types[1]);
    if (rows[0] % CIQ_WGMMA_ROWS != 0)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: the first weight has %lld rows, not a multiple "
                        "of %d", (long long)rows[0], CIQ_WGMMA_ROWS);
    if (k <= 0 || k % QK_K != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_group: K must be a multiple of %d, got %lld",
                        QK_K, (long long)k);
    const int nb = (int)(k / QK_K);
    const int64_t row_bytes0 = (int64_t)nb * Q4_K_BLOCK_BYTES, row_bytes1 = (int64_t)nb * Q6_K_BLOCK_BYTES;
    if (!aligned16(weights[0]) || !aligned16(weights[1]) || row_bytes1 % 16 != 0)  // both staged by TMA
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: weights TMA cannot stage (16-byte aligned, "
                        "Q6_K with K a multiple of 2048)");
    const int64_t total = rows[0] + rows[1];
    CIQ_TRY(wgmma_check_size("ciq_cuda_gemm_wgmma_group", total, k, tokens));
    if (!aligned16(x_f16))
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_group: activations must be 16-byte aligned");
    const ciq_wgmma_switches sw = wgmma_plan_switches(switches);
    if (!sw.rs || sw.group == 0)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: off (GGML_CIQ_WGMMA_GROUP=0 or "
                        "GGML_CIQ_WGMMA_RS=0)");
    wgmma_outputs outs;
    CIQ_TRY(wgmma_make_outputs(outputs, n_outputs, total, out_type, outs));
    wgmma_device dev;
    CIQ_TRY(wgmma_device_state(device, dev));
    // planned as one problem of both weights' rows (the grouped kernel's shared memory is Q6_K's: its occupancy)
    wgmma_plan plan = pick_plan<T1, true, true>(total, tokens, nb, dev.sms, dev.l2_bytes, sw);
    if (sw.group == 1) {  // the two apart, as ciq_cuda_gemm_wgmma_outputs would plan them
        const double apart = pick_plan<T0, true, true>(rows[0], tokens, nb, dev.sms, dev.l2_bytes, sw).model_s +
                             pick_plan<T1, true, true>(rows[1], tokens, nb, dev.sms, dev.l2_bytes, sw).model_s;
        if (plan.model_s >= apart)
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: the time model gains nothing (%.1f us "
                            "grouped, %.1f apart)", plan.model_s * 1e6, apart * 1e6);
    }
    plan.partial = dev.ws.partial, plan.flags = dev.ws.flags;
    plan.pdl = sw.pdl;
    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap xmap, wmap0, wmap1;
    CIQ_TRY(wgmma_x_map(encode, x_f16, k, tokens, k_wgmma_configs[plan.config].bn, &xmap));
    CIQ_TRY(wgmma_w_map(encode, weights[0], row_bytes0, rows[0], wgmma_rs_wbox(T0), &wmap0));
    CIQ_TRY(wgmma_w_map(encode, weights[1], row_bytes1, rows[1], wgmma_rs_wbox(T1), &wmap1));
    const float *scales = (const float *)((const uint8_t *)x_f16 + ciq_f16_scale_offset(tokens, k));
    const wgmma_group group{&wmap1, (int)(rows[0] / CIQ_WGMMA_ROWS)};
    return dispatch_wgmma<T0, true, true, T1>(xmap, wmap0, weights[0], total, nb, scales, tokens, plan, outs, out_type,
                                              group);
}

#else  // HIP: no wgmma

ciq_status ciq_cuda_gemm_wgmma(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t, const void *,
                               int64_t, void *, ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_outputs(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t,
                                       const void *, int64_t, const ciq_gemm_output *, int, ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_glu(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t,
                                   const void *, int64_t, bool, float *) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_group(int, const ciq_wgmma_switches &, const ciq_type[2], const void *const[2],
                                     const int64_t[2], int64_t, const void *, int64_t, const ciq_gemm_output *, int,
                                     ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
#endif
