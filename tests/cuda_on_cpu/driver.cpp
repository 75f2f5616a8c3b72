// The C entry points tests/test_cuda_emulation.py calls: the CUDA backend's host functions of ops.cu,
// ops_llamacpp.cu, attention.cu, attention_llamacpp.cu, gemm_q32.cu and gemm_mma.cu (compiled for the CPU emulation); errors are recorded by the library's status.cpp, switches read by its switches.cpp.
#include "cuda/common.cuh"

#include <vector>

cudaStream_t ciq_stream() { return nullptr; }  // runtime.cu's, which the emulation does not build: one stream

// runtime.cu's scratch buffers (attention's split over the keys): host memory, grown on demand, kept per slot.
ciq_status ciq_cuda_scratch(int, int slot, size_t nbytes, void **ptr) {
    static std::vector<std::vector<unsigned char>> buffers(CIQ_SCRATCH_SLOTS);
    if (slot < 0 || slot >= CIQ_SCRATCH_SLOTS) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "scratch slot %d", slot);
    if (buffers[slot].size() < nbytes) buffers[slot].resize(nbytes);
    *ptr = buffers[slot].data();
    return CIQ_OK;
}

// attention_wgmma.cu's entry points (Hopper wgmma/TMA, which the emulation cannot run): not built here, as on a GPU
// without sm_90a code: no shared memory size (ciq_cuda_attention_supports answers false) and an error if called.
size_t ciq_cuda_attention_wgmma_smem(int64_t) { return 0; }
ciq_status ciq_cuda_attention_wgmma(const float *, const uint16_t *, const uint16_t *, int64_t, int64_t, int64_t,
                                    int64_t, int64_t, float, int64_t, float *, bool) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (wgmma) is not built for the CPU emulation");
}
ciq_status ciq_cuda_attention_wgmma_masked(const float *, const uint16_t *, const uint16_t *, const uint16_t *, int64_t,
                                           const uint8_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float,
                                           float *, bool) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention (wgmma) is not built for the CPU emulation");
}

extern "C" {
const char *emu_last_error(void) { return ciq_last_error(); }
int emu_attention_supports(int kernel, int64_t head_dim) {
    return ciq_cuda_attention_supports(0, (ciq_attention_kernel)kernel, head_dim);
}
int emu_attention(int kernel, const float *q, const uint16_t *k, const uint16_t *v, int64_t tokens, int64_t heads,
                  int64_t heads_kv, int64_t head_dim, int64_t n_past, float scale, int64_t window, float *out) {
    return ciq_cuda_attention((ciq_attention_kernel)kernel, q, k, v, tokens, heads, heads_kv, head_dim, n_past, scale,
                              window, out, ciq_switches_attention());  // the switches as the C API reads them
}
int emu_attention_masked(int kernel, const float *q, const uint16_t *k, const uint16_t *v, const uint16_t *mask,
                         int64_t mask_row, int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim,
                         int64_t n_kv, float scale, float *out) {
    return ciq_cuda_attention_masked((ciq_attention_kernel)kernel, q, k, v, mask, mask_row, tokens, heads, heads_kv,
                                     head_dim, n_kv, scale, out, ciq_switches_attention());
}
int emu_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table, int64_t table_rows,
                     int64_t row_stride) {
    return ciq_cuda_rows_set_f16(x, n, k, ids, table, table_rows, row_stride);
}
int emu_rms_norm(int order, const float *x, const float *weight, const float *add, float eps, int64_t n, int64_t d,
                 float *out) {
    return ciq_cuda_rms_norm((ciq_op_order)order, x, weight, add, eps, n, d, out);
}
int emu_rms_norm_f16(const float *x, const float *weight, float eps, int64_t tokens, int64_t k, void *out) {
    return ciq_cuda_rms_norm_convert_f16(x, weight, eps, out, tokens, k);
}
int emu_rope(int order, int mode, const float *x, const int32_t *positions, int64_t tokens, int64_t heads,
             int64_t head_dim, float base, float *out) {
    return ciq_cuda_rope((ciq_op_order)order, (ciq_rope_mode)mode, x, positions, tokens, heads, head_dim, base, out);
}
int emu_rms_norm_rope(int order, int mode, const float *x, const float *weight, float eps, const int32_t *positions,
                      int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out) {
    return ciq_cuda_rms_norm_rope((ciq_op_order)order, (ciq_rope_mode)mode, x, weight, eps, positions, tokens, heads,
                                  head_dim, base, out);
}
int emu_rope_kv_store(int mode, const float *q, const float *k, const float *v, const int32_t *positions,
                      int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim, float base, int64_t start,
                      float *q_out, uint16_t *k_cache, uint16_t *v_cache) {
    return ciq_cuda_rope_kv_store((ciq_rope_mode)mode, q, k, v, positions, tokens, heads, heads_kv, head_dim, base,
                                  start, q_out, k_cache, v_cache);
}
int emu_rope_rows_set_f16(int mode, const int32_t *positions, int64_t tokens, int64_t head_dim, float base,
                          const float *q, int64_t heads, float *q_out, const float *k, int64_t heads_kv,
                          const float *v, int64_t v_k, const int64_t *k_ids, uint16_t *k_table, int64_t k_table_rows,
                          int64_t k_row_stride, const int64_t *v_ids, uint16_t *v_table, int64_t v_table_rows,
                          int64_t v_row_stride) {
    return ciq_cuda_llamacpp_rope_rows_set_f16((ciq_rope_mode)mode, positions, tokens, head_dim, base, q, heads, q_out, k,
                                               heads_kv, v, v_k, k_ids, k_table, k_table_rows, k_row_stride, v_ids,
                                               v_table, v_table_rows, v_row_stride);
}
int emu_rope_rows_set_kernel(int64_t n, int64_t head_dim, const float *q, const float *q_out, const float *k,
                             const float *v, int64_t v_k, const uint16_t *k_table, int64_t k_row_stride,
                             const uint16_t *v_table, int64_t v_row_stride) {
    return ciq_cuda_llamacpp_rope_rows_set_kernel(n, head_dim, q, q_out, k, v, v_k, k_table, k_row_stride, v_table,
                                                  v_row_stride);
}
int emu_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    return ciq_cuda_kv_store(cache, start, x, tokens, row_values);
}
int emu_glu(int order, int kind, const float *gate, const float *up, int64_t n, float *out) {
    return ciq_cuda_glu((ciq_op_order)order, (ciq_glu_kind)kind, gate, up, n, out);
}
int emu_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out) { return ciq_cuda_add(a, n, b, b_n, out); }
int emu_scale(const float *x, float s, int64_t n, float *out) { return ciq_cuda_scale(x, s, n, out); }
int emu_get_rows(int type, const void *table, int64_t table_rows, int64_t k, const int32_t *ids, int64_t n, float *out) {
    return ciq_cuda_get_rows(type, table, table_rows, k, ids, n, out);
}
int emu_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out) {
    return ciq_cuda_dequantize_bf16(type, data, rows, k, out);
}
int emu_convert_bf16(const float *x, int64_t n, void *out) { return ciq_cuda_convert_bf16(x, n, out); }
int emu_gemm_mma(int type, const void *weight, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out) {
    return ciq_cuda_gemm_mma((ciq_type)type, weight, rows, k, xq, tokens, out, CIQ_OUT_F32);
}
int emu_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out) {
    return ciq_cuda_gemm_q32(type, weight, rows, k, xq, tokens, out);
}
}
