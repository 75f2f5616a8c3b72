// Host keep-quant GEMM, both semantics (docs/SEMANTICS.md). This file is compiled once per instruction set
// (CIQ_ISA = scalar | avx2 | avxvnni); cpu_backend.cpp picks one at run time.
//
// Each thread takes a run of weight rows, unpacks one row at a time into unsigned 8-bit quants (Q4_K 0..15,
// Q5_K 0..31, Q6_K 0..63) plus per-sub-block scales, and dots that row with every token. The integer kernel is
// "isums of 128 values": four 32-value sums (Q4_K, Q5_K) or eight 16-value sums (Q6_K), unsigned x signed bytes
// (maddubs pairs stay below 2 * 63 * 128: no int16 saturation).
#include "cpu_backend.h"
#include "../fp16.h"

#include <cmath>
#include <type_traits>
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

// One super-block's sum over its eight 32-value chunks c of scale[c] * (the chunk's integer dot product), exact: maddubs
// pairs stay within int16 (quants <= 31, |a| <= 128: 2 * 31 * 128), madd by the 6-bit scale within int32.
inline int32_t scaled_sum32x8(const uint8_t *w, const int8_t *a, const int32_t *scale) {
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
        const __m256i pairs = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w + 32 * c)),
                                                   _mm256_loadu_si256((const __m256i *)(a + 32 * c)));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, _mm256_set1_epi16((int16_t)scale[c])));
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
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
inline int32_t scaled_sum32x8(const uint8_t *w, const int8_t *a, const int32_t *scale) {
    int32_t is[8], s = 0;
    isums_n(w, a, is, 32, 8);
    for (int c = 0; c < 8; ++c) s += scale[c] * is[c];
    return s;
}
#endif

// One weight row, unpacked. Per super-block b: quants q[256b..], and the scales each semantics needs.
struct UnpackedRow {
    std::vector<uint8_t> q;
    std::vector<int32_t> scale, min;     // Q4_K, Q5_K: 8 per block; Q6_K: 16 scales per block
    std::vector<double> d, dmin;         // super-block scales
    std::vector<double> mmq_a, mmq_b;    // Q4_K MMQ: half(d*sc), -half(dmin*m) per 32 values
};

// Q5_K's fifth bits into 256 unpacked low nibbles: q[64c + l] |= bit 2c of qh[l] << 4, q[64c + 32 + l] |= bit 2c+1.
inline void add_fifth_bits(const uint8_t *qh, uint8_t *q) {
#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh), one = _mm256_set1_epi8(1);
    for (int j = 0; j < 8; ++j) {  // bit j of each byte, moved to bit 4 (16-bit shifts; the mask drops what crossed)
        const __m256i bit = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, j), one), 4);
        _mm256_storeu_si256((__m256i *)(q + 32 * j), _mm256_or_si256(_mm256_loadu_si256((const __m256i *)(q + 32 * j)), bit));
    }
#else
    for (int j = 0; j < 8; ++j) {
        for (int l = 0; l < 32; ++l) q[32 * j + l] |= ((qh[l] >> j) & 1) << 4;
    }
#endif
}

