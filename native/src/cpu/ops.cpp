// Transformer ops on the host in ggml CPU's float order (OpenMP over rows for large ops; -ffp-contract=off, no FMAs):
//   rms_norm : squares (float) summed in double left to right, mean = (float)(sum / d), scale = 1/sqrtf(mean + eps),
//              out = (x * scale) * weight.
//   rope     : theta_0 = pos, theta_i = theta_{i-1} * powf(base, -2/head_dim) (ggml's rope cache), cosf/sinf;
//              (fma(x0, cos, -(x1 sin)), fma(x0, sin, x1 cos)): ggml's rotate_pairs as GCC contracts it on x86.
//   glu      : silu = x / (1 + expf(-x)); gelu through ggml's fp16 table (x rounded to f16, the table entry computed
//              in float and rounded to f16; x <= -10 gives 0, x >= 10 gives x), then * up.
//   attention: per query and head, s_p = (sum_e q_e k_pe, e ascending) * scale; m = max s_p; w_p = expf(s_p - m);
//              out_e = (sum_p w_p v_pe) / (sum_p w_p), keys ascending.
#include "../ciq_internal.h"
#include "../dequantize.h"
#include "fp16.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <vector>

// Below this many values an op runs on the calling thread: waking the OpenMP team costs more than the work.
constexpr int64_t PARALLEL_MIN = 1 << 16;

ciq_status ciq_cpu_rms_norm(const float *x, const float *weight, float eps, int64_t n, int64_t d, float *out) {
#pragma omp parallel for schedule(static) if (n * d >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r) {
        const float *xr = x + r * d;
        double sum = 0.0;
        for (int64_t i = 0; i < d; ++i) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)d);
        const float scale = 1.0f / std::sqrt(mean + eps);
        float *o = out + r * d;
        for (int64_t i = 0; i < d; ++i) o[i] = weight ? (xr[i] * scale) * weight[i] : xr[i] * scale;
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
                        int64_t head_dim, float base, float *out) {
    const float theta_scale = std::pow(base, -2.0f / (float)head_dim);
    const int64_t half = head_dim / 2;
#pragma omp parallel if (tokens * heads * head_dim >= PARALLEL_MIN)
    {
        std::vector<float> cosines(half), sines(half);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < tokens; ++t) {
            float theta = (float)positions[t];
            for (int64_t i = 0; i < half; ++i) {
                cosines[i] = std::cos(theta);
                sines[i] = std::sin(theta);
                theta *= theta_scale;
            }
            for (int64_t h = 0; h < heads; ++h) {
                const float *xr = x + (t * heads + h) * head_dim;
                float *o = out + (t * heads + h) * head_dim;
                for (int64_t i = 0; i < half; ++i) {
                    const int64_t a = mode == CIQ_ROPE_NEOX ? i : 2 * i, b = mode == CIQ_ROPE_NEOX ? i + half : 2 * i + 1;
                    const float x0 = xr[a], x1 = xr[b];
                    o[a] = std::fma(x0, cosines[i], -(x1 * sines[i]));  // as GCC contracts ggml's rotate_pairs
                    o[b] = std::fma(x0, sines[i], x1 * cosines[i]);
                }
            }
        }
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                             int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                             int64_t window, float *out) {
    const int64_t group = heads / heads_kv, row = heads_kv * head_dim;
#pragma omp parallel
    {
        std::vector<float> scores(n_past + tokens), acc(head_dim);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t h = 0; h < heads; ++h) {
                const int64_t pos = n_past + t;
                const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
                const float *qr = q + (t * heads + h) * head_dim;
                const int64_t kv_offset = (h / group) * head_dim;
                float max = -INFINITY;
                for (int64_t p = first; p <= pos; ++p) {
                    const uint16_t *kr = k_cache + p * row + kv_offset;
                    float dot = 0.0f;
                    for (int64_t e = 0; e < head_dim; ++e) dot += qr[e] * ciq_fp16_to_fp32(kr[e]);
                    scores[p] = dot * scale;
                    max = std::fmax(max, scores[p]);
                }
                float sum = 0.0f;
                for (int64_t e = 0; e < head_dim; ++e) acc[e] = 0.0f;
                for (int64_t p = first; p <= pos; ++p) {
                    const float w = std::exp(scores[p] - max);
                    sum += w;
                    const uint16_t *vr = v_cache + p * row + kv_offset;
                    for (int64_t e = 0; e < head_dim; ++e) acc[e] += w * ciq_fp16_to_fp32(vr[e]);
                }
                float *o = out + t * heads * head_dim + h * head_dim;
                for (int64_t e = 0; e < head_dim; ++e) o[e] = acc[e] / sum;
            }
        }
    }
    return CIQ_OK;
}

