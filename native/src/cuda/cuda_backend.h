// The CUDA/HIP backend's entry points (native/src/cuda/), present when GGML_CIQ_WITH_CUDA is defined. All pointers
// are device memory; work is queued on the legacy default stream; launch errors are returned, not synchronized.
// Arguments are checked by the C API before these run.
#pragma once
#include "../blocks.h"
#include "../status.h"
#include "../switches.h"

#define CIQ_GEMM_OUTPUTS_MAX 4  // ciq_gemm_quantized_outputs' n_outputs (ggml_ciq.h says 1..4)
#define CIQ_GEMM_GROUP_MAX 3    // ciq_gemm_quantized_group's n_weights (ggml_ciq.h says 1..3)

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
#define CIQ_SCRATCH_SLOTS 5  // 0: quantized activations (ciq_gemm); 1: attention's split over the keys; 2: the
                             // whole product of ciq_gemm_quantized_outputs where it is copied out; 3: the wgmma
                             // GEMM's stream-K hand-over (partial tiles and flags); 4: ciq_attention_masked's
                             // marked mask tiles
ciq_status ciq_cuda_scratch(int device, int slot, size_t nbytes, void **ptr);  // per-device buffers, grown on demand
// CUDA graphs (runtime.cu): this thread's calls between begin and end are captured, not run; the graph is replayed by
// launch (on the thread's graph stream) and fails as stale once a scratch buffer has moved.
ciq_status ciq_cuda_graph_begin(int device);
ciq_status ciq_cuda_graph_end(int device, void **graph);
ciq_status ciq_cuda_graph_launch(void *graph);
ciq_status ciq_cuda_graph_free(void *graph);
ciq_status ciq_cuda_stream_wait_event(int device, void *event);    // ciq_stream() waits for another library's event
ciq_status ciq_cuda_stream_record_event(int device, void *event);  // records ciq_stream()'s work in that event
ciq_status ciq_cuda_event_record(int device, void **event);  // creates and records an event
ciq_status ciq_cuda_event_elapsed(void *start, void *stop, float *milliseconds);  // syncs stop, frees both (stop NULL: frees start)

ciq_status ciq_cuda_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cuda_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k);
// variant is one of CIQ_VARIANT_WMMA, _WMMA_WIDE, _WMMA_SHARED, _WMMA_BIGTILE; x is Q8_K.
ciq_status ciq_cuda_gemm_wmma(ciq_variant variant, ciq_type type, const void *weight, int64_t rows, int64_t k,
                              const void *x_q8_K, int64_t tokens, void *out, ciq_out_type out_type);
ciq_status ciq_cuda_dense_gemm_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x,
                                    int64_t tokens, void *out, ciq_out_type out_type);
// f16 semantics: x -> the f16 activation layout (ciq_activations_size); the wgmma GEMM reads it (sm_90a).
ciq_status ciq_cuda_convert_f16(const float *x, void *out, int64_t tokens, int64_t k);
// ciq_glu (host order) then ciq_cuda_convert_f16 in one kernel: the same bytes.
ciq_status ciq_cuda_glu_convert_f16(bool gelu, const float *gate, const float *up, void *out, int64_t tokens, int64_t k);
// ciq_rms_norm (host order, weight or NULL, no add) then ciq_cuda_convert_f16 in one kernel: the same bytes.
ciq_status ciq_cuda_rms_norm_convert_f16(const float *x, const float *weight, float eps, void *out, int64_t tokens,
                                         int64_t k);
// The wgmma GEMM (gemm_wgmma.cu; sm_90a): sw, the GGML_CIQ_WGMMA_* switches the caller read (switches.h).
ciq_status ciq_cuda_gemm_wgmma(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                               int64_t rows, int64_t k, const void *x_f16, int64_t tokens, void *out,
                               ciq_out_type out_type);
// The same with the product's rows split among outputs, each plus an optional float32 addend (ciq_gemm_output; the
// API checked them): one launch where every output but the last has a multiple of 128 rows (CIQ_ERR_UNSUPPORTED
// otherwise, for the caller's fallback).
ciq_status ciq_cuda_gemm_wgmma_outputs(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                       int64_t rows, int64_t k, const void *x_f16, int64_t tokens,
                                       const ciq_gemm_output *outputs, int n_outputs, ciq_out_type out_type);