// Q4_K's row, or Q5_K's (the same fields, its fifth bits ORed in; Q5_K runs in CPU semantics only).
template <class Block>
void unpack_q4_K(const Block *blocks, int64_t nb, bool mmq, UnpackedRow &row) {
    for (int64_t b = 0; b < nb; ++b) {
        const Block &x = blocks[b];
        const float d = ciq_fp16_to_fp32(x.d), dmin = ciq_fp16_to_fp32(x.dmin);
        row.d[b] = d;
        row.dmin[b] = dmin;
        for (int j = 0; j < 8; ++j) {
            const uint8_t *s = x.scales;
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
            const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
            row.scale[b * 8 + j] = sc;
            row.min[b * 8 + j] = m;
            if (mmq) {
                row.mmq_a[b * 8 + j] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(d * (float)sc));
                row.mmq_b[b * 8 + j] = -ciq_fp16_to_fp32(ciq_fp32_to_fp16(dmin * (float)m));
            }
        }
        uint8_t *q = row.q.data() + b * QK_K;
        for (int c = 0; c < 4; ++c) {
#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
            const __m256i v = _mm256_loadu_si256((const __m256i *)(x.qs + 32 * c));
            const __m256i low4 = _mm256_set1_epi8(0x0F);
            _mm256_storeu_si256((__m256i *)(q + 64 * c), _mm256_and_si256(v, low4));
            _mm256_storeu_si256((__m256i *)(q + 64 * c + 32), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
#else
            for (int l = 0; l < 32; ++l) {
                q[64 * c + l] = x.qs[32 * c + l] & 0xF;
                q[64 * c + 32 + l] = x.qs[32 * c + l] >> 4;
            }
#endif
        }
        if constexpr (std::is_same_v<Block, block_q5_K>) add_fifth_bits(x.qh, q);
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
#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
            const __m256i low4 = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), two), 4); };
            _mm256_storeu_si256((__m256i *)(q + 128 * n), _mm256_or_si256(_mm256_and_si256(l0, low4), high(0)));
            _mm256_storeu_si256((__m256i *)(q + 128 * n + 32), _mm256_or_si256(_mm256_and_si256(l1, low4), high(2)));
            _mm256_storeu_si256((__m256i *)(q + 128 * n + 64),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), high(4)));
            _mm256_storeu_si256((__m256i *)(q + 128 * n + 96),
                                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4), high(6)));
#else
            for (int l = 0; l < 32; ++l) {
                q[128 * n + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
                q[128 * n + 32 + l] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
                q[128 * n + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
                q[128 * n + 96 + l] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
            }
#endif
        }
    }
}

// One super-block b of one row with one token, in each semantics. CPU semantics accumulate in float32 in the
// order of the kernel llama.cpp's x86 AVX2 build runs for the matrix in its model path as we load it (weights in
// plain buffers: llama_model_params.use_extra_bufts off, so no CPU_REPACK / AMX layouts), so that the engine
// reproduces llama.cpp CPU's outputs bit for bit:
//   TILED  (>= 8 tokens, Q4_K and Q6_K; ggml's tiled K-quant matmul): per super-block res = d*s (Q4_K:
//          res = fma(-dmin, s_min, d*s)), acc[0] = fma(res, dy, acc[0]); out = acc[0].
//   LANES  (< 8 tokens; ggml_vec_dot_q4_K_q8_K / ggml_vec_dot_q6_K_q8_K): eight lanes, lane l the integer sum over
//          the eight 32-value chunks c of the sub-block scale times the dot of bytes 4l..4l+3 of chunk c
//          (Q6_K: sc[2c + l/4], unsigned quants, minus 32 * (bsums[2l]*sc[2l] + bsums[2l+1]*sc[2l+1]); Q4_K:
//          sc[c]); acc[l] = fma(dy*d, lane_l, acc[l]); out = ((a4+a0)+(a6+a2)) + ((a5+a1)+(a7+a3)); Q4_K adds
//          four min lanes, acc[8+p] = fma(-dy*dmin, m[2p]*(bsums[4p]+bsums[4p+1]) + m[2p+1]*(...), acc[8+p]),
//          as ((m0+m2)+(m1+m3)) after the eight.
// Q5_K: TILED is Q4_K's (the same template instance of the tiled matmul; only the unpack differs). LANES
// (ggml_vec_dot_q5_K_q8_K) has Q4_K's eight lanes, but its mins are one scalar per output, acc[8] = summs =
// fma(-dy*dmin, s_min, summs) with s_min the integer sum of Q4_K's four min lanes, out = lanes + summs. The fma:
// ggml's C files build as gnu11 (C_EXTENSIONS on), where GCC contracts `summs += dmin * s_min`; unfused, 3-35% of
// the outputs differ from llama.cpp's at K >= 512.
// llama.cpp's AVX-512 build gives the same GEMM outputs (its tiled kernel's mul + add contracted to fma by GCC); its
// other ops run 16-wide float vectors, rounding-level apart from the engine (compare's provenance names the build).
enum CpuOrder { TILED, LANES };

