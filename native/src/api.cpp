// The C API: argument checks, device routing, AUTO variant resolution and dispatch counters.
#include "ciq_internal.h"
#include "dequantize.h"

#include <atomic>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <string>

#ifndef GGML_CIQ_VERSION
#define GGML_CIQ_VERSION "0.0.0"
#endif
#ifndef GGML_CIQ_CUDA_ARCHS
#define GGML_CIQ_CUDA_ARCHS ""
#endif

static thread_local char g_last_error[1024] = "";
static std::atomic<uint64_t> g_dispatch[CIQ_VARIANT_COUNT][2];
static std::atomic<uint64_t> g_dispatch_q32[2][3];  // [host, GPU][Q4_0, Q5_0, Q8_0]

ciq_status ciq_fail(ciq_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    std::vsnprintf(g_last_error, sizeof(g_last_error), format, args);
    va_end(args);
    return status;
}

#define CIQ_TRY(expr)                        \
    do {                                     \
        ciq_status status_ = (expr);         \
        if (status_ != CIQ_OK) return status_; \
    } while (0)

static const char *const k_variant_names[CIQ_VARIANT_COUNT] = {"auto", "cpu", "wmma", "wmma-wide", "wmma-shared",
                                                               "wmma-bigtile", "mma", "wgmma"};
static const char *const k_semantics_names[] = {"cpu", "mmq", "f16", "any"};

int ciq_api_version(void) { return GGML_CIQ_API_VERSION; }
const char *ciq_last_error(void) { return g_last_error; }

const char *ciq_variant_name(ciq_variant variant) {
    return (int)variant >= 0 && variant < CIQ_VARIANT_COUNT ? k_variant_names[variant] : "unknown";
}

ciq_semantics ciq_variant_semantics(ciq_variant variant) {
    return variant == CIQ_VARIANT_MMA ? CIQ_SEMANTICS_MMQ : variant == CIQ_VARIANT_WGMMA ? CIQ_SEMANTICS_F16 : CIQ_SEMANTICS_CPU;
}

size_t ciq_weight_row_bytes(ciq_weight_type type, int64_t k) {
    return (size_t)(k / QK_K) * (type == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : Q6_K_BLOCK_BYTES);
}

const char *ciq_build_info(void) {
    static std::string info;
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer),
                  "{\"version\": \"%s\", \"api_version\": %d, \"backends\": [\"cpu\"%s], \"cuda_archs\": \"%s\", "
                  "\"hip\": %s, \"cpu_isa\": \"%s\", \"threads\": %d}",
                  GGML_CIQ_VERSION, GGML_CIQ_API_VERSION,
#ifdef GGML_CIQ_WITH_CUDA
                  ", \"cuda\"",
#else
                  "",
#endif
                  GGML_CIQ_CUDA_ARCHS,
#ifdef GGML_CIQ_HIP
                  "true",
#else
                  "false",
#endif
                  ciq_cpu_features(), ciq_cpu_threads());
    info = buffer;
    return info.c_str();
}

// ---------------------------------------------------------------------------------------------
// Devices and memory

static ciq_status check_device(int device) {
    if (device == CIQ_DEVICE_CPU) return CIQ_OK;
#ifdef GGML_CIQ_WITH_CUDA
    int count = 0;
    CIQ_TRY(ciq_cuda_device_count(&count));
    if (device < 0 || device >= count) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "GPU device %d requested but %d CUDA device(s) found", device, count);
    }
    return CIQ_OK;
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "GPU device %d requested but libggml_ciq was built without CUDA", device);
#endif
}

