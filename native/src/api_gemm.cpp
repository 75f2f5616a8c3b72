// The C API's GEMM calls: the activation quantizers, ciq_gemm (plan, quantize, run) and
// ciq_gemm_quantized (run a plan), the dense bf16 ceiling. Variant facts and resolution: registry.cpp.
#include "counters.h"
#include "registry.h"
#include "switches.h"

#include <cstring>
#include <string>

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
            case CIQ_LAYOUT_Q8_1_CPU: return ciq_cpu_quantize_q8_1_cpu(x, out, tokens, k);
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
        case CIQ_LAYOUT_Q8_1_CPU:
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "the q8_1-cpu activation layout is made on the host only");
        default: return ciq_cuda_quantize_q8_1_mmq(ds4, x, out, tokens, k);
    }
#else
    return CIQ_ERR_UNSUPPORTED;
#endif
}

// The checks of a plan's run (ciq_gemm_quantized and ciq_gemm_quantized_outputs): the variant's row on success.
static ciq_status check_run(int device, const ciq_plan *plan, ciq_type type, size_t weight_nbytes, int64_t rows,
                            int64_t k, int64_t tokens, ciq_out_type out_type, const ciq_variant_row **run) {
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
    const uint32_t runs = ciq_registry_semantics(*row, type, device == CIQ_DEVICE_CPU);  // less k_type_semantics
    if ((int)plan->semantics >= 0 && plan->semantics < CIQ_SEMANTICS_ANY && (implemented & (1u << plan->semantics)) &&
        !(runs & (1u << plan->semantics))) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s does not run %s weights in %s semantics on %s",
                        row->info.name, ciq_type_name(type), ciq_semantics_name(plan->semantics),
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
    *run = row;
    return CIQ_OK;
}

ciq_status ciq_gemm_quantized(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                              size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized, int64_t tokens,
                              void *out, ciq_out_type out_type) {
    if (plan == nullptr || weight == nullptr || x_quantized == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: NULL pointer");
    }
    const ciq_variant_row *row = nullptr;
    CIQ_TRY(check_run(device, plan, type, weight_nbytes, rows, k, tokens, out_type, &row));
    const ciq_status status = row->launch(device, plan->variant, plan->semantics, type, weight, rows, k, x_quantized,
                                          tokens, out, out_type);
    if (status == CIQ_OK) ciq_counters_gemm(plan->variant, type);
    return status;
}

static bool overlap(const void *a, size_t a_bytes, const void *b, size_t b_bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + b_bytes && y < x + a_bytes;
}

// The outputs of one weight's product of `rows` rows (ciq_gemm_quantized_outputs): 1..4, each non-NULL with rows
// left for it, an addend only for float32, their rows summing to the weight's.
static ciq_status check_outputs(const char *fn, int64_t rows, const ciq_gemm_output *outputs, int n_outputs,
                                ciq_out_type out_type) {
    if (outputs == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: outputs is NULL", fn);
    if (n_outputs < 1 || n_outputs > CIQ_GEMM_OUTPUTS_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %d outputs (1..%d)", fn, n_outputs, CIQ_GEMM_OUTPUTS_MAX);
    }
    int64_t sum = 0;
    for (int s = 0; s < n_outputs; ++s) {
        const ciq_gemm_output &o = outputs[s];
        if (o.out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: output %d is NULL", fn, s);
        if (o.rows < 1 || o.rows > rows - sum) {
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: output %d has %lld rows, %lld of the weight's %lld are left",
                            fn, s, (long long)o.rows, (long long)(rows - sum), (long long)rows);
        }
        if (o.add != nullptr && out_type != CIQ_OUT_F32) {
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: an addend needs float32 output", fn);
        }
        sum += o.rows;
    }
    if (sum != rows) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: the outputs have %lld rows, the weight %lld", fn, (long long)sum,
                        (long long)rows);
    }
    return CIQ_OK;
}

// No output overlapping an addend or another output (a race, refused): outputs[0 .. n) of `tokens` rows each.
static ciq_status check_no_overlap(const char *fn, int64_t tokens, const ciq_gemm_output *const *outputs, int n,
                                   ciq_out_type out_type) {
    const size_t esize = out_type == CIQ_OUT_F32 ? sizeof(float) : 2;
    for (int s = 0; s < n; ++s) {
        const size_t bytes = (size_t)tokens * (size_t)outputs[s]->rows * esize;
        for (int t = 0; t < n; ++t) {
            const ciq_gemm_output &o = *outputs[t];
            const size_t other = (size_t)tokens * (size_t)o.rows * (o.add ? sizeof(float) : esize);
            if (o.add != nullptr && overlap(outputs[s]->out, bytes, o.add, other)) {
                return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: output %d overlaps the addend of output %d", fn, s, t);
            }
            if (t != s && overlap(outputs[s]->out, bytes, o.out, (size_t)tokens * (size_t)o.rows * esize)) {
                return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: outputs %d and %d overlap", fn, s, t);
            }
        }
    }
    return CIQ_OK;
}

