// Activation quantizers on the host, byte-identical to ggml's quantize_row_q8_K_ref and llama.cpp CUDA's
// quantize_mmq_q8_1 (docs/SEMANTICS.md).
#include "cpu_backend.h"
#include "../fp16.h"

#include <cmath>

static inline int nearest_int(float fval) {  // ggml: round half to even for |fval| < 2^22
    float val = fval + 12582912.f;
    int i;
    std::memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static void quantize_block_q8_K(const float *x, block_q8_K *y) {
    float max = 0, amax = 0;
    for (int j = 0; j < QK_K; ++j) {
        const float ax = std::fabs(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    std::memset(y, 0, sizeof(*y));
    if (amax == 0) return;
    const float iscale = -127.f / max;
    for (int j = 0; j < QK_K; ++j) {
        const int v = nearest_int(iscale * x[j]);
        y->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int j = 0; j < QK_K / 16; ++j) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += y->qs[j * 16 + i];
        y->bsums[j] = (int16_t)sum;
    }
    y->d = 1 / iscale;
}

ciq_status ciq_cpu_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k) {
    block_q8_K *y = (block_q8_K *)out;
    const int64_t nb = k / QK_K;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nb; ++i) quantize_block_q8_K(x + i * QK_K, y + i);
    return CIQ_OK;
}

// One group of 32 values: int8 quants, the scale d and the float sum in llama.cpp's shuffle order.
static void quantize_group_q8_1(const float *x, int8_t *q, float *d, float *sum) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    float t[8];
    for (int i = 0; i < 8; ++i) t[i] = ((x[4 * i] + x[4 * i + 1]) + x[4 * i + 2]) + x[4 * i + 3];
    *sum = ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
    const float d_inv = 127.0f / amax;
    for (int i = 0; i < 32; ++i) q[i] = amax == 0.0f ? 0 : (int8_t)std::round(x[i] * d_inv);
    *d = 1.0f / d_inv;
}

ciq_status ciq_cpu_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k) {
    block_q8_1_mmq *y = (block_q8_1_mmq *)out;
    const int64_t nblocks = CIQ_Q8_1_MMQ_BLOCKS(k);
    static const float zeros[32] = {};  // the padding past K (K a multiple of 32): q = 0, d = 0, s = 0
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tokens * nblocks; ++i) {
        const int64_t token = i / nblocks, kb = i % nblocks;
        block_q8_1_mmq *block = y + kb * tokens + token;
        for (int g = 0; g < 4; ++g) {
            float d, sum;
            const int64_t c = kb * Q8_1_MMQ_VALUES + g * 32;
            quantize_group_q8_1(c < k ? x + token * k + c : zeros, block->qs + g * 32, &d, &sum);
            block->scales[g] = ds4 ? (uint32_t)ciq_fp32_to_fp16(d) | ((uint32_t)ciq_fp32_to_fp16(sum) << 16)
                                   : ciq_float_to_bits(d);
        }
    }
    return CIQ_OK;
}

// f16 semantics: each token scaled by the power of two 2^-e that puts its largest |x| in [2^14, 2^15), rounded to
// f16 (round to nearest even); scale_t = 2^e is stored after the f16 values (ciq_f16_scale_offset).
ciq_status ciq_cpu_convert_f16(const float *x, void *out, int64_t tokens, int64_t k) {
    uint16_t *xh = (uint16_t *)out;
    float *scales = (float *)((uint8_t *)out + ciq_f16_scale_offset(tokens, k));
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tokens; ++t) {
        const float *xr = x + t * k;
        float amax = 0.f;
        for (int64_t c = 0; c < k; ++c) amax = std::fmax(amax, std::fabs(xr[c]));
        int e = 0;
        std::frexp(amax, &e);
        e = e < -100 ? -100 : e;
        const float up = std::ldexp(1.0f, 15 - e);
        scales[t] = std::ldexp(1.0f, e - 15);
        for (int64_t c = 0; c < k; ++c) xh[t * k + c] = ciq_fp32_to_fp16(xr[c] * up);
    }
    return CIQ_OK;
}