ciq_status ciq_device_count(int *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_device_count: count is NULL");
    *count = 0;
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_device_count(count);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_device_name(int device, char *buffer, size_t buffer_size) {
    if (buffer == nullptr || buffer_size == 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_device_name: empty buffer");
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        std::snprintf(buffer, buffer_size, "CPU (%s, %d threads)", ciq_cpu_features(), ciq_cpu_threads());
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_device_name(device, buffer, buffer_size);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_variant_available(int device, ciq_variant variant, int *available) {
    if (available == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_variant_available: available is NULL");
    if ((int)variant < 0 || variant >= CIQ_VARIANT_COUNT) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    }
    *available = 0;
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        *available = variant == CIQ_VARIANT_AUTO || variant == CIQ_VARIANT_CPU;
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    int major = 0, minor = 0;
    CIQ_TRY(ciq_cuda_compute_capability(device, &major, &minor));
#ifdef GGML_CIQ_HIP
    // AMD: major is the gfx generation (11: RDNA3, 12: RDNA4). mma is CUDA-only; wmma-wide and wmma-bigtile need
    // more than the 64 KB of LDS an RDNA workgroup gets.
    *available = (variant == CIQ_VARIANT_AUTO || variant == CIQ_VARIANT_WMMA || variant == CIQ_VARIANT_WMMA_SHARED) &&
                 (major == 11 || major == 12);
    (void)minor;
#else
    if (variant == CIQ_VARIANT_WGMMA) {  // sm_90a machine code runs on compute capability 9.0 only
        *available = major == 9 && minor == 0 && std::strstr(GGML_CIQ_CUDA_ARCHS, "90a") != nullptr;
    } else {
        *available = variant != CIQ_VARIANT_CPU && major >= 8;  // kernels are built for sm_80 and newer
    }
#endif
#endif
    return CIQ_OK;
}

ciq_status ciq_malloc(int device, size_t nbytes, void **ptr) {
    if (ptr == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_malloc: ptr is NULL");
    *ptr = nullptr;
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        *ptr = std::malloc(nbytes ? nbytes : 1);
        return *ptr ? CIQ_OK : ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "ciq_malloc: %zu bytes of host memory", nbytes);
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_malloc(device, nbytes, ptr);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_free(int device, void *ptr) {
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        std::free(ptr);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_free(device, ptr);
#else
    return CIQ_OK;
#endif
}

static ciq_status copy(int device, void *dst, const void *src, size_t nbytes, bool to_device) {
    if ((dst == nullptr || src == nullptr) && nbytes) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "memcpy: NULL pointer");
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        if (nbytes) std::memcpy(dst, src, nbytes);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_memcpy(device, dst, src, nbytes, to_device);
#else
    (void)to_device;
    return CIQ_OK;
#endif
}

ciq_status ciq_memcpy_to_device(int device, void *dst, const void *host_src, size_t nbytes) {
    return copy(device, dst, host_src, nbytes, true);
}

ciq_status ciq_memcpy_to_host(int device, void *host_dst, const void *src, size_t nbytes) {
    return copy(device, host_dst, src, nbytes, false);
}

ciq_status ciq_memset(int device, void *dst, int value, size_t nbytes) {
    if (dst == nullptr && nbytes) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_memset: dst is NULL");
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        if (nbytes) std::memset(dst, value, nbytes);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_memset(device, dst, value, nbytes);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_synchronize(int device) {
    CIQ_TRY(check_device(device));
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) return ciq_cuda_synchronize(device);
#endif
    return CIQ_OK;
}

ciq_status ciq_set_num_threads(int threads) {
    ciq_cpu_set_threads(threads);
    return CIQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Quantization and GEMM

size_t ciq_q8_K_size(int64_t tokens, int64_t k) {
    return tokens > 0 && k > 0 ? (size_t)(tokens * (k / QK_K)) * Q8_K_BLOCK_BYTES : 0;
}

size_t ciq_q8_1_mmq_size(int64_t tokens, int64_t k) {
    return tokens > 0 && k > 0 ? (size_t)(tokens * (k / Q8_1_MMQ_VALUES)) * Q8_1_MMQ_BLOCK_BYTES : 0;
}

size_t ciq_f16_size(int64_t tokens, int64_t k) {
    return tokens > 0 && k > 0 ? ciq_f16_scale_offset(tokens, k) + (size_t)tokens * sizeof(float) : 0;
}

static ciq_status check_count(const char *what, const char *name, int64_t value);

static ciq_status check_shape(const char *what, int64_t tokens, int64_t k) {
    if (tokens < 1) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: tokens must be >= 1, got %lld", what, (long long)tokens);
    if (k < QK_K || k % QK_K != 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: K must be a positive multiple of 256, got %lld", what, (long long)k);
    }
    return CIQ_OK;
}

static ciq_status check_type(const char *what, ciq_weight_type type) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q6_K) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: weight type %d is not Q4_K (12) or Q6_K (14)", what, (int)type);
    }
    return CIQ_OK;
}

ciq_status ciq_quantize_q8_K(int device, const float *x, void *out, int64_t tokens, int64_t k) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_quantize_q8_K: NULL pointer");
    CIQ_TRY(check_shape("ciq_quantize_q8_K", tokens, k));
    CIQ_TRY(check_device(device));
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) {
        CIQ_TRY(ciq_cuda_set_device(device));
        return ciq_cuda_quantize_q8_K(x, out, tokens, k);
    }
