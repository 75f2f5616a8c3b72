// Block layouts of the weights and activations (identical to ggml's ggml-common.h and llama.cpp CUDA's mmq.cuh),
// shared by the API, cpu/ and cuda/.
#pragma once
#include "ggml_ciq.h"

#include <cstddef>
#include <cstdint>

#define QK_K 256
#define Q4_0_BLOCK_BYTES 18   // the 32-value block types: half d, then their quants
#define Q5_0_BLOCK_BYTES 22
#define Q8_0_BLOCK_BYTES 34
#define Q4_1_BLOCK_BYTES 20   // half d, half m, then their quants: value = q * d + m
#define Q5_1_BLOCK_BYTES 24
#define Q8_1_BLOCK_BYTES 36   // ggml's block_q8_1: half d, half s, int8 qs[32]
#define Q4_K_BLOCK_BYTES 144
#define Q5_K_BLOCK_BYTES 176
#define Q6_K_BLOCK_BYTES 210
#define Q8_K_BLOCK_BYTES 292
#define Q8_1_MMQ_VALUES 128
#define Q8_1_MMQ_BLOCK_BYTES 144
// q8_1-mmq blocks of a token for K values (K a multiple of 32): the last block zero-padded, as llama.cpp pads src1
// (its quantize_mmq_q8_1 writes q = 0, d = 0, s = 0 past ne00).
#define CIQ_Q8_1_MMQ_BLOCKS(k) (((k) + Q8_1_MMQ_VALUES - 1) / Q8_1_MMQ_VALUES)
#define F16_K_UNIT 64  // the f16 layout's K multiple: wgmma's pipeline stage (two 32-value blocks)

// Block layouts, identical to ggml's (ggml-common.h). Scales are IEEE half bit patterns.
struct block_q4_K {
    uint16_t d;          // super-block scale for the 6-bit sub-block scales
    uint16_t dmin;       // super-block scale for the 6-bit sub-block mins
    uint8_t scales[12];  // 8 scales and 8 mins, 6 bits each (get_scale_min_k4)
    uint8_t qs[128];     // 4-bit quants: value e of chunk c=e/64 is low nibble of qs[32c + e%32] for e%64 < 32, else high
};
struct block_q5_K {
    uint16_t d;          // as block_q4_K's
    uint16_t dmin;
    uint8_t scales[12];
    uint8_t qh[32];      // the fifth bits: bit 2c (low 32 values of chunk c) and 2c+1 (high 32) of qh[e%32]
    uint8_t qs[128];     // the low 4 bits, as block_q4_K's
};
struct block_q6_K {
    uint8_t ql[128];     // low 4 bits
    uint8_t qh[64];      // high 2 bits
    int8_t scales[16];   // one per 16 values
    uint16_t d;
};
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
struct block_q8_1_mmq {
    uint32_t scales[4];  // DS4: half2 {d, s} per 32 values; D4: float d per 32 values
    int8_t qs[Q8_1_MMQ_VALUES];
};
static_assert(sizeof(block_q4_K) == Q4_K_BLOCK_BYTES, "block_q4_K");
static_assert(sizeof(block_q5_K) == Q5_K_BLOCK_BYTES, "block_q5_K");
static_assert(sizeof(block_q6_K) == Q6_K_BLOCK_BYTES, "block_q6_K");
static_assert(sizeof(block_q8_K) == Q8_K_BLOCK_BYTES, "block_q8_K");
static_assert(sizeof(block_q8_1_mmq) == Q8_1_MMQ_BLOCK_BYTES, "block_q8_1_mmq");

// f16 activation layout (f16 semantics): f16 [tokens][K], then at this offset float scale[tokens].
static inline size_t ciq_f16_scale_offset(int64_t tokens, int64_t k) { return ((size_t)tokens * k * 2 + 255) & ~(size_t)255; }

// Bytes of one weight row of K values for the K-quant types (Q4_K, Q5_K, Q6_K).
static inline size_t ciq_weight_row_bytes(ciq_type type, int64_t k) {
    return (size_t)(k / QK_K) * (type == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : type == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES
                                                                                                 : Q6_K_BLOCK_BYTES);
}
