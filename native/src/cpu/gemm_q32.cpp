// Host GEMMs of the 32-block types: the q32 variant on the CPU (its GPU twin: cuda/gemm_q32.cu).
//   MMQ semantics (all five): q8_1-mmq activations, llama.cpp CUDA MMQ's per-block formula.
//   CPU semantics, Q4_0 / Q5_0 / Q8_0: q8_0 activations [tokens][K] int8 then d[tokens][K/32], llamafile
//   tinyBLAS_Q0_AVX's lanes; Q4_1 / Q5_1: q8_1-cpu activations, ggml's vec_dot_q{4,5}_1_q8_1 (the end of this file).
// Weights are unpacked per chunk of rows into int8 values and float scales (for_each_q32_chunk, for_each_q32_1_chunk).
#include "cpu_backend.h"
#include "../dequantize.h"
#include "../fp16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

// A Q4_0 / Q5_0 / Q8_0 matrix as MMQ's load_tiles and tinyBLAS see it, in chunks of up to Q32_CHUNK rows (in
// parallel): int8 values (Q4_0 q-8, Q5_0 q-16, Q8_0 q) and the blocks' fp16 scales, row-major within the chunk,
// handed to dot(first row, rows, q, d).
constexpr int64_t Q32_CHUNK = 32;
template <class Dot> static void for_each_q32_chunk(int type, const void *weight, int64_t rows, int64_t k, Dot dot) {
    const int block_bytes = ciq_block_bytes(type);
    const int64_t nb = k / 32;
#pragma omp parallel
    {
        std::vector<int8_t> q(Q32_CHUNK * k);
        std::vector<float> d(Q32_CHUNK * nb);
#pragma omp for schedule(dynamic, 1)
        for (int64_t r0 = 0; r0 < rows; r0 += Q32_CHUNK) {
            const int64_t n = std::min(Q32_CHUNK, rows - r0);
            for (int64_t b = 0; b < n * nb; ++b) {  // block b of the chunk: row b / nb, block b % nb
                const uint8_t *blk = (const uint8_t *)weight + (r0 * nb + b) * block_bytes;
                uint16_t dh;
                std::memcpy(&dh, blk, 2);
                d[b] = ciq_fp16_to_fp32(dh);
                for (int j = 0; j < 32; ++j) {
                    if (type == 8) {
                        q[b * 32 + j] = (int8_t)blk[2 + j];
                    } else {
                        const uint8_t *qs = blk + (type == 6 ? 6 : 2);
                        const int nibble = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
                        const int high = type == 6 ? (blk[2 + j / 8] >> (j % 8)) & 1 : 0;
                        q[b * 32 + j] = (int8_t)((nibble | high << 4) - (type == 6 ? 16 : 8));
                    }
                }
            }
            dot(r0, n, q.data(), d.data());
        }
    }
}

// The q32 variant in CPU semantics (ggml_ciq.h): q8_0 activations as ggml's AVX2 quantize_row_q8_0 (d = fp16(amax/127),
// q = round-half-even(x * (127/amax))), tinyBLAS_Q0_AVX's eight lanes per block and its final sum.
#if defined(__x86_64__)
// A chunk of weight rows against every token, tinyBLAS_Q0_AVX's own instructions: lanes = madd(1, maddubs(|a|,
// sign(v, a))). Tokens go in tiles of Q32_TOKENS (their q8_0 rows stay in L1 over the chunk's rows), four at a time
// sharing a row's loads with four accumulation chains in flight; each token's lanes see the blocks in order.
constexpr int64_t Q32_TOKENS = 16;
// One block of 32 activations to int8 as ggml's AVX2 quantize_row_q8_0 and quantize_row_q8_1: the same values as the
// scalar loop (max |x| in any order, x * (127 / amax) rounded half to even); returns max |x|.
__attribute__((target("avx2,fma"))) static float quantize_block_amax_avx2(const float *v, int8_t *q) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 x[4], amax = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
        x[j] = _mm256_loadu_ps(v + 8 * j);
        amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, x[j]));
    }
    float lane[8];
    _mm256_storeu_ps(lane, amax);
    float m = 0.0f;
    for (float l : lane) m = std::max(m, l);
    const __m256 id = _mm256_set1_ps(m != 0.0f ? 127.0f / m : 0.0f);
    __m256i i32[4];
    for (int j = 0; j < 4; ++j) i32[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(x[j], id), _MM_FROUND_TO_NEAREST_INT));
    const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, i8);
    return m;
}
// q8_0's block: returns d = fp16(amax / 127) as float.
__attribute__((target("avx2,fma"))) static float quantize_q8_0_block_avx2(const float *v, int8_t *q) {
    return ciq_fp16_to_fp32(ciq_fp32_to_fp16(quantize_block_amax_avx2(v, q) / 127.0f));
}