#endif
    return ciq_cpu_quantize_q8_K(x, out, tokens, k);
}

ciq_status ciq_quantize_q8_1_mmq(int device, ciq_weight_type layout_for, const float *x, void *out, int64_t tokens,
                                 int64_t k) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_quantize_q8_1_mmq: NULL pointer");
    CIQ_TRY(check_type("ciq_quantize_q8_1_mmq", layout_for));
    CIQ_TRY(check_count("ciq_quantize_q8_1_mmq", "tokens", tokens));
    if (k < Q8_1_MMQ_VALUES || k % Q8_1_MMQ_VALUES) {  // the layout's unit is 128 values (ciq_gemm_q32 uses it too)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_quantize_q8_1_mmq: K must be a positive multiple of 128, got %lld",
                        (long long)k);
    }
    CIQ_TRY(check_device(device));
    const bool ds4 = layout_for == CIQ_TYPE_Q4_K;
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) {
        CIQ_TRY(ciq_cuda_set_device(device));
        return ciq_cuda_quantize_q8_1_mmq(ds4, x, out, tokens, k);
    }
#endif
    return ciq_cpu_quantize_q8_1_mmq(ds4, x, out, tokens, k);
}

ciq_status ciq_convert_f16(int device, const float *x, void *out, int64_t tokens, int64_t k) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_convert_f16: NULL pointer");
    CIQ_TRY(check_shape("ciq_convert_f16", tokens, k));
    CIQ_TRY(check_device(device));
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) {
        CIQ_TRY(ciq_cuda_set_device(device));
        return ciq_cuda_convert_f16(x, out, tokens, k);
    }
#endif
    return ciq_cpu_convert_f16(x, out, tokens, k);
}

// AUTO on a GPU: GGML_CIQ_VARIANT if set, else the first entry of this table (measured on the H200, see
// bench/results/) that matches the semantics and token count and is available on the device.
struct AutoChoice {
    ciq_semantics semantics;
    int64_t max_tokens;  // the entry applies when tokens <= max_tokens
    ciq_variant variant;
};
static const AutoChoice k_auto_table[] = {
#ifdef GGML_CIQ_HIP
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_WMMA_SHARED},  // AMD: no mma; wide and bigtile exceed 64 KB of LDS
    {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_WMMA_SHARED},
#else
    {CIQ_SEMANTICS_ANY, 8, CIQ_VARIANT_MMA},  // decode-size batches: mma's 8-token tiles waste less
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_WGMMA},  // Hopper
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_MMA},
    {CIQ_SEMANTICS_F16, INT64_MAX, CIQ_VARIANT_WGMMA},
    {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_MMA},
    {CIQ_SEMANTICS_CPU, 128, CIQ_VARIANT_WMMA_SHARED},  // seed6, 128 tokens: shared fastest on 4 of 6 shapes
    {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_WMMA_BIGTILE},  // llama3-8b, 512 tokens: bigtile on 9 of 10
#endif
};

static ciq_status variant_from_name(const char *name, ciq_variant *variant) {
    for (int v = 1; v < CIQ_VARIANT_COUNT; ++v) {
        if (std::strcmp(name, k_variant_names[v]) == 0) {
            *variant = (ciq_variant)v;
            return CIQ_OK;
        }
    }
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "GGML_CIQ_VARIANT=%s is not a kernel variant", name);
}

