// gemm_wgmma_kernel.cuh - the device side of the Hopper keep-quant GEMM on f16 tensor cores (wgmma, sm_90a), f16
// semantics (docs/SEMANTICS.md): one kernel family (the SS and RS forms, grouped, stream-K) and the constants, shared
// memory layout and warp roles (role_of_warpgroup) its host planner (gemm_wgmma.cu, which includes this) launches it by.
//
// out[t][r] = scale_t * sum_k W16[r][k] * X16[t][k] with fp32 accumulation over the whole K, where
//   X16 = f16(x * 2^-e_t), scale_t = 2^e_t: activations converted once per call (convert_f16.cu), each
//         token with the power of two that puts its largest |x| in (2^14, 2^15] (no f16 overflow, 11-bit mantissa);
//   W16 = the GGUF blocks dequantized in the kernel, one f16 rounding per weight:
//         Q4_K, Q5_K  fma(q, half(d*sc), -half(dmin*m))   (MMQ's fp16 sub-block scale and min; Q5_K's q 0..31)
//         Q6_K  (q - 32) * half(d*sc)
//         Q4_0 (q - 8) * d, Q5_0 (q - 16) * d, Q8_0 q * d   (the 32-value blocks: d their fp16 scale)
//         Q4_1, Q5_1  fma(q, d, m)                          (d, m their fp16 scale and offset)
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
//       (every Q4_K and Q5_K matrix; Q6_K when its 210 B rows have a 16-byte pitch, K % 2048 == 0), or
//     - each thread loads from global memory into registers, PREFETCH stages ahead (other Q6_K matrices, and
//       the 32-value block types, whose 18/20/22/24/34-byte blocks no TMA box fits).
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
// Warp roles: "warp roles" below, the one layout of both forms (role_of_warpgroup).
// Files: the PTX wrappers in wgmma_ptx.cuh; here the tile constants, the warp roles, the producer's dequantizer
// (raw_stage), the kernel as wgmma_produce / wgmma_consume / wgmma_epilogue and the kernel for a tile config
// (wgmma_kernel); the host planner (pick_plan), tensor maps, launch and entry points in gemm_wgmma.cu.
#pragma once
#include "wgmma_ptx.cuh"

#include <type_traits>

#if !defined(GGML_CIQ_HIP)
#include <cudaTypedefs.h>

#define CIQ_WGMMA_ROWS 128
#define CIQ_WGMMA_KSTAGE 64  // K values per pipeline stage (one 128-byte swizzle atom of f16)
static_assert(CIQ_WGMMA_KSTAGE == F16_K_UNIT, "the f16 layout's K multiple (blocks.h) is one stage");

#define RED_STRIDE (CIQ_WGMMA_ROWS + 4)  // floats per token row of the epilogue's red[] (bank-conflict-free stores)
#define CIQ_WGMMA_MAX_SPLITS 8          // split-K runs inside one cluster (portable cluster size)

#define WSLOTS 2                          // super-blocks of weights staged in shared memory (TMA_W kernels)

// A measurement build, never the default (tools/gpu.py setup --diag N builds it apart): CIQ_WGMMA_DIAG=1 leaves out the
// producers' dequantization (the A tiles keep what the ring holds), 2 the consumers' wgmma (the outputs are 0): the
// time of either side alone, so that a change is aimed at the side that bounds the kernel.
#ifndef CIQ_WGMMA_DIAG
#define CIQ_WGMMA_DIAG 0
#endif