// Float accumulators of one output in CPU semantics: eight lanes and Q4_K's four min lanes (Q5_K: one, acc[8]).
constexpr int CPU_ACCUMULATORS = 12;

// The integer lanes of llama.cpp's AVX2 vec_dot over one super-block: lane l sums, over the eight 32-value chunks c,
// the scale lo[stride*c] (lanes 0..3) or hi[stride*c] (lanes 4..7) times the dot of bytes 4l..4l+3 of chunk c
// (Q4_K: lo = hi = its 32-value scales; Q6_K: its 16-value scales, lo = sc, hi = sc + 1, stride 2).
inline void scaled_lanes(const uint8_t *q, const int8_t *a, const int32_t *lo, const int32_t *hi, int stride,
                         int32_t *lane) {
#if defined(CIQ_ISA_AVX2) || defined(CIQ_ISA_AVXVNNI)
    __m256i sum = _mm256_setzero_si256();
    for (int c = 0; c < 8; ++c) {
        const int32_t l = lo[stride * c], h = hi[stride * c];
        const __m256i scale = _mm256_setr_epi32(l, l, l, l, h, h, h, h);
        sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(scale, dot4(q + 32 * c, a + 32 * c)));
    }
    _mm256_storeu_si256((__m256i *)lane, sum);
#else
    for (int l = 0; l < 8; ++l) {
        lane[l] = 0;
        for (int c = 0; c < 8; ++c) {
            int32_t dot = 0;
            for (int e = 0; e < 4; ++e) dot += (int32_t)q[32 * c + 4 * l + e] * a[32 * c + 4 * l + e];
            lane[l] += (l < 4 ? lo : hi)[stride * c] * dot;
        }
    }
#endif
}

void superblock_cpu_q4_K(const UnpackedRow &row, int64_t b, const block_q8_K &y, CpuOrder order, float *acc) {
    const uint8_t *q = row.q.data() + b * QK_K;
    const int32_t *sc = row.scale.data() + b * 8, *m = row.min.data() + b * 8;
    int32_t summ[4];
    for (int p = 0; p < 4; ++p) {
        summ[p] = m[2 * p] * (y.bsums[4 * p] + y.bsums[4 * p + 1]) + m[2 * p + 1] * (y.bsums[4 * p + 2] + y.bsums[4 * p + 3]);
    }
    if (order == TILED) {
        const int32_t s = scaled_sum32x8(q, y.qs, sc);
        const int32_t s_min = summ[0] + summ[1] + summ[2] + summ[3];
        const float d = (float)row.d[b], dmin = (float)row.dmin[b];
        acc[0] = std::fma(std::fma(-dmin, (float)s_min, d * (float)s), y.d, acc[0]);
        return;
    }
    int32_t lane[8];
    scaled_lanes(q, y.qs, sc, sc, 1, lane);
    const float d = y.d * (float)row.d[b], dmin = -y.d * (float)row.dmin[b];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, (float)lane[l], acc[l]);
    for (int p = 0; p < 4; ++p) acc[8 + p] = std::fma(dmin, (float)summ[p], acc[8 + p]);
}

void superblock_cpu_q5_K(const UnpackedRow &row, int64_t b, const block_q8_K &y, CpuOrder order, float *acc) {
    if (order == TILED) return superblock_cpu_q4_K(row, b, y, order, acc);
    const uint8_t *q = row.q.data() + b * QK_K;
    const int32_t *sc = row.scale.data() + b * 8, *m = row.min.data() + b * 8;
    int32_t s_min = 0;
    for (int p = 0; p < 8; ++p) s_min += m[p] * (y.bsums[2 * p] + y.bsums[2 * p + 1]);
    int32_t lane[8];
    scaled_lanes(q, y.qs, sc, sc, 1, lane);
    const float d = y.d * (float)row.d[b], dmin = -y.d * (float)row.dmin[b];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, (float)lane[l], acc[l]);
    acc[8] = std::fma(dmin, (float)s_min, acc[8]);  // summs += dmin * S, contracted by GCC (see CpuOrder)
}

