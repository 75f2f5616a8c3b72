// Internal declarations shared by the C API (api.cpp), the CPU backend and the CUDA backend.
#pragma once
#include "ggml_ciq.h"

#include <cstdint>
#include <cstring>

#define QK_K 256
#define Q4_K_BLOCK_BYTES 144
#define Q6_K_BLOCK_BYTES 210
#define Q8_K_BLOCK_BYTES 292
#define Q8_1_MMQ_VALUES 128
#define Q8_1_MMQ_BLOCK_BYTES 144

// Block layouts, identical to ggml's (ggml-common.h). Scales are IEEE half bit patterns.
struct block_q4_K {
    uint16_t d;          // super-block scale for the 6-bit sub-block scales
    uint16_t dmin;       // super-block scale for the 6-bit sub-block mins
    uint8_t scales[12];  // 8 scales and 8 mins, 6 bits each (get_scale_min_k4)
    uint8_t qs[128];     // 4-bit quants: value e of chunk c=e/64 is low nibble of qs[32c + e%32] for e%64 < 32, else high
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
static_assert(sizeof(block_q6_K) == Q6_K_BLOCK_BYTES, "block_q6_K");
static_assert(sizeof(block_q8_K) == Q8_K_BLOCK_BYTES, "block_q8_K");
static_assert(sizeof(block_q8_1_mmq) == Q8_1_MMQ_BLOCK_BYTES, "block_q8_1_mmq");

// f16 activation layout (f16 semantics): f16 [tokens][K], then at this offset float scale[tokens].
static inline size_t ciq_f16_scale_offset(int64_t tokens, int64_t k) { return ((size_t)tokens * k * 2 + 255) & ~(size_t)255; }

// Records the thread-local error message and returns status.
ciq_status ciq_fail(ciq_status status, const char *format, ...);

size_t ciq_weight_row_bytes(ciq_weight_type type, int64_t k);

// CPU backend (native/src/cpu/).
ciq_status ciq_cpu_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_convert_f16(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                            int64_t tokens, float *out);
ciq_status ciq_cpu_gemm_q32_q8_0(int type, const void *weight, int64_t rows, int64_t k, const float *x,
                                 int64_t tokens, float *out);
// MMVQ semantics (llama.cpp CUDA mul_mat_vec_q, 1..8 tokens): x_q8_1 is [tokens][K/32] block_q8_1 (36 B: half d,
// half sum, int8 qs[32]); types Q4_0, Q5_0, Q8_0, Q4_K, Q6_K; out float32 [tokens][rows]. cpu/gemm_mmvq.cpp.
ciq_status ciq_cpu_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_gemm_mmvq(int ggml_type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1,
                             int64_t tokens, float *out);
ciq_status ciq_cpu_gemm(ciq_semantics semantics, ciq_weight_type type, const void *weight, int64_t rows, int64_t k,
                        const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type);
ciq_status ciq_cpu_rms_norm(const float *x, const float *weight, float eps, int64_t n, int64_t d, float *out);
ciq_status ciq_cpu_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
                        int64_t head_dim, float base, float *out);
ciq_status ciq_cpu_attention_ggml(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                  int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                  int64_t window, float *out);
ciq_status ciq_cpu_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                             int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                             int64_t window, float *out);
ciq_status ciq_cpu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values);
ciq_status ciq_cpu_glu(ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out);
ciq_status ciq_cpu_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_cpu_scale(const float *x, float s, int64_t n, float *out);
ciq_status ciq_cpu_get_rows(int type, const void *table, int64_t k, const int32_t *ids, int64_t n, float *out);
ciq_status ciq_cpu_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out);
ciq_status ciq_cpu_convert_bf16(const float *x, int64_t n, void *out);
int ciq_cpu_threads(void);
void ciq_cpu_set_threads(int threads);
const char *ciq_cpu_features(void);