__attribute__((target("avx2,fma"))) static __m256 q32_lanes_avx2(__m256i abs_a, __m256i a, const int8_t *v) {
    const __m256i prod = _mm256_maddubs_epi16(abs_a, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)v), a));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), prod));
}

template <int N>
__attribute__((target("avx2,fma"))) static void q32_tokens_avx2(const int8_t *q, const float *d, int64_t nb,
                                                                const int8_t *xq, const float *xd, int64_t t,
                                                                float *out, int64_t rows) {
    __m256 acc[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i a = _mm256_loadu_si256((const __m256i *)(q + b * 32)), abs_a = _mm256_sign_epi8(a, a);
        for (int j = 0; j < N; ++j) {
            const int64_t i = (t + j) * nb + b;
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d[b] * xd[i]), q32_lanes_avx2(abs_a, a, xq + i * 32), acc[j]);
        }
    }
    for (int j = 0; j < N; ++j) {
        float lane[8];
        _mm256_storeu_ps(lane, acc[j]);
        out[(t + j) * rows] = ciq_hsum8(lane);
    }
}

__attribute__((target("avx2,fma"))) static void q32_chunk_avx2(const int8_t *q, const float *d, int64_t n, int64_t nb,
                                                               const int8_t *xq, const float *xd, int64_t tokens,
                                                               int64_t rows, int64_t r0, float *out) {
    for (int64_t t0 = 0; t0 < tokens; t0 += Q32_TOKENS) {
        const int64_t t1 = std::min(tokens, t0 + Q32_TOKENS);
        for (int64_t r = 0; r < n; ++r) {
            const int8_t *qr = q + r * nb * 32;
            const float *dr = d + r * nb;
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) q32_tokens_avx2<4>(qr, dr, nb, xq, xd, t, out + r0 + r, rows);
            for (; t < t1; ++t) q32_tokens_avx2<1>(qr, dr, nb, xq, xd, t, out + r0 + r, rows);
        }
    }
}
#endif

// The q8_0 activation layout (ggml_ciq.h): int8 [tokens][K], then float d[tokens][K/32].
ciq_status ciq_cpu_quantize_q8_0(const float *x, void *out, int64_t tokens, int64_t k) {
    const int64_t nb = k / 32;
    int8_t *xq = (int8_t *)out;
    float *xd = (float *)(xq + tokens * k);
    const bool avx2 = ciq_cpu_avx2();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nb; ++i) {
        const float *v = x + i * 32;
#if defined(__x86_64__)
        if (avx2) {
            xd[i] = quantize_q8_0_block_avx2(v, xq + i * 32);
            continue;
        }
#endif
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; ++j) xq[i * 32 + j] = (int8_t)std::nearbyint(v[j] * id);
        xd[i] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(amax / 127.0f));
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_gemm_q32_q8_0(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_0,
                                 int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    const int8_t *xq = (const int8_t *)x_q8_0;
    const float *xd = (const float *)(xq + tokens * k);
    const bool avx2 = ciq_cpu_avx2();
    for_each_q32_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const int8_t *qc, const float *dc) {
#if defined(__x86_64__)
        if (avx2) return q32_chunk_avx2(qc, dc, n, nb, xq, xd, tokens, rows, r0, out);
#endif
        for (int64_t r = r0; r < r0 + n; ++r) {
            const int8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                float lane[8] = {};
                for (int64_t b = 0; b < nb; ++b) {
                    const int8_t *a = q + b * 32, *v = xq + (t * nb + b) * 32;
                    const float dd = d[b] * xd[t * nb + b];
                    for (int l = 0; l < 8; ++l) {
                        const int32_t s = a[4 * l] * v[4 * l] + a[4 * l + 1] * v[4 * l + 1] + a[4 * l + 2] * v[4 * l + 2] +
                                          a[4 * l + 3] * v[4 * l + 3];
                        lane[l] = std::fma(dd, (float)s, lane[l]);
                    }
                }
                out[t * rows + r] = ciq_hsum8(lane);
            }
        }
    });
    return CIQ_OK;
}

