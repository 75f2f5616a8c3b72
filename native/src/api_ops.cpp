// The C API's transformer ops (for the prefill engine): argument checks and routing here, the arithmetic in
// cpu/ops.cpp, cuda/ops.cu and cuda/attention.cu. Attention launches are counted per resolved kernel.
#include "checks.h"
#include "counters.h"
#include "dequantize.h"
#include "switches.h"

#include <cstdlib>
#include <new>
#include <string>
#include <vector>

// CIQ_ORDER_LLAMACPP_CUDA runs on a GPU only, CIQ_ORDER_LLAMACPP_CPU on the host only; unknown orders are invalid.
static ciq_status check_order(const char *what, int device, ciq_op_order order) {
    if (order != CIQ_ORDER_HOST && order != CIQ_ORDER_LLAMACPP_CUDA && order != CIQ_ORDER_LLAMACPP_CPU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: unknown float order %d (HOST 0, LLAMACPP_CUDA 1, LLAMACPP_CPU 2)",
                        what, (int)order);
    }
    if (order == CIQ_ORDER_LLAMACPP_CUDA && device == CIQ_DEVICE_CPU) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: llama.cpp CUDA's float order runs on a GPU, not the CPU", what);
    }
    if (order == CIQ_ORDER_LLAMACPP_CPU && device != CIQ_DEVICE_CPU) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: llama.cpp CPU's SIMD float order runs on the CPU, not a GPU", what);
    }
    return CIQ_OK;
}

// Host float32 scratch of tokens x k values (an op run before the next on the host): overflow and want of memory
// reported in `what`'s name.
static ciq_status host_values(const char *what, int64_t tokens, int64_t k, std::vector<float> &values) {
    if (tokens > INT64_MAX / k) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %lld x %lld values overflow", what, (long long)tokens,
                        (long long)k);
    }
    try {
        values.resize((size_t)tokens * (size_t)k);
    } catch (const std::exception &) {  // bad_alloc, or length_error past the vector's max_size
        return ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "%s: %lld x %lld float32 values", what, (long long)tokens, (long long)k);
    }
    return CIQ_OK;
}

ciq_status ciq_rms_norm(int device, ciq_op_order order, const float *x, const float *weight, const float *add,
                        float eps, int64_t n, int64_t d, float *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm: NULL pointer");
    CIQ_TRY(ciq_check_count("ciq_rms_norm", "n", n));
    CIQ_TRY(ciq_check_count("ciq_rms_norm", "d", d));
    if (d > INT32_MAX) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm: d %lld exceeds 2^31 - 1", (long long)d);
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order("ciq_rms_norm", device, order));
    CIQ_ROUTE(device, ciq_cpu_rms_norm(x, weight, add, eps, n, d, out),
              ciq_cuda_rms_norm(order, x, weight, add, eps, n, d, out));
}

