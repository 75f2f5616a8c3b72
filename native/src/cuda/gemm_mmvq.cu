// gemm_mmvq.cu - llama.cpp CUDA's mul_mat_vec_q (MMVQ), the kernel llama.cpp runs for 1..8 activation columns, in
// its float order (docs/SEMANTICS.md "mmvq"; host twin native/src/cpu/gemm_mmvq.cpp, reference
// quants.gemm_mmvq_semantics_quantized). Also llama.cpp's quantize_q8_1, which makes MMVQ's activations.
//
// Layouts:
//   x      : float32 [tokens][K], K a multiple of 32.
//   x_q8_1 : [tokens][K/32] ggml block_q8_1 (36 B: half d, half sum, int8 qs[32]); 4-byte aligned.
//   weight : [rows][K] GGUF blocks: Q4_0 18 B, Q5_0 22 B, Q8_0 34 B, Q4_1 20 B, Q5_1 24 B per 32 values (2-byte
//            aligned; read as 16-bit words), Q4_K 144 B, Q5_K 176 B, Q6_K 210 B per 256 values (Q6_K read as 16-bit
//            words).
//   out    : float32 [tokens][rows].
//
// Roles, as llama.cpp's mul_mat_vec_q on NVIDIA (its generic table: Ampere, Ada, Hopper, Blackwell): a CTA of
// NWARPS = 4 (1..4 tokens) or 2 (5..8) warps computes ROWS = 1 (one token) or 2 rows for every token. Thread
// tid = 32*warp + lane is part s = tid % TPB of the weight blocks kb = tid/TPB + n*(NWARPS*32/TPB) (TPB threads
// per block: Q4_0/Q5_0/Q4_1/Q5_1 2, Q8_0 4, Q4_K/Q5_K 16, Q6_K 32), accumulated in n order from 0.f by the type's step (below, as
// in vecdotq.cuh). Warps 1.. park their sums in shared memory; lane x of warp 0 adds them in warp order, and the
// xor butterfly (offsets 16, 8, 4, 2, 1) sums the lanes. Lane i writes row i.
// Float operations are explicit round-to-nearest intrinsics: exactly the FFMA / FMUL / FADD that nvcc emits for
// llama.cpp's expressions (read from its sm_90a SASS, -use_fast_math), so a fast-math build changes nothing. llama.cpp
// flushes subnormals (.FTZ); these do not, which matters only below 2^-126.
#include "common.cuh"

#include <type_traits>

namespace {

constexpr int MMVQ_MAX_TOKENS = 8;
constexpr int MMVQ_WARP = 32;

struct block_q8_1 {
    uint16_t d, s;  // half2 ds: the scale and the float sum of the 32 values
    int8_t qs[32];
};
static_assert(sizeof(block_q8_1) == 36, "block_q8_1");

template <int TYPE> struct mmvq_traits;
template <> struct mmvq_traits<2> { static constexpr int qk = 32, bytes = Q4_0_BLOCK_BYTES, tpb = 2; };  // Q4_0
template <> struct mmvq_traits<6> { static constexpr int qk = 32, bytes = Q5_0_BLOCK_BYTES, tpb = 2; };  // Q5_0
template <> struct mmvq_traits<8> { static constexpr int qk = 32, bytes = Q8_0_BLOCK_BYTES, tpb = 4; };  // Q8_0
template <> struct mmvq_traits<3> { static constexpr int qk = 32, bytes = Q4_1_BLOCK_BYTES, tpb = 2; };  // Q4_1
template <> struct mmvq_traits<7> { static constexpr int qk = 32, bytes = Q5_1_BLOCK_BYTES, tpb = 2; };  // Q5_1
template <> struct mmvq_traits<12> { static constexpr int qk = 256, bytes = Q4_K_BLOCK_BYTES, tpb = 16; };  // Q4_K
template <> struct mmvq_traits<13> { static constexpr int qk = 256, bytes = Q5_K_BLOCK_BYTES, tpb = 16; };  // Q5_K
template <> struct mmvq_traits<14> { static constexpr int qk = 256, bytes = Q6_K_BLOCK_BYTES, tpb = 32; };  // Q6_K

__device__ __forceinline__ int load_b2(const uint8_t *p, int i32) {  // 32 bits at a 2-byte aligned address
    const uint16_t *p16 = reinterpret_cast<const uint16_t *>(p);
    return (int)(p16[2 * i32] | (uint32_t)p16[2 * i32 + 1] << 16);
}
__device__ __forceinline__ int load_b4(const void *p, int i32) { return reinterpret_cast<const int *>(p)[i32]; }
__device__ __forceinline__ int sub32_bytes(int v) {  // each byte minus 32 (bytes are 0..63)
    return (int)(((uint32_t)v | 0x80808080u) - 0x20202020u) ^ (int)0x80808080u;
}

// Q5_0 / Q5_1: the quants' fifth bits, qh bit 4(iqs) + n to bit 4 of byte n (vi0) and bit 16 + 4(iqs) + n (vi1).
__device__ __forceinline__ void q5_high_bits(int vh, int &vi0, int &vi1) {
    vi0 |= (vh << 4) & 0x00000010;
    vi0 |= (vh << 11) & 0x00001000;
    vi0 |= (vh << 18) & 0x00100000;
    vi0 |= (vh << 25) & 0x10000000;
    vi1 |= (vh >> 12) & 0x00000010;
    vi1 |= (vh >> 5) & 0x00001000;
    vi1 |= (vh << 2) & 0x00100000;
    vi1 |= (vh << 9) & 0x10000000;
}

// The 32-value blocks of 4- and 5-bit quants, two threads a block: thread s takes bytes 8s..8s+7 of qs (values
// 8s..8s+7 in the low nibbles, 16+8s.. in the high; HIGH: the fifth bits from the qh word) and sums their raw quants
// times the q8 values.
template <bool HIGH>
__device__ __forceinline__ int raw_isum(const uint8_t *qs, const uint8_t *qh, const block_q8_1 *y, int s) {
    const int iqs = 2 * s;
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int v = load_b2(qs, iqs + i);
        int vi0 = v & 0x0F0F0F0F, vi1 = (v >> 4) & 0x0F0F0F0F;
        if constexpr (HIGH) q5_high_bits(load_b2(qh, 0) >> (4 * (iqs + i)), vi0, vi1);
        sumi = ciq_dot4(vi0, load_b4(y->qs, iqs + i), sumi);
        sumi = ciq_dot4(vi1, load_b4(y->qs, iqs + i + 4), sumi);
    }
    return sumi;
}