// The q32 variant in MMQ semantics on the host: the GPU kernel's formula (cuda/gemm_q32.cu) on the host's q8_1-mmq bytes
// (block b of a token in q8_1-mmq block b / 4, K any multiple of 32). Q4_0 / Q5_0 / Q8_0: acc = fma(isum * d_w, d8, acc);
// Q4_1 / Q5_1 (after the definitions below): acc = fma(d_w * d8, isum, acc), acc = fma(m_w, s8, acc).
static float q8_1_mmq_half(uint32_t scale, bool high) { return ciq_fp16_to_fp32((uint16_t)(high ? scale >> 16 : scale)); }

static ciq_status q32_1_mmq(int type, const void *weight, int64_t rows, int64_t k, const block_q8_1_mmq *xq,
                            int64_t tokens, float *out);

// One output in MMQ semantics: weight row q (nb blocks of 32 quants) against token t's q8_1-mmq blocks, each block's
// exact integer dot product and scale word folded into acc, in K order, by step(block, isum, scale word, acc).
template <class Q, class Step>
static float mmq_row_dot(const Q *q, int64_t nb, const block_q8_1_mmq *xq, int64_t tokens, int64_t t, Step step) {
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
        const block_q8_1_mmq &xb = xq[(b / 4) * tokens + t];
        int isum = 0;
        for (int j = 0; j < 32; ++j) isum += (int)q[b * 32 + j] * (int)xb.qs[(b % 4) * 32 + j];
        acc = step(b, isum, xb.scales[b % 4], acc);
    }
    return acc;
}

ciq_status ciq_cpu_gemm_q32_mmq(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                                int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    const block_q8_1_mmq *xq = (const block_q8_1_mmq *)x_q8_1_mmq;
    if (type == CIQ_TYPE_Q4_1 || type == CIQ_TYPE_Q5_1) return q32_1_mmq(type, weight, rows, k, xq, tokens, out);
    for_each_q32_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const int8_t *qc, const float *dc) {
        for (int64_t r = r0; r < r0 + n; ++r) {
            const int8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                out[t * rows + r] = mmq_row_dot(q, nb, xq, tokens, t, [&](int64_t b, int isum, uint32_t scale, float acc) {
                    const float d8 = type == CIQ_TYPE_Q4_0 ? q8_1_mmq_half(scale, false) : ciq_bits_to_float(scale);
                    return std::fma((float)isum * d[b], d8, acc);
                });
            }
        }
    });
    return CIQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Q4_1 / Q5_1 in CPU semantics. llama.cpp x86 CPU's mul_mat runs neither llamafile_sgemm (no case for these types)
// nor the tiled K-quant matmul for them: every (row, token) output is one ggml_vec_dot_q{4,5}_1_q8_1
// (ggml-cpu/arch/x86/quants.c) on activations from quantize_row_q8_1, whatever the token count:
//   per 32-value block b, in order: lane l = fma(d_w * d_x, sum of the 4 products of values 4l..4l+3 (unsigned weight
//   quant 0..15 / 0..31 times int8 activation), lane l) for the 8 lanes; summs = fma(m_w, s_x, summs) (GCC contracts
//   ggml's `summs += m * s` into one FMA, in its AVX2 build and in its -march=native AVX-512 one alike; the product of
//   two fp16 values is exact in float32, as d_w * d_x is, so fused or not gives the same sums);
//   out = ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)) + summs.
// Weights are unpacked per chunk of rows into their unsigned quants and float d and m (for_each_q32_1_chunk).