// CUDA backend (native/src/cuda/), present when GGML_CIQ_WITH_CUDA is defined. All pointers are device
// memory; work is queued on the legacy default stream; launch errors are returned, not synchronized.
#ifdef GGML_CIQ_WITH_CUDA
ciq_status ciq_cuda_device_count(int *count);
ciq_status ciq_cuda_set_device(int device);
ciq_status ciq_cuda_device_name(int device, char *buffer, size_t buffer_size);
ciq_status ciq_cuda_compute_capability(int device, int *major, int *minor);
ciq_status ciq_cuda_malloc(int device, size_t nbytes, void **ptr);
ciq_status ciq_cuda_free(int device, void *ptr);
ciq_status ciq_cuda_memcpy(int device, void *dst, const void *src, size_t nbytes, bool to_device);
ciq_status ciq_cuda_memset(int device, void *dst, int value, size_t nbytes);
ciq_status ciq_cuda_synchronize(int device);
#define CIQ_SCRATCH_SLOTS 1  // 0: quantized activations (ciq_gemm)
ciq_status ciq_cuda_scratch(int device, int slot, size_t nbytes, void **ptr);  // per-device buffers, grown on demand
ciq_status ciq_cuda_event_record(int device, void **event);  // creates and records an event
ciq_status ciq_cuda_event_elapsed(void *start, void *stop, float *milliseconds);  // syncs stop, frees both (stop NULL: frees start)

ciq_status ciq_cuda_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cuda_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k);
// variant is one of CIQ_VARIANT_WMMA, _WMMA_WIDE, _WMMA_SHARED, _WMMA_BIGTILE; x is Q8_K.
ciq_status ciq_cuda_gemm_wmma(ciq_variant variant, ciq_weight_type type, const void *weight, int64_t rows, int64_t k,
                              const void *x_q8_K, int64_t tokens, void *out, ciq_out_type out_type);
ciq_status ciq_cuda_dense_gemm_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x,
                                    int64_t tokens, void *out, ciq_out_type out_type);
// f16 semantics: x -> the f16 activation layout (ciq_f16_size); the wgmma GEMM reads it (sm_90a).
ciq_status ciq_cuda_convert_f16(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cuda_gemm_wgmma(int device, ciq_weight_type type, const void *weight, int64_t rows, int64_t k,
                               const void *x_f16, int64_t tokens, void *out, ciq_out_type out_type);
// Transformer ops (cuda/ops.cu, cuda/attention.cu); arguments checked by the C API. get_rows writes NaN rows for ids
// outside [0, table_rows).
ciq_status ciq_cuda_rms_norm(const float *x, const float *weight, float eps, int64_t n, int64_t d, float *out);
ciq_status ciq_cuda_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
                         int64_t head_dim, float base, float *out);
bool ciq_cuda_attention_supports(int device, ciq_attention_kernel kernel, int64_t head_dim);  // built, fits
ciq_status ciq_cuda_attention(ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                              const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv,
                              int64_t head_dim, int64_t n_past, float scale, int64_t window, float *out);
ciq_status ciq_cuda_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values);
ciq_status ciq_cuda_glu(ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out);
ciq_status ciq_cuda_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_cuda_scale(const float *x, float s, int64_t n, float *out);
ciq_status ciq_cuda_get_rows(int type, const void *table, int64_t table_rows, int64_t k, const int32_t *ids, int64_t n,
                             float *out);
ciq_status ciq_cuda_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out);
ciq_status ciq_cuda_convert_bf16(const float *x, int64_t n, void *out);
// x is q8_1-mmq (DS4 for Q4_K, D4 for Q6_K).
ciq_status ciq_cuda_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                             int64_t tokens, float *out);
ciq_status ciq_cuda_gemm_mma(ciq_weight_type type, const void *weight, int64_t rows, int64_t k,
                             const void *x_q8_1_mmq, int64_t tokens, void *out, ciq_out_type out_type);
// MMVQ semantics on the GPU (cuda/gemm_mmvq.cu): layouts as ciq_cpu_gemm_mmvq; tokens 1..8.
ciq_status ciq_cuda_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cuda_gemm_mmvq(int ggml_type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1,
                              int64_t tokens, float *out);
#endif