// Q4_0 / Q5_0: raw_isum of the raw quants; inner = fma(d8, float(isum), -c*s8) with c = 4 (Q4_0) or 8 (Q5_0);
// acc = fma(d_w, inner, acc).
template <int TYPE>
__device__ __forceinline__ float step_q4_5_0(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const int sumi = raw_isum<TYPE == 6>(blk + (TYPE == 6 ? 6 : 2), blk + 2, y, s);
    const float d_w = ciq_half_to_float(*reinterpret_cast<const uint16_t *>(blk));
    const float d8 = ciq_half_to_float(y->d), s8 = ciq_half_to_float(y->s);
    const float inner = __fmaf_rn(d8, (float)sumi, __fmul_rn(s8, TYPE == 2 ? -4.f : -8.f));
    return __fmaf_rn(d_w, inner, acc);
}

// llama.cpp's __hmul of two fp16 values, as a float: their float product is exact (11-bit significands), so one
// rounding to fp16 of it is the fp16 product (correctly rounded, inf past the range).
__device__ __forceinline__ float half_product(uint16_t a, uint16_t b) {
    return __half2float(__float2half_rn(__fmul_rn(ciq_half_to_float(a), ciq_half_to_float(b))));
}

// Q4_1 / Q5_1 (blocks {half d, half m[, qh], qs}): Q4_0's split of the values, quants 0..15 / 0..31; d4d8 =
// half(d_w*d8) and m4s8 = half(m_w*s8) (llama.cpp's __hmul2 under FAST_FP16_AVAILABLE: one fp16 rounding of an exact
// product); acc = acc + fma(d4d8, float(isum), m4s8/2) (the two threads of a block each add half the offset term).
template <int TYPE>
__device__ __forceinline__ float step_q4_5_1(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const int sumi = raw_isum<TYPE == 7>(blk + (TYPE == 7 ? 8 : 4), blk + 4, y, s);
    const uint16_t *dm = reinterpret_cast<const uint16_t *>(blk);
    const float d4d8 = half_product(dm[0], y->d), m4s8 = half_product(dm[1], y->s);
    return __fadd_rn(acc, __fmaf_rn(d4d8, (float)sumi, __fmul_rn(m4s8, 0.5f)));
}

