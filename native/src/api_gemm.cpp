// The C API's GEMM calls: activation layouts and their quantizers, ciq_gemm (plan, quantize, run) and
// ciq_gemm_quantized (run a plan), the dense bf16 ceiling. Variant facts and resolution: registry.cpp.
#include "registry.h"

#include <string>

ciq_status ciq_activations_size(ciq_layout layout, int64_t tokens, int64_t k, size_t *bytes) {
    if (bytes == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_activations_size: bytes is NULL");
    *bytes = 0;
    CIQ_TRY(ciq_check_count("activations", "tokens", tokens));
    int64_t unit = 0;
    switch (layout) {
        case CIQ_LAYOUT_Q8_K: unit = QK_K; break;
        case CIQ_LAYOUT_F16: unit = F16_K_UNIT; break;
        case CIQ_LAYOUT_Q8_1_MMQ_DS4: case CIQ_LAYOUT_Q8_1_MMQ_D4: unit = Q8_1_MMQ_VALUES; break;
        case CIQ_LAYOUT_Q8_0: case CIQ_LAYOUT_Q8_1: unit = 32; break;
        default: return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown activation layout %d", (int)layout);
    }
    if (k < unit || k % unit) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "activations: K must be a positive multiple of %lld, got %lld",
                        (long long)unit, (long long)k);
    }
    switch (layout) {
        case CIQ_LAYOUT_Q8_K: *bytes = (size_t)(tokens * (k / QK_K)) * Q8_K_BLOCK_BYTES; break;
        case CIQ_LAYOUT_F16: *bytes = ciq_f16_scale_offset(tokens, k) + (size_t)tokens * sizeof(float); break;
        case CIQ_LAYOUT_Q8_0: *bytes = (size_t)(tokens * k) + (size_t)(tokens * (k / 32)) * sizeof(float); break;
        case CIQ_LAYOUT_Q8_1: *bytes = (size_t)(tokens * (k / 32)) * 36; break;  // block_q8_1: half d, half sum, qs[32]
        default: *bytes = (size_t)(tokens * (k / Q8_1_MMQ_VALUES)) * Q8_1_MMQ_BLOCK_BYTES; break;
    }
    return CIQ_OK;
}

ciq_status ciq_activations_quantize(int device, ciq_layout layout, const float *x, void *out, int64_t tokens,
                                    int64_t k) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_activations_quantize: NULL pointer");
    size_t bytes = 0;
    CIQ_TRY(ciq_activations_size(layout, tokens, k, &bytes));
    CIQ_TRY(ciq_check_device(device));
    const bool ds4 = layout == CIQ_LAYOUT_Q8_1_MMQ_DS4;
    if (device == CIQ_DEVICE_CPU) {
        switch (layout) {
            case CIQ_LAYOUT_Q8_K: return ciq_cpu_quantize_q8_K(x, out, tokens, k);
            case CIQ_LAYOUT_F16: return ciq_cpu_convert_f16(x, out, tokens, k);
            case CIQ_LAYOUT_Q8_0: return ciq_cpu_quantize_q8_0(x, out, tokens, k);
            case CIQ_LAYOUT_Q8_1: return ciq_cpu_quantize_q8_1(x, out, tokens, k);
            default: return ciq_cpu_quantize_q8_1_mmq(ds4, x, out, tokens, k);
        }
    }
#ifdef GGML_CIQ_WITH_CUDA
    CIQ_TRY(ciq_cuda_set_device(device));
    switch (layout) {
        case CIQ_LAYOUT_Q8_K: return ciq_cuda_quantize_q8_K(x, out, tokens, k);
        case CIQ_LAYOUT_F16: return ciq_cuda_convert_f16(x, out, tokens, k);
        case CIQ_LAYOUT_Q8_0: return ciq_fail(CIQ_ERR_UNSUPPORTED, "the q8_0 activation layout is made on the host only");
        case CIQ_LAYOUT_Q8_1: return ciq_cuda_quantize_q8_1(x, out, tokens, k);
        default: return ciq_cuda_quantize_q8_1_mmq(ds4, x, out, tokens, k);
    }