// ggml_v_expf (ggml-cpu/vec.h, AVX2) for one value: its polynomial, fused steps and over/underflow path.
__attribute__((always_inline)) static inline float ggml_expf(float x) {
    const float r = 0x1.8p23f, z = std::fma(x, 0x1.715476p+0f, r), n = z - r;
    const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
    const uint32_t e = ciq_float_to_bits(z) << 23;
    const float k = ciq_bits_to_float(e + ciq_float_to_bits(1.0f));
    const float u = b * b;
    const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                             u, 0x1.ffffecp-1f * b);
    if (!(std::fabs(n) > 126.0f)) return std::fma(k, j, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u;
    const float s1 = ciq_bits_to_float(g + 0x7f000000u), s2 = ciq_bits_to_float(e - g);
    return std::fabs(n) > 192.0f ? s1 * s1 : std::fma(s2, j, s2) * s1;
}

// The sum of eight lanes as ggml's AVX hsum: ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)).
static float hsum8(const float *l) { return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3])); }

// The host kernels' AVX2 paths run where the GEMMs' do (AVX2 and FMA; GGML_CIQ_CPU_ISA=scalar turns them off).
static bool host_avx2() { return std::strcmp(ciq_cpu_features(), "scalar") != 0; }

// Eight fma lanes over a[i] * b[i], lane i % 8, then hsum8: the float order of the attention's two dot products.
static float dot8(const float *a, const float *b, int64_t n) {
    float lane[8] = {};
    for (int64_t i = 0; i < n; i += 8) {
        for (int e = 0; e < 8; ++e) lane[e] = std::fma(a[i + e], b[i + e], lane[e]);
    }
    return hsum8(lane);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static float dot8_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    return hsum8(lane);
}
#endif

// llama.cpp x86 CPU attention without flash attention, for micro-batches of >= 2 tokens: KQ = K q16 through
// llamafile's f16 tinyBLAS (q rounded to f16; eight fma lanes over dims 8l+e, hsum8); softmax of KQ*scale with
// masked keys at -inf, ggml_vec_soft_max_f32 (ggml_expf per key, hsum8 per 8 keys summed in double, then
// * (float)(1/sum)); KQV = V^T p16 through the same tinyBLAS (p rounded to f16; lanes over keys 8l+e). Keys run
// from 0 in chunks of 8; the keys llama.cpp pads its K/V view with add exact zeros, and so do the chunks a query
// cannot see at all, which are skipped (lanes never hold -0, so + 0 changes nothing).
// Cloned for CPUs with FMA (resolved by the CPU's features; an arch= clone would be picked by CPU model only, so
// never on AMD): there std::fma and the inlined ggml_expf compile to vfmadd, elsewhere to libm's fmaf.
__attribute__((target_clones("fma", "default")))
ciq_status ciq_cpu_attention_ggml(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                  int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                  int64_t window, float *out) {
    if (head_dim % 8) return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (ggml): head_dim %lld is not a multiple of 8", (long long)head_dim);
    const int64_t group = heads / heads_kv, row = heads_kv * head_dim, n_kv = n_past + tokens, n_pad = (n_kv + 7) / 8 * 8;
    float (*dot)(const float *, const float *, int64_t) = dot8;  // the same values on every ISA
#if defined(__x86_64__)
    if (host_avx2()) dot = dot8_avx2;
#endif
    // K [kv head][key][dim] and V^T [kv head][dim][key] as float, keys padded to a multiple of 8 with zeros. Keys no
    // query of this call can see (before the first query's window) are zeros too: they are never read from the
    // cache, and their weight is 0 for every query, so they add exactly +0 as in llama.cpp.
    const int64_t first = window > 0 && n_past - window + 1 > 0 ? n_past - window + 1 : 0;
    std::vector<float> kf(heads_kv * n_pad * head_dim, 0.0f), vt(heads_kv * head_dim * n_pad, 0.0f);
#pragma omp parallel for schedule(static)
    for (int64_t p = first; p < n_kv; ++p) {
        for (int64_t g = 0; g < heads_kv; ++g) {
            for (int64_t d = 0; d < head_dim; ++d) {
                kf[(g * n_pad + p) * head_dim + d] = ciq_fp16_to_fp32(k_cache[p * row + g * head_dim + d]);
                vt[(g * head_dim + d) * n_pad + p] = ciq_fp16_to_fp32(v_cache[p * row + g * head_dim + d]);
            }
        }
    }
#pragma omp parallel
    {
        std::vector<float> qh(head_dim), w(n_pad), p16(n_pad);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t h = 0; h < heads; ++h) {
                const int64_t pos = n_past + t, g = h / group;
                // the chunks of 8 keys holding a key this query sees: [lo, hi)
                const int64_t lo = window > 0 && pos - window + 1 > 0 ? (pos - window + 1) / 8 * 8 : 0,
                              hi = (pos + 8) / 8 * 8;
                const float *qr = q + (t * heads + h) * head_dim, *kg = kf.data() + g * n_pad * head_dim;
                for (int64_t e = 0; e < head_dim; ++e) qh[e] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(qr[e]));
                float max = -INFINITY;
                for (int64_t p = lo; p < hi; ++p) {
                    if (p > pos || (window > 0 && pos - p >= window)) {
                        w[p] = -INFINITY;
                        continue;
                    }
                    w[p] = dot(kg + p * head_dim, qh.data(), head_dim) * scale;
                    max = std::fmax(max, w[p]);
                }
                double sum = 0.0;
                for (int64_t p = lo; p < hi; p += 8) {
                    for (int e = 0; e < 8; ++e) w[p + e] = ggml_expf(w[p + e] - max);
                    sum += (double)hsum8(&w[p]);
                }
                const float inv = (float)(1.0 / sum);
                for (int64_t p = lo; p < hi; ++p) p16[p] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(w[p] * inv));
                float *o = out + t * heads * head_dim + h * head_dim;
                for (int64_t d = 0; d < head_dim; ++d) o[d] = dot(vt.data() + (g * head_dim + d) * n_pad + lo, p16.data() + lo, hi - lo);
            }
        }
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    uint16_t *dst = cache + start * row_values;
#pragma omp parallel for schedule(static) if (tokens * row_values >= PARALLEL_MIN)
    for (int64_t i = 0; i < tokens * row_values; ++i) dst[i] = ciq_fp32_to_fp16(x[i]);
    return CIQ_OK;
}