ciq_status ciq_resolve_variant(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type,
                               int64_t rows, int64_t k, int64_t tokens, ciq_variant *resolved) {
    if (resolved == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_resolve_variant: resolved is NULL");
    CIQ_TRY(check_type("ciq_resolve_variant", type));
    CIQ_TRY(check_shape("ciq_resolve_variant", tokens, k));
    if (rows < 1) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "rows must be >= 1, got %lld", (long long)rows);
    if ((int)variant < 0 || variant >= CIQ_VARIANT_COUNT) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    }
    if ((int)semantics < CIQ_SEMANTICS_CPU || semantics > CIQ_SEMANTICS_ANY) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown semantics %d", (int)semantics);
    }
    CIQ_TRY(check_device(device));
    *resolved = variant;
    if (variant == CIQ_VARIANT_AUTO) {
        const char *env = std::getenv("GGML_CIQ_VARIANT");
        if (device == CIQ_DEVICE_CPU) {
            *resolved = CIQ_VARIANT_CPU;
        } else if (env != nullptr && *env != '\0') {
            CIQ_TRY(variant_from_name(env, resolved));
        } else {
            for (const AutoChoice &choice : k_auto_table) {
                int ok = 0;
                if (choice.semantics != semantics || tokens > choice.max_tokens) continue;
                CIQ_TRY(ciq_variant_available(device, choice.variant, &ok));
                if (ok) {
                    *resolved = choice.variant;
                    break;
                }
            }
            if (*resolved == CIQ_VARIANT_AUTO) {
                return ciq_fail(CIQ_ERR_UNSUPPORTED, "no GPU kernel of this build implements %s semantics on this GPU",
                                k_semantics_names[semantics]);
            }
        }
    }
    int available = 0;
    CIQ_TRY(ciq_variant_available(device, *resolved, &available));
    if (!available) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s is not available on %s", ciq_variant_name(*resolved),
                        device == CIQ_DEVICE_CPU ? "the CPU" : "this GPU");
    }
    const bool cpu_ok = *resolved == CIQ_VARIANT_CPU && semantics != CIQ_SEMANTICS_F16;
    if (semantics != CIQ_SEMANTICS_ANY && !cpu_ok && ciq_variant_semantics(*resolved) != semantics) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "kernel variant %s implements %s semantics, not %s",
                        ciq_variant_name(*resolved), *resolved == CIQ_VARIANT_CPU ? "cpu or mmq"
                        : k_semantics_names[ciq_variant_semantics(*resolved)], k_semantics_names[semantics]);
    }
    return CIQ_OK;
}

ciq_status ciq_gemm_quantized(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type,
                              const void *weight, size_t weight_nbytes, int64_t rows, int64_t k,
                              const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type) {
    if (weight == nullptr || x_quantized == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: NULL pointer");
    }
    CIQ_TRY(check_type("ciq_gemm", type));
    CIQ_TRY(check_shape("ciq_gemm", tokens, k));
    if (semantics == CIQ_SEMANTICS_ANY) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_quantized: name the semantics of the activation layout");
    }
    if (rows < 1) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: rows must be >= 1, got %lld", (long long)rows);
    if (weight_nbytes != (size_t)rows * ciq_weight_row_bytes(type, k)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: %s [%lld x %lld] needs %zu weight bytes, got %zu",
                        type == CIQ_TYPE_Q4_K ? "Q4_K" : "Q6_K", (long long)rows, (long long)k,
                        (size_t)rows * ciq_weight_row_bytes(type, k), weight_nbytes);
    }
    if (out_type != CIQ_OUT_F32 && out_type != CIQ_OUT_BF16) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: unknown output type %d", (int)out_type);
    }
    ciq_variant resolved;
    CIQ_TRY(ciq_resolve_variant(device, variant, semantics, type, rows, k, tokens, &resolved));
    ciq_status status;
    if (resolved == CIQ_VARIANT_CPU) {
        status = ciq_cpu_gemm(semantics, type, weight, rows, k, x_quantized, tokens, out, out_type);
    } else {
#ifdef GGML_CIQ_WITH_CUDA
        status = ciq_cuda_set_device(device);
        if (status == CIQ_OK) {
            status = resolved == CIQ_VARIANT_MMA
                         ? ciq_cuda_gemm_mma(type, weight, rows, k, x_quantized, tokens, out, out_type)
                     : resolved == CIQ_VARIANT_WGMMA
                         ? ciq_cuda_gemm_wgmma(device, type, weight, rows, k, x_quantized, tokens, out, out_type)
                         : ciq_cuda_gemm_wmma(resolved, type, weight, rows, k, x_quantized, tokens, out, out_type);
        }
#else
        status = ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s is not built", ciq_variant_name(resolved));
#endif
    }
    if (status == CIQ_OK) g_dispatch[resolved][type == CIQ_TYPE_Q6_K].fetch_add(1, std::memory_order_relaxed);
    return status;
}