// Q8_0: thread s takes values 8s..8s+7; acc = fma(d_w*d8, float(isum), acc).
__device__ __forceinline__ float step_q8_0(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 2; ++i) sumi = ciq_dot4(load_b2(blk + 2, 2 * s + i), load_b4(y->qs, 2 * s + i), sumi);
    const float d_w = ciq_half_to_float(*reinterpret_cast<const uint16_t *>(blk));
    return __fmaf_rn(__fmul_rn(d_w, ciq_half_to_float(y->d)), (float)sumi, acc);
}

// Q4_K / Q5_K: thread s = 4c + l takes sub-blocks 2c + i (i = 0, 1) at positions 4l..4l+3 and 16+4l..16+4l+3
// (Q5_K: bit 2c + i of the qh bytes at those positions is the fifth bit); sumf_d = fma(d8_1, float(sc_1*dot_1),
// d8_0*float(sc_0*dot_0)), sumf_m the same with m and the q8 sums; acc = acc + fma(sumf_d, d, -(sumf_m*dmin)).
template <int TYPE>
__device__ __forceinline__ float step_q45_K(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    using block = std::conditional_t<TYPE == 12, block_q4_K, block_q5_K>;
    const block *b = reinterpret_cast<const block *>(blk);
    const int c = s / 4, l = s % 4;
    const int v0 = load_b4(b->qs, 8 * c + l), v1 = load_b4(b->qs, 8 * c + l + 4);
    int h0 = 0, h1 = 0;
    if constexpr (TYPE == 13) {
        h0 = load_b4(b->qh, l) >> (2 * c);
        h1 = load_b4(b->qh, l + 4) >> (2 * c);
    }
    float sumf_d = 0.f, sumf_m = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int sc, m;
        ciq_q4_K_scale_min(2 * c + i, b->scales, &sc, &m);
        const block_q8_1 *yi = y + 2 * c + i;
        const int u0 = load_b4(yi->qs, l), u1 = load_b4(yi->qs, l + 4);
        const int q0 = ((v0 >> (4 * i)) & 0x0F0F0F0F) | (((h0 >> i) << 4) & 0x10101010);
        const int q1 = ((v1 >> (4 * i)) & 0x0F0F0F0F) | (((h1 >> i) << 4) & 0x10101010);
        const int dot1 = ciq_dot4(q1, u1, ciq_dot4(q0, u0, 0));
        const int dot2 = ciq_dot4(0x01010101, u1, ciq_dot4(0x01010101, u0, 0));
        const float d8 = ciq_half_to_float(yi->d);
        sumf_d = i == 0 ? __fmul_rn(d8, (float)(dot1 * sc)) : __fmaf_rn(d8, (float)(dot1 * sc), sumf_d);
        sumf_m = i == 0 ? __fmul_rn(d8, (float)(dot2 * m)) : __fmaf_rn(d8, (float)(dot2 * m), sumf_m);
    }
    const float d = ciq_half_to_float(b->d), dmin = ciq_half_to_float(b->dmin);
    return __fadd_rn(acc, __fmaf_rn(sumf_d, d, -__fmul_rn(sumf_m, dmin)));
}

// Q6_K: thread s = 16n + 8h + w takes, for i = 0, 1, the values 128n + 32g + 4w + e (g = h + 2i, e < 4) of q8
// block 4n + g with the 16-value scale 8n + 2g + w/4; sumf = fma(d8_1, float(sc_1*dot_1), d8_0*float(sc_0*dot_0));
// acc = fma(d, sumf, acc).
__device__ __forceinline__ float step_q6_K(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const block_q6_K *b = reinterpret_cast<const block_q6_K *>(blk);
    const int n = s / 16, h = (s / 8) % 2, w = s % 8;
    const int vl = load_b2(b->ql, s);
    const int vh = load_b2(b->qh, 8 * n + w) >> (2 * h);
    float sumf = 0.f;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int g = h + 2 * i;
        const int vil = (vl >> (4 * i)) & 0x0F0F0F0F;
        const int vih = ((vh >> (4 * i)) << 4) & 0x30303030;
        const int dot = ciq_dot4(sub32_bytes(vil | vih), load_b4(y[4 * n + g].qs, w), 0);
        const int sc = b->scales[8 * n + 2 * g + w / 4];
        const float d8 = ciq_half_to_float(y[4 * n + g].d);
        sumf = i == 0 ? __fmul_rn(d8, (float)(dot * sc)) : __fmaf_rn(d8, (float)(dot * sc), sumf);
    }
    return __fmaf_rn(ciq_half_to_float(b->d), sumf, acc);
}