static constexpr __host__ __device__ int wgmma_stage_bytes(int BN) { return CIQ_WGMMA_ROWS * 128 + BN * 128; }
// A staged weight row: one GGUF block in a TMA box of 16-byte multiples. TMA boxes start at 16-byte multiples, so a
// Q6_K block (210 B) lands at offset (210 kb) % 16 <= 14 of its 224-byte box row.
static constexpr __host__ __device__ int wgmma_wbox(ciq_type T) {
    return T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : T == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES : 224;
}
// Pipeline stages (64 K values each) per weight unit, and a unit's bytes in one row.
static constexpr __host__ __device__ bool wgmma_kquant(ciq_type T) {
    return T == CIQ_TYPE_Q4_K || T == CIQ_TYPE_Q5_K || T == CIQ_TYPE_Q6_K;
}
// K-quants whose every row allows a tensor map (16-byte blocks): Q4_K and Q5_K, always staged.
static constexpr __host__ __device__ bool wgmma_always_staged(ciq_type T) { return T == CIQ_TYPE_Q4_K || T == CIQ_TYPE_Q5_K; }
static constexpr __host__ __device__ int wgmma_unit_stages(ciq_type T) { return wgmma_kquant(T) ? 4 : 1; }
static constexpr __host__ __device__ int wgmma_block32_bytes(ciq_type T) {
    return T == CIQ_TYPE_Q4_0   ? Q4_0_BLOCK_BYTES
           : T == CIQ_TYPE_Q5_0 ? Q5_0_BLOCK_BYTES
           : T == CIQ_TYPE_Q4_1 ? Q4_1_BLOCK_BYTES
           : T == CIQ_TYPE_Q5_1 ? Q5_1_BLOCK_BYTES
                                : Q8_0_BLOCK_BYTES;
}
static constexpr __host__ __device__ int wgmma_unit_bytes(ciq_type T) {
    return T == CIQ_TYPE_Q4_K   ? Q4_K_BLOCK_BYTES
           : T == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES
           : T == CIQ_TYPE_Q6_K ? Q6_K_BLOCK_BYTES
                                : 2 * wgmma_block32_bytes(T);
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
static constexpr __host__ __device__ int wgmma_rs_wbox(ciq_type T) {
    return T == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : T == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES : 240;
}
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

// The weights of one RS launch (the kernel's parameter comment: CIQ_WGMMA_KERNEL_PARAMS): the first row tile of
// weights 1 and 2 (INT_MAX: no such weight), the first weight of type T1, and whether wmap/wmap1 are a GLU pair.
struct wgmma_group_tiles {
    int start1, start2, t1_from, glu_pair;
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

// ---- warp roles: one layout for both forms -----------------------------------------------------------------------
// A CTA is WGMMA_CONSUMERS = 2 consumer warpgroups (consumer c: rows 64c .. 64c+63 of the tile, its wgmma and its
// accumulators) and the producer warpgroups (PW of the SS form, one of the RS form): 128 (producers + 2) threads
// (wgmma_threads). wgmma_roles is the one place the order is written and role_of_warpgroup() the one function that
// reads a warpgroup's role from it; every index below (consumer c, the producers' threads, the RS producer's TMA
// threads) derives from wgmma_roles:
// producers first, then the consumers, in both forms:
//   SS (gemm_wgmma_kernel)    warpgroups 0 .. PW-1 the producers, PW and PW+1 the consumers 0 and 1;
//   RS (gemm_wgmma_rs_kernel) warpgroup 0 the producer, which gives its registers to the consumers (setmaxnreg
//                             56 / 224), warpgroups 1 and 2 the consumers 0 and 1.
#define WGMMA_CONSUMERS 2
enum wgmma_role { WGMMA_CONSUMER = 0, WGMMA_PRODUCER = 1 };
template <int PW, bool RS> struct wgmma_roles {
    static_assert(PW == 1 || (PW == 2 && !RS), "producer warpgroups: 1 or 2 (SS), 1 (RS)");
    static constexpr int producers = RS ? 1 : PW;
    static constexpr int consumer0 = producers;  // the first consumer warpgroup
    static constexpr int producer0 = 0;          // the first producer warpgroup
    static constexpr unsigned producer_begin = 128u * producer0, producer_end = producer_begin + 128u * producers;
};
// The role of the warpgroup (thread / 128) of CTA thread `thread`: the producers are the warpgroups before the
// consumers. Compared on the thread index, as the roles were read before they were named: the same machine code. (The SS kernel's branch compares threadIdx.x with wgmma_roles::producer_end itself, tied to
// this function by a static_assert: there a call, even inlined, changes the TMA_W kernels' machine code.)
template <int PW, bool RS> static constexpr __host__ __device__ __forceinline__ wgmma_role role_of_warpgroup(unsigned thread) {
    return wgmma_role(thread < wgmma_roles<PW, RS>::producer_end);
}
static_assert(role_of_warpgroup<2, false>(255) == WGMMA_PRODUCER && role_of_warpgroup<2, false>(256) == WGMMA_CONSUMER &&
                  role_of_warpgroup<1, false>(127) == WGMMA_PRODUCER && role_of_warpgroup<1, false>(128) == WGMMA_CONSUMER &&
                  role_of_warpgroup<1, true>(127) == WGMMA_PRODUCER && role_of_warpgroup<1, true>(128) == WGMMA_CONSUMER,
              "producers, then consumers");
// A consumer warpgroup's index c (0, 1). (Unsigned arithmetic, as the indices were computed before the roles were named: the same machine code.)
template <int PW, bool RS> static constexpr __host__ __device__ __forceinline__ int wgmma_consumer_of(unsigned wg) {
    return (int)(wg - (unsigned)wgmma_roles<PW, RS>::consumer0);
}
// The CTA thread of the producers' thread t (the RS producer's TMA threads: t = 0 and 32, CTA threads 0 and 32).
template <int PW, bool RS> static constexpr __host__ __device__ __forceinline__ unsigned wgmma_producer_cta_thread(int t) {
    return 128u * wgmma_roles<PW, RS>::producer0 + (unsigned)t;
}
// Threads of a CTA: 128 PW producers (RS: one warpgroup) then 256 consumers. (An RS kernel
// of a tile config with 2 SS producer warpgroups still has one.)
static constexpr __host__ __device__ int wgmma_threads(int PW, bool RS) { return 128 * ((RS ? 1 : PW) + WGMMA_CONSUMERS); }

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

// Q4_K / Q5_K: per row p the 8 qs bytes 32c + 8i .. +7 (low nibbles: chunk i, sub-block 2c; high: chunk i+4, 2c+1),
// Q5_K's 8 qh bytes 8i .. +7 (bit 2c: the low chunk's fifth bits, 2c+1 the high's) and the 16-byte header
// {d, dmin, scales[12]}.
template <ciq_type T, int R> struct raw_stage_q45_K {  // staged only: Q4_K/Q5_K rows always allow TMA
    static constexpr int RSTEP = CIQ_WGMMA_ROWS / R, QS = T == CIQ_TYPE_Q5_K ? 48 : 16;
    uint2 qs[R];
    uint2 qh[T == CIQ_TYPE_Q5_K ? R : 1];
    uint4 hdr[R];
    __device__ __forceinline__ void load(const uint8_t *const (&blk)[R], int c, int i) {
#pragma unroll
        for (int p = 0; p < R; ++p) {
            qs[p] = ld<true, uint2>(blk[p] + QS + 32 * c + 8 * i);
            if constexpr (T == CIQ_TYPE_Q5_K) qh[p] = ld<true, uint2>(blk[p] + 16 + 8 * i);
            hdr[p] = ld<true, uint4>(blk[p]);
        }
    }
    // Q5_K: bit b of each byte of the qh word to bit 4.
    static __device__ __forceinline__ uint32_t fifth_bits(uint32_t h, int b) { return ((h >> b) & 0x01010101u) << 4; }
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
                uint32_t lo = q & 0x0F0F0F0F;
                if constexpr (T == CIQ_TYPE_Q5_K) lo |= fifth_bits(w ? qh[p].y : qh[p].x, 2 * c);
                __half2 l0, l1, h0, h1;
                bytes_to_half2(lo, bias, l0, l1);
                uint32_t hi = (q >> 4) & 0x0F0F0F0F;
                if constexpr (T == CIQ_TYPE_Q5_K) hi |= fifth_bits(w ? qh[p].y : qh[p].x, 2 * c + 1);
                bytes_to_half2(hi, bias, h0, h1);
                o[0][2 * w] = h2u(__hfma2(l0, s0, nm0));
                o[0][2 * w + 1] = h2u(__hfma2(l1, s0, nm0));
                o[1][2 * w] = h2u(__hfma2(h0, s1, nm1));
                o[1][2 * w + 1] = h2u(__hfma2(h1, s1, nm1));
            }
            store_pair(a_tile, r, i, o);
        }
    }
};
template <int R, bool SMEM> struct raw_stage<CIQ_TYPE_Q4_K, R, SMEM> : raw_stage_q45_K<CIQ_TYPE_Q4_K, R> {
    static_assert(SMEM, "Q4_K blocks are read from shared memory");
};
template <int R, bool SMEM> struct raw_stage<CIQ_TYPE_Q5_K, R, SMEM> : raw_stage_q45_K<CIQ_TYPE_Q5_K, R> {
    static_assert(SMEM, "Q5_K blocks are read from shared memory");
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
// Q5_0's high-bit byte and the fp16 d (and m). Bytes become f16 (1024 + byte) less a bias (exact small integers),
// times d (plus m, fused): one f16 rounding of q * d (+ m), as dequantize_f16 in ggml_ciq/quants.py.
//   Q8_0 {d, qs[32]}: value j = int8 qs[j]                          (byte ^ 0x80 less 1152)
//   Q4_0 {d, qs[16]}: value j = nibble j of qs (low: j < 16) - 8     (less 1032)
//   Q5_0 {d, qh[4], qs[16]}: the same nibble | bit j of qh << 4, - 16 (less 1040)
//   Q4_1 {d, m, qs[16]}, Q5_1 {d, m, qh[4], qs[16]}: Q4_0's / Q5_0's quants unbiased (less 1024), fma(q, d, m)
// 8 bytes at a 2-byte-aligned address as four 16-bit loads: never a byte past them (ldg8_a2's three aligned words
// may read up to 4 bytes past, beyond a buffer that ends with the block: a Q4_0/Q5_0/Q8_0 block's last chunk is its
// last 8 bytes).
static __device__ __forceinline__ uint2 ldg8_u16(const uint8_t *p) {
    const uint16_t *h = (const uint16_t *)p;
    return make_uint2(__ldg(h) | (uint32_t)__ldg(h + 1) << 16, __ldg(h + 2) | (uint32_t)__ldg(h + 3) << 16);
}

template <ciq_type T, int R> struct raw_stage_block32 {
    static constexpr int RSTEP = CIQ_WGMMA_ROWS / R, BYTES = wgmma_block32_bytes(T);
    static constexpr bool OFFSET = T == CIQ_TYPE_Q4_1 || T == CIQ_TYPE_Q5_1;  // {d, m}: value = q * d + m
    static constexpr bool HIGH = T == CIQ_TYPE_Q5_0 || T == CIQ_TYPE_Q5_1;    // a qh word of fifth bits
    static constexpr int QH = OFFSET ? 4 : 2, QS = QH + (HIGH ? 4 : 0);       // offsets of qh and qs in the block
    uint2 q[R][2];
    std::conditional_t<OFFSET, uint32_t, uint16_t> d[R][2];  // the fp16 d (Q4_1/Q5_1: d | m << 16, one register)
    uint8_t h[R][2];  // Q5_0/Q5_1: qh byte i (the high bits of chunk i's 8 values)
    __device__ __forceinline__ void load(const uint8_t *const (&blk)[R], int, int i) {
#pragma unroll
        for (int p = 0; p < R; ++p)
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const uint8_t *bp = blk[p] + BYTES * b;
                q[p][b] = ldg8_u16(bp + QS + (T == CIQ_TYPE_Q8_0 ? 8 * i : 8 * (i & 1)));
                d[p][b] = __ldg((const uint16_t *)bp);
                if constexpr (OFFSET) d[p][b] |= (uint32_t)__ldg((const uint16_t *)bp + 1) << 16;
                if constexpr (HIGH) h[p][b] = __ldg(bp + QH + i);
            }
    }
    // Bit n of the 4 bits hb4 to bit 4 of byte n.
    static __device__ __forceinline__ uint32_t spread4(uint32_t hb4) {
        return (hb4 & 1) << 4 | (hb4 & 2) << 11 | (hb4 & 4) << 18 | (hb4 & 8) << 25;
    }
    __device__ __forceinline__ void dequant(uint8_t *a_tile, int, int i, int r0) const {
        const __half2 bias = __half2half2(__ushort_as_half(T == CIQ_TYPE_Q8_0 ? 0x6480 : T == CIQ_TYPE_Q5_0 ? 0x6410
                                                           : T == CIQ_TYPE_Q4_0 ? 0x6408 : 0x6400));
        const int shift = T == CIQ_TYPE_Q8_0 ? 0 : 4 * (i >> 1);  // chunks 2, 3: the high nibbles
#pragma unroll
        for (int p = 0; p < R; ++p) {
            uint32_t o[2][4];
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const __half2 d2 = __half2half2(__ushort_as_half((uint16_t)d[p][b]));
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const uint32_t word = w ? q[p][b].y : q[p][b].x;
                    uint32_t v;
                    if constexpr (T == CIQ_TYPE_Q8_0) v = word ^ 0x80808080u;
                    else v = (word >> shift) & 0x0F0F0F0Fu;
                    if constexpr (HIGH) v |= spread4((uint32_t)(h[p][b] >> (4 * w)) & 0xF);
                    __half2 v0, v1;
                    bytes_to_half2(v, bias, v0, v1);
                    if constexpr (OFFSET) {
                        const __half2 m2 = __half2half2(__ushort_as_half((uint16_t)(d[p][b] >> 16)));
                        o[b][2 * w] = h2u(__hfma2(v0, d2, m2));
                        o[b][2 * w + 1] = h2u(__hfma2(v1, d2, m2));
                    } else {
                        o[b][2 * w] = h2u(__hmul2(v0, d2));
                        o[b][2 * w + 1] = h2u(__hmul2(v1, d2));
                    }
                }
            }
            store_pair(a_tile, r0 + RSTEP * p, i, o);
        }
    }
};
template <int R> struct raw_stage<CIQ_TYPE_Q4_0, R, false> : raw_stage_block32<CIQ_TYPE_Q4_0, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q5_0, R, false> : raw_stage_block32<CIQ_TYPE_Q5_0, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q8_0, R, false> : raw_stage_block32<CIQ_TYPE_Q8_0, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q4_1, R, false> : raw_stage_block32<CIQ_TYPE_Q4_1, R> {};
template <int R> struct raw_stage<CIQ_TYPE_Q5_1, R, false> : raw_stage_block32<CIQ_TYPE_Q5_1, R> {};

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