void superblock_cpu_q6_K(const UnpackedRow &row, int64_t b, const block_q8_K &y, CpuOrder order, float *acc) {
    const uint8_t *q = row.q.data() + b * QK_K;
    const int32_t *sc = row.scale.data() + b * 16;
    int32_t lane[8];
    scaled_lanes(q, y.qs, sc, sc + 1, 2, lane);
    for (int l = 0; l < 8; ++l) lane[l] -= 32 * (y.bsums[2 * l] * sc[2 * l] + y.bsums[2 * l + 1] * sc[2 * l + 1]);
    if (order == TILED) {
        const int32_t s = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
        acc[0] = std::fma((float)row.d[b] * (float)s, y.d, acc[0]);
        return;
    }
    const float d = y.d * (float)row.d[b];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, (float)lane[l], acc[l]);
}

// MMQ semantics: the two q8_1-mmq blocks (128 values each) of super-block b for one token.
double superblock_mmq_q4_K(const UnpackedRow &row, int64_t b, const block_q8_1_mmq &y0, const block_q8_1_mmq &y1) {
    double acc = 0;
    int32_t is[4];
    for (int half = 0; half < 2; ++half) {
        const block_q8_1_mmq &y = half ? y1 : y0;
        isums32x4(row.q.data() + b * QK_K + 128 * half, y.qs, is);
        for (int g = 0; g < 4; ++g) {
            const double d8 = ciq_fp16_to_fp32((uint16_t)(y.scales[g] & 0xFFFF));
            const double s8 = ciq_fp16_to_fp32((uint16_t)(y.scales[g] >> 16));
            acc += row.mmq_a[b * 8 + half * 4 + g] * d8 * is[g] + row.mmq_b[b * 8 + half * 4 + g] * s8;
        }
    }
    return acc;
}

double superblock_mmq_q6_K(const UnpackedRow &row, int64_t b, const block_q8_1_mmq &y0, const block_q8_1_mmq &y1,
                           const int32_t *bsum16) {
    double block = 0;
    int32_t is[8];
    for (int half = 0; half < 2; ++half) {
        const block_q8_1_mmq &y = half ? y1 : y0;
        isums16x8(row.q.data() + b * QK_K + 128 * half, y.qs, is);
        const int32_t *sc = row.scale.data() + b * 16 + half * 8, *bs = bsum16 + half * 8;
        for (int g = 0; g < 4; ++g) {
            const int32_t sumi = sc[2 * g] * (is[2 * g] - 32 * bs[2 * g]) + sc[2 * g + 1] * (is[2 * g + 1] - 32 * bs[2 * g + 1]);
            block += (double)ciq_bits_to_float(y.scales[g]) * sumi;
        }
    }
    return row.d[b] * block;
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

// The float result of one output's CPU-semantics accumulators (see CpuOrder).
inline float finish_cpu(ciq_type type, CpuOrder order, const float *a) {
    if (order == TILED) return a[0];
    const float lanes = ((a[4] + a[0]) + (a[6] + a[2])) + ((a[5] + a[1]) + (a[7] + a[3]));
    if (type == CIQ_TYPE_Q5_K) return lanes + a[8];
    return type == CIQ_TYPE_Q4_K ? lanes + ((a[8] + a[10]) + (a[9] + a[11])) : lanes;
}

inline void store(void *out, int64_t index, double value, ciq_out_type out_type) {
    if (out_type == CIQ_OUT_F32) {
        ((float *)out)[index] = (float)value;
    } else {
        ((uint16_t *)out)[index] = ciq_fp32_to_bf16((float)value);
    }
}

}  // namespace

// Tiles of ROW_TILE rows x TOKEN_TILE tokens walk K one super-block at a time, so that a super-block's weights
// and activations (about 9 KB) stay in L1 while every pair of the tile is dotted.
constexpr int ROW_TILE = 16, TOKEN_TILE = 16;