template <int TYPE, int NCOLS>
__global__ void __launch_bounds__((NCOLS <= 4 ? 4 : 2) * MMVQ_WARP, 1)
gemm_mmvq_kernel(const uint8_t *__restrict__ weight, int64_t rows, int64_t k, const block_q8_1 *__restrict__ x,
                 float *__restrict__ out) {
    constexpr int NWARPS = NCOLS <= 4 ? 4 : 2, ROWS = NCOLS == 1 ? 1 : 2;
    constexpr int QK = mmvq_traits<TYPE>::qk, BYTES = mmvq_traits<TYPE>::bytes, TPB = mmvq_traits<TYPE>::tpb;
    constexpr int PER_ITER = NWARPS * MMVQ_WARP / TPB;
    const int tid = MMVQ_WARP * threadIdx.y + threadIdx.x;
    const int64_t row0 = (int64_t)ROWS * blockIdx.x;
    const int64_t nb = k / QK, x_blocks = k / 32;

    float tmp[NCOLS][ROWS];
#pragma unroll
    for (int j = 0; j < NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) tmp[j][i] = 0.f;
    }
    const int s = tid % TPB;
    for (int64_t kb = tid / TPB; kb < nb; kb += PER_ITER) {
#pragma unroll
        for (int j = 0; j < NCOLS; ++j) {
            const block_q8_1 *y = x + j * x_blocks + kb * (QK / 32);
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
                const int64_t row = row0 + i < rows ? row0 + i : rows - 1;  // a tail CTA's spare row reads row rows-1
                const uint8_t *blk = weight + (row * nb + kb) * BYTES;
                if constexpr (TYPE == 2 || TYPE == 6) tmp[j][i] = step_q4_5_0<TYPE>(blk, y, s, tmp[j][i]);
                if constexpr (TYPE == 8) tmp[j][i] = step_q8_0(blk, y, s, tmp[j][i]);
                if constexpr (TYPE == 3 || TYPE == 7) tmp[j][i] = step_q4_5_1<TYPE>(blk, y, s, tmp[j][i]);
                if constexpr (TYPE == 12 || TYPE == 13) tmp[j][i] = step_q45_K<TYPE>(blk, y, s, tmp[j][i]);
                if constexpr (TYPE == 14) tmp[j][i] = step_q6_K(blk, y, s, tmp[j][i]);
            }
        }
    }

    __shared__ float parked[NWARPS - 1][NCOLS][ROWS][MMVQ_WARP];
    if (threadIdx.y > 0) {
#pragma unroll
        for (int j = 0; j < NCOLS; ++j) {
#pragma unroll
            for (int i = 0; i < ROWS; ++i) parked[threadIdx.y - 1][j][i][threadIdx.x] = tmp[j][i];
        }
    }
    __syncthreads();
    if (threadIdx.y > 0) return;
#pragma unroll
    for (int j = 0; j < NCOLS; ++j) {
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            float v = tmp[j][i];
#pragma unroll
            for (int l = 0; l < NWARPS - 1; ++l) v = __fadd_rn(v, parked[l][j][i][threadIdx.x]);
#pragma unroll
            for (int offset = MMVQ_WARP / 2; offset > 0; offset >>= 1) {
                v = __fadd_rn(v, __shfl_xor_sync(0xFFFFFFFF, v, offset));
            }
            if ((int)threadIdx.x == i && row0 + i < rows) out[j * rows + row0 + i] = v;
        }
    }
}

template <int TYPE, int NCOLS>
void launch_mmvq(const void *weight, int64_t rows, int64_t k, const void *x, float *out) {
    constexpr int NWARPS = NCOLS <= 4 ? 4 : 2, ROWS = NCOLS == 1 ? 1 : 2;
    const dim3 grid((unsigned)((rows + ROWS - 1) / ROWS)), block(MMVQ_WARP, NWARPS);
    const auto kernel = gemm_mmvq_kernel<TYPE, NCOLS>;
    kernel<<<grid, block, 0, ciq_stream()>>>((const uint8_t *)weight, rows, k, (const block_q8_1 *)x, out);
}

template <int TYPE>
void launch_mmvq_tokens(const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens, float *out) {
    switch (tokens) {
        case 1: launch_mmvq<TYPE, 1>(weight, rows, k, x, out); break;
        case 2: launch_mmvq<TYPE, 2>(weight, rows, k, x, out); break;
        case 3: launch_mmvq<TYPE, 3>(weight, rows, k, x, out); break;
        case 4: launch_mmvq<TYPE, 4>(weight, rows, k, x, out); break;
        case 5: launch_mmvq<TYPE, 5>(weight, rows, k, x, out); break;
        case 6: launch_mmvq<TYPE, 6>(weight, rows, k, x, out); break;
        case 7: launch_mmvq<TYPE, 7>(weight, rows, k, x, out); break;
        default: launch_mmvq<TYPE, 8>(weight, rows, k, x, out); break;
    }
}