// n (2..CIQ_GEMM_GROUP_MAX) weights' GEMMs on the same f16 activations in one launch (the RS kernel over several
// tensor maps): one K-quant type (Q4_K, Q5_K, Q6_K), or Q4_K weights then Q6_K ones, all staged by TMA, each but the
// last a multiple of 128 rows; the outputs split their rows in the weights' order. CIQ_ERR_UNSUPPORTED where that does
// not hold (or GGML_CIQ_WGMMA_GROUP=0 / GGML_CIQ_WGMMA_RS=0, or =1 and the time model gains nothing): run them apart.
ciq_status ciq_cuda_gemm_wgmma_group(int device, const ciq_wgmma_switches &sw, int n, const ciq_type *types,
                                     const void *const *weights, const int64_t *rows, int64_t k, const void *x_f16,
                                     int64_t tokens, const ciq_gemm_output *outputs, int n_outputs,
                                     ciq_out_type out_type);
// A gate/up weight interleaved by CIQ_GLU_INTERLEAVE rows, its GLU from the epilogue: out [tokens][rows/2] float32.
ciq_status ciq_cuda_gemm_wgmma_glu(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                   int64_t rows, int64_t k, const void *x_f16, int64_t tokens, bool gelu, float *out);
// The same GLU from two matrices gate, up [rows][K] of one K-quant type (rows a multiple of 64, both staged by TMA):
// each tile stages gate's 64 rows and up's, the interleaved weight's tile; out [tokens][rows] float32.
// CIQ_ERR_UNSUPPORTED where that does not hold: the caller runs the two GEMMs and the GLU.
ciq_status ciq_cuda_gemm_wgmma_glu_pair(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *gate,
                                        const void *up, int64_t rows, int64_t k, const void *x_f16, int64_t tokens,
                                        bool gelu, float *out);
// dst[r][0 .. width) = src[r][0 .. width) for height rows of the given byte pitches (device to device, queued).
ciq_status ciq_cuda_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                            size_t height);
// Transformer ops (cuda/ops.cu, cuda/attention.cu); arguments checked by the C API. get_rows writes NaN rows for ids
// outside [0, table_rows).
// order: CIQ_ORDER_HOST in ops.cu, CIQ_ORDER_LLAMACPP_CUDA in ops_llamacpp.cu (built as llama.cpp builds its kernels).
ciq_status ciq_cuda_rms_norm(ciq_op_order order, const float *x, const float *weight, const float *add, float eps,
                             int64_t n, int64_t d, float *out);
ciq_status ciq_cuda_rope(ciq_op_order order, ciq_rope_mode mode, const float *x, const int32_t *positions,
                         int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out);
ciq_status ciq_cuda_rms_norm_rope(ciq_op_order order, ciq_rope_mode mode, const float *x, const float *weight, float eps,
                                  const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                                  float base, float *out);
bool ciq_cuda_attention_supports(int device, ciq_attention_kernel kernel, int64_t head_dim);  // built, fits
// sw: GGML_CIQ_ATTENTION_SPLIT and GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM as the caller read them (switches.h).
ciq_status ciq_cuda_attention(ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                              const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv,
                              int64_t head_dim, int64_t n_past, float scale, int64_t window, float *out,
                              const ciq_attention_switches &sw);
// CIQ_ATTENTION_MMA_LLAMACPP (attention_llamacpp.cu; CUDA only): its dynamic shared memory for head_dim, and the call.
size_t ciq_cuda_attention_llamacpp_smem(int64_t head_dim);
ciq_status ciq_cuda_attention_llamacpp(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                       int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                       int64_t window, float *out, int blocks_per_sm);
// CIQ_ATTENTION_WGMMA (attention_wgmma.cu; CUDA sm_90a only): its dynamic shared memory for head_dim (0: not built
// for it), and the call.
size_t ciq_cuda_attention_wgmma_smem(int64_t head_dim);
ciq_status ciq_cuda_attention_wgmma(const float *q, const uint16_t *k_cache, const uint16_t *v_cache, int64_t tokens,
                                    int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale,
                                    int64_t window, float *out, bool split);
// ciq_attention_masked's wgmma call: the mask and its tile marks (attention.cu's attention_mark_kernel) made.
ciq_status ciq_cuda_attention_wgmma_masked(const float *q, const uint16_t *k_cache, const uint16_t *v_cache,
                                           const uint16_t *mask, int64_t mask_row, const uint8_t *marked,
                                           int64_t key_tiles, int64_t n_kv, int64_t tokens, int64_t heads,
                                           int64_t heads_kv, int64_t head_dim, float scale, float *out, bool split);
