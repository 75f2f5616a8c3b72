// gemm_mmvq.cpp - llama.cpp CUDA's mul_mat_vec_q (MMVQ: 1..8 tokens) on the host, in the GPU kernel's float order
// (docs/SEMANTICS.md "mmvq"; the device version is native/src/cuda/gemm_mmvq.cu, the reference
// quants.gemm_mmvq_semantics_quantized).
//
// Layouts:
//   weight : [rows][K] GGUF blocks (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1: 32 values; Q4_K, Q5_K, Q6_K: 256 values).
//   x_q8_1 : [tokens][K/32] ggml block_q8_1 (36 B: half d, half sum, int8 qs[32]), as llama.cpp's quantize_q8_1.
//   out    : float32 [tokens][rows].
//
// The arithmetic, per output (row, token), as the kernel does it on an NVIDIA GPU (llama.cpp's generic table, Ampere
// to Blackwell): a CTA of nwarps = 4 (1..4 tokens) or 2 (5..8) warps; thread tid = 32*warp + lane is part
// s = tid % tpb (threads per weight block: Q4_0/Q5_0/Q4_1/Q5_1 2, Q8_0 4, Q4_K/Q5_K 16, Q6_K 32) of the blocks
// kb = tid / tpb + n * (nwarps*32 / tpb), accumulated in n order from 0.f by the type's step below. Lane x of warp 0
// then adds warps 1.. in order, and the xor butterfly (offsets 16, 8, 4, 2, 1) sums the lanes. Each fmaf is a
// fused multiply-add where nvcc fuses one in llama.cpp's SASS (sm_90a, -use_fast_math); everything else is a plain
// float32 operation (this file is built with -ffp-contract=off). The GPU flushes subnormals, the host keeps them.
#include "cpu_backend.h"
#include "../fp16.h"

#include <cmath>
#include <type_traits>

namespace {

constexpr int MMVQ_WARP = 32;
constexpr float Q8_1_INV_127 = 0x1.020408p-7f;  // float(1/127): nvcc folds amax / 127.0f into amax * this

struct block_q8_1 {
    uint16_t d, s;  // half2 ds: the scale and the float sum of the 32 values
    int8_t qs[32];
};
static_assert(sizeof(block_q8_1) == 36, "block_q8_1");

inline int dot_bytes(const uint8_t *w, const int8_t *x, int n) {  // signed weight bytes . x
    int s = 0;
    for (int i = 0; i < n; ++i) s += (int)(int8_t)w[i] * x[i];
    return s;
}

// The 32-value blocks of 4- and 5-bit quants, two threads a block: thread s takes the values 8s..8s+7 and
// 16+8s..16+8s+7 and sums their raw quants (qh: the fifth bits, or none) times the q8 values.
int raw_isum(const uint8_t *qs, const uint8_t *qh, const block_q8_1 *y, int s) {
    const uint32_t h = qh ? (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24 : 0;
    int isum = 0;
    for (int v = 8 * s; v < 8 * s + 8; ++v) {
        const int lo = (qs[v] & 15) | ((h >> v) & 1) << 4, hi = (qs[v] >> 4) | ((h >> (v + 16)) & 1) << 4;
        isum += lo * y->qs[v] + hi * y->qs[v + 16];
    }
    return isum;
}

// Q4_0 / Q5_0: raw_isum of the raw quants (q+8, q+16); inner = fma(d8, float(isum), -c*s8) with c = 4 (Q4_0) or 8
// (Q5_0) per thread; acc = fma(d_w, inner, acc).
template <int TYPE>
float step_q4_5_0(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const float d_w = ciq_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8));
    const int isum = raw_isum(blk + (TYPE == 6 ? 6 : 2), TYPE == 6 ? blk + 2 : nullptr, y, s);
    const float d8 = ciq_fp16_to_fp32(y->d), s8 = ciq_fp16_to_fp32(y->s);
    const float inner = std::fma(d8, (float)isum, s8 * (TYPE == 2 ? -4.f : -8.f));
    return std::fma(d_w, inner, acc);
}

// The GPU's __hmul of two fp16 values, as a float: their float product is exact (11-bit significands), so one
// rounding of it to fp16 is the fp16 product.
float half_product(uint16_t a, uint16_t b) {
    return ciq_fp16_to_fp32(ciq_fp32_to_fp16(ciq_fp16_to_fp32(a) * ciq_fp16_to_fp32(b)));
}

// Q4_1 / Q5_1 ({half d, half m[, qh], qs}): Q4_0's split, quants 0..15 / 0..31; d4d8 = half(d_w*d8), m4s8 =
// half(m_w*s8) (the GPU's __hmul2: the float product of two halves is exact, one rounding to half);
// acc = acc + fma(d4d8, float(isum), m4s8/2).
template <int TYPE>
float step_q4_5_1(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const uint16_t d_w = (uint16_t)(blk[0] | blk[1] << 8), m_w = (uint16_t)(blk[2] | blk[3] << 8);
    const int isum = raw_isum(blk + (TYPE == 7 ? 8 : 4), TYPE == 7 ? blk + 4 : nullptr, y, s);
    const float d4d8 = half_product(d_w, y->d), m4s8 = half_product(m_w, y->s);
    return acc + std::fma(d4d8, (float)isum, m4s8 * 0.5f);
}