ciq_status ciq_gemm(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type, const void *weight,
                    size_t weight_nbytes, int64_t rows, int64_t k, const float *x, int64_t tokens, void *out,
                    ciq_out_type out_type) {
    if (x == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: x is NULL");
    CIQ_TRY(check_type("ciq_gemm", type));
    CIQ_TRY(check_shape("ciq_gemm", tokens, k));
    ciq_variant resolved;
    CIQ_TRY(ciq_resolve_variant(device, variant, semantics, type, rows, k, tokens, &resolved));
    if (semantics == CIQ_SEMANTICS_ANY) {
        semantics = resolved == CIQ_VARIANT_CPU ? CIQ_SEMANTICS_CPU : ciq_variant_semantics(resolved);
    }
    const size_t nbytes = semantics == CIQ_SEMANTICS_CPU   ? ciq_q8_K_size(tokens, k)
                          : semantics == CIQ_SEMANTICS_MMQ ? ciq_q8_1_mmq_size(tokens, k)
                                                           : ciq_f16_size(tokens, k);
    void *scratch = nullptr;
    std::string host_scratch;
    if (device == CIQ_DEVICE_CPU) {
        host_scratch.resize(nbytes);
        scratch = &host_scratch[0];
#ifdef GGML_CIQ_WITH_CUDA
    } else {
        CIQ_TRY(ciq_cuda_scratch(device, 0, nbytes, &scratch));
#endif
    }
    if (semantics == CIQ_SEMANTICS_CPU) {
        CIQ_TRY(ciq_quantize_q8_K(device, x, scratch, tokens, k));
    } else if (semantics == CIQ_SEMANTICS_MMQ) {
        CIQ_TRY(ciq_quantize_q8_1_mmq(device, type, x, scratch, tokens, k));
    } else {
        CIQ_TRY(ciq_convert_f16(device, x, scratch, tokens, k));
    }
    return ciq_gemm_quantized(device, resolved, semantics, type, weight, weight_nbytes, rows, k, scratch, tokens, out,
                              out_type);
}

ciq_status ciq_dense_gemm_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x, int64_t tokens,
                               void *out, ciq_out_type out_type) {
    if (weight == nullptr || x == nullptr || out == nullptr) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dense_gemm_bf16: NULL pointer");
    }
    if (rows < 1 || k < 1 || tokens < 1 || rows > INT32_MAX || k > INT32_MAX || tokens > INT32_MAX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dense_gemm_bf16: bad shape %lld x %lld x %lld", (long long)rows,
                        (long long)k, (long long)tokens);
    }
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_dense_gemm_bf16 runs on a GPU only");
#ifdef GGML_CIQ_WITH_CUDA
    CIQ_TRY(ciq_cuda_set_device(device));
    return ciq_cuda_dense_gemm_bf16(device, weight, rows, k, x, tokens, out, out_type);
#else
    (void)out_type;
    return CIQ_ERR_UNSUPPORTED;
#endif
}

struct Timer {
    int device;
    void *start, *stop;  // CUDA events, or nullptr on the host
    std::chrono::steady_clock::time_point host_start, host_stop;
    bool marked;
};

ciq_status ciq_timer_start(int device, void **timer) {
    if (timer == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_start: timer is NULL");
    CIQ_TRY(check_device(device));
    Timer *t = new Timer{device, nullptr, nullptr, std::chrono::steady_clock::now(), {}, false};
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) {
        ciq_status status = ciq_cuda_event_record(device, &t->start);
        if (status != CIQ_OK) {
            delete t;
            return status;
        }
    }
#endif
    *timer = t;
    return CIQ_OK;
}