ciq_status CIQ_FN(ciq_cpu_gemm)(ciq_semantics semantics, ciq_type type, const void *weight, int64_t rows,
                                int64_t k, const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type) {
    const int64_t nb = k / QK_K;
    const size_t row_bytes = ciq_weight_row_bytes(type, k);
    const bool mmq = semantics == CIQ_SEMANTICS_MMQ;
    const CpuOrder order = tokens >= 8 ? TILED : LANES;
    const block_q8_K *x8 = (const block_q8_K *)x_quantized;
    const block_q8_1_mmq *x1 = (const block_q8_1_mmq *)x_quantized;
    std::vector<int32_t> bsum16;
    if (mmq && type == CIQ_TYPE_Q6_K) bsum16 = q8_1_mmq_sums16(x1, tokens, k);
    const int64_t row_tiles = (rows + ROW_TILE - 1) / ROW_TILE;
#pragma omp parallel
    {
        std::vector<UnpackedRow> tile(ROW_TILE);
        for (UnpackedRow &row : tile) {
            row.q.resize(k);
            row.scale.resize(nb * 16);
            row.min.resize(nb * 8);
            row.d.resize(nb);
            row.dmin.resize(nb);
            row.mmq_a.resize(nb * 8);
            row.mmq_b.resize(nb * 8);
        }
        double acc[ROW_TILE][TOKEN_TILE];           // MMQ semantics: float64 sums, rounded once
        float facc[ROW_TILE][TOKEN_TILE][CPU_ACCUMULATORS];  // CPU semantics: llama.cpp's float32 accumulators
#pragma omp for schedule(dynamic, 1)
        for (int64_t rt = 0; rt < row_tiles; ++rt) {
            const int64_t r0 = rt * ROW_TILE;
            const int nr = (int)(rows - r0 < ROW_TILE ? rows - r0 : ROW_TILE);
            for (int i = 0; i < nr; ++i) {
                const uint8_t *w = (const uint8_t *)weight + (r0 + i) * row_bytes;
                if (type == CIQ_TYPE_Q4_K) {
                    unpack_q4_K((const block_q4_K *)w, nb, mmq, tile[i]);
                } else if (type == CIQ_TYPE_Q5_K) {
                    unpack_q4_K((const block_q5_K *)w, nb, false, tile[i]);
                } else {
                    unpack_q6_K((const block_q6_K *)w, nb, tile[i]);
                }
            }
            for (int64_t t0 = 0; t0 < tokens; t0 += TOKEN_TILE) {
                const int nt = (int)(tokens - t0 < TOKEN_TILE ? tokens - t0 : TOKEN_TILE);
                for (int i = 0; i < nr; ++i) {
                    for (int j = 0; j < nt; ++j) {
                        acc[i][j] = 0;
                        for (int l = 0; l < CPU_ACCUMULATORS; ++l) facc[i][j][l] = 0.0f;
                    }
                }
                for (int64_t b = 0; b < nb; ++b) {
                    for (int j = 0; j < nt; ++j) {
                        const int64_t t = t0 + j;
                        for (int i = 0; i < nr; ++i) {
                            const UnpackedRow &row = tile[i];
                            if (!mmq) {
                                const block_q8_K &y = x8[t * nb + b];
                                if (type == CIQ_TYPE_Q4_K) {
                                    superblock_cpu_q4_K(row, b, y, order, facc[i][j]);
                                } else if (type == CIQ_TYPE_Q5_K) {
                                    superblock_cpu_q5_K(row, b, y, order, facc[i][j]);
                                } else {
                                    superblock_cpu_q6_K(row, b, y, order, facc[i][j]);
                                }
                            } else {
                                const block_q8_1_mmq &y0 = x1[(2 * b) * tokens + t], &y1 = x1[(2 * b + 1) * tokens + t];
                                acc[i][j] += type == CIQ_TYPE_Q4_K
                                                 ? superblock_mmq_q4_K(row, b, y0, y1)
                                                 : superblock_mmq_q6_K(row, b, y0, y1, bsum16.data() + t * (k / 16) + b * 16);
                            }
                        }
                    }
                }
                for (int i = 0; i < nr; ++i) {
                    for (int j = 0; j < nt; ++j) {
                        store(out, (t0 + j) * rows + r0 + i, mmq ? acc[i][j] : (double)finish_cpu(type, order, facc[i][j]),
                              out_type);
                    }
                }
            }
        }
    }
    return CIQ_OK;
}