// Room for a product the fallbacks below take apart: `host` grown on the CPU, the device's scratch slot 2 on a GPU.
static ciq_status product_buffer(const char *fn, int device, size_t bytes, std::string &host, void **out) {
    if (device == CIQ_DEVICE_CPU) {
        try {
            host.resize(bytes);
        } catch (const std::exception &) {
            return ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "%s: %zu bytes of product", fn, bytes);
        }
        *out = &host[0];
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_scratch(device, 2, bytes, out);
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: no GPU in this build", fn);
#endif
}

ciq_status ciq_gemm_quantized_outputs(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                                      size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized,
                                      int64_t tokens, const ciq_gemm_output *outputs, int n_outputs,
                                      ciq_out_type out_type) {
    static const char fn[] = "ciq_gemm_quantized_outputs";
    if (plan == nullptr || weight == nullptr || x_quantized == nullptr || outputs == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: NULL pointer", fn);
    }
    const ciq_variant_row *row = nullptr;
    CIQ_TRY(check_run(device, plan, type, weight_nbytes, rows, k, tokens, out_type, &row));
    CIQ_TRY(check_outputs(fn, rows, outputs, n_outputs, out_type));
    const ciq_gemm_output *list[CIQ_GEMM_OUTPUTS_MAX];
    for (int s = 0; s < n_outputs; ++s) list[s] = &outputs[s];
    CIQ_TRY(check_no_overlap(fn, tokens, list, n_outputs, out_type));
    const size_t esize = out_type == CIQ_OUT_F32 ? sizeof(float) : 2;
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU && plan->variant == CIQ_VARIANT_WGMMA) {  // one launch, from the epilogue
        ciq_wgmma_switches sw;
        CIQ_TRY(ciq_switches_wgmma(&sw));  // GGML_CIQ_WGMMA_* (switches.cpp), passed down
        const ciq_status status = ciq_cuda_gemm_wgmma_outputs(device, sw, type, weight, rows, k, x_quantized, tokens,
                                                              outputs, n_outputs, out_type);
        if (status == CIQ_OK) ciq_counters_gemm(plan->variant, type);
        if (status != CIQ_ERR_UNSUPPORTED) return status;  // unsupported: the outputs' rows; copied out below
    }
#endif
    if (n_outputs == 1 && outputs[0].add == nullptr) {
        return ciq_gemm_quantized(device, plan, type, weight, weight_nbytes, rows, k, x_quantized, tokens,
                                  outputs[0].out, out_type);
    }
    // The whole product, then each output's columns copied out and its addend added (ciq_add's values).
    const size_t row_bytes = (size_t)rows * esize, whole_bytes = (size_t)tokens * row_bytes;
    void *whole = nullptr;
    std::string host_whole;
    CIQ_TRY(product_buffer(fn, device, whole_bytes, host_whole, &whole));
    CIQ_TRY(ciq_gemm_quantized(device, plan, type, weight, weight_nbytes, rows, k, x_quantized, tokens, whole, out_type));
    size_t first = 0;  // bytes into a product row
    for (int s = 0; s < n_outputs; ++s) {
        const ciq_gemm_output &o = outputs[s];
        const size_t width = (size_t)o.rows * esize;
        if (device == CIQ_DEVICE_CPU) {
            for (int64_t t = 0; t < tokens; ++t)
                std::memcpy((uint8_t *)o.out + t * width, (const uint8_t *)whole + t * row_bytes + first, width);
#ifdef GGML_CIQ_WITH_CUDA
        } else {
            CIQ_TRY(ciq_cuda_copy_2d(o.out, width, (const uint8_t *)whole + first, row_bytes, width, (size_t)tokens));
#endif
        }
        if (o.add != nullptr) {  // in place (out is a): each value read, then written, by one thread
            const int64_t n = tokens * o.rows;
            CIQ_TRY(ciq_add(device, (const float *)o.out, n, o.add, n, (float *)o.out));
        }
        first += width;
    }
    return CIQ_OK;
}