ciq_status ciq_rope(int device, ciq_op_order order, ciq_rope_mode mode, const float *x, const int32_t *positions,
                    int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out) {
    if (x == nullptr || positions == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: NULL pointer");
    if (mode != CIQ_ROPE_NORM && mode != CIQ_ROPE_NEOX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: unknown mode %d (NORM 0, NEOX 2)", (int)mode);
    }
    CIQ_TRY(ciq_check_count("ciq_rope", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_rope", "heads", heads));
    if (head_dim < 2 || head_dim % 2) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: head_dim must be even and >= 2, got %lld", (long long)head_dim);
    }
    if (!(base > 0.0f)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: base must be > 0, got %g", (double)base);
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order("ciq_rope", device, order));
    CIQ_ROUTE(device, ciq_cpu_rope(mode, x, positions, tokens, heads, head_dim, base, out),
              ciq_cuda_rope(order, mode, x, positions, tokens, heads, head_dim, base, out));
}

ciq_status ciq_rms_norm_rope(int device, ciq_op_order order, ciq_rope_mode mode, const float *x, const float *weight,
                             float eps, const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                             float base, float *out) {
    if (x == nullptr || weight == nullptr || positions == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_rope: NULL pointer");
    }
    if (mode != CIQ_ROPE_NORM && mode != CIQ_ROPE_NEOX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_rope: unknown mode %d (NORM 0, NEOX 2)", (int)mode);
    }
    CIQ_TRY(ciq_check_count("ciq_rms_norm_rope", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_rms_norm_rope", "heads", heads));
    if (head_dim < 2 || head_dim % 2 || head_dim > INT32_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_rope: head_dim must be even, >= 2 and < 2^31, got %lld",
                        (long long)head_dim);
    }
    if (!(base > 0.0f)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_rope: base must be > 0, got %g", (double)base);
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order("ciq_rms_norm_rope", device, order));
    if (device == CIQ_DEVICE_CPU) {  // the host order: the two ops in turn, rope in place
        CIQ_TRY(ciq_cpu_rms_norm(x, weight, nullptr, eps, tokens * heads, head_dim, out));
        return ciq_cpu_rope(mode, out, positions, tokens, heads, head_dim, base, out);
    }
    CIQ_ROUTE(device, CIQ_OK, ciq_cuda_rms_norm_rope(order, mode, x, weight, eps, positions, tokens, heads, head_dim,
                                                     base, out));
}

static bool uses_mma(ciq_attention_kernel kernel) {  // the tensor-core kernels: 16-byte-aligned K/V
    return kernel == CIQ_ATTENTION_MMA || kernel == CIQ_ATTENTION_MMA_LLAMACPP || kernel == CIQ_ATTENTION_WGMMA;
}

ciq_status ciq_attention_resolve(int device, ciq_attention_kernel kernel, int64_t head_dim,
                                 ciq_attention_kernel *resolved) {
    if (resolved == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_resolve: resolved is NULL");
    if ((int)kernel < CIQ_ATTENTION_AUTO || kernel > CIQ_ATTENTION_WGMMA) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown attention kernel %d", (int)kernel);
    }
    CIQ_TRY(ciq_check_count("ciq_attention", "head_dim", head_dim));
    CIQ_TRY(ciq_check_device(device));
    bool take_wgmma = true;
    // GGML_CIQ_ATTENTION_WGMMA (switches.cpp), read where AUTO resolves, on every device: a bad value is bad
    if (kernel == CIQ_ATTENTION_AUTO) CIQ_TRY(ciq_switches_attention_wgmma(&take_wgmma));
    static const char *const names[] = {"auto", "cpu", "simt", "mma", "ggml", "mma_llamacpp", "wgmma"};
    if (device == CIQ_DEVICE_CPU) {
        if (kernel == CIQ_ATTENTION_SIMT || uses_mma(kernel)) {
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention kernel %s runs on a GPU, not the CPU", names[kernel]);
        }
        *resolved = kernel == CIQ_ATTENTION_GGML ? CIQ_ATTENTION_GGML : CIQ_ATTENTION_CPU;
        return CIQ_OK;
    }
    if (kernel == CIQ_ATTENTION_CPU || kernel == CIQ_ATTENTION_GGML) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention kernel %s runs on the CPU only", names[kernel]);
    }
#ifdef GGML_CIQ_WITH_CUDA
    int major = 0, minor = 0;
    CIQ_TRY(ciq_cuda_compute_capability(device, &major, &minor));
#ifdef GGML_CIQ_HIP
    const bool mma_ok = false, wgmma_ok = false;  // mma.sync and wgmma are CUDA-only
#else
    const bool mma_ok = major >= 8 && ciq_cuda_attention_supports(device, CIQ_ATTENTION_MMA, head_dim);
    const bool wgmma_ok = major == 9 && minor == 0 && ciq_cuda_attention_supports(device, CIQ_ATTENTION_WGMMA, head_dim);
#endif
    *resolved = kernel != CIQ_ATTENTION_AUTO ? kernel
                : wgmma_ok && take_wgmma         ? CIQ_ATTENTION_WGMMA
                : mma_ok                         ? CIQ_ATTENTION_MMA
                                                 : CIQ_ATTENTION_SIMT;
    const bool ok = *resolved == CIQ_ATTENTION_WGMMA ? wgmma_ok
                    : uses_mma(*resolved)            ? mma_ok
                                                     : ciq_cuda_attention_supports(device, CIQ_ATTENTION_SIMT, head_dim);
    if (!ok) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention kernel %s does not run head_dim %lld on this GPU",
                        names[*resolved], (long long)head_dim);
    }
    (void)minor;
    return CIQ_OK;
#else
    (void)take_wgmma;
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_attention(int device, ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                         const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim,
                         int64_t cache_rows, int64_t n_past, float scale, int64_t window, float *out) {
    if (q == nullptr || k_cache == nullptr || v_cache == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention: NULL pointer");
    }
    if ((const void *)out == (const void *)q) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention: out must not be q");
    CIQ_TRY(ciq_check_count("ciq_attention", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_attention", "heads_kv", heads_kv));
    if (heads < heads_kv || heads % heads_kv) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention: heads (%lld) must be a multiple of heads_kv (%lld)",
                        (long long)heads, (long long)heads_kv);
    }
    if (n_past < 0 || window < 0 || n_past + tokens > cache_rows) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_attention: n_past %lld + tokens %lld must fit the %lld cache rows (window %lld >= 0)",
                        (long long)n_past, (long long)tokens, (long long)cache_rows, (long long)window);
    }
    ciq_attention_kernel resolved;
    CIQ_TRY(ciq_attention_resolve(device, kernel, head_dim, &resolved));
    if (uses_mma(resolved) && (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15)) {  // uint4 K/V loads
        if (kernel != CIQ_ATTENTION_AUTO || ciq_attention_resolve(device, CIQ_ATTENTION_SIMT, head_dim, &resolved) != CIQ_OK)
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention: the tensor-core kernels need 16-byte-aligned K/V caches");
    }
    ciq_status status;
    if (resolved == CIQ_ATTENTION_GGML) {
        status = ciq_cpu_attention_ggml(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window, out);
    } else if (device == CIQ_DEVICE_CPU) {
        status = ciq_cpu_attention(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window, out);
    } else {
#ifdef GGML_CIQ_WITH_CUDA
        status = ciq_cuda_set_device(device);
        if (status == CIQ_OK) {
            status = ciq_cuda_attention(resolved, q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale,
                                        window, out, ciq_switches_attention());
        }
#else
        status = CIQ_ERR_UNSUPPORTED;
#endif
    }
    if (status == CIQ_OK) ciq_counters_attention(resolved);
    return status;
}

