// Host keep-quant GEMM, both semantics (docs/SEMANTICS.md). This file is compiled once per instruction set
// (CIQ_ISA = scalar | avx2 | avxvnni); cpu_backend.cpp picks one at run time.
//
// Each thread takes a run of weight rows, unpacks one row at a time into unsigned 8-bit quants (Q4_K 0..15,
// Q6_K 0..63) plus per-sub-block scales, and dots that row with every token. The integer kernel is
// "isums of 128 values": four 32-value sums (Q4_K) or eight 16-value sums (Q6_K), unsigned x signed bytes.
#include "../ciq_internal.h"
#include "fp16.h"

#include <vector>
#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
#include <immintrin.h>
#endif

#define CIQ_CAT2(a, b) a##_##b
#define CIQ_CAT(a, b) CIQ_CAT2(a, b)
#define CIQ_FN(name) CIQ_CAT(name, CIQ_ISA)

namespace {

#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
// Eight int32 lanes, lane l = sum of the products of bytes 4l..4l+3 of the 32 unsigned w and signed a.
inline __m256i dot4(const uint8_t *w, const int8_t *a) {
    const __m256i wv = _mm256_loadu_si256((const __m256i *)w);
    const __m256i av = _mm256_loadu_si256((const __m256i *)a);
#if defined(CIQ_ISA_AVXVNNI)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), wv, av);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wv, av), _mm256_set1_epi16(1));
#endif
}

// 128 values -> low lane: first-16 sums of the four 32-groups, high lane: second-16 sums.
inline __m256i half_sums(const uint8_t *w, const int8_t *a) {
    const __m256i h01 = _mm256_hadd_epi32(dot4(w, a), dot4(w + 32, a + 32));
    const __m256i h23 = _mm256_hadd_epi32(dot4(w + 64, a + 64), dot4(w + 96, a + 96));
    return _mm256_hadd_epi32(h01, h23);
}

inline void isums32x4(const uint8_t *w, const int8_t *a, int32_t *out) {
    const __m256i h = half_sums(w, a);
    _mm_storeu_si128((__m128i *)out, _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

inline void isums16x8(const uint8_t *w, const int8_t *a, int32_t *out) {
    const __m256i h = half_sums(w, a);
    const __m128i lo = _mm256_castsi256_si128(h), hi = _mm256_extracti128_si256(h, 1);
    _mm_storeu_si128((__m128i *)out, _mm_unpacklo_epi32(lo, hi));
    _mm_storeu_si128((__m128i *)(out + 4), _mm_unpackhi_epi32(lo, hi));
}
#else
inline void isums_n(const uint8_t *w, const int8_t *a, int32_t *out, int group, int groups) {
    for (int g = 0; g < groups; ++g) {
        int32_t s = 0;
        for (int i = 0; i < group; ++i) s += (int32_t)w[g * group + i] * a[g * group + i];
        out[g] = s;
    }
}
inline void isums32x4(const uint8_t *w, const int8_t *a, int32_t *out) { isums_n(w, a, out, 32, 4); }
inline void isums16x8(const uint8_t *w, const int8_t *a, int32_t *out) { isums_n(w, a, out, 16, 8); }
#endif

// One weight row, unpacked. Per super-block b: quants q[256b..], and the scales each semantics needs.
struct UnpackedRow {
    std::vector<uint8_t> q;
    std::vector<int32_t> scale, min;     // Q4_K: 8 per block; Q6_K: 16 scales per block
    std::vector<double> d, dmin;         // super-block scales
    std::vector<double> mmq_a, mmq_b;    // Q4_K MMQ: half(d*sc), -half(dmin*m) per 32 values
};

void unpack_q4_K(const block_q4_K *blocks, int64_t nb, UnpackedRow &row) {
    for (int64_t b = 0; b < nb; ++b) {
        const block_q4_K &x = blocks[b];
        const float d = ciq_fp16_to_fp32(x.d), dmin = ciq_fp16_to_fp32(x.dmin);
        row.d[b] = d;
        row.dmin[b] = dmin;
        for (int j = 0; j < 8; ++j) {
            const uint8_t *s = x.scales;
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            row.scale[b * 8 + j] = sc;
            row.min[b * 8 + j] = m;
            row.mmq_a[b * 8 + j] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(d * (float)sc));
            row.mmq_b[b * 8 + j] = -ciq_fp16_to_fp32(ciq_fp32_to_fp16(dmin * (float)m));
        }
        uint8_t *q = row.q.data() + b * QK_K;
        for (int c = 0; c < 4; ++c) {
            for (int l = 0; l < 32; ++l) {
                q[64 * c + l] = x.qs[32 * c + l] & 0xF;
                q[64 * c + 32 + l] = x.qs[32 * c + l] >> 4;
            }
        }
    }
}

void unpack_q6_K(const block_q6_K *blocks, int64_t nb, UnpackedRow &row) {
    for (int64_t b = 0; b < nb; ++b) {
        const block_q6_K &x = blocks[b];
        row.d[b] = ciq_fp16_to_fp32(x.d);
        for (int j = 0; j < 16; ++j) row.scale[b * 16 + j] = x.scales[j];
        uint8_t *q = row.q.data() + b * QK_K;
        for (int n = 0; n < 2; ++n) {
            const uint8_t *ql = x.ql + 64 * n, *qh = x.qh + 32 * n;
            for (int l = 0; l < 32; ++l) {
                q[128 * n + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
                q[128 * n + 32 + l] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                q[128 * n + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[128 * n + 96 + l] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
        }
    }
}

// CPU semantics: activations Q8_K [tokens][nb].
double dot_cpu_q4_K(const UnpackedRow &row, const block_q8_K *y, int64_t nb) {
    double acc = 0;
    int32_t is[8];
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *q = row.q.data() + b * QK_K;
        isums32x4(q, y[b].qs, is);
        isums32x4(q + 128, y[b].qs + 128, is + 4);
        const int32_t *sc = row.scale.data() + b * 8, *m = row.min.data() + b * 8;
        int32_t sumi = 0, summ = 0;
        for (int j = 0; j < 8; ++j) {
            sumi += sc[j] * is[j];
            summ += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
        }
        acc += (double)y[b].d * (row.d[b] * sumi - row.dmin[b] * summ);
    }
    return acc;
}

double dot_cpu_q6_K(const UnpackedRow &row, const block_q8_K *y, int64_t nb) {
    double acc = 0;
    int32_t is[16];
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t *q = row.q.data() + b * QK_K;
        isums16x8(q, y[b].qs, is);
        isums16x8(q + 128, y[b].qs + 128, is + 8);
        const int32_t *sc = row.scale.data() + b * 16;
        int32_t sumi = 0;
        for (int j = 0; j < 16; ++j) sumi += sc[j] * (is[j] - 32 * y[b].bsums[j]);
        acc += (double)y[b].d * row.d[b] * sumi;
    }
    return acc;
}

// MMQ semantics: activations q8_1-mmq [K/128][tokens]; x points at this token's first block.
double dot_mmq_q4_K(const UnpackedRow &row, const block_q8_1_mmq *x, int64_t tokens, int64_t nb128) {
    double acc = 0;
    int32_t is[4];
    for (int64_t kb = 0; kb < nb128; ++kb) {
        const block_q8_1_mmq &y = x[kb * tokens];
        isums32x4(row.q.data() + kb * 128, y.qs, is);
        for (int g = 0; g < 4; ++g) {
            const double d8 = ciq_fp16_to_fp32((uint16_t)(y.scales[g] & 0xFFFF));
            const double s8 = ciq_fp16_to_fp32((uint16_t)(y.scales[g] >> 16));
            acc += row.mmq_a[kb * 4 + g] * d8 * is[g] + row.mmq_b[kb * 4 + g] * s8;
        }
    }
    return acc;
}

double dot_mmq_q6_K(const UnpackedRow &row, const block_q8_1_mmq *x, const int32_t *bsum16, int64_t tokens,
                    int64_t nb128) {
    double acc = 0;
    int32_t is[8];
    for (int64_t kb = 0; kb < nb128; ++kb) {
        const block_q8_1_mmq &y = x[kb * tokens];
        isums16x8(row.q.data() + kb * 128, y.qs, is);
        const int32_t *sc = row.scale.data() + kb * 8, *bs = bsum16 + kb * 8;
        double block = 0;
        for (int g = 0; g < 4; ++g) {
            const int32_t sumi = sc[2 * g] * (is[2 * g] - 32 * bs[2 * g]) + sc[2 * g + 1] * (is[2 * g + 1] - 32 * bs[2 * g + 1]);
            block += (double)ciq_bits_to_float(y.scales[g]) * sumi;
        }
        acc += row.d[kb / 2] * block;
    }
    return acc;
}

// Sums of 16 activation quants, [tokens][K/16], for the -32 offset of Q6_K's unsigned quants.
std::vector<int32_t> q8_1_mmq_sums16(const block_q8_1_mmq *x, int64_t tokens, int64_t k) {
    std::vector<int32_t> sums(tokens * (k / 16));
    for (int64_t t = 0; t < tokens; ++t) {
        for (int64_t i = 0; i < k / 16; ++i) {
            const int8_t *q = x[(i / 8) * tokens + t].qs + (i % 8) * 16;
            int32_t s = 0;
            for (int l = 0; l < 16; ++l) s += q[l];
            sums[t * (k / 16) + i] = s;
        }
    }
    return sums;
}

inline void store(void *out, int64_t index, double value, ciq_out_type out_type) {
    if (out_type == CIQ_OUT_F32) {
        ((float *)out)[index] = (float)value;
    } else {
        ((uint16_t *)out)[index] = ciq_fp32_to_bf16((float)value);
    }
}

}  // namespace

ciq_status CIQ_FN(ciq_cpu_gemm)(ciq_semantics semantics, ciq_weight_type type, const void *weight, int64_t rows,
                                int64_t k, const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type) {
    const int64_t nb = k / QK_K;
    const size_t row_bytes = ciq_weight_row_bytes(type, k);
    std::vector<int32_t> bsum16;
    if (semantics == CIQ_SEMANTICS_MMQ && type == CIQ_TYPE_Q6_K) {
        bsum16 = q8_1_mmq_sums16((const block_q8_1_mmq *)x_quantized, tokens, k);
    }
#pragma omp parallel
    {
        UnpackedRow row;
        row.q.resize(k);
        row.scale.resize(nb * 16);
        row.min.resize(nb * 8);
        row.d.resize(nb);
        row.dmin.resize(nb);
        row.mmq_a.resize(nb * 8);
        row.mmq_b.resize(nb * 8);
#pragma omp for schedule(dynamic, 4)
        for (int64_t r = 0; r < rows; ++r) {
            const uint8_t *w = (const uint8_t *)weight + r * row_bytes;
            if (type == CIQ_TYPE_Q4_K) {
                unpack_q4_K((const block_q4_K *)w, nb, row);
            } else {
                unpack_q6_K((const block_q6_K *)w, nb, row);
            }
            for (int64_t t = 0; t < tokens; ++t) {
                double v;
                if (semantics == CIQ_SEMANTICS_CPU) {
                    const block_q8_K *y = (const block_q8_K *)x_quantized + t * nb;
                    v = type == CIQ_TYPE_Q4_K ? dot_cpu_q4_K(row, y, nb) : dot_cpu_q6_K(row, y, nb);
                } else {
                    const block_q8_1_mmq *y = (const block_q8_1_mmq *)x_quantized + t;
                    v = type == CIQ_TYPE_Q4_K ? dot_mmq_q4_K(row, y, tokens, 2 * nb)
                                              : dot_mmq_q6_K(row, y, bsum16.data() + t * (k / 16), tokens, 2 * nb);
                }
                store(out, t * rows + r, v, out_type);
            }
        }
    }
    return CIQ_OK;
}
