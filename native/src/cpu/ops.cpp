// Transformer ops on the host in ggml CPU's float order (OpenMP over rows for large ops; -ffp-contract=off, no FMAs):
//   rms_norm : squares (float) summed in double left to right, mean = (float)(sum / d), scale = 1/sqrtf(mean + eps),
//              out = (x * scale) * weight, then + add in a second rounding (ggml CPU does not fuse the add).
//   rope     : theta_0 = pos, theta_i = theta_{i-1} * powf(base, -2/head_dim) (ggml's rope cache), cosf/sinf;
//              (fma(x0, cos, -(x1 sin)), fma(x0, sin, x1 cos)): ggml's rotate_pairs as GCC contracts it on x86.
//   glu      : silu = x / (1 + expf(-x)) (CIQ_ORDER_LLAMACPP_CPU: ggml_v_expf but for each row's last row % 8); gelu through ggml's fp16 table (x rounded to f16, the table entry computed
//              in float and rounded to f16; x <= -10 gives 0, x >= 10 gives x), then * up.
//   attention: per query and head, s_p = (sum_e q_e k_pe, e ascending) * scale; m = max s_p; w_p = expf(s_p - m);
//              out_e = (sum_p w_p v_pe) / (sum_p w_p), keys ascending.
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

// Below this many values an op runs on the calling thread: waking the OpenMP team costs more than the work.
constexpr int64_t PARALLEL_MIN = 1 << 16;

ciq_status ciq_cpu_rms_norm(const float *x, const float *weight, const float *add, float eps, int64_t n, int64_t d,
                            float *out) {
#pragma omp parallel for schedule(static) if (n * d >= PARALLEL_MIN)
    for (int64_t r = 0; r < n; ++r) {
        const float *xr = x + r * d;
        double sum = 0.0;
        for (int64_t i = 0; i < d; ++i) sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / (double)d);
        const float scale = 1.0f / std::sqrt(mean + eps);
        float *o = out + r * d;
        const float *ar = add ? add + r * d : nullptr;
        for (int64_t i = 0; i < d; ++i) {
            const float v = weight ? (xr[i] * scale) * weight[i] : xr[i] * scale;
            o[i] = ar ? v + ar[i] : v;
        }
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

ciq_status ciq_cpu_attention_masked(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                    const uint16_t *mask, int64_t mask_row, int64_t tokens, int64_t heads,
                                    int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale, float *out) {
    const int64_t group = heads / heads_kv, row = heads_kv * head_dim;
    constexpr uint16_t F16_NEG_INF = 0xFC00;
#pragma omp parallel
    {
        std::vector<float> scores(n_kv), acc(head_dim);
#pragma omp for schedule(dynamic, 1) collapse(2)
        for (int64_t t = 0; t < tokens; ++t) {
            for (int64_t h = 0; h < heads; ++h) {
                const float *qr = q + (t * heads + h) * head_dim;
                const uint16_t *mr = mask + t * mask_row;
                const int64_t kv_offset = (h / group) * head_dim;
                float max = -INFINITY;
                for (int64_t p = 0; p < n_kv; ++p) {
                    if (mr[p] == F16_NEG_INF) continue;
                    const uint16_t *kr = k_cache + p * row + kv_offset;
                    float dot = 0.0f;
                    for (int64_t e = 0; e < head_dim; ++e) dot += qr[e] * ciq_fp16_to_fp32(kr[e]);
                    scores[p] = dot * scale + ciq_fp16_to_fp32(mr[p]);
                    max = std::fmax(max, scores[p]);
                }
                float sum = 0.0f;
                for (int64_t e = 0; e < head_dim; ++e) acc[e] = 0.0f;
                for (int64_t p = 0; p < n_kv; ++p) {
                    if (mr[p] == F16_NEG_INF) continue;
                    const float w = std::exp(scores[p] - max);
                    sum += w;
                    const uint16_t *vr = v_cache + p * row + kv_offset;
                    for (int64_t e = 0; e < head_dim; ++e) acc[e] += w * ciq_fp16_to_fp32(vr[e]);
                }
                float *o = out + t * heads * head_dim + h * head_dim;
                for (int64_t e = 0; e < head_dim; ++e) o[e] = sum > 0.0f ? acc[e] / sum : 0.0f;
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


// Eight fma lanes over a[i] * b[i], lane i % 8, then hsum8: the float order of the attention's two dot products.
static float dot8(const float *a, const float *b, int64_t n) {
    float lane[8] = {};
    for (int64_t i = 0; i < n; i += 8) {
        for (int e = 0; e < 8; ++e) lane[e] = std::fma(a[i + e], b[i + e], lane[e]);
    }
    return ciq_hsum8(lane);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static float dot8_avx2(const float *a, const float *b, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc);
    float lane[8];
    _mm256_storeu_ps(lane, acc);
    return ciq_hsum8(lane);
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
    if (ciq_cpu_avx2()) dot = dot8_avx2;
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
                    sum += (double)ciq_hsum8(&w[p]);
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

ciq_status ciq_cpu_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                                int64_t row_stride) {
#pragma omp parallel for schedule(static) if (n * k >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        uint16_t *dst = table + ids[i] * row_stride;
        for (int64_t e = 0; e < k; ++e) dst[e] = ciq_fp32_to_fp16(x[i * k + e]);
    }
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

// llama.cpp x86 AVX2's SiLU: ggml_vec_swiglu_f32 per row of `row` values, 8 from the row's start at a time through
// ggml_v_silu (x / (1 + ggml_v_expf(0 - x))), the row's last row % 8 through ggml_silu_f32 (libm expf); then * up.
// Elementwise, so value i takes the vector expression when its place in the row lies before the row's tail.
__attribute__((target_clones("fma", "default")))
static void silu_llamacpp(const float *gate, const float *up, int64_t n, int64_t row, float *out) {
    const int64_t vector_end = row - row % 8;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        const float x = gate[i];
        const float e = i % row < vector_end ? ggml_expf(0.0f - x) : std::exp(-x);
        out[i] = x / (1.0f + e) * up[i];
    }
}

ciq_status ciq_cpu_glu(ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up, int64_t n,
                       int64_t row, float *out) {
    if (kind == CIQ_GLU_SILU && order == CIQ_ORDER_LLAMACPP_CPU) {
        silu_llamacpp(gate, up, n, row, out);
        return CIQ_OK;
    }
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