ciq_status ciq_attention_masked(int device, ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, const uint16_t *mask, int64_t mask_row, int64_t tokens,
                                int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale,
                                float *out) {
    if (q == nullptr || k_cache == nullptr || v_cache == nullptr || mask == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_masked: NULL pointer");
    }
    if ((const void *)out == (const void *)q) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_masked: out must not be q");
    }
    CIQ_TRY(ciq_check_count("ciq_attention_masked", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_attention_masked", "heads_kv", heads_kv));
    CIQ_TRY(ciq_check_count("ciq_attention_masked", "n_kv", n_kv));
    if (heads < heads_kv || heads % heads_kv) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_attention_masked: heads (%lld) must be a multiple of heads_kv (%lld)", (long long)heads,
                        (long long)heads_kv);
    }
    if (mask_row < n_kv) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_masked: mask_row %lld is shorter than n_kv %lld",
                        (long long)mask_row, (long long)n_kv);
    }
    if (n_kv > INT32_MAX / 2 || tokens > INT32_MAX / 2 || heads > 65535) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_attention_masked: %lld keys, %lld tokens, %lld heads exceed the limits",
                        (long long)n_kv, (long long)tokens, (long long)heads);
    }
    if (kernel != CIQ_ATTENTION_AUTO && kernel != CIQ_ATTENTION_CPU && kernel != CIQ_ATTENTION_SIMT &&
        kernel != CIQ_ATTENTION_MMA && kernel != CIQ_ATTENTION_WGMMA) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED,
                        "ciq_attention_masked runs the cpu, simt, mma and wgmma kernels (asked: %d)", (int)kernel);
    }
    ciq_attention_kernel resolved;
    CIQ_TRY(ciq_attention_resolve(device, kernel, head_dim, &resolved));  // AUTO: wgmma, mma, simt as ciq_attention
    if (kernel == CIQ_ATTENTION_AUTO && uses_mma(resolved) && (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15)) {
        CIQ_TRY(ciq_attention_resolve(device, CIQ_ATTENTION_SIMT, head_dim, &resolved));
    }
    if (uses_mma(resolved) && (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_attention_masked: the tensor-core kernels need 16-byte-aligned K/V caches");
    }
    ciq_status status;
    if (device == CIQ_DEVICE_CPU) {
        status = ciq_cpu_attention_masked(q, k_cache, v_cache, mask, mask_row, tokens, heads, heads_kv, head_dim, n_kv,
                                          scale, out);
    } else {
#ifdef GGML_CIQ_WITH_CUDA
        status = ciq_cuda_set_device(device);
        if (status == CIQ_OK) {
            status = ciq_cuda_attention_masked(resolved, q, k_cache, v_cache, mask, mask_row, tokens, heads, heads_kv,
                                               head_dim, n_kv, scale, out, ciq_switches_attention());
        }
#else
        status = CIQ_ERR_UNSUPPORTED;
#endif
    }
    if (status == CIQ_OK) ciq_counters_attention(resolved);
    return status;
}