// A Q4_1 / Q5_1 matrix in chunks of up to Q32_CHUNK rows (in parallel): quants 0..15 / 0..31 and the blocks' fp16 d and
// m as floats, row-major within the chunk, handed to dot(first row, rows, q, d, m).
template <class Dot> static void for_each_q32_1_chunk(int type, const void *weight, int64_t rows, int64_t k, Dot dot) {
    const int block_bytes = ciq_block_bytes(type);
    const int64_t nb = k / 32;
#pragma omp parallel
    {
        std::vector<uint8_t> q(Q32_CHUNK * k);
        std::vector<float> d(Q32_CHUNK * nb), m(Q32_CHUNK * nb);
#pragma omp for schedule(dynamic, 1)
        for (int64_t r0 = 0; r0 < rows; r0 += Q32_CHUNK) {
            const int64_t n = std::min(Q32_CHUNK, rows - r0);
            for (int64_t b = 0; b < n * nb; ++b) {  // block b of the chunk: row b / nb, block b % nb
                const uint8_t *blk = (const uint8_t *)weight + (r0 * nb + b) * block_bytes;
                uint16_t dh, mh;
                std::memcpy(&dh, blk, 2);
                std::memcpy(&mh, blk + 2, 2);
                d[b] = ciq_fp16_to_fp32(dh);
                m[b] = ciq_fp16_to_fp32(mh);
                uint32_t qh = 0;
                if (type == CIQ_TYPE_Q5_1) std::memcpy(&qh, blk + 4, 4);
                const uint8_t *qs = blk + (type == CIQ_TYPE_Q5_1 ? 8 : 4);
                for (int j = 0; j < 32; ++j) {
                    const int nibble = j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
                    q[b * 32 + j] = (uint8_t)(nibble | ((qh >> j) & 1) << 4);
                }
            }
            dot(r0, n, q.data(), d.data(), m.data());
        }
    }
}

// The q8_1-cpu activations' scales as floats: d[i] and s[i] of block i of [tokens][K/32].
static void q8_1_scales(const uint8_t *blocks, int64_t n, std::vector<float> &d, std::vector<float> &s) {
    d.resize(n);
    s.resize(n);
    for (int64_t i = 0; i < n; ++i) {
        uint16_t dh, sh;
        std::memcpy(&dh, blocks + i * Q8_1_BLOCK_BYTES, 2);
        std::memcpy(&sh, blocks + i * Q8_1_BLOCK_BYTES + 2, 2);
        d[i] = ciq_fp16_to_fp32(dh);
        s[i] = ciq_fp16_to_fp32(sh);
    }
}

#if defined(__x86_64__)
// One token tile as q32_tokens_avx2, with ggml's instructions: lanes = cvt(madd(1, maddubs(q_w, q_x))) (its
// mul_sum_us8_pairs_float; the AVX-512 VNNI build's dpbusd gives the same sums: no pair saturates int16).
template <int N>
__attribute__((target("avx2,fma"))) static void q32_1_tokens_avx2(const uint8_t *q, const float *d, const float *m,
                                                                  int64_t nb, const uint8_t *x, const float *xd,
                                                                  const float *xs, int64_t t, float *out, int64_t rows) {
    __m256 acc[N];
    float summs[N];
    for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps(), summs[j] = 0.0f;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < nb; ++b) {
        const __m256i qw = _mm256_loadu_si256((const __m256i *)(q + b * 32));
        for (int j = 0; j < N; ++j) {
            const int64_t i = (t + j) * nb + b;
            summs[j] = std::fma(m[b], xs[i], summs[j]);
            const __m256i qx = _mm256_loadu_si256((const __m256i *)(x + i * Q8_1_BLOCK_BYTES + 4));
            const __m256 lanes = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, _mm256_maddubs_epi16(qw, qx)));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(d[b] * xd[i]), lanes, acc[j]);
        }
    }
    for (int j = 0; j < N; ++j) {
        float lane[8];
        _mm256_storeu_ps(lane, acc[j]);
        out[(t + j) * rows] = ciq_hsum8(lane) + summs[j];
    }
}

__attribute__((target("avx2,fma"))) static void q32_1_chunk_avx2(const uint8_t *q, const float *d, const float *m,
                                                                 int64_t n, int64_t nb, const uint8_t *x,
                                                                 const float *xd, const float *xs, int64_t tokens,
                                                                 int64_t rows, int64_t r0, float *out) {
    for (int64_t t0 = 0; t0 < tokens; t0 += Q32_TOKENS) {
        const int64_t t1 = std::min(tokens, t0 + Q32_TOKENS);
        for (int64_t r = 0; r < n; ++r) {
            const uint8_t *qr = q + r * nb * 32;
            const float *dr = d + r * nb, *mr = m + r * nb;
            int64_t t = t0;
            for (; t + 4 <= t1; t += 4) q32_1_tokens_avx2<4>(qr, dr, mr, nb, x, xd, xs, t, out + r0 + r, rows);
            for (; t < t1; ++t) q32_1_tokens_avx2<1>(qr, dr, mr, nb, x, xd, xs, t, out + r0 + r, rows);
        }
    }
}
#endif