// Q8_0: thread s takes values 8s..8s+7; acc = fma(d_w*d8, float(isum), acc).
float step_q8_0(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const float d_w = ciq_fp16_to_fp32((uint16_t)(blk[0] | blk[1] << 8));
    const int isum = dot_bytes(blk + 2 + 8 * s, y->qs + 8 * s, 8);
    return std::fma(d_w * ciq_fp16_to_fp32(y->d), (float)isum, acc);
}

// Q4_K / Q5_K: thread s = 4c + l takes sub-blocks 2c + i (i = 0, 1) at positions 4l..4l+3 and 16+4l..16+4l+3
// (Q5_K's fifth bit: bit 2c + i of qh at the position); sumf_d = fma(d8_1, float(sc_1*dot_1), d8_0*float(sc_0*dot_0)),
// sumf_m the same with m and the q8 sums; acc = acc + fma(sumf_d, d, -(sumf_m*dmin)).
template <int TYPE>
float step_q45_K(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    using block = std::conditional_t<TYPE == 12, block_q4_K, block_q5_K>;
    const block *b = (const block *)blk;
    const int c = s / 4, l = s % 4;
    float sumf_d = 0.f, sumf_m = 0.f;
    for (int i = 0; i < 2; ++i) {
        const int j = 2 * c + i;
        int sc, m;
        if (j < 4) {
            sc = b->scales[j] & 63;
            m = b->scales[j + 4] & 63;
        } else {
            sc = (b->scales[j + 4] & 0xF) | ((b->scales[j - 4] >> 6) << 4);
            m = (b->scales[j + 4] >> 4) | ((b->scales[j] >> 6) << 4);
        }
        const block_q8_1 *yj = y + j;
        int dot1 = 0, dot2 = 0;
        for (int h = 0; h < 2; ++h) {
            for (int e = 0; e < 4; ++e) {
                const int r = 16 * h + 4 * l + e;
                int q = (b->qs[32 * c + r] >> (4 * i)) & 15;
                if constexpr (TYPE == 13) q |= ((b->qh[r] >> j) & 1) << 4;
                dot1 += q * yj->qs[r];
                dot2 += yj->qs[r];
            }
        }
        const float d8 = ciq_fp16_to_fp32(yj->d);
        sumf_d = i == 0 ? d8 * (float)(dot1 * sc) : std::fma(d8, (float)(dot1 * sc), sumf_d);
        sumf_m = i == 0 ? d8 * (float)(dot2 * m) : std::fma(d8, (float)(dot2 * m), sumf_m);
    }
    const float d = ciq_fp16_to_fp32(b->d), dmin = ciq_fp16_to_fp32(b->dmin);
    return acc + std::fma(sumf_d, d, -(sumf_m * dmin));
}

// Q6_K: thread s = 16n + 8h + w takes, for i = 0, 1, the values 128n + 32g + 4w + e (g = h + 2i, e < 4) of q8
// block 4n + g with the 16-value scale 8n + 2g + w/4; sumf = fma(d8_1, float(sc_1*dot_1), d8_0*float(sc_0*dot_0));
// acc = fma(d, sumf, acc).
float step_q6_K(const uint8_t *blk, const block_q8_1 *y, int s, float acc) {
    const block_q6_K *b = (const block_q6_K *)blk;
    const int n = s / 16, h = (s / 8) % 2, w = s % 8;
    float sumf = 0.f;
    for (int i = 0; i < 2; ++i) {
        const int g = h + 2 * i;
        int dot = 0;
        for (int e = 0; e < 4; ++e) {
            const int l = 4 * w + e;
            const int lo = g < 2 ? b->ql[64 * n + l + 32 * g] & 15 : b->ql[64 * n + l + 32 * (g - 2)] >> 4;
            const int hi = (b->qh[32 * n + l] >> (2 * g)) & 3;
            dot += ((lo | hi << 4) - 32) * y[4 * n + g].qs[l];
        }
        const int sc = b->scales[8 * n + 2 * g + w / 4];
        const float d8 = ciq_fp16_to_fp32(y[4 * n + g].d);
        sumf = i == 0 ? d8 * (float)(dot * sc) : std::fma(d8, (float)(dot * sc), sumf);
    }
    return std::fma(ciq_fp16_to_fp32(b->d), sumf, acc);
}