ciq_status ciq_rows_set_f16(int device, const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                            int64_t table_rows, int64_t row_stride) {
    if (x == nullptr || ids == nullptr || table == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rows_set_f16: NULL pointer");
    }
    CIQ_TRY(ciq_check_count("ciq_rows_set_f16", "n", n));
    CIQ_TRY(ciq_check_count("ciq_rows_set_f16", "k", k));
    CIQ_TRY(ciq_check_count("ciq_rows_set_f16", "table_rows", table_rows));
    if (row_stride < k) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rows_set_f16: row_stride %lld is shorter than k %lld",
                        (long long)row_stride, (long long)k);
    }
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        for (int64_t i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] >= table_rows) {
                return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rows_set_f16: id %lld at %lld outside [0, %lld)",
                                (long long)ids[i], (long long)i, (long long)table_rows);
            }
        }
    }
    CIQ_ROUTE(device, ciq_cpu_rows_set_f16(x, n, k, ids, table, row_stride),
              ciq_cuda_rows_set_f16(x, n, k, ids, table, table_rows, row_stride));
}

ciq_status ciq_kv_store(int device, uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    if (cache == nullptr || x == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_kv_store: NULL pointer");
    if (start < 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_kv_store: start must be >= 0, got %lld", (long long)start);
    CIQ_TRY(ciq_check_count("ciq_kv_store", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_kv_store", "row_values", row_values));
    CIQ_TRY(ciq_check_device(device));
    CIQ_ROUTE(device, ciq_cpu_kv_store(cache, start, x, tokens, row_values),
              ciq_cuda_kv_store(cache, start, x, tokens, row_values));
}

ciq_status ciq_rope_kv_store(int device, ciq_op_order order, ciq_rope_mode mode, const float *q, const float *k,
                             const float *v, const int32_t *positions, int64_t tokens, int64_t heads, int64_t heads_kv,
                             int64_t head_dim, float base, int64_t start, float *q_out, uint16_t *k_cache,
                             uint16_t *v_cache) {
    if (q == nullptr || k == nullptr || positions == nullptr || q_out == nullptr || k_cache == nullptr ||
        (v != nullptr && v_cache == nullptr)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: NULL pointer");
    }
    if (mode != CIQ_ROPE_NORM && mode != CIQ_ROPE_NEOX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: unknown mode %d (NORM 0, NEOX 2)", (int)mode);
    }
    CIQ_TRY(ciq_check_count("ciq_rope_kv_store", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_rope_kv_store", "heads", heads));
    CIQ_TRY(ciq_check_count("ciq_rope_kv_store", "heads_kv", heads_kv));
    if (head_dim < 2 || head_dim % 2) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: head_dim must be even and >= 2, got %lld",
                        (long long)head_dim);
    }
    if (!(base > 0.0f)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: base must be > 0, got %g", (double)base);
    if (start < 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: start must be >= 0, got %lld", (long long)start);
    const int64_t row = heads_kv * head_dim;  // both counted (ciq_check_count bounds each)
    if (row / head_dim != heads_kv || tokens > INT64_MAX / row) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope_kv_store: %lld tokens of %lld x %lld values overflow",
                        (long long)tokens, (long long)heads_kv, (long long)head_dim);
    }
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order("ciq_rope_kv_store", device, order));
    if (device == CIQ_DEVICE_CPU) {  // the calls in turn
        std::vector<float> roped;
        CIQ_TRY(host_values("ciq_rope_kv_store", tokens, row, roped));
        CIQ_TRY(ciq_cpu_rope(mode, k, positions, tokens, heads_kv, head_dim, base, roped.data()));
        CIQ_TRY(ciq_cpu_rope(mode, q, positions, tokens, heads, head_dim, base, q_out));
        CIQ_TRY(ciq_cpu_kv_store(k_cache, start, roped.data(), tokens, row));
        return v ? ciq_cpu_kv_store(v_cache, start, v, tokens, row) : CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    if (order != CIQ_ORDER_HOST) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_rope_kv_store: a GPU fuses the host order only: run ciq_rope and "
                        "ciq_kv_store");
    }
    CIQ_TRY(ciq_cuda_set_device(device));
    return ciq_cuda_rope_kv_store(mode, q, k, v, positions, tokens, heads, heads_kv, head_dim, base, start, q_out,
                                  k_cache, v_cache);
#else
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_rope_rows_set_f16(int device, ciq_op_order order, ciq_rope_mode mode, const int32_t *positions,
                                 int64_t tokens, int64_t head_dim, float base, const float *q, int64_t heads,
                                 float *q_out, const float *k, int64_t heads_kv, const float *v, int64_t v_k,
                                 const int64_t *k_ids, uint16_t *k_table, int64_t k_table_rows, int64_t k_row_stride,
                                 const int64_t *v_ids, uint16_t *v_table, int64_t v_table_rows,
                                 int64_t v_row_stride) {
    const char *what = "ciq_rope_rows_set_f16";
    if (positions == nullptr || k == nullptr || k_ids == nullptr || k_table == nullptr ||
        (q != nullptr && q_out == nullptr) || (v != nullptr && (v_ids == nullptr || v_table == nullptr))) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: NULL pointer", what);
    }
    if (mode != CIQ_ROPE_NORM && mode != CIQ_ROPE_NEOX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: unknown mode %d (NORM 0, NEOX 2)", what, (int)mode);
    }
    CIQ_TRY(ciq_check_count(what, "tokens", tokens));
    CIQ_TRY(ciq_check_count(what, "heads_kv", heads_kv));
    CIQ_TRY(ciq_check_count(what, "k_table_rows", k_table_rows));
    if (q != nullptr) CIQ_TRY(ciq_check_count(what, "heads", heads));
    if (v != nullptr) {
        CIQ_TRY(ciq_check_count(what, "v_k", v_k));
        CIQ_TRY(ciq_check_count(what, "v_table_rows", v_table_rows));
    }
    if (head_dim < 2 || head_dim % 2 || head_dim > INT32_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: head_dim must be even, >= 2 and < 2^31, got %lld", what,
                        (long long)head_dim);
    }
    if (!(base > 0.0f)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: base must be > 0, got %g", what, (double)base);
    const int64_t q_heads = q != nullptr ? heads : 0;
    if (heads_kv > INT64_MAX / head_dim || q_heads > INT64_MAX / head_dim) {  // checked before any product is formed
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: heads x head_dim %lld overflows", what, (long long)head_dim);
    }
    const int64_t k_row = heads_kv * head_dim;
    if (tokens > INT64_MAX / 4 / k_row || (q_heads > 0 && tokens > INT64_MAX / 4 / (q_heads * head_dim)) ||
        (v != nullptr && tokens > INT64_MAX / 4 / v_k)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %lld tokens of its rows overflow", what, (long long)tokens);
    }
    if (k_row_stride < k_row || (v != nullptr && v_row_stride < v_k)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: a table's row_stride (k %lld, v %lld) is shorter than its rows "
                        "(k %lld, v %lld values)", what, (long long)k_row_stride, (long long)v_row_stride,
                        (long long)k_row, (long long)(v != nullptr ? v_k : 0));
    }
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order(what, device, order));
    if (device == CIQ_DEVICE_CPU) {  // the calls in turn (ciq_rows_set_f16's checks of the ids included)
        std::vector<float> roped;
        CIQ_TRY(host_values(what, tokens, k_row, roped));
        CIQ_TRY(ciq_cpu_rope(mode, k, positions, tokens, heads_kv, head_dim, base, roped.data()));
        if (q != nullptr) CIQ_TRY(ciq_cpu_rope(mode, q, positions, tokens, heads, head_dim, base, q_out));
        CIQ_TRY(ciq_rows_set_f16(device, roped.data(), tokens, k_row, k_ids, k_table, k_table_rows, k_row_stride));
        return v != nullptr ? ciq_rows_set_f16(device, v, tokens, v_k, v_ids, v_table, v_table_rows, v_row_stride)
                            : CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    if (order != CIQ_ORDER_LLAMACPP_CUDA) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: a GPU fuses llama.cpp CUDA's order only: run ciq_rope and "
                        "ciq_rows_set_f16", what);
    }
    CIQ_TRY(ciq_cuda_set_device(device));
    return ciq_cuda_llamacpp_rope_rows_set_f16(mode, positions, tokens, head_dim, base, q, heads, q_out, k, heads_kv,
                                               v, v_k, k_ids, k_table, k_table_rows, k_row_stride, v_ids,
                                               v_table, v_table_rows, v_row_stride);