ciq_status ciq_timer_mark(void *timer) {
    if (timer == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_mark: timer is NULL");
    Timer *t = (Timer *)timer;
    if (t->marked) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_mark: the timer is marked already");
    t->host_stop = std::chrono::steady_clock::now();
#ifdef GGML_CIQ_WITH_CUDA
    if (t->start != nullptr) CIQ_TRY(ciq_cuda_event_record(t->device, &t->stop));
#endif
    t->marked = true;
    return CIQ_OK;
}

ciq_status ciq_timer_stop(void *timer, float *milliseconds) {
    if (timer == nullptr || milliseconds == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_stop: NULL");
    Timer *t = (Timer *)timer;
    ciq_status status = t->marked ? CIQ_OK : ciq_timer_mark(t);
    if (status == CIQ_OK && t->start == nullptr)
        *milliseconds = std::chrono::duration<float, std::milli>(t->host_stop - t->host_start).count();
#ifdef GGML_CIQ_WITH_CUDA
    if (t->start != nullptr) {
        if (status == CIQ_OK) status = ciq_cuda_event_elapsed(t->start, t->stop, milliseconds);  // frees both
        else ciq_cuda_event_elapsed(t->start, nullptr, milliseconds);  // frees start
    }
#endif
    delete t;
    return status;
}

ciq_status ciq_dispatch_count(ciq_variant variant, ciq_weight_type type, uint64_t *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dispatch_count: count is NULL");
    if ((int)variant < 0 || variant >= CIQ_VARIANT_COUNT) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    }
    CIQ_TRY(check_type("ciq_dispatch_count", type));
    *count = g_dispatch[variant][type == CIQ_TYPE_Q6_K].load();
    return CIQ_OK;
}

void ciq_dispatch_reset(void) {
    for (auto &per_variant : g_dispatch) {
        for (auto &counter : per_variant) counter.store(0);
    }
    for (auto &per_device : g_dispatch_q32) {
        for (auto &counter : per_device) counter.store(0);
    }
}

// ---------------------------------------------------------------------------------------------
// Transformer ops: checks here, the arithmetic in cpu/ops.cpp and cuda/ops.cu, cuda/attention.cu.

#ifdef GGML_CIQ_WITH_CUDA
#define CIQ_ROUTE(device, cpu_call, cuda_call)        \
    do {                                              \
        if ((device) != CIQ_DEVICE_CPU) {             \
            CIQ_TRY(ciq_cuda_set_device(device));     \
            return cuda_call;                         \
        }                                             \
        return cpu_call;                              \
    } while (0)
#else
#define CIQ_ROUTE(device, cpu_call, cuda_call) return cpu_call
#endif

static ciq_status check_count(const char *what, const char *name, int64_t value) {
    if (value < 1) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: %s must be >= 1, got %lld", what, name, (long long)value);
    return CIQ_OK;
}

ciq_status ciq_rms_norm(int device, const float *x, const float *weight, float eps, int64_t n, int64_t d, float *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rms_norm: NULL pointer");
    CIQ_TRY(check_count("ciq_rms_norm", "n", n));
    CIQ_TRY(check_count("ciq_rms_norm", "d", d));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_rms_norm(x, weight, eps, n, d, out), ciq_cuda_rms_norm(x, weight, eps, n, d, out));
}

ciq_status ciq_rope(int device, ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens,
                    int64_t heads, int64_t head_dim, float base, float *out) {
    if (x == nullptr || positions == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: NULL pointer");
    if (mode != CIQ_ROPE_NORM && mode != CIQ_ROPE_NEOX) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: unknown mode %d (NORM 0, NEOX 2)", (int)mode);
    }
    CIQ_TRY(check_count("ciq_rope", "tokens", tokens));
    CIQ_TRY(check_count("ciq_rope", "heads", heads));
    if (head_dim < 2 || head_dim % 2) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: head_dim must be even and >= 2, got %lld", (long long)head_dim);
    }
    if (!(base > 0.0f)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_rope: base must be > 0, got %g", (double)base);
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_rope(mode, x, positions, tokens, heads, head_dim, base, out),
              ciq_cuda_rope(mode, x, positions, tokens, heads, head_dim, base, out));
}

ciq_status ciq_attention_resolve(int device, ciq_attention_kernel kernel, int64_t head_dim,
                                 ciq_attention_kernel *resolved) {
    if (resolved == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_resolve: resolved is NULL");
    if ((int)kernel < CIQ_ATTENTION_AUTO || kernel > CIQ_ATTENTION_GGML) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown attention kernel %d", (int)kernel);
    }
    CIQ_TRY(check_count("ciq_attention", "head_dim", head_dim));
    CIQ_TRY(check_device(device));
    static const char *const names[] = {"auto", "cpu", "simt", "mma", "ggml"};
    if (device == CIQ_DEVICE_CPU) {
        if (kernel == CIQ_ATTENTION_SIMT || kernel == CIQ_ATTENTION_MMA) {
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
    const bool mma_ok = false;  // mma.sync is CUDA-only
#else
    const bool mma_ok = major >= 8 && ciq_cuda_attention_supports(device, CIQ_ATTENTION_MMA, head_dim);
#endif
    *resolved = kernel == CIQ_ATTENTION_AUTO ? (mma_ok ? CIQ_ATTENTION_MMA : CIQ_ATTENTION_SIMT) : kernel;
    const bool ok = *resolved == CIQ_ATTENTION_MMA ? mma_ok : ciq_cuda_attention_supports(device, CIQ_ATTENTION_SIMT, head_dim);
    if (!ok) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "attention kernel %s does not run head_dim %lld on this GPU",
                        names[*resolved], (long long)head_dim);
    }
    (void)minor;
    return CIQ_OK;
#else
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
    CIQ_TRY(check_count("ciq_attention", "tokens", tokens));
    CIQ_TRY(check_count("ciq_attention", "heads_kv", heads_kv));
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
    if (resolved == CIQ_ATTENTION_MMA && (((uintptr_t)k_cache | (uintptr_t)v_cache) & 15)) {  // uint4 K/V loads
        if (kernel != CIQ_ATTENTION_AUTO || ciq_attention_resolve(device, CIQ_ATTENTION_SIMT, head_dim, &resolved) != CIQ_OK)
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention: the mma kernel needs 16-byte-aligned K/V caches");
    }
    if (resolved == CIQ_ATTENTION_GGML) {
        return ciq_cpu_attention_ggml(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window, out);
    }
    CIQ_ROUTE(device, ciq_cpu_attention(q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale, window, out),
              ciq_cuda_attention(resolved, q, k_cache, v_cache, tokens, heads, heads_kv, head_dim, n_past, scale,
                                 window, out));
}