// ggml's tanh GELU in float: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), 1 + 0.044715 x^2 fused as
// the compiler contracts it in ggml's x86 FMA builds (one table entry differs without it).
static float gelu_f32(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * std::fma(0.044715f * x, x, 1.0f)));
}

// ggml_table_gelu_f16: the f16 GELU of every f16 input, built once.
static const std::vector<uint16_t> &gelu_table() {
    static const std::vector<uint16_t> table = [] {
        std::vector<uint16_t> t(65536);
        for (uint32_t i = 0; i < 65536; ++i) t[i] = ciq_fp32_to_fp16(gelu_f32(ciq_fp16_to_fp32((uint16_t)i)));
        return t;
    }();
    return table;
}

ciq_status ciq_cpu_glu(ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out) {
    if (kind == CIQ_GLU_SILU) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
        for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
        return CIQ_OK;
    }
    const uint16_t *table = gelu_table().data();
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        const float act = g <= -10.0f ? 0.0f : g >= 10.0f ? g : ciq_fp16_to_fp32(table[ciq_fp32_to_fp16(g)]);
        out[i] = act * up[i];
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t r = 0; r < n / b_n; ++r) {
        for (int64_t i = r * b_n; i < (r + 1) * b_n; ++i) out[i] = a[i] + b[i - r * b_n];
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_scale(const float *x, float s, int64_t n, float *out) {
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * s;
    return CIQ_OK;
}

ciq_status ciq_cpu_get_rows(int type, const void *table, int64_t k, const int32_t *ids, int64_t n, float *out) {
    const int values = ciq_block_values(type), bytes = ciq_block_bytes(type);
    const size_t row_bytes = (size_t)(k / values) * bytes;
#pragma omp parallel for schedule(static) if (n * k >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r) {
        const uint8_t *src = (const uint8_t *)table + (size_t)ids[r] * row_bytes;
        for (int64_t i = 0; i < k; ++i) out[r * k + i] = ciq_dequantize_value(type, src + (i / values) * bytes, (int)(i % values));
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out) {
    const int values = ciq_block_values(type), bytes = ciq_block_bytes(type);
    const size_t row_bytes = (size_t)(k / values) * bytes;
    uint16_t *o = (uint16_t *)out;
#pragma omp parallel for schedule(static) if (rows * k >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const uint8_t *src = (const uint8_t *)data + (size_t)r * row_bytes;
        for (int64_t i = 0; i < k; ++i) {
            o[r * k + i] = ciq_fp32_to_bf16(ciq_dequantize_value(type, src + (i / values) * bytes, (int)(i % values)));
        }
    }
    return CIQ_OK;
}

ciq_status ciq_cpu_convert_bf16(const float *x, int64_t n, void *out) {
    uint16_t *o = (uint16_t *)out;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) o[i] = ciq_fp32_to_bf16(x[i]);
    return CIQ_OK;
}

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

