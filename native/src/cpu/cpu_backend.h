// The host backend's entry points (native/src/cpu/): arguments are checked by the C API before these run.
#pragma once
#include "../blocks.h"
#include "../status.h"

ciq_status ciq_cpu_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_convert_f16(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_quantize_q8_0(const float *x, void *out, int64_t tokens, int64_t k);
// The 32-block GEMMs (cpu/gemm_q32.cpp): MMQ semantics on q8_1-mmq activations, CPU semantics on q8_0 ones.
ciq_status ciq_cpu_gemm_q32_mmq(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                                int64_t tokens, float *out);
ciq_status ciq_cpu_gemm_q32_q8_0(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_0,
                                 int64_t tokens, float *out);
// Q4_1 / Q5_1 in CPU semantics (cpu/gemm_q32.cpp): llama.cpp x86's quantize_row_q8_1 and vec_dot_q{4,5}_1_q8_1.
ciq_status ciq_cpu_quantize_q8_1_cpu(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_gemm_q32_q8_1(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_cpu,
                                 int64_t tokens, float *out);
bool ciq_cpu_avx2(void);  // the host kernels' AVX2 paths run (AVX2 and FMA; GGML_CIQ_CPU_ISA=scalar turns them off)
// MMVQ semantics (llama.cpp CUDA mul_mat_vec_q, 1..8 tokens): x_q8_1 is [tokens][K/32] block_q8_1 (36 B: half d,
// half sum, int8 qs[32]); types Q4_0, Q5_0, Q8_0, Q4_K, Q6_K; out float32 [tokens][rows]. cpu/gemm_mmvq.cpp.
ciq_status ciq_cpu_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cpu_gemm_mmvq(int ggml_type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1,
                             int64_t tokens, float *out);
ciq_status ciq_cpu_gemm(ciq_semantics semantics, ciq_type type, const void *weight, int64_t rows, int64_t k,
                        const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type);
ciq_status ciq_cpu_rms_norm(const float *x, const float *weight, const float *add, float eps, int64_t n, int64_t d,
                            float *out);
ciq_status ciq_cpu_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
                        int64_t head_dim, float base, float *out);
ciq_status ciq_cpu_attention_ggml(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                  int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                  int64_t window, float *out);
ciq_status ciq_cpu_attention(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                             int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                             int64_t window, float *out);
ciq_status ciq_cpu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values);
// ciq_attention_masked on the host: ciq_cpu_attention's float order over the keys whose mask is above -inf.
ciq_status ciq_cpu_attention_masked(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                    const uint16_t *mask, int64_t mask_row, int64_t tokens, int64_t heads,
                                    int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale, float *out);
ciq_status ciq_cpu_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                                int64_t row_stride);
// row: values per row of llama.cpp's op (CIQ_ORDER_LLAMACPP_CPU's SiLU runs its SIMD lanes from each row's start).
ciq_status ciq_cpu_glu(ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up, int64_t n,
                       int64_t row, float *out);
ciq_status ciq_cpu_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_cpu_scale(const float *x, float s, int64_t n, float *out);
ciq_status ciq_cpu_get_rows(int type, const void *table, int64_t k, const int32_t *ids, int64_t n, float *out);
ciq_status ciq_cpu_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out);
ciq_status ciq_cpu_convert_bf16(const float *x, int64_t n, void *out);
int ciq_cpu_threads(void);
void ciq_cpu_set_threads(int threads);
const char *ciq_cpu_features(void);


// The sum of eight lanes as ggml's AVX hsum: ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)).
static inline float ciq_hsum8(const float *l) { return ((l[4] + l[0]) + (l[6] + l[2])) + ((l[5] + l[1]) + (l[7] + l[3])); }