#else
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_glu(int device, ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up, int64_t n,
                   float *out) {
    if (gate == nullptr || up == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu: NULL pointer");
    if (kind != CIQ_GLU_SILU && kind != CIQ_GLU_GELU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu: unknown kind %d (SILU 0, GELU 1)", (int)kind);
    }
    CIQ_TRY(ciq_check_count("ciq_glu", "n", n));
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order("ciq_glu", device, order));
    CIQ_ROUTE(device, ciq_cpu_glu(order, kind, gate, up, n, n, out), ciq_cuda_glu(order, kind, gate, up, n, out));
}

// An op fused into ciq_activations_quantize (`apart` names the op it fuses): the host runs the op into float32
// scratch, then the conversion, for every layout; a GPU runs the fused kernel (gpu) for the host order and the f16
// layout only.
template <class Host, class Gpu>
static ciq_status fused_activations(const char *what, const char *apart, int device, ciq_op_order order,
                                    ciq_layout layout, int64_t tokens, int64_t k, void *out, Host host, Gpu gpu) {
    size_t bytes = 0;
    CIQ_TRY(ciq_activations_size(layout, tokens, k, &bytes));  // the layout, tokens and K (its multiple) checked
    CIQ_TRY(ciq_check_device(device));
    CIQ_TRY(check_order(what, device, order));
    if (device == CIQ_DEVICE_CPU) {
        std::vector<float> values;
        CIQ_TRY(host_values(what, tokens, k, values));
        CIQ_TRY(host(values.data()));
        return ciq_activations_quantize(device, layout, values.data(), out, tokens, k);
    }
#ifdef GGML_CIQ_WITH_CUDA
    if (layout != CIQ_LAYOUT_F16 || order != CIQ_ORDER_HOST) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: a GPU fuses the host order into the f16 layout only (layout %d, order "
                        "%d asked): run %s then ciq_activations_quantize", what, (int)layout, (int)order, apart);
    }
    CIQ_TRY(ciq_cuda_set_device(device));
    return gpu();