// ciq_gemm_q32 in cpu semantics (ggml_ciq.h): q8_0 activations as ggml's AVX2 quantize_row_q8_0 (d = fp16(amax/127),
// q = round-half-even(x * (127/amax))), tinyBLAS_Q0_AVX's eight lanes per block and its final sum.
#if defined(__x86_64__)
// A chunk of weight rows against every token, tinyBLAS_Q0_AVX's own instructions: lanes = madd(1, maddubs(|a|,
// sign(v, a))). Tokens go in tiles of Q32_TOKENS (their q8_0 rows stay in L1 over the chunk's rows), four at a time
// sharing a row's loads with four accumulation chains in flight; each token's lanes see the blocks in order.
constexpr int64_t Q32_TOKENS = 16;
// One block of 32 activations to q8_0 as ggml's AVX2 quantize_row_q8_0: the same values as the scalar loop
// (max |x| in any order, x * (127 / amax) rounded half to even); returns d = fp16(amax / 127) as float.
__attribute__((target("avx2,fma"))) static float quantize_q8_0_block_avx2(const float *v, int8_t *q) {
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
    // pack to int8 in order: packs interleaves 128-bit halves, the permute puts them back
    const __m256i i16a = _mm256_packs_epi32(i32[0], i32[1]), i16b = _mm256_packs_epi32(i32[2], i32[3]);
    const __m256i i8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16a, i16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, i8);
    return ciq_fp16_to_fp32(ciq_fp32_to_fp16(m / 127.0f));
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
        out[(t + j) * rows] = hsum8(lane);
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

ciq_status ciq_cpu_gemm_q32_q8_0(int type, const void *weight, int64_t rows, int64_t k, const float *x,
                                 int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    std::vector<int8_t> xq(tokens * k);
    std::vector<float> xd(tokens * nb);
    const bool avx2 = host_avx2();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nb; ++i) {
        const float *v = x + i * 32;
#if defined(__x86_64__)
        if (avx2) {
            xd[i] = quantize_q8_0_block_avx2(v, xq.data() + i * 32);
            continue;
        }
#endif
        float amax = 0.0f;
        for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(v[j]));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        for (int j = 0; j < 32; ++j) xq[i * 32 + j] = (int8_t)std::nearbyint(v[j] * id);
        xd[i] = ciq_fp16_to_fp32(ciq_fp32_to_fp16(amax / 127.0f));
    }
    for_each_q32_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const int8_t *qc, const float *dc) {
#if defined(__x86_64__)
        if (avx2) return q32_chunk_avx2(qc, dc, n, nb, xq.data(), xd.data(), tokens, rows, r0, out);
#endif
        for (int64_t r = r0; r < r0 + n; ++r) {
            const int8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                float lane[8] = {};
                for (int64_t b = 0; b < nb; ++b) {
                    const int8_t *a = q + b * 32, *v = xq.data() + (t * nb + b) * 32;
                    const float dd = d[b] * xd[t * nb + b];
                    for (int l = 0; l < 8; ++l) {
                        const int32_t s = a[4 * l] * v[4 * l] + a[4 * l + 1] * v[4 * l + 1] + a[4 * l + 2] * v[4 * l + 2] +
                                          a[4 * l + 3] * v[4 * l + 3];
                        lane[l] = std::fma(dd, (float)s, lane[l]);
                    }
                }
                out[t * rows + r] = hsum8(lane);
            }
        }
    });
    return CIQ_OK;
}

// ciq_gemm_q32 on the host: the GPU kernel's formula (cuda/gemm_q32.cu) on the host's q8_1-mmq bytes.
ciq_status ciq_cpu_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                            int64_t tokens, float *out) {
    const int64_t nb = k / 32;
    const block_q8_1_mmq *xq = (const block_q8_1_mmq *)x_q8_1_mmq;
    for_each_q32_chunk(type, weight, rows, k, [&](int64_t r0, int64_t n, const int8_t *qc, const float *dc) {
        for (int64_t r = r0; r < r0 + n; ++r) {
            const int8_t *q = qc + (r - r0) * k;
            const float *d = dc + (r - r0) * nb;
            for (int64_t t = 0; t < tokens; ++t) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; ++b) {
                    const block_q8_1_mmq &xb = xq[(b / 4) * tokens + t];
                    int isum = 0;
                    for (int j = 0; j < 32; ++j) isum += (int)q[b * 32 + j] * (int)xb.qs[(b % 4) * 32 + j];
                    const uint32_t scale = xb.scales[b % 4];
                    const float d8 = type == 2 ? ciq_fp16_to_fp32((uint16_t)(scale & 0xFFFF)) : ciq_bits_to_float(scale);
                    acc = std::fma((float)isum * d[b], d8, acc);
                }
                out[t * rows + r] = acc;
            }
        }
    });
    return CIQ_OK;
}