ciq_status ciq_gemm_quantized_group(int device, const ciq_gemm_weight *weights, int n_weights, int64_t k,
                                    const void *x_quantized, int64_t tokens, ciq_out_type out_type) {
    static const char fn[] = "ciq_gemm_quantized_group";
    if (weights == nullptr || x_quantized == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: NULL pointer", fn);
    if (n_weights < 1 || n_weights > CIQ_GEMM_GROUP_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %d weights (1..%d)", fn, n_weights, CIQ_GEMM_GROUP_MAX);
    }
    const ciq_gemm_output *list[CIQ_GEMM_GROUP_MAX * CIQ_GEMM_OUTPUTS_MAX];
    int n_list = 0;
    for (int i = 0; i < n_weights; ++i) {
        const ciq_gemm_weight &w = weights[i];
        if (w.plan == nullptr || w.weight == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: weight %d: NULL pointer", fn, i);
        if (i > 0 && w.plan->activation_layout != weights[0].plan->activation_layout) {
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: weight %d's plan reads activation layout %d, weight 0's %d: "
                            "one x_quantized cannot be both", fn, i, (int)w.plan->activation_layout,
                            (int)weights[0].plan->activation_layout);
        }
        const ciq_variant_row *row = nullptr;
        CIQ_TRY(check_run(device, w.plan, w.type, w.weight_nbytes, w.rows, k, tokens, out_type, &row));
        CIQ_TRY(check_outputs(fn, w.rows, w.outputs, w.n_outputs, out_type));
        for (int s = 0; s < w.n_outputs; ++s) list[n_list++] = &w.outputs[s];
    }
    CIQ_TRY(check_no_overlap(fn, tokens, list, n_list, out_type));
#ifdef GGML_CIQ_WITH_CUDA
    bool wgmma = n_weights >= 2 && device != CIQ_DEVICE_CPU && n_list <= CIQ_GEMM_OUTPUTS_MAX;
    for (int i = 0; i < n_weights; ++i) wgmma = wgmma && weights[i].plan->variant == CIQ_VARIANT_WGMMA;
    if (wgmma) {
        // the Q4_K weights' rows first (the kernel's order: Q4_K then Q6_K), stable; the outputs follow their weights
        int order[CIQ_GEMM_GROUP_MAX], n_order = 0;
        for (int pass = 0; pass < 2; ++pass)
            for (int i = 0; i < n_weights; ++i)
                if ((weights[i].type == CIQ_TYPE_Q6_K) == (pass == 1)) order[n_order++] = i;
        ciq_type types[CIQ_GEMM_GROUP_MAX];
        const void *blocks[CIQ_GEMM_GROUP_MAX];
        int64_t rows[CIQ_GEMM_GROUP_MAX];
        ciq_gemm_output outs[CIQ_GEMM_OUTPUTS_MAX];
        int n = 0;
        for (int j = 0; j < n_weights; ++j) {
            const ciq_gemm_weight &w = weights[order[j]];
            types[j] = w.type, blocks[j] = w.weight, rows[j] = w.rows;
            for (int s = 0; s < w.n_outputs; ++s) outs[n++] = w.outputs[s];
        }
        ciq_wgmma_switches sw;
        CIQ_TRY(ciq_switches_wgmma(&sw));
        const ciq_status status = ciq_cuda_gemm_wgmma_group(device, sw, n_weights, types, blocks, rows, k, x_quantized,
                                                            tokens, outs, n, out_type);
        if (status == CIQ_OK)
            for (int i = 0; i < n_weights; ++i) ciq_counters_gemm(CIQ_VARIANT_WGMMA, weights[i].type);
        if (status != CIQ_ERR_UNSUPPORTED) return status;  // unsupported: one call each below
    }
#endif
    for (int i = 0; i < n_weights; ++i) {
        const ciq_gemm_weight &w = weights[i];
        CIQ_TRY(ciq_gemm_quantized_outputs(device, w.plan, w.type, w.weight, w.weight_nbytes, w.rows, k, x_quantized,
                                           tokens, w.outputs, w.n_outputs, out_type));
    }
    return CIQ_OK;
}

ciq_status ciq_gemm_quantized_glu(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                                  size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized,
                                  int64_t tokens, ciq_glu_kind kind, float *out) {
    static const char fn[] = "ciq_gemm_quantized_glu";
    if (plan == nullptr || weight == nullptr || x_quantized == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: NULL pointer", fn);
    }
    if (kind != CIQ_GLU_SILU && kind != CIQ_GLU_GELU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: unknown GLU kind %d (SILU 0, GELU 1)", fn, (int)kind);
    }
    const ciq_variant_row *row = nullptr;
    CIQ_TRY(check_run(device, plan, type, weight_nbytes, rows, k, tokens, CIQ_OUT_F32, &row));
    const int64_t block = 2 * CIQ_GLU_INTERLEAVE;
    if (rows % block != 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: a gate/up weight interleaved by %d rows has a multiple of %lld "
                        "rows, got %lld", fn, (int)CIQ_GLU_INTERLEAVE, (long long)block, (long long)rows);
    }
    const int64_t half = rows / 2, n = tokens * half;
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU && plan->variant == CIQ_VARIANT_WGMMA) {  // the GLU from the epilogue
        ciq_wgmma_switches sw;
        CIQ_TRY(ciq_switches_wgmma(&sw));
        const ciq_status status = ciq_cuda_gemm_wgmma_glu(device, sw, type, weight, rows, k, x_quantized, tokens,
                                                          kind == CIQ_GLU_GELU, out);
        if (status == CIQ_OK) ciq_counters_gemm(plan->variant, type);
        return status;
    }