#else
    (void)gpu;
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_glu_activations(int device, ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up,
                               int64_t tokens, int64_t k, ciq_layout layout, void *out) {
    if (gate == nullptr || up == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu_activations: NULL pointer");
    }
    if (kind != CIQ_GLU_SILU && kind != CIQ_GLU_GELU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu_activations: unknown kind %d (SILU 0, GELU 1)", (int)kind);
    }
    return fused_activations(
        "ciq_glu_activations", "ciq_glu", device, order, layout, tokens, k, out,
        [&](float *values) { return ciq_cpu_glu(order, kind, gate, up, tokens * k, k, values); },
        [&] { return CIQ_GPU_CALL(ciq_cuda_glu_convert_f16(kind == CIQ_GLU_GELU, gate, up, out, tokens, k)); });
}

ciq_status ciq_rms_norm_activations(int device, ciq_op_order order, const float *x, const float *weight, float eps,
                                    int64_t tokens, int64_t k, ciq_layout layout, void *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_activations: NULL pointer");
    if (k > INT32_MAX) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm_activations: k %lld exceeds 2^31 - 1", (long long)k);
    return fused_activations(
        "ciq_rms_norm_activations", "ciq_rms_norm", device, order, layout, tokens, k, out,
        [&](float *values) { return ciq_cpu_rms_norm(x, weight, nullptr, eps, tokens, k, values); },
        [&] { return CIQ_GPU_CALL(ciq_cuda_rms_norm_convert_f16(x, weight, eps, out, tokens, k)); });
}