// Q4_K / Q5_K stage c: qs bytes 32c .. 32c+31; slice j takes the bytes 16(j%2) + 2q (+1) and + 8, low nibbles for
// j < 2 (sub-block 2c), high for j >= 2 (2c+1); Q5_K the qh bytes at the same positions, bit 2c (j < 2) or 2c+1.
template <ciq_type T> struct rs_frag_q45_K {
    uint4 hdr[2];
    __device__ __forceinline__ void header(const uint8_t *const (&blk)[2]) {
        hdr[0] = *(const uint4 *)blk[0];
        hdr[1] = *(const uint4 *)blk[1];
    }
    __device__ __forceinline__ void build(const uint8_t *const (&blk)[2], int c, int q, uint32_t (&a)[4][4]) const {
        using raw = raw_stage_q45_K<T, 4>;
        const __half2 bias = __half2half2(__ushort_as_half(0x6400));  // 1024
#pragma unroll
        for (int p = 0; p < 2; ++p) {
            const uint8_t *qs = blk[p] + raw::QS + 32 * c + 2 * q;
            const uint32_t w[2] = {lds16x2(qs, 8), lds16x2(qs + 16, 8)};
            uint32_t hb[2] = {0, 0};
            if constexpr (T == CIQ_TYPE_Q5_K) hb[0] = lds16x2(blk[p] + 16 + 2 * q, 8), hb[1] = lds16x2(blk[p] + 32 + 2 * q, 8);
            __half2 s[2], nm[2];
            raw::scale_min(hdr[p], 2 * c, s[0], nm[0]);
            raw::scale_min(hdr[p], 2 * c + 1, s[1], nm[1]);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                uint32_t v = (j < 2 ? w[j % 2] : w[j % 2] >> 4) & 0x0F0F0F0F;
                if constexpr (T == CIQ_TYPE_Q5_K) v |= raw::fifth_bits(hb[j % 2], 2 * c + j / 2);
                __half2 lo, hi;
                bytes_to_half2(v, bias, lo, hi);
                a[j][p] = h2u(__hfma2(lo, s[j / 2], nm[j / 2]));
                a[j][p + 2] = h2u(__hfma2(hi, s[j / 2], nm[j / 2]));
            }
        }
    }
};