ciq_status ciq_kv_store(int device, uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    if (cache == nullptr || x == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_kv_store: NULL pointer");
    if (start < 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_kv_store: start must be >= 0, got %lld", (long long)start);
    CIQ_TRY(check_count("ciq_kv_store", "tokens", tokens));
    CIQ_TRY(check_count("ciq_kv_store", "row_values", row_values));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_kv_store(cache, start, x, tokens, row_values),
              ciq_cuda_kv_store(cache, start, x, tokens, row_values));
}

ciq_status ciq_glu(int device, ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out) {
    if (gate == nullptr || up == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu: NULL pointer");
    if (kind != CIQ_GLU_SILU && kind != CIQ_GLU_GELU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_glu: unknown kind %d (SILU 0, GELU 1)", (int)kind);
    }
    CIQ_TRY(check_count("ciq_glu", "n", n));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_glu(kind, gate, up, n, out), ciq_cuda_glu(kind, gate, up, n, out));
}

ciq_status ciq_add(int device, const float *a, int64_t n, const float *b, int64_t b_n, float *out) {
    if (a == nullptr || b == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_add: NULL pointer");
    CIQ_TRY(check_count("ciq_add", "n", n));
    CIQ_TRY(check_count("ciq_add", "b_n", b_n));
    if (n % b_n) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_add: b_n %lld does not divide n %lld", (long long)b_n, (long long)n);
    }
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_add(a, n, b, b_n, out), ciq_cuda_add(a, n, b, b_n, out));
}

ciq_status ciq_scale(int device, const float *x, float s, int64_t n, float *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_scale: NULL pointer");
    CIQ_TRY(check_count("ciq_scale", "n", n));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_scale(x, s, n, out), ciq_cuda_scale(x, s, n, out));
}

static ciq_status check_table(const char *what, int type, int64_t rows, int64_t k) {
    const int values = ciq_block_values(type);
    if (values == 0) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: ggml type %d is not one of F32, F16, BF16, Q4_0, Q5_0, Q8_0, Q4_K, "
                        "Q5_K, Q6_K", what, type);
    }
    CIQ_TRY(check_count(what, "rows", rows));
    if (k < 1 || k % values) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: k must be a positive multiple of %d for type %d, got %lld", what,
                        values, type, (long long)k);
    }
    return CIQ_OK;
}

ciq_status ciq_get_rows(int device, int ggml_type, const void *table, int64_t table_rows, int64_t k,
                        const int32_t *ids, int64_t n, float *out) {
    if (table == nullptr || ids == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_get_rows: NULL pointer");
    CIQ_TRY(check_table("ciq_get_rows", ggml_type, table_rows, k));
    CIQ_TRY(check_count("ciq_get_rows", "n", n));
    CIQ_TRY(check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        for (int64_t i = 0; i < n; ++i) {
            if (ids[i] < 0 || ids[i] >= table_rows) {
                return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_get_rows: id %d at %lld outside [0, %lld)", (int)ids[i],
                                (long long)i, (long long)table_rows);
            }
        }
    }
    CIQ_ROUTE(device, ciq_cpu_get_rows(ggml_type, table, k, ids, n, out),
              ciq_cuda_get_rows(ggml_type, table, table_rows, k, ids, n, out));
}

