// Transformer ops on the host in ggml CPU's float order (OpenMP over rows for large ops; -ffp-contract=off, no FMAs):
//   rms_norm : squares (float) summed in double left to right, mean = (float)(sum / d), scale = 1/sqrtf(mean + eps),
//              out = (x * scale) * weight.
//   rope     : theta_0 = pos, theta_i = theta_{i-1} * powf(base, -2/head_dim) (ggml's rope cache), cosf/sinf;
//              (x0 cos - x1 sin, x0 sin + x1 cos).
//   glu      : silu = x / (1 + expf(-x)); gelu through ggml's fp16 table (x rounded to f16, the table entry computed
//              in float and rounded to f16; x <= -10 gives 0, x >= 10 gives x), then * up.
//   attention: per query and head, s_p = (sum_e q_e k_pe, e ascending) * scale; m = max s_p; w_p = expf(s_p - m);
//              out_e = (sum_p w_p v_pe) / (sum_p w_p), keys ascending.
#include "../ciq_internal.h"
#include "../dequantize.h"
#include "fp16.h"

#include <cmath>
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
                    o[a] = x0 * cosines[i] - x1 * sines[i];
                    o[b] = x0 * sines[i] + x1 * cosines[i];
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

ciq_status ciq_cpu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    uint16_t *dst = cache + start * row_values;
#pragma omp parallel for schedule(static) if (tokens * row_values >= PARALLEL_MIN)
    for (int64_t i = 0; i < tokens * row_values; ++i) dst[i] = ciq_fp32_to_fp16(x[i]);
    return CIQ_OK;
}

// ggml's tanh GELU in float: 0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))).
static float gelu_f32(float x) {
    return 0.5f * x * (1.0f + std::tanh(0.79788456080286535587989211986876f * x * (1.0f + 0.044715f * x * x)));
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

// ciq_gemm_q32 on the host: the GPU kernel's formula (cuda/gemm_q32.cu) on the host's q8_1-mmq bytes.
ciq_status ciq_cpu_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                            int64_t tokens, float *out) {
    const int block_bytes = ciq_block_bytes(type);
    const int64_t nb = k / 32;
    const block_q8_1_mmq *xq = (const block_q8_1_mmq *)x_q8_1_mmq;
#pragma omp parallel
    {
        std::vector<int8_t> q(k);
        std::vector<float> d(nb);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const uint8_t *row = (const uint8_t *)weight + r * nb * block_bytes;
            for (int64_t b = 0; b < nb; ++b) {  // int8 values as MMQ's load_tiles leave them, and the block's d
                const uint8_t *blk = row + b * block_bytes;
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
    }
    return CIQ_OK;
}
