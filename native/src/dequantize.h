// Row dequantizers for every GGUF type get_rows and the dense path read, shared by the host (cpu/ops.cpp) and the
// GPU (cuda/ops.cu). Each value is computed in ggml's float order (ggml-quants.c dequantize_row_*): products and
// differences are separate roundings (explicit _rn intrinsics on the GPU, -ffp-contract=off on the host).
// Table types are ggml's type ids, the public header's ciq_type (CIQ_TYPE_*): the one list of them.
#pragma once
#include "blocks.h"
#include "fp16.h"

// Values per block and bytes per block of a table type; 0 for a type get_rows does not read.
CIQ_HOST_DEVICE int ciq_block_values(int type) {
    switch (type) {
        case CIQ_TYPE_F32: case CIQ_TYPE_F16: case CIQ_TYPE_BF16: return 1;
        case CIQ_TYPE_Q4_0: case CIQ_TYPE_Q5_0: case CIQ_TYPE_Q8_0: return 32;
        case CIQ_TYPE_Q4_1: case CIQ_TYPE_Q5_1: return 32;
        case CIQ_TYPE_Q4_K: case CIQ_TYPE_Q5_K: case CIQ_TYPE_Q6_K: return 256;
        default: return 0;
    }
}
CIQ_HOST_DEVICE int ciq_block_bytes(int type) {
    switch (type) {
        case CIQ_TYPE_F32: return 4;
        case CIQ_TYPE_F16: case CIQ_TYPE_BF16: return 2;
        case CIQ_TYPE_Q4_0: return Q4_0_BLOCK_BYTES;
        case CIQ_TYPE_Q5_0: return Q5_0_BLOCK_BYTES;
        case CIQ_TYPE_Q8_0: return Q8_0_BLOCK_BYTES;
        case CIQ_TYPE_Q4_1: return Q4_1_BLOCK_BYTES;
        case CIQ_TYPE_Q5_1: return Q5_1_BLOCK_BYTES;
        case CIQ_TYPE_Q4_K: return Q4_K_BLOCK_BYTES;
        case CIQ_TYPE_Q5_K: return Q5_K_BLOCK_BYTES;
        case CIQ_TYPE_Q6_K: return Q6_K_BLOCK_BYTES;
        default: return 0;
    }
}

CIQ_HOST_DEVICE float ciq_dq_half(const uint8_t *p) { return ciq_half_to_float((uint16_t)(p[0] | (p[1] << 8))); }

CIQ_HOST_DEVICE float ciq_dq_mul(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

CIQ_HOST_DEVICE float ciq_dq_sub(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

CIQ_HOST_DEVICE float ciq_dq_add(float a, float b) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

// ggml's get_scale_min_k4 (Q4_K and Q5_K sub-block j of 8).
CIQ_HOST_DEVICE void ciq_dq_scale_min_k4(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Value i (0 <= i < block values) of one block of `type` at `b`.
CIQ_HOST_DEVICE float ciq_dequantize_value(int type, const uint8_t *b, int i) {
    switch (type) {
        case CIQ_TYPE_F32:
            return ciq_bits_to_float((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
        case CIQ_TYPE_F16: return ciq_dq_half(b);
        case CIQ_TYPE_BF16: return ciq_bits_to_float(((uint32_t)b[0] | (uint32_t)b[1] << 8) << 16);
        case CIQ_TYPE_Q8_0: return ciq_dq_mul((float)(int8_t)b[2 + i], ciq_dq_half(b));
        case CIQ_TYPE_Q4_0: {  // value j: low nibble of qs[j] (j < 16), high nibble of qs[j - 16]
            const int q = i < 16 ? (b[2 + i] & 0xF) : (b[2 + i - 16] >> 4);
            return ciq_dq_mul((float)(q - 8), ciq_dq_half(b));
        }
        case CIQ_TYPE_Q5_0: {  // qh (4 bytes, little endian) bit j is the fifth bit of value j
            const uint32_t qh = (uint32_t)b[2] | (uint32_t)b[3] << 8 | (uint32_t)b[4] << 16 | (uint32_t)b[5] << 24;
            const int low = i < 16 ? (b[6 + i] & 0xF) : (b[6 + i - 16] >> 4);
            const int q = (low | (int)((qh >> i) & 1) << 4) - 16;
            return ciq_dq_mul((float)q, ciq_dq_half(b));
        }
        case CIQ_TYPE_Q4_1: {  // half d, half m, qs[16]: value j as Q4_0's, then q * d + m
            const int q = i < 16 ? (b[4 + i] & 0xF) : (b[4 + i - 16] >> 4);
            return ciq_dq_add(ciq_dq_mul((float)q, ciq_dq_half(b)), ciq_dq_half(b + 2));
        }
        case CIQ_TYPE_Q5_1: {  // half d, half m, qh (4 bytes: bit j the fifth bit of value j), qs[16]
            const uint32_t qh = (uint32_t)b[4] | (uint32_t)b[5] << 8 | (uint32_t)b[6] << 16 | (uint32_t)b[7] << 24;
            const int low = i < 16 ? (b[8 + i] & 0xF) : (b[8 + i - 16] >> 4);
            const int q = low | (int)((qh >> i) & 1) << 4;
            return ciq_dq_add(ciq_dq_mul((float)q, ciq_dq_half(b)), ciq_dq_half(b + 2));
        }
        case CIQ_TYPE_Q4_K: {  // 64-value chunk c: sub-block 2c (low nibbles of qs[32c..]), 2c+1 (high nibbles)
            const int c = i / 64, l = i % 32, sub = i / 32;
            int sc, m;
            ciq_dq_scale_min_k4(sub, b + 4, &sc, &m);
            const uint8_t q = b[16 + 32 * c + l];
            const int v = (i % 64) < 32 ? (q & 0xF) : (q >> 4);
            const float d1 = ciq_dq_mul(ciq_dq_half(b), (float)sc), m1 = ciq_dq_mul(ciq_dq_half(b + 2), (float)m);
            return ciq_dq_sub(ciq_dq_mul(d1, (float)v), m1);
        }
        case CIQ_TYPE_Q5_K: {  // as Q4_K plus qh[32]: bit sub of qh[l] is the fifth bit
            const int c = i / 64, l = i % 32, sub = i / 32;
            int sc, m;
            ciq_dq_scale_min_k4(sub, b + 4, &sc, &m);
            const uint8_t q = b[48 + 32 * c + l];
            const int v = ((i % 64) < 32 ? (q & 0xF) : (q >> 4)) + (((b[16 + l] >> sub) & 1) ? 16 : 0);
            const float d1 = ciq_dq_mul(ciq_dq_half(b), (float)sc), m1 = ciq_dq_mul(ciq_dq_half(b + 2), (float)m);
            return ciq_dq_sub(ciq_dq_mul(d1, (float)v), m1);
        }
        case CIQ_TYPE_Q6_K: {  // ql[128] qh[64] scales[16] d: half n of 128 values, group g of 32, lane l
            const int n = i / 128, g = (i % 128) / 32, l = i % 32;
            const uint8_t ql = b[64 * n + l + (g & 1) * 32];
            const uint8_t qh = b[128 + 32 * n + l];
            const int q = (((g < 2) ? (ql & 0xF) : (ql >> 4)) | (((qh >> (2 * g)) & 3) << 4)) - 32;
            const int8_t sc = (int8_t)b[192 + 8 * n + l / 16 + 2 * g];
            return ciq_dq_mul(ciq_dq_mul(ciq_dq_half(b + 208), (float)sc), (float)q);
        }
        default: return 0.0f;
    }
}