template <int TYPE>
void gemm_mmvq(const uint8_t *weight, int64_t rows, int64_t k, const block_q8_1 *x, int64_t tokens, float *out) {
    constexpr int qk = TYPE >= 12 ? 256 : 32;
    constexpr int block_bytes = TYPE == 2    ? Q4_0_BLOCK_BYTES
                                : TYPE == 3  ? Q4_1_BLOCK_BYTES
                                : TYPE == 6  ? Q5_0_BLOCK_BYTES
                                : TYPE == 7  ? Q5_1_BLOCK_BYTES
                                : TYPE == 8  ? Q8_0_BLOCK_BYTES
                                : TYPE == 12 ? Q4_K_BLOCK_BYTES
                                : TYPE == 13 ? Q5_K_BLOCK_BYTES
                                             : Q6_K_BLOCK_BYTES;
    constexpr int tpb = TYPE == 8 ? 4 : TYPE == 12 || TYPE == 13 ? 16 : TYPE == 14 ? 32 : 2;
    const int nwarps = tokens <= 4 ? 4 : 2;
    const int threads = nwarps * MMVQ_WARP, per_iter = threads / tpb;
    const int64_t nb = k / qk, x_blocks = k / 32;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *wr = weight + r * nb * block_bytes;
        for (int64_t t = 0; t < tokens; ++t) {
            float lane[4 * MMVQ_WARP];
            for (int tid = 0; tid < threads; ++tid) {
                float acc = 0.f;
                for (int64_t kb = tid / tpb; kb < nb; kb += per_iter) {
                    const uint8_t *blk = wr + kb * block_bytes;
                    const block_q8_1 *y = x + t * x_blocks + kb * (qk / 32);
                    const int s = tid % tpb;
                    if constexpr (TYPE == 2 || TYPE == 6) acc = step_q4_5_0<TYPE>(blk, y, s, acc);
                    if constexpr (TYPE == 8) acc = step_q8_0(blk, y, s, acc);
                    if constexpr (TYPE == 3 || TYPE == 7) acc = step_q4_5_1<TYPE>(blk, y, s, acc);
                    if constexpr (TYPE == 12 || TYPE == 13) acc = step_q45_K<TYPE>(blk, y, s, acc);
                    if constexpr (TYPE == 14) acc = step_q6_K(blk, y, s, acc);
                }
                lane[tid] = acc;
            }
            for (int x0 = 0; x0 < MMVQ_WARP; ++x0) {
                for (int wp = 1; wp < nwarps; ++wp) lane[x0] = lane[x0] + lane[wp * MMVQ_WARP + x0];
            }
            for (int offset = MMVQ_WARP / 2; offset > 0; offset >>= 1) {
                for (int x0 = 0; x0 < offset; ++x0) lane[x0] = lane[x0] + lane[x0 + offset];
            }
            out[t * rows + r] = lane[0];
        }
    }
}

}  // namespace

// llama.cpp's quantize_q8_1 per 32 values: amax, d = amax * float(1/127), q = roundf(x * (1/d)) (0 for an all-zero
// block), the sum by the xor butterfly of a warp (offsets 16..1), ds = half2(d, sum). The GPU's 1/d is rcp.approx
// (fast math); the host's is IEEE, so q can differ by one at a rounding tie.
ciq_status ciq_cpu_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k) {
    block_q8_1 *y = (block_q8_1 *)out;
    const int64_t nb = k / 32;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nb; ++i) {
        const float *xb = x + i * 32;
        float amax = 0.f, v[32];
        for (int j = 0; j < 32; ++j) {
            amax = std::fmax(amax, std::fabs(xb[j]));
            v[j] = xb[j];
        }
        const float d = amax * Q8_1_INV_127;
        const float rd = 1.0f / d;
        for (int j = 0; j < 32; ++j) y[i].qs[j] = amax == 0.f ? 0 : (int8_t)std::round(xb[j] * rd);
        for (int offset = 16; offset > 0; offset >>= 1) {
            for (int j = 0; j < offset; ++j) v[j] = v[j] + v[j + offset];
        }
        y[i].d = ciq_fp32_to_fp16(d);
        y[i].s = ciq_fp32_to_fp16(v[0]);
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_gemm_mmvq(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1, int64_t tokens,
                             float *out) {
    const uint8_t *w = (const uint8_t *)weight;
    const block_q8_1 *x = (const block_q8_1 *)x_q8_1;
    switch (type) {
        case 2: gemm_mmvq<2>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 6: gemm_mmvq<6>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 8: gemm_mmvq<8>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 3: gemm_mmvq<3>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 7: gemm_mmvq<7>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 12: gemm_mmvq<12>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 13: gemm_mmvq<13>(w, rows, k, x, tokens, out); return CIQ_OK;
        case 14: gemm_mmvq<14>(w, rows, k, x, tokens, out); return CIQ_OK;
        default: return ciq_fail(CIQ_ERR_UNSUPPORTED, "MMVQ: unsupported weight type %d", type);
    }
}