// ciq_attention_masked with kernel SIMT, MMA or WGMMA (attention.cu): the mask's 64 x 64 tiles marked in scratch
// slot 4.
ciq_status ciq_cuda_attention_masked(ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                                     const uint16_t *v_cache, const uint16_t *mask, int64_t mask_row, int64_t tokens,
                                     int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale,
                                     float *out, const ciq_attention_switches &sw);
ciq_status ciq_cuda_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values);
ciq_status ciq_cuda_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                                 int64_t table_rows, int64_t row_stride);
// ciq_cuda_rope (host order) of q, and of k stored as ciq_cuda_kv_store at row start of k_cache, v (or NULL) stored
// in v_cache: one kernel, the same values.
ciq_status ciq_cuda_rope_kv_store(ciq_rope_mode mode, const float *q, const float *k, const float *v,
                                  const int32_t *positions, int64_t tokens, int64_t heads, int64_t heads_kv,
                                  int64_t head_dim, float base, int64_t start, float *q_out, uint16_t *k_cache,
                                  uint16_t *v_cache);
ciq_status ciq_cuda_glu(ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up, int64_t n,
                        float *out);
ciq_status ciq_cuda_llamacpp_rms_norm(const float *x, const float *weight, const float *add, float eps, int64_t n,
                                      int64_t d, float *out);
ciq_status ciq_cuda_llamacpp_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens,
                                  int64_t heads, int64_t head_dim, float base, float *out);
ciq_status ciq_cuda_llamacpp_rms_norm_rope(ciq_rope_mode mode, const float *x, const float *weight, float eps,
                                           const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                                           float base, float *out);
// The kernel ciq_cuda_llamacpp_rope_rows_set_f16 runs for n grid indices (q's and k's pairs, v's values) over these
// rows and tables (the tests' view of its dispatch).
enum { CIQ_ROPE_ROWS_SET_VECTORS = 0, CIQ_ROPE_ROWS_SET_SCALAR32 = 1, CIQ_ROPE_ROWS_SET_SCALAR64 = 2 };
int ciq_cuda_llamacpp_rope_rows_set_kernel(int64_t n, int64_t head_dim, const float *q, const float *q_out,
                                           const float *k, const float *v, int64_t v_k, const uint16_t *k_table,
                                           int64_t k_row_stride, const uint16_t *v_table, int64_t v_row_stride);
// ciq_rope_rows_set_f16 in llama.cpp CUDA's order: q (or NULL) roped into q_out, k roped and v (or NULL) rounded to f16
// into their tables' rows ids[t], one kernel (ops_llamacpp.cu).
ciq_status ciq_cuda_llamacpp_rope_rows_set_f16(ciq_rope_mode mode, const int32_t *positions, int64_t tokens,
                                               int64_t head_dim, float base, const float *q, int64_t heads,
                                               float *q_out, const float *k, int64_t heads_kv, const float *v,
                                               int64_t v_k, const int64_t *k_ids, uint16_t *k_table,
                                               int64_t k_table_rows, int64_t k_row_stride, const int64_t *v_ids,
                                               uint16_t *v_table, int64_t v_table_rows, int64_t v_row_stride);
ciq_status ciq_cuda_llamacpp_glu(ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out);
ciq_status ciq_cuda_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_cuda_scale(const float *x, float s, int64_t n, float *out);
ciq_status ciq_cuda_get_rows(int type, const void *table, int64_t table_rows, int64_t k, const int32_t *ids, int64_t n,
                             float *out);
ciq_status ciq_cuda_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out);
ciq_status ciq_cuda_convert_bf16(const float *x, int64_t n, void *out);
// x is q8_1-mmq (DS4 for Q4_K, D4 for Q6_K).
ciq_status ciq_cuda_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                             int64_t tokens, float *out);
ciq_status ciq_cuda_gemm_mma(ciq_type type, const void *weight, int64_t rows, int64_t k,
                             const void *x_q8_1_mmq, int64_t tokens, void *out, ciq_out_type out_type);
// MMVQ semantics on the GPU (cuda/gemm_mmvq.cu): layouts as ciq_cpu_gemm_mmvq; tokens 1..8.
ciq_status ciq_cuda_quantize_q8_1(const float *x, void *out, int64_t tokens, int64_t k);
ciq_status ciq_cuda_gemm_mmvq(int ggml_type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1,
                              int64_t tokens, float *out);
#endif