template <> struct rs_frag<CIQ_TYPE_Q4_K> : rs_frag_q45_K<CIQ_TYPE_Q4_K> {};
template <> struct rs_frag<CIQ_TYPE_Q5_K> : rs_frag_q45_K<CIQ_TYPE_Q5_K> {};

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
    static_assert(wgmma_roles<PW, false>::producer_begin == 0, "SS: the producers' thread t is the CTA thread");
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
        constexpr int PREFETCH =
            (T == CIQ_TYPE_Q6_K || T == CIQ_TYPE_Q5_0 || T == CIQ_TYPE_Q4_1 || T == CIQ_TYPE_Q5_1) && PW == 1 ? 1 : 2;
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
    const int cw = wgmma_consumer_of<PW, false>(threadIdx.x / 128), lane = threadIdx.x % 32;
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
// here the producer warpgroup (before the two consumer warpgroups, its registers given to them) only issues TMA copies:
// thread 0 the B stages (after the PDL wait), thread 32 (another warp: neither's waits hold up the other) the staged
// super-blocks (RS_WSLOTS slots; wempty: the 8 consumer warps' reads of a slot done); the consumers read their rows'
// quants from the staged block, build the A fragments (rs_frag) and issue wgmma with A from registers. Fragments
// alternate between two register sets: a stage's wgmma group may still run while the next stage's set is built, and a
// set is rebuilt only after wait_group(1) retired the group that read it. SLOT: the bytes between staged-weight slots
// (a grouped kernel's two types share the larger type's slots).
template <ciq_type T, int BN, int STAGES, int SLOT = CIQ_WGMMA_ROWS * wgmma_rs_wbox(T)>
static __device__ __forceinline__ void wgmma_produce_rs(const CUtensorMap &xmap, const CUtensorMap &wmap,
                                                        const CUtensorMap &wmap_hi, bool pair, uint8_t *smem,
                                                        uint8_t *wraw,
                                                        uint64_t *full, uint64_t *empty, uint64_t *wfull,
                                                        uint64_t *wempty, int kb0, int nsb, int64_t wrow0, int tok0,
                                                        int it0, int sb0) {
    constexpr int WB = wgmma_rs_wbox(T), block_bytes = wgmma_unit_bytes(T);  // wrow0: the tile's first row in wmap
    if (threadIdx.x == wgmma_producer_cta_thread<1, true>(32)) {  // weights (the producer's warp 1, CTA thread 32):
        // no kernel writes them, so before the PDL wait
        for (int sb = 0; sb < nsb; ++sb) {
            const int n = sb0 + sb, ws = n % RS_WSLOTS;
            if (n >= RS_WSLOTS) mbar_wait(&wempty[ws], ((n / RS_WSLOTS) + 1) & 1);
            mbar_arrive_expect_tx(&wfull[ws], CIQ_WGMMA_ROWS * WB);
            const int kx = (kb0 + sb) * block_bytes & ~15;
            tma_load_2d(wraw + ws * SLOT, &wmap, kx, (int)wrow0, &wfull[ws]);
            if (pair)  // a GLU pair: 64 rows of gate (wmap), then up's same 64 (wmap_hi; 64-row boxes)
                tma_load_2d(wraw + ws * SLOT + CIQ_GLU_INTERLEAVE * WB, &wmap_hi, kx, (int)wrow0, &wfull[ws]);
        }
    } else if (threadIdx.x == wgmma_producer_cta_thread<1, true>(0)) {  // activations (its warp 0, CTA thread 0)
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
    const int cw = wgmma_consumer_of<1, true>(threadIdx.x / 128), warp = (threadIdx.x % 128) / 32,
              lane = threadIdx.x % 32;  // warpgroups 1, 2
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

// The kernel's body, for the SS kernel and the RS kernel (launch bounds of their threads, one CTA an SM).
#define CIQ_WGMMA_KERNEL_PARAMS                                                                                        \
    const __grid_constant__ CUtensorMap xmap, const __grid_constant__ CUtensorMap wmap, const uint8_t *__restrict__ w, \
        int64_t rows, int nb, const float *__restrict__ tscale, int tokens, int kb_per_split, int tile0, int row_tiles, \
        const __grid_constant__ wgmma_outputs outs, ciq_out_type out_type, wgmma_stream_k sk,                        \
        const __grid_constant__ CUtensorMap wmap1, const __grid_constant__ CUtensorMap wmap2, wgmma_group_tiles gt
// The RS form reads gt (the SS form one weight: wmap): weights 0, 1, 2 (wmap, wmap1, wmap2) own the product's row tiles
// from 0, gt.start1, gt.start2 (INT_MAX: none); weights from gt.t1_from on are of type T1 (T1 != T: the grouped
// kernel), the others T; gt.glu_pair: wmap gate's and wmap1 up's rows, 64-row boxes, a tile's staged rows 0..63 gate's
// 64t.. and 64..127 up's (ciq_gemm_quantized_glu's interleaved weight, read from two matrices).
template <ciq_type T, int BN, int STAGES, int PW, bool TMA_W, bool RS, ciq_type T1 = T>
static __device__ __forceinline__ void gemm_wgmma_body(const CUtensorMap &xmap, const CUtensorMap &wmap,
                                                       const uint8_t *__restrict__ w, int64_t rows, int nb,
                                                       const float *__restrict__ tscale, int tokens, int kb_per_split,
                                                       int tile0, int row_tiles, const wgmma_outputs &outs,
                                                       ciq_out_type out_type, const wgmma_stream_k &sk,
                                                       const CUtensorMap &wmap1, const CUtensorMap &wmap2,
                                                       const wgmma_group_tiles &gt) {
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
            mbar_init(&empty[s], 4 * WGMMA_CONSUMERS);  // one arrival a consumer warp
        }
        for (int s = 0; s < NW; ++s) {
            mbar_init(&wfull[s], 1);
            if (RS) mbar_init(&wempty[s], 4 * WGMMA_CONSUMERS);
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
        static_assert(role_of_warpgroup<PW, false>(wgmma_roles<PW, false>::producer_end - 1) == WGMMA_PRODUCER &&
                          role_of_warpgroup<PW, false>(wgmma_roles<PW, false>::producer_end) == WGMMA_CONSUMER,
                      "the SS branch below is role_of_warpgroup's");
        if (threadIdx.x < wgmma_roles<PW, false>::producer_end) {  // role_of_warpgroup<PW, false> == WGMMA_PRODUCER
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
        // The tile's weight (CTA-uniform): 0, 1 or 2 (wmap, wmap1, wmap2), whether it is of type T1, and the tile's
        // first row in its map. Each map is named in its own branch below: a tensor map picked through a runtime
        // pointer is copied out of the parameter space (register spills in every RS kernel).
        auto weight_of = [&](int64_t row0, int &wi, bool &t1, int64_t &wrow) {
            const int rt = (int)(row0 / CIQ_WGMMA_ROWS);
            wi = (rt >= gt.start1) + (rt >= gt.start2);
            t1 = GROUPED && wi >= gt.t1_from;
            wrow = gt.glu_pair ? row0 / 2 : row0 - (int64_t)(wi == 0 ? 0 : wi == 1 ? gt.start1 : gt.start2) * CIQ_WGMMA_ROWS;
        };
        auto type1 = [&](int64_t row0) {  // the consumers: only the tile's type
            const int rt = (int)(row0 / CIQ_WGMMA_ROWS);
            return GROUPED && (rt >= gt.start1) + (rt >= gt.start2) >= gt.t1_from;
        };
        if (role_of_warpgroup<PW, true>(threadIdx.x) == WGMMA_PRODUCER) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 56;");
            each_segment([&](int tile, int kb0, int kb1, int it0, int sb0, const wgmma_handover &hand) {
                int64_t row0;
                int tok0;
                tile_of(tile, row0, tok0);
                int wi;
                bool t1;
                int64_t wrow;
                weight_of(row0, wi, t1, wrow);
                const int nsb = kb1 - kb0;
                if (wi == 0)
                    wgmma_produce_rs<T, BN, STAGES, SLOT>(xmap, wmap, wmap1, gt.glu_pair, smem, wraw, full, empty,
                                                          wfull, wempty, kb0, nsb, wrow, tok0, it0, sb0);
                else if (t1 && wi == 1)
                    wgmma_produce_rs<T1, BN, STAGES, SLOT>(xmap, wmap1, wmap1, false, smem, wraw, full, empty, wfull,
                                                           wempty, kb0, nsb, wrow, tok0, it0, sb0);
                else if (t1)
                    wgmma_produce_rs<T1, BN, STAGES, SLOT>(xmap, wmap2, wmap1, false, smem, wraw, full, empty, wfull,
                                                           wempty, kb0, nsb, wrow, tok0, it0, sb0);
                else if (wi == 1)
                    wgmma_produce_rs<T, BN, STAGES, SLOT>(xmap, wmap1, wmap1, false, smem, wraw, full, empty, wfull,
                                                          wempty, kb0, nsb, wrow, tok0, it0, sb0);
                else
                    wgmma_produce_rs<T, BN, STAGES, SLOT>(xmap, wmap2, wmap1, false, smem, wraw, full, empty, wfull,
                                                          wempty, kb0, nsb, wrow, tok0, it0, sb0);
                wgmma_epilogue<BN>(smem, tscale, tokens, outs, out_type, row0, tok0, hand);
            });
        } else {
            asm volatile("setmaxnreg.inc.sync.aligned.u32 224;");
            each_segment([&](int tile, int kb0, int kb1, int it0, int sb0, const wgmma_handover &hand) {
                int64_t row0;
                int tok0;
                tile_of(tile, row0, tok0);
                float acc[BN / 2];
                if (type1(row0))
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
                                                     row_tiles, outs, out_type, sk, wmap1, wmap2, gt);
}
// T1 != T: the grouped kernel (two weights' tiles in one grid: gemm_wgmma_body)
template <ciq_type T, int BN, int STAGES, ciq_type T1>
__global__ void __launch_bounds__(wgmma_threads(1, true), 1) gemm_wgmma_rs_kernel(CIQ_WGMMA_KERNEL_PARAMS) {
    gemm_wgmma_body<T, BN, STAGES, 1, true, true, T1>(xmap, wmap, w, rows, nb, tscale, tokens, kb_per_split, tile0,
                                                      row_tiles, outs, out_type, sk, wmap1, wmap2, gt);
}

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

#endif  // !GGML_CIQ_HIP