// The q8_1-cpu activation layout (ggml_ciq.h): [tokens][K/32] block_q8_1 as ggml's x86 quantize_row_q8_1 writes them:
// d = amax / 127 (float), q = round-half-even(x * (127 / amax)), half d, half s = fp16(d * float(sum of q)).
ciq_status ciq_cpu_quantize_q8_1_cpu(const float *x, void *out, int64_t tokens, int64_t k) {
    const int64_t nb = k / 32;
    uint8_t *y = (uint8_t *)out;
    const bool avx2 = ciq_cpu_avx2();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nb; ++i) {
        const float *v = x + i * 32;
        int8_t *q = (int8_t *)(y + i * Q8_1_BLOCK_BYTES + 4);
        float amax = 0.0f;
#if defined(__x86_64__)
        if (avx2) amax = quantize_block_amax_avx2(v, q);
#endif
        if (!avx2) {
            for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            for (int j = 0; j < 32; ++j) q[j] = (int8_t)std::nearbyint(v[j] * id);
        }
        int isum = 0;
        for (int j = 0; j < 32; ++j) isum += q[j];
        const float d = amax / 127.0f;
        const uint16_t dh = ciq_fp32_to_fp16(d), sh = ciq_fp32_to_fp16(d * (float)isum);
        std::memcpy(y + i * Q8_1_BLOCK_BYTES, &dh, 2);
        std::memcpy(y + i * Q8_1_BLOCK_BYTES + 2, &sh, 2);
    }
    return CIQ_OK;
}

// Q4_1 / Q5_1 in MMQ semantics (ciq_cpu_gemm_q32_mmq): llama.cpp CUDA's vec_dot_q8_1_q8_1_mma per block, in K order.
static ciq_status q32_1_mmq(int type, const void *weight, int64_t rows, int64_t k, const block_q8_1_mmq *xq,
                            int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    for_each_q32_1_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const uint8_t *qc, const float *dc,
                                                    const float *mc) {
        for (int64_t r = r0; r < r0 + n; ++r) {
            const uint8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb, *m = mc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                out[t * rows + r] = mmq_row_dot(q, nb, xq, tokens, t, [&](int64_t b, int isum, uint32_t scale, float acc) {
                    acc = std::fma(d[b] * q8_1_mmq_half(scale, false), (float)isum, acc);
                    return std::fma(m[b], q8_1_mmq_half(scale, true), acc);
                });
            }
        }
    });
    return CIQ_OK;
}

ciq_status ciq_cpu_gemm_q32_q8_1(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_cpu,
                                 int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    const uint8_t *x = (const uint8_t *)x_q8_1_cpu;
    std::vector<float> xd, xs;
    q8_1_scales(x, tokens * nb, xd, xs);
    const bool avx2 = ciq_cpu_avx2();
    for_each_q32_1_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const uint8_t *qc, const float *dc,
                                                    const float *mc) {
#if defined(__x86_64__)
        if (avx2) return q32_1_chunk_avx2(qc, dc, mc, n, nb, x, xd.data(), xs.data(), tokens, rows, r0, out);
#endif
        for (int64_t r = r0; r < r0 + n; ++r) {
            const uint8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb, *m = mc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                float lane[8] = {}, summs = 0.0f;
                for (int64_t b = 0; b < nb; ++b) {
                    const int64_t i = t * nb + b;
                    const uint8_t *a = q + b * 32;
                    const int8_t *v = (const int8_t *)(x + i * Q8_1_BLOCK_BYTES + 4);
                    summs = std::fma(m[b], xs[i], summs);
                    const float dd = d[b] * xd[i];
                    for (int l = 0; l < 8; ++l) {
                        const int32_t s = a[4 * l] * v[4 * l] + a[4 * l + 1] * v[4 * l + 1] + a[4 * l + 2] * v[4 * l + 2] +
                                          a[4 * l + 3] * v[4 * l + 3];
                        lane[l] = std::fma(dd, (float)s, lane[l]);
                    }
                }
                out[t * rows + r] = ciq_hsum8(lane) + summs;
            }
        }
    });
    return CIQ_OK;
}