ciq_status ciq_dequantize_bf16(int device, int ggml_type, const void *data, int64_t rows, int64_t k, void *out) {
    if (data == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dequantize_bf16: NULL pointer");
    CIQ_TRY(check_table("ciq_dequantize_bf16", ggml_type, rows, k));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_dequantize_bf16(ggml_type, data, rows, k, out),
              ciq_cuda_dequantize_bf16(ggml_type, data, rows, k, out));
}

ciq_status ciq_convert_bf16(int device, const float *x, int64_t n, void *out) {
    if (x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_convert_bf16: NULL pointer");
    CIQ_TRY(check_count("ciq_convert_bf16", "n", n));
    CIQ_TRY(check_device(device));
    CIQ_ROUTE(device, ciq_cpu_convert_bf16(x, n, out), ciq_cuda_convert_bf16(x, n, out));
}

static int q32_index(int ggml_type) { return ggml_type == 2 ? 0 : ggml_type == 6 ? 1 : ggml_type == 8 ? 2 : -1; }

ciq_status ciq_gemm_q32(int device, ciq_semantics semantics, int ggml_type, const void *weight, int64_t rows,
                        int64_t k, const float *x, int64_t tokens, float *out) {
    if (weight == nullptr || x == nullptr || out == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_q32: NULL pointer");
    if (q32_index(ggml_type) < 0) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_gemm_q32: ggml type %d is not Q4_0 (2), Q5_0 (6) or Q8_0 (8)", ggml_type);
    }
    if (semantics != CIQ_SEMANTICS_MMQ && semantics != CIQ_SEMANTICS_CPU) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_q32: semantics must be cpu or mmq, got %d", (int)semantics);
    }
    CIQ_TRY(check_count("ciq_gemm_q32", "rows", rows));
    CIQ_TRY(check_count("ciq_gemm_q32", "tokens", tokens));
    const int64_t unit = semantics == CIQ_SEMANTICS_CPU ? 32 : Q8_1_MMQ_VALUES;
    if (k < unit || k % unit) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_q32: K must be a positive multiple of %lld, got %lld",
                        (long long)unit, (long long)k);
    }
    CIQ_TRY(check_device(device));
    if (semantics == CIQ_SEMANTICS_CPU && device != CIQ_DEVICE_CPU) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_gemm_q32: cpu semantics run on the host only");
    }
    const bool ds4 = ggml_type == 2;  // MMQ's layout for Q4_0; D4 for Q5_0 and Q8_0
    const size_t nbytes = ciq_q8_1_mmq_size(tokens, k);
    ciq_status status;
    if (semantics == CIQ_SEMANTICS_CPU) {
        status = ciq_cpu_gemm_q32_q8_0(ggml_type, weight, rows, k, x, tokens, out);
    } else if (device == CIQ_DEVICE_CPU) {
        std::string scratch(nbytes, '\0');
        CIQ_TRY(ciq_cpu_quantize_q8_1_mmq(ds4, x, &scratch[0], tokens, k));
        status = ciq_cpu_gemm_q32(ggml_type, weight, rows, k, scratch.data(), tokens, out);
    } else {
#ifdef GGML_CIQ_WITH_CUDA
        void *scratch = nullptr;
        CIQ_TRY(ciq_cuda_set_device(device));
        CIQ_TRY(ciq_cuda_scratch(device, 0, nbytes, &scratch));
        CIQ_TRY(ciq_cuda_quantize_q8_1_mmq(ds4, x, scratch, tokens, k));
        status = ciq_cuda_gemm_q32(ggml_type, weight, rows, k, scratch, tokens, out);
#else
        status = CIQ_ERR_UNSUPPORTED;
#endif
    }
    if (status == CIQ_OK) g_dispatch_q32[device != CIQ_DEVICE_CPU][q32_index(ggml_type)].fetch_add(1, std::memory_order_relaxed);
    return status;
}

ciq_status ciq_q32_dispatch_count(int device, int ggml_type, uint64_t *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_q32_dispatch_count: count is NULL");
    if (q32_index(ggml_type) < 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_q32_dispatch_count: ggml type %d is not Q4_0, Q5_0 or Q8_0", ggml_type);
    }
    *count = g_dispatch_q32[device != CIQ_DEVICE_CPU][q32_index(ggml_type)].load();
    return CIQ_OK;
}