ciq_status ciq_add(int device, const float *a, int64_t n, const float *b, int64_t b_n, float *out) {
    if (a == nullptr || b == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_add: NULL pointer");
    CIQ_TRY(ciq_check_count("ciq_add", "n", n));
    CIQ_TRY(ciq_check_count("ciq_add", "b_n", b_n));
    if (n % b_n) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_add: b_n %lld does not divide n %lld", (long long)b_n, (long long)n);
    }
    CIQ_TRY(ciq_check_device(device));
    CIQ_ROUTE(device, ciq_cpu_add(a, n, b, b_n, out), ciq_cuda_add(a, n, b, b_n, out));
}

ciq_status ciq_scale(int device, const float *x, float s, int64_t n, float *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_scale: NULL pointer");
    CIQ_TRY(ciq_check_count("ciq_scale", "n", n));
    CIQ_TRY(ciq_check_device(device));
    CIQ_ROUTE(device, ciq_cpu_scale(x, s, n, out), ciq_cuda_scale(x, s, n, out));
}

static ciq_status check_table(const char *what, int type, int64_t rows, int64_t k) {
    const int values = ciq_block_values(type);
    if (values == 0) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: ggml type %d is not one of F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_1, "
                        "Q5_1, Q4_K, Q5_K, Q6_K", what, type);
    }
    CIQ_TRY(ciq_check_count(what, "rows", rows));
    if (k < 1 || k % values) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: k must be a positive multiple of %d for type %d, got %lld", what,
                        values, type, (long long)k);
    }
    return CIQ_OK;
}

ciq_status ciq_rows_get(int device, ciq_type ggml_type, const void *table, int64_t table_rows, int64_t k,
                        const int32_t *ids, int64_t n, float *out) {
    if (table == nullptr || ids == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rows_get: NULL pointer");
    CIQ_TRY(check_table("ciq_rows_get", ggml_type, table_rows, k));
    CIQ_TRY(ciq_check_count("ciq_rows_get", "n", n));
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        for (int64_t i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] >= table_rows) {
                return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rows_get: id %d at %lld outside [0, %lld)", (int)ids[i],
                                (long long)i, (long long)table_rows);
            }
        }
    }
    CIQ_ROUTE(device, ciq_cpu_get_rows(ggml_type, table, k, ids, n, out),
              ciq_cuda_get_rows(ggml_type, table, table_rows, k, ids, n, out));
}

ciq_status ciq_tensor_dequantize_bf16(int device, ciq_type ggml_type, const void *data, int64_t rows, int64_t k, void *out) {
    if (data == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_tensor_dequantize_bf16: NULL pointer");
    CIQ_TRY(check_table("ciq_tensor_dequantize_bf16", ggml_type, rows, k));
    CIQ_TRY(ciq_check_device(device));
    CIQ_ROUTE(device, ciq_cpu_dequantize_bf16(ggml_type, data, rows, k, out),
              ciq_cuda_dequantize_bf16(ggml_type, data, rows, k, out));
}

ciq_status ciq_values_convert_bf16(int device, const float *x, int64_t n, void *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_values_convert_bf16: NULL pointer");
    CIQ_TRY(ciq_check_count("ciq_values_convert_bf16", "n", n));
    CIQ_TRY(ciq_check_device(device));
    CIQ_ROUTE(device, ciq_cpu_convert_bf16(x, n, out), ciq_cuda_convert_bf16(x, n, out));
}