#else
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_gemm_quantized(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                              size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized, int64_t tokens,
                              void *out, ciq_out_type out_type) {
    if (plan == nullptr || weight == nullptr || x_quantized == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: NULL pointer");
    }
    CIQ_TRY(ciq_check_device(device));
    const ciq_variant_row *row = ciq_registry_row(plan->variant);
    if (row == nullptr || row->launch == nullptr || !ciq_registry_covers(*row, type)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: the plan's variant %d does not run %s weights "
                        "in this build (make the plan with ciq_gemm_plan)", (int)plan->variant, ciq_type_name(type));
    }
    const uint32_t implemented = device == CIQ_DEVICE_CPU ? row->info.host_semantics : row->info.gpu_semantics;
    if (implemented == 0) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s is not available on %s", row->info.name,
                        device == CIQ_DEVICE_CPU ? "the CPU" : "a GPU");
    }
    if ((int)plan->semantics < 0 || plan->semantics >= CIQ_SEMANTICS_ANY || !(implemented & (1u << plan->semantics))) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: the plan's semantics %d is not one variant %s "
                        "implements on %s (make the plan with ciq_gemm_plan)", (int)plan->semantics, row->info.name,
                        device == CIQ_DEVICE_CPU ? "the CPU" : "a GPU");
    }
    CIQ_TRY(ciq_check_count("ciq_gemm", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_gemm", "rows", rows));
    if (tokens < row->info.min_tokens || tokens > row->info.max_tokens) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: variant %s runs %lld..%lld tokens, not %lld",
                        row->info.name, (long long)row->info.min_tokens, (long long)row->info.max_tokens,
                        (long long)tokens);
    }
    const int values = ciq_type_block_values(type);
    if (k < values || k % values) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: K must be a positive multiple of %d for %s, got %lld",
                        values, ciq_type_name(type), (long long)k);
    }
    const size_t expected = (size_t)rows * (size_t)(k / values) * (size_t)ciq_type_block_bytes(type);
    if (weight_nbytes != expected) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: %s [%lld x %lld] needs %zu weight bytes, got %zu",
                        ciq_type_name(type), (long long)rows, (long long)k, expected, weight_nbytes);
    }
    if (out_type != CIQ_OUT_F32 && out_type != CIQ_OUT_BF16) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: unknown output type %d", (int)out_type);
    }
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) CIQ_TRY(ciq_cuda_set_device(device));
#endif
    const ciq_status status = row->launch(device, plan->variant, plan->semantics, type, weight, rows, k, x_quantized,
                                          tokens, out, out_type);
    if (status == CIQ_OK) ciq_registry_count(plan->variant, type);
    return status;
}

ciq_status ciq_gemm(int device, ciq_variant variant, ciq_semantics semantics, ciq_type type, const void *weight,
                    size_t weight_nbytes, int64_t rows, int64_t k, const float *x, int64_t tokens, void *out,
                    ciq_out_type out_type) {
    if (x == nullptr || weight == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: NULL pointer");
    ciq_plan plan;
    CIQ_TRY(ciq_gemm_plan(device, variant, semantics, type, rows, k, tokens, &plan));
    void *scratch = nullptr;
    std::string host_scratch;
    if (device == CIQ_DEVICE_CPU) {
        host_scratch.resize(plan.activation_bytes);
        scratch = &host_scratch[0];
#ifdef GGML_CIQ_WITH_CUDA
    } else {
        CIQ_TRY(ciq_cuda_scratch(device, 0, plan.activation_bytes, &scratch));
#endif
    }
    CIQ_TRY(ciq_activations_quantize(device, plan.activation_layout, x, scratch, tokens, k));
    return ciq_gemm_quantized(device, &plan, type, weight, weight_nbytes, rows, k, scratch, tokens, out, out_type);
}

ciq_status ciq_gemm_dense_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens,
                               void *out, ciq_out_type out_type) {
    if (weight == nullptr || x == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_dense_bf16: NULL pointer");
    }
    if (rows < 1 || k < 1 || tokens < 1 || rows > INT32_MAX || k > INT32_MAX || tokens > INT32_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_dense_bf16: bad shape %lld x %lld x %lld", (long long)rows,
                        (long long)k, (long long)tokens);
    }
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_gemm_dense_bf16 runs on a GPU only");
#ifdef GGML_CIQ_WITH_CUDA
    CIQ_TRY(ciq_cuda_set_device(device));
    return ciq_cuda_dense_gemm_bf16(device, weight, rows, k, x, tokens, out, out_type);
#else
    (void)out_type;
    return CIQ_ERR_UNSUPPORTED;
#endif
}