#endif
    // The product, its gate and up halves taken apart (rows of CIQ_GLU_INTERLEAVE values, one each in turn), ciq_glu.
    const size_t product_bytes = (size_t)tokens * (size_t)rows * sizeof(float), half_bytes = product_bytes / 2;
    const size_t piece = CIQ_GLU_INTERLEAVE * sizeof(float), pieces = (size_t)tokens * (size_t)(rows / block);
    void *buffer = nullptr;
    std::string host;
    CIQ_TRY(product_buffer(fn, device, product_bytes + half_bytes, host, &buffer));
    float *product = (float *)buffer, *up = (float *)((uint8_t *)buffer + product_bytes);
    CIQ_TRY(ciq_gemm_quantized(device, plan, type, weight, weight_nbytes, rows, k, x_quantized, tokens, product,
                               CIQ_OUT_F32));
    // gate: pieces 0, 2, 4, .. of the product into out; up: 1, 3, 5, .. (each a row of `piece` bytes, 2 pieces apart)
    if (device == CIQ_DEVICE_CPU) {
        for (size_t i = 0; i < pieces; ++i) {
            std::memcpy((uint8_t *)out + i * piece, (const uint8_t *)product + 2 * i * piece, piece);
            std::memcpy((uint8_t *)up + i * piece, (const uint8_t *)product + (2 * i + 1) * piece, piece);
        }
#ifdef GGML_CIQ_WITH_CUDA
    } else {
        CIQ_TRY(ciq_cuda_copy_2d(out, piece, product, 2 * piece, piece, pieces));
        CIQ_TRY(ciq_cuda_copy_2d(up, piece, (const uint8_t *)product + piece, 2 * piece, piece, pieces));
#endif
    }
    return ciq_glu(device, CIQ_ORDER_HOST, kind, out, up, n, out);
}

ciq_status ciq_gemm_quantized_glu_pair(int device, const ciq_plan *plan, ciq_type type, const void *gate,
                                       const void *up, size_t weight_nbytes, int64_t rows, int64_t k,
                                       const void *x_quantized, int64_t tokens, ciq_glu_kind kind, float *out) {
    static const char fn[] = "ciq_gemm_quantized_glu_pair";
    if (plan == nullptr || gate == nullptr || up == nullptr || x_quantized == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: NULL pointer", fn);
    }
    if (kind != CIQ_GLU_SILU && kind != CIQ_GLU_GELU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: unknown GLU kind %d (SILU 0, GELU 1)", fn, (int)kind);
    }
    const ciq_variant_row *row = nullptr;
    CIQ_TRY(check_run(device, plan, type, weight_nbytes, rows, k, tokens, CIQ_OUT_F32, &row));
    const size_t out_bytes = (size_t)tokens * (size_t)rows * sizeof(float);
    if (overlap(out, out_bytes, gate, weight_nbytes) || overlap(out, out_bytes, up, weight_nbytes) ||
        overlap(out, out_bytes, x_quantized, plan->activation_bytes)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: out overlaps a weight or the activations", fn);
    }
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU && plan->variant == CIQ_VARIANT_WGMMA) {  // the GLU from the epilogue
        ciq_wgmma_switches sw;
        CIQ_TRY(ciq_switches_wgmma(&sw));
        const ciq_status status = ciq_cuda_gemm_wgmma_glu_pair(device, sw, type, gate, up, rows, k, x_quantized,
                                                               tokens, kind == CIQ_GLU_GELU, out);
        if (status == CIQ_OK) {
            ciq_counters_gemm(plan->variant, type);
            ciq_counters_gemm(plan->variant, type);
        }
        if (status != CIQ_ERR_UNSUPPORTED) return status;  // unsupported: the two GEMMs and the GLU below
    }
#endif
    // gate's product into out, up's into scratch, then ciq_glu in place (each value read, then written, by one thread)
    void *buffer = nullptr;
    std::string host;
    CIQ_TRY(product_buffer(fn, device, out_bytes, host, &buffer));
    float *up_product = (float *)buffer;
    CIQ_TRY(ciq_gemm_quantized(device, plan, type, gate, weight_nbytes, rows, k, x_quantized, tokens, out, CIQ_OUT_F32));
    CIQ_TRY(ciq_gemm_quantized(device, plan, type, up, weight_nbytes, rows, k, x_quantized, tokens, up_product,
                               CIQ_OUT_F32));
    return ciq_glu(device, CIQ_ORDER_HOST, kind, out, up_product, tokens * rows, out);
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