// llama.cpp builds ggml-cuda with -use_fast_math: its quantize_q8_1 computes d = amax / 127.0f as amax * float(1/127)
// (FMUL) and q = roundf(x / d) as x * rcp.approx.ftz(d) (MUFU.RCP, FMUL). The same instructions here give the same
// bytes. HIP (v_rcp_f32) and the CPU emulation of the tests (IEEE 1/d) approximate the reciprocal differently.
__device__ __forceinline__ float approx_rcp(float a) {
#if defined(GGML_CIQ_HIP)
    return __builtin_amdgcn_rcpf(a);
#elif defined(CIQ_CUDA_ON_CPU)
    return 1.0f / a;
#else
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
#endif
}

// One warp per 32-value block, lane = value; blocks numbered token-major, as x and x_q8_1.
constexpr int QUANTIZE_WARPS = 8;
__global__ void __launch_bounds__(QUANTIZE_WARPS * MMVQ_WARP)
quantize_q8_1_kernel(const float *__restrict__ x, block_q8_1 *__restrict__ out, int64_t blocks) {
    const int64_t block = (int64_t)blockIdx.x * QUANTIZE_WARPS + threadIdx.x / MMVQ_WARP;
    if (block >= blocks) return;  // the whole warp leaves together
    const int lane = threadIdx.x % MMVQ_WARP;
    const float xi = x[block * 32 + lane];
    float amax = fabsf(xi), sum = xi;
#pragma unroll
    for (int offset = MMVQ_WARP / 2; offset > 0; offset >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFF, amax, offset));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFF, sum, offset));
    }
    const float d = __fmul_rn(amax, 0x1.020408p-7f);  // float(1/127)
    out[block].qs[lane] = amax == 0.f ? 0 : (int8_t)roundf(__fmul_rn(approx_rcp(d), xi));
    if (lane == 0) {
        out[block].d = __half_as_ushort(__float2half_rn(d));
        out[block].s = __half_as_ushort(__float2half_rn(sum));
    }
}

}  // namespace

ciq_status ciq_cuda_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k) {
    const int64_t blocks = tokens * (k / 32);
    if (blocks == 0) return CIQ_OK;
    const unsigned grid = (unsigned)((blocks + QUANTIZE_WARPS - 1) / QUANTIZE_WARPS);
    quantize_q8_1_kernel<<<grid, QUANTIZE_WARPS * MMVQ_WARP, 0, ciq_stream()>>>(x, (block_q8_1 *)out, blocks);
    CIQ_CUDA_LAUNCH_CHECK("quantize_q8_1");
    return CIQ_OK;
}

ciq_status ciq_cuda_gemm_mmvq(int ggml_type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1,
                              int64_t tokens, float *out) {
    if (tokens < 1 || tokens > MMVQ_MAX_TOKENS) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "MMVQ runs 1..%d tokens, got %lld", MMVQ_MAX_TOKENS, (long long)tokens);
    }
    if (rows == 0) return CIQ_OK;
    const int align = ggml_type == 12 || ggml_type == 13 ? 4 : 2;  // Q4_K/Q5_K read qs and qh as 32-bit words
    if ((uintptr_t)weight % align != 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "MMVQ: weights of type %d must be %d-byte aligned", ggml_type, align);
    }
    switch (ggml_type) {
        case 2: launch_mmvq_tokens<2>(weight, rows, k, x_q8_1, tokens, out); break;
        case 6: launch_mmvq_tokens<6>(weight, rows, k, x_q8_1, tokens, out); break;
        case 8: launch_mmvq_tokens<8>(weight, rows, k, x_q8_1, tokens, out); break;
        case 3: launch_mmvq_tokens<3>(weight, rows, k, x_q8_1, tokens, out); break;
        case 7: launch_mmvq_tokens<7>(weight, rows, k, x_q8_1, tokens, out); break;
        case 12: launch_mmvq_tokens<12>(weight, rows, k, x_q8_1, tokens, out); break;
        case 13: launch_mmvq_tokens<13>(weight, rows, k, x_q8_1, tokens, out); break;
        case 14: launch_mmvq_tokens<14>(weight, rows, k, x_q8_1, tokens, out); break;
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "MMVQ: unsupported weight type %d", ggml_type);
    }
    CIQ_CUDA_LAUNCH_CHECK("gemm_mmvq");
    return CIQ_OK;
}
