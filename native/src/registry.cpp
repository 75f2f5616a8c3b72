// The kernel variant registry (registry.h): every GEMM variant's facts in one table, the tuning data per
// architecture beside it, and the one resolution of a request into a plan (ciq_gemm_plan).
//
//   k_variants       : name, semantics, weight types, token range, architecture predicate, launcher per variant.
//   k_layouts        : which activation layout a semantics uses for a weight type (ciq_activations_size: its bytes).
//   k_type_semantics : where a variant runs a weight type in fewer semantics than its row says.
//   k_auto_*         : AUTO's order per backend (the first entry that fits wins), measured on the H200.
//   k_offload        : from how many tokens and weight values a variant beats llama.cpp's own mul_mat (the ggml
//                      plugin's choice).
#include "registry.h"
#include "switches.h"

#include <cstdlib>
#include <cstring>

#ifndef GGML_CIQ_CUDA_ARCHS
#define GGML_CIQ_CUDA_ARCHS ""
#endif

// ---------------------------------------------------------------------------------------------
// Architecture predicates

static bool on_host(const ciq_device_facts &d) { return d.host; }
static bool on_gpu_sm80(const ciq_device_facts &d) { return !d.host && !d.hip && d.major >= 8; }  // built for sm_80+
static bool on_gpu_rdna(const ciq_device_facts &d) { return !d.host && d.hip && (d.major == 11 || d.major == 12); }
// WMMA 16x16 and the 32-block kernel: CUDA sm_80+ and RDNA3/RDNA4.
static bool on_gpu_wmma(const ciq_device_facts &d) { return on_gpu_sm80(d) || on_gpu_rdna(d); }
// sm_90a machine code runs on compute capability 9.0 only.
static bool on_hopper_90a(const ciq_device_facts &d) {
    return !d.host && !d.hip && d.major == 9 && d.minor == 0 && d.built_90a;
}
static bool on_host_or_gpu_wmma(const ciq_device_facts &d) { return d.host || on_gpu_wmma(d); }

// ---------------------------------------------------------------------------------------------
// Launchers: the backend entry point of each variant.

static ciq_status launch_cpu(int, ciq_variant, ciq_semantics semantics, ciq_type type, const void *weight,
                             int64_t rows, int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    return ciq_cpu_gemm(semantics, type, weight, rows, k, x, tokens, out, out_type);
}

static ciq_status launch_q32(int device, ciq_variant, ciq_semantics semantics, ciq_type type, const void *weight,
                             int64_t rows, int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    if (out_type != CIQ_OUT_F32) return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant q32 writes float32 output only");
    if (device == CIQ_DEVICE_CPU) {
        if (semantics != CIQ_SEMANTICS_CPU) return ciq_cpu_gemm_q32_mmq(type, weight, rows, k, x, tokens, (float *)out);
        return type == CIQ_TYPE_Q4_1 || type == CIQ_TYPE_Q5_1
                   ? ciq_cpu_gemm_q32_q8_1(type, weight, rows, k, x, tokens, (float *)out)
                   : ciq_cpu_gemm_q32_q8_0(type, weight, rows, k, x, tokens, (float *)out);
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_gemm_q32(type, weight, rows, k, x, tokens, (float *)out);
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant q32 on a GPU is not built");
#endif
}

static ciq_status launch_mmvq(int device, ciq_variant, ciq_semantics, ciq_type type, const void *weight, int64_t rows,
                              int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    if (out_type != CIQ_OUT_F32) return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant mmvq writes float32 output only");
    if (device == CIQ_DEVICE_CPU) return ciq_cpu_gemm_mmvq(type, weight, rows, k, x, tokens, (float *)out);
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_gemm_mmvq(type, weight, rows, k, x, tokens, (float *)out);
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant mmvq on a GPU is not built");
#endif
}

#ifdef GGML_CIQ_WITH_CUDA
static ciq_status launch_wmma(int, ciq_variant variant, ciq_semantics, ciq_type type, const void *weight, int64_t rows,
                              int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    return ciq_cuda_gemm_wmma(variant, type, weight, rows, k, x, tokens, out, out_type);
}
static ciq_status launch_mma(int, ciq_variant, ciq_semantics, ciq_type type, const void *weight, int64_t rows,
                             int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    return ciq_cuda_gemm_mma(type, weight, rows, k, x, tokens, out, out_type);
}
static ciq_status launch_wgmma(int device, ciq_variant, ciq_semantics, ciq_type type, const void *weight, int64_t rows,
                               int64_t k, const void *x, int64_t tokens, void *out, ciq_out_type out_type) {
    ciq_wgmma_switches sw;
    CIQ_TRY(ciq_switches_wgmma(&sw));  // GGML_CIQ_WGMMA_* (switches.cpp), passed down to the planner
    return ciq_cuda_gemm_wgmma(device, sw, type, weight, rows, k, x, tokens, out, out_type);
}
#else
#define launch_wmma nullptr
#define launch_mma nullptr
#define launch_wgmma nullptr
#endif

// ---------------------------------------------------------------------------------------------
// The variants

#define SEM(s) (1u << CIQ_SEMANTICS_##s)
#define K_QUANTS 2, {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K}
#define HOST_K_QUANTS 3, {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K, CIQ_TYPE_Q5_K}  // the cpu variant's, and mma's (GPU)
#define BLOCK32 5, {CIQ_TYPE_Q4_0, CIQ_TYPE_Q5_0, CIQ_TYPE_Q8_0, CIQ_TYPE_Q4_1, CIQ_TYPE_Q5_1}
#define ANY_TOKENS 1, INT64_MAX, 1
#define ANY_TOKENS_K64 1, INT64_MAX, F16_K_UNIT
// Every type some variant multiplies (AUTO's list, wgmma's, mmvq's): 8, all of ciq_variant_info.weight_types (a ninth needs a
// new API).
#define ALL_TYPES 8, {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K, CIQ_TYPE_Q4_0, CIQ_TYPE_Q5_0, CIQ_TYPE_Q8_0, CIQ_TYPE_Q4_1, CIQ_TYPE_Q5_1, \
                     CIQ_TYPE_Q5_K}

static const ciq_variant_row k_variants[CIQ_VARIANT_COUNT] = {
    {CIQ_VARIANT_AUTO,
     {"auto", CIQ_SEMANTICS_ANY, SEM(CPU) | SEM(MMQ) | SEM(MMVQ), SEM(CPU) | SEM(MMQ) | SEM(F16) | SEM(MMVQ), ALL_TYPES,
      ANY_TOKENS,
      "GGML_CIQ_VARIANT (GPU), else the registry's AUTO order for the device"},
     nullptr, nullptr},
    {CIQ_VARIANT_CPU,
     {"cpu", CIQ_SEMANTICS_CPU, SEM(CPU) | SEM(MMQ), 0, HOST_K_QUANTS, ANY_TOKENS,
      "host K-quant kernel: AVX-VNNI, AVX2 or scalar int8 dot products, threaded; Q5_K cpu only"},
     on_host, launch_cpu},
    {CIQ_VARIANT_WMMA,
     {"wmma", CIQ_SEMANTICS_CPU, 0, SEM(CPU), K_QUANTS, ANY_TOKENS, "warp-private 16x16 WMMA tile, 4 warps"},
     on_gpu_wmma, launch_wmma},
    {CIQ_VARIANT_WMMA_WIDE,
     {"wmma-wide", CIQ_SEMANTICS_CPU, 0, SEM(CPU), K_QUANTS, ANY_TOKENS, "warp-private 16x16 WMMA tile, 8 warps"},
     on_gpu_sm80, launch_wmma},  // more than the 64 KB of LDS an RDNA workgroup gets
    {CIQ_VARIANT_WMMA_SHARED,
     {"wmma-shared", CIQ_SEMANTICS_CPU, 0, SEM(CPU), K_QUANTS, ANY_TOKENS,
      "WMMA, 8 warps, activation rows staged in shared memory"},
     on_gpu_wmma, launch_wmma},
    {CIQ_VARIANT_WMMA_BIGTILE,
     {"wmma-bigtile", CIQ_SEMANTICS_CPU, 0, SEM(CPU), K_QUANTS, ANY_TOKENS,
      "WMMA, 8 warps, 2-D grid, 48 staged activation rows reused"},
     on_gpu_sm80, launch_wmma},  // more than the 64 KB of LDS an RDNA workgroup gets
    {CIQ_VARIANT_MMA,
     {"mma", CIQ_SEMANTICS_MMQ, 0, SEM(MMQ), HOST_K_QUANTS, ANY_TOKENS,
      "MMQ-class 128-row tile, mma.sync m16n8k32 (CUDA only; Q5_K as MMQ runs it, Q4_K's formula)"},
     on_gpu_sm80, launch_mma},
    {CIQ_VARIANT_WGMMA,
     {"wgmma", CIQ_SEMANTICS_F16, 0, SEM(F16), ALL_TYPES, ANY_TOKENS_K64,
      "Hopper sm_90a: TMA + warp-specialized wgmma on f16 (32-value block types: K a multiple of 64)"},
     on_hopper_90a, launch_wgmma},
    {CIQ_VARIANT_Q32,
     {"q32", CIQ_SEMANTICS_CPU, SEM(CPU) | SEM(MMQ), SEM(MMQ), BLOCK32, ANY_TOKENS,
      "32-block types: host tinyBLAS lanes or ggml's vec_dot (cpu), MMQ's formula (mmq: host, GPU 64-row tile)"},
     on_host_or_gpu_wmma, launch_q32},
    {CIQ_VARIANT_MMVQ,
     {"mmvq", CIQ_SEMANTICS_MMVQ, SEM(MMVQ), SEM(MMVQ), ALL_TYPES, 1, 8, 1,
      "llama.cpp CUDA's mul_mat_vec_q in its float order: host twin and GPU kernel, 1..8 tokens"},
     on_host_or_gpu_wmma, launch_mmvq},
};

// Which layout a semantics quantizes X into for a weight type.
struct LayoutChoice {
    ciq_semantics semantics;
    ciq_type type;
    ciq_layout layout;
};
static const LayoutChoice k_layouts[] = {
    {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q4_K, CIQ_LAYOUT_Q8_K},        {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q6_K, CIQ_LAYOUT_Q8_K},
    {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q4_0, CIQ_LAYOUT_Q8_0},        {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q5_0, CIQ_LAYOUT_Q8_0},
    {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q8_0, CIQ_LAYOUT_Q8_0},        {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q4_K, CIQ_LAYOUT_Q8_1_MMQ_DS4},
    {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q6_K, CIQ_LAYOUT_Q8_1_MMQ_D4}, {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q4_0, CIQ_LAYOUT_Q8_1_MMQ_DS4},
    {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q5_0, CIQ_LAYOUT_Q8_1_MMQ_D4}, {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q8_0, CIQ_LAYOUT_Q8_1_MMQ_D4},
    {CIQ_SEMANTICS_F16, CIQ_TYPE_Q4_K, CIQ_LAYOUT_F16},         {CIQ_SEMANTICS_F16, CIQ_TYPE_Q6_K, CIQ_LAYOUT_F16},
    {CIQ_SEMANTICS_F16, CIQ_TYPE_Q4_0, CIQ_LAYOUT_F16},         {CIQ_SEMANTICS_F16, CIQ_TYPE_Q5_0, CIQ_LAYOUT_F16},
    {CIQ_SEMANTICS_F16, CIQ_TYPE_Q8_0, CIQ_LAYOUT_F16},         {CIQ_SEMANTICS_F16, CIQ_TYPE_Q4_1, CIQ_LAYOUT_F16},
    {CIQ_SEMANTICS_F16, CIQ_TYPE_Q5_1, CIQ_LAYOUT_F16},         {CIQ_SEMANTICS_F16, CIQ_TYPE_Q5_K, CIQ_LAYOUT_F16},
    {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q4_K, CIQ_LAYOUT_Q8_1},       {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q6_K, CIQ_LAYOUT_Q8_1},
    {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q4_0, CIQ_LAYOUT_Q8_1},       {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q5_0, CIQ_LAYOUT_Q8_1},
    {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q8_0, CIQ_LAYOUT_Q8_1},       {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q4_1, CIQ_LAYOUT_Q8_1},
    {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q5_1, CIQ_LAYOUT_Q8_1},       {CIQ_SEMANTICS_MMVQ, CIQ_TYPE_Q5_K, CIQ_LAYOUT_Q8_1},
    {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q4_1, CIQ_LAYOUT_Q8_1_CPU},   {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q5_1, CIQ_LAYOUT_Q8_1_CPU},
    {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q4_1, CIQ_LAYOUT_Q8_1_MMQ_DS4}, {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q5_1, CIQ_LAYOUT_Q8_1_MMQ_DS4},
    {CIQ_SEMANTICS_CPU, CIQ_TYPE_Q5_K, CIQ_LAYOUT_Q8_K},       {CIQ_SEMANTICS_MMQ, CIQ_TYPE_Q5_K, CIQ_LAYOUT_Q8_1_MMQ_DS4},
};

// A variant row has one weight-type list for all its semantics and devices; where it runs a type in fewer, the
// semantics it runs that type in (host, GPU). Planning refuses the rest (CIQ_ERR_UNSUPPORTED) and AUTO skips them.
struct TypeSemantics {
    ciq_variant variant;
    ciq_type type;
    uint32_t host_semantics;
    uint32_t gpu_semantics;
};
static const TypeSemantics k_type_semantics[] = {
    // llama.cpp x86 CPU's vec_dot_q{4,5}_1_q8_1 on the host (cpu/gemm_q32.cpp); MMQ's vec_dot_q8_1_q8_1 on both.
    {CIQ_VARIANT_Q32, CIQ_TYPE_Q4_1, SEM(CPU) | SEM(MMQ), SEM(MMQ)},
    {CIQ_VARIANT_Q32, CIQ_TYPE_Q5_1, SEM(CPU) | SEM(MMQ), SEM(MMQ)},
    // llama.cpp x86 CPU's tiled K-quant matmul and vec_dot_q5_K_q8_K only (cpu/gemm_kernels.cpp).
    {CIQ_VARIANT_CPU, CIQ_TYPE_Q5_K, SEM(CPU), 0},
};

// ---------------------------------------------------------------------------------------------
// Tuning data per architecture

// AUTO: the first entry of the device's table that matches the requested semantics (ANY included) and token count,
// multiplies the weight type and runs on the device.
struct AutoChoice {
    ciq_semantics semantics;
    int64_t max_tokens;  // the entry applies when tokens <= max_tokens
    ciq_variant variant;
};
static const AutoChoice k_auto_host[] = {
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_CPU}, {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_CPU}, {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_CPU}, {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_MMVQ, 8, CIQ_VARIANT_MMVQ},
};
static const AutoChoice k_auto_cuda[] = {
    // 1..8 tokens, where llama.cpp runs MMVQ: never less exact than llama.cpp. The 32-block types take MMQ's formula
    // (as exact as MMVQ for Q8_0, more for Q4_0/Q5_0, whose MMVQ offset term uses the fp16 activation sum), the
    // K-quants MMVQ's own arithmetic (mma's MMQ arithmetic is 5-30x further from float64 for Q4_K there;
    // docs/SEMANTICS.md "mmvq"). Speed against llama.cpp's MMVQ not yet measured.
    {CIQ_SEMANTICS_ANY, 8, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_ANY, 8, CIQ_VARIANT_MMVQ},
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_WGMMA},   // Hopper
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_MMA},
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_F16, INT64_MAX, CIQ_VARIANT_WGMMA},
    {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_MMA},
    {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_CPU, 128, CIQ_VARIANT_WMMA_SHARED},   // seed6, 128 tokens: shared fastest on 4 of 6 shapes
    {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_WMMA_BIGTILE},  // llama3-8b, 512 tokens: bigtile on 9 of 10
    {CIQ_SEMANTICS_MMVQ, 8, CIQ_VARIANT_MMVQ},
};
static const AutoChoice k_auto_hip[] = {  // AMD: no mma; wide and bigtile exceed 64 KB of LDS
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_WMMA_SHARED},
    {CIQ_SEMANTICS_ANY, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_CPU, INT64_MAX, CIQ_VARIANT_WMMA_SHARED},
    {CIQ_SEMANTICS_MMQ, INT64_MAX, CIQ_VARIANT_Q32},
    {CIQ_SEMANTICS_MMVQ, 8, CIQ_VARIANT_MMVQ},
};

// Offload: a variant runs a weight type faster than llama.cpp's own mul_mat from min_tokens on, for weights of
// min_weight_values to max_weight_values values (rows x K; 0: no upper bound), end to end inside llama.cpp through the
// ggml plugin, where CIQi takes the whole graph and orders our stream against CUDAi's with events (no host wait; API
// v19). A (variant, type) without an entry is never offloaded. mmvq runs 0.29x-1.06x llama.cpp's MMVQ at 1 and 8
// tokens (bench/results/h200/offload-3f4cfb3/), so decode stays llama.cpp's; the GPU q32 kernel 0.19x-0.36x MMQ on
// 4096-row and larger 32-block weights; mma 0.63x-0.73x MMQ (bench/results/h200/wgmma-5d360bc-*.json), the WMMA
// family slower still; the host kernels 0.6x-0.8x llama.cpp CPU (bench/results/cpu/compare-gemma3-270m-*.json).
struct OffloadThreshold {
    bool (*device)(const ciq_device_facts &d);
    ciq_variant variant;
    ciq_type type;
    int64_t min_tokens;
    int64_t min_weight_values;
    int64_t max_weight_values;  // 0: none
};
constexpr int64_t k_8b_weights = 1024 * 4096;  // the smallest Llama-3-8B weight (k/v: 1024 x 4096)
static const OffloadThreshold k_offload[] = {
    // K-quants. llama-bench on an H100 through the plugin (API v19, bench/results/summary/plugin-graph-h100.json),
    // every MUL_MAT of the model offloaded, against CUDA0 alone (both run orders): synthetic Llama-3-8B (Q4_K / Q6_K)
    // pp16 1.13x, pp32 1.30x-1.31x, pp64 1.58x-1.61x, pp128 2.01x-2.04x, pp512 2.36x-2.40x; Gemma 3 270M (640-row
    // weights, with its Q5_0 / Q8_0) pp32 0.96x (as with nothing offloaded), pp128 1.43x-1.44x, pp512 1.28x-1.30x,
    // pp4096 1.39x-1.40x. So 8B-sized weights from 16 tokens (below, kernel alone: 0.89x-1.13x at 9-16), any weight
    // from 128. Q5_K runs through Q4_K's kernel and measured in its class (gemm-new-types-8b).
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q4_K, 16, k_8b_weights, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q6_K, 16, k_8b_weights, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q5_K, 16, k_8b_weights, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q4_K, 128, 0, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q6_K, 128, 0, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q5_K, 128, 0, 0},
    // The 32-value block types through wgmma (f16 semantics), from 128 tokens: SmolLM2-135M (Q4_1 with Q8_0, hidden
    // 576) every MUL_MAT offloaded pp32 1.07x-1.08x, pp128 1.78x-1.82x, pp512 1.50x-1.54x, pp2048 1.56x-1.57x;
    // Gemma's Q5_0 / Q8_0 inside the figures above. Q4_1 / Q5_1 at any size (8B shapes, kernel alone: 1.13x-1.22x
    // MMQ at 128 tokens, 1.50x-1.63x at 512); Q4_0 / Q5_0 / Q8_0 only below the 8B's weights, where wgmma is no faster
    // than MMQ (0.96x / 1.00x at 512; Q5_0 4096 x 4096 0.57x at 16 tokens: gemm-block32-8b). Q4_0 by its class: no
    // catalog model has it.
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q4_1, 128, 0, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q5_1, 128, 0, 0},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q4_0, 128, 0, k_8b_weights - 1},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q5_0, 128, 0, k_8b_weights - 1},
    {on_hopper_90a, CIQ_VARIANT_WGMMA, CIQ_TYPE_Q8_0, 128, 0, k_8b_weights - 1},
};

// ---------------------------------------------------------------------------------------------
// Lookups

const ciq_variant_row *ciq_registry_row(ciq_variant variant) {
    return (int)variant >= 0 && variant < CIQ_VARIANT_COUNT ? &k_variants[variant] : nullptr;
}

bool ciq_registry_covers(const ciq_variant_row &row, ciq_type type) {
    for (int i = 0; i < row.info.weight_type_count; ++i) {
        if (row.info.weight_types[i] == type) return true;
    }
    return false;
}

uint32_t ciq_registry_semantics(const ciq_variant_row &row, ciq_type type, bool host) {
    uint32_t mask = host ? row.info.host_semantics : row.info.gpu_semantics;
    if (!ciq_registry_covers(row, type)) return 0;
    for (const TypeSemantics &t : k_type_semantics) {
        if (t.variant == row.variant && t.type == type) mask &= host ? t.host_semantics : t.gpu_semantics;
    }
    return mask;
}

int ciq_type_block_values(ciq_type type) {
    switch (type) {
        case CIQ_TYPE_Q4_0: case CIQ_TYPE_Q5_0: case CIQ_TYPE_Q8_0: return 32;
        case CIQ_TYPE_Q4_1: case CIQ_TYPE_Q5_1: return 32;
        case CIQ_TYPE_Q4_K: case CIQ_TYPE_Q5_K: case CIQ_TYPE_Q6_K: return QK_K;
        default: return 0;
    }
}

int ciq_type_block_bytes(ciq_type type) {
    switch (type) {
        case CIQ_TYPE_Q4_0: return Q4_0_BLOCK_BYTES;
        case CIQ_TYPE_Q5_0: return Q5_0_BLOCK_BYTES;
        case CIQ_TYPE_Q8_0: return Q8_0_BLOCK_BYTES;
        case CIQ_TYPE_Q4_K: return Q4_K_BLOCK_BYTES;
        case CIQ_TYPE_Q5_K: return Q5_K_BLOCK_BYTES;
        case CIQ_TYPE_Q6_K: return Q6_K_BLOCK_BYTES;
        case CIQ_TYPE_Q4_1: return Q4_1_BLOCK_BYTES;
        case CIQ_TYPE_Q5_1: return Q5_1_BLOCK_BYTES;
        default: return 0;
    }
}

const char *ciq_type_name(ciq_type type) {
    switch (type) {
        case CIQ_TYPE_F32: return "F32";
        case CIQ_TYPE_F16: return "F16";
        case CIQ_TYPE_Q4_0: return "Q4_0";
        case CIQ_TYPE_Q5_0: return "Q5_0";
        case CIQ_TYPE_Q8_0: return "Q8_0";
        case CIQ_TYPE_Q4_1: return "Q4_1";
        case CIQ_TYPE_Q5_1: return "Q5_1";
        case CIQ_TYPE_Q4_K: return "Q4_K";
        case CIQ_TYPE_Q5_K: return "Q5_K";
        case CIQ_TYPE_Q6_K: return "Q6_K";
        case CIQ_TYPE_BF16: return "BF16";
        default: return "unknown";
    }
}

const char *ciq_semantics_name(ciq_semantics semantics) {
    static const char *const names[] = {"cpu", "mmq", "f16", "mmvq", "any"};
    return (int)semantics >= 0 && semantics <= CIQ_SEMANTICS_ANY ? names[semantics] : "unknown";
}

ciq_status ciq_device_facts_get(int device, ciq_device_facts *facts) {
    *facts = ciq_device_facts{device == CIQ_DEVICE_CPU, false, 0, 0, false};
    CIQ_TRY(ciq_check_device(device));
    if (facts->host) return CIQ_OK;
#ifdef GGML_CIQ_WITH_CUDA
    CIQ_TRY(ciq_cuda_compute_capability(device, &facts->major, &facts->minor));
#ifdef GGML_CIQ_HIP
    facts->hip = true;
#endif
    facts->built_90a = std::strstr(GGML_CIQ_CUDA_ARCHS, "90a") != nullptr;
#endif
    return CIQ_OK;
}

// ---------------------------------------------------------------------------------------------
// The C API's registry calls

ciq_status ciq_variant_describe(ciq_variant variant, ciq_variant_info *info) {
    if (info == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_variant_describe: info is NULL");
    const ciq_variant_row *row = ciq_registry_row(variant);
    if (row == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    *info = row->info;
    return CIQ_OK;
}

ciq_status ciq_variant_available(int device, ciq_variant variant, int *available) {
    if (available == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_variant_available: available is NULL");
    const ciq_variant_row *row = ciq_registry_row(variant);
    if (row == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    *available = 0;
    ciq_device_facts facts;
    CIQ_TRY(ciq_device_facts_get(device, &facts));
    if (variant == CIQ_VARIANT_AUTO) {
        for (const ciq_variant_row &r : k_variants) *available |= r.runs_on != nullptr && r.runs_on(facts);
    } else {
        *available = row->runs_on(facts) && row->launch != nullptr;
    }
    return CIQ_OK;
}

ciq_status ciq_activations_layout(ciq_semantics semantics, ciq_type type, ciq_layout *layout) {
    if (layout == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_activations_layout: layout is NULL");
    for (const LayoutChoice &choice : k_layouts) {
        if (choice.semantics == semantics && choice.type == type) {
            *layout = choice.layout;
            return CIQ_OK;
        }
    }
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "no activation layout for %s semantics on %s weights",
                    ciq_semantics_name(semantics), ciq_type_name(type));
}

ciq_status ciq_activations_size(ciq_layout layout, int64_t tokens, int64_t k, size_t *bytes) {
    if (bytes == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_activations_size: bytes is NULL");
    *bytes = 0;
    CIQ_TRY(ciq_check_count("activations", "tokens", tokens));
    int64_t unit = 0;
    switch (layout) {
        case CIQ_LAYOUT_Q8_K: unit = QK_K; break;
        case CIQ_LAYOUT_F16: unit = F16_K_UNIT; break;
        case CIQ_LAYOUT_Q8_1_MMQ_DS4: case CIQ_LAYOUT_Q8_1_MMQ_D4:  // the last 128-value block zero-padded
        case CIQ_LAYOUT_Q8_0: case CIQ_LAYOUT_Q8_1: case CIQ_LAYOUT_Q8_1_CPU: unit = 32; break;
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
        case CIQ_LAYOUT_Q8_1_CPU: *bytes = (size_t)(tokens * (k / 32)) * Q8_1_BLOCK_BYTES; break;
        default: *bytes = (size_t)(tokens * CIQ_Q8_1_MMQ_BLOCKS(k)) * Q8_1_MMQ_BLOCK_BYTES; break;
    }
    return CIQ_OK;
}

// "cpu or mmq" for a mask of semantics bits.
static void semantics_names(uint32_t mask, char (&names)[32]) {
    names[0] = '\0';
    for (int s = CIQ_SEMANTICS_CPU; s < CIQ_SEMANTICS_ANY; ++s) {
        if (!(mask & (1u << s))) continue;
        if (names[0]) std::strcat(names, " or ");
        std::strcat(names, ciq_semantics_name((ciq_semantics)s));
    }
}

static ciq_status variant_from_name(const char *name, ciq_variant *variant) {
    for (const ciq_variant_row &row : k_variants) {
        if (row.variant != CIQ_VARIANT_AUTO && std::strcmp(name, row.info.name) == 0) {
            *variant = row.variant;
            return CIQ_OK;
        }
    }
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "GGML_CIQ_VARIANT=%s is not a kernel variant", name);
}

static ciq_status resolve_auto(const ciq_device_facts &facts, ciq_semantics semantics, ciq_type type, int64_t k,
                               int64_t tokens, ciq_variant *resolved) {
    const char *env = ciq_switches_variant();  // GGML_CIQ_VARIANT (switches.cpp)
    if (!facts.host && env != nullptr) return variant_from_name(env, resolved);
    const AutoChoice *table = k_auto_host;
    size_t entries = sizeof(k_auto_host) / sizeof(k_auto_host[0]);
    if (!facts.host && facts.hip) {
        table = k_auto_hip;
        entries = sizeof(k_auto_hip) / sizeof(k_auto_hip[0]);
    } else if (!facts.host) {
        table = k_auto_cuda;
        entries = sizeof(k_auto_cuda) / sizeof(k_auto_cuda[0]);
    }
    const ciq_variant_row *k_rejected = nullptr;  // a variant that would have run but for K
    for (size_t i = 0; i < entries; ++i) {
        const ciq_variant_row &row = k_variants[table[i].variant];
        const uint32_t runs = ciq_registry_semantics(row, type, facts.host);  // 0 where it never runs the type here
        if (table[i].semantics == semantics && tokens <= table[i].max_tokens && runs != 0 &&
            (semantics == CIQ_SEMANTICS_ANY || (runs & (1u << semantics))) && row.runs_on(facts) &&
            row.launch != nullptr) {
            if (k % row.info.k_multiple == 0) {
                *resolved = table[i].variant;
                return CIQ_OK;
            }
            if (k_rejected == nullptr) k_rejected = &row;
        }
    }
    if (k_rejected != nullptr) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "no kernel of this build runs %s semantics for %s weights at K = %lld (%s "
                        "needs a multiple of %lld)", ciq_semantics_name(semantics), ciq_type_name(type), (long long)k,
                        k_rejected->info.name, (long long)k_rejected->info.k_multiple);
    }
    uint32_t implemented = 0, listed = 0;  // by any variant of the registry for this weight type and kind of device;
                                           // listed: by the rows that list the type, whatever k_type_semantics says
    for (const ciq_variant_row &row : k_variants) {
        if (row.variant != CIQ_VARIANT_AUTO && ciq_registry_covers(row, type)) {
            implemented |= ciq_registry_semantics(row, type, facts.host);
            listed |= facts.host ? row.info.host_semantics : row.info.gpu_semantics;
        }
    }
    if (semantics != CIQ_SEMANTICS_ANY && !(implemented & (1u << semantics)) && (listed & (1u << semantics))) {
        char names[32];
        semantics_names(implemented, names);
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "no kernel of this build runs %s weights in %s semantics on %s (%s%s)",
                        ciq_type_name(type), ciq_semantics_name(semantics), facts.host ? "the CPU" : "a GPU",
                        implemented ? "only in " : "in no semantics there", implemented ? names : "");
    }
    if (semantics != CIQ_SEMANTICS_ANY && !(implemented & (1u << semantics))) {
        char names[32];
        semantics_names(implemented, names);
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "the %s kernels for %s weights implement %s semantics, not %s",
                        facts.host ? "CPU" : "GPU", ciq_type_name(type), names, ciq_semantics_name(semantics));
    }
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "no kernel of this build implements %s semantics for %s weights on %s",
                    ciq_semantics_name(semantics), ciq_type_name(type), facts.host ? "the CPU" : "this GPU");
}

static ciq_status offload_decision(const ciq_device_facts &facts, ciq_variant variant, ciq_type type, int64_t rows,
                                   int64_t k, int64_t tokens, int *offload) {
    CIQ_TRY(ciq_switches_offload(offload));  // GGML_CIQ_OFFLOAD (switches.cpp): all 1, none 0, unset -1
    if (*offload >= 0) return CIQ_OK;
    *offload = 0;
    for (const OffloadThreshold &t : k_offload) {
        // rows x k against the bounds without overflow: rows >= ceil(min / k), rows <= floor(max / k)
        const bool above = k >= t.min_weight_values || rows >= (t.min_weight_values + k - 1) / k;
        const bool below = t.max_weight_values == 0 || rows <= t.max_weight_values / k;
        if (t.variant == variant && t.type == type && t.device(facts) && tokens >= t.min_tokens && above && below)
            *offload = 1;
    }
    return CIQ_OK;
}

ciq_status ciq_gemm_plan(int device, ciq_variant variant, ciq_semantics semantics, ciq_type type, int64_t rows,
                         int64_t k, int64_t tokens, ciq_plan *plan) {
    if (plan == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm_plan: plan is NULL");
    const ciq_variant_row *row = ciq_registry_row(variant);
    if (row == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown kernel variant %d", (int)variant);
    if ((int)semantics < CIQ_SEMANTICS_CPU || semantics > CIQ_SEMANTICS_ANY) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown semantics %d", (int)semantics);
    }
    if (!ciq_registry_covers(k_variants[CIQ_VARIANT_AUTO], type)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "weight type %s (%d) is not Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q8_0, Q4_1 or "
                        "Q5_1",
                        ciq_type_name(type), (int)type);
    }
    CIQ_TRY(ciq_check_count("ciq_gemm", "tokens", tokens));
    CIQ_TRY(ciq_check_count("ciq_gemm", "rows", rows));
    const int values = ciq_type_block_values(type);
    if (k < values || k % values) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_gemm: K must be a positive multiple of %d for %s, got %lld",
                        values, ciq_type_name(type), (long long)k);
    }
    ciq_device_facts facts;
    CIQ_TRY(ciq_device_facts_get(device, &facts));
    ciq_variant resolved = variant;
    if (variant == CIQ_VARIANT_AUTO) CIQ_TRY(resolve_auto(facts, semantics, type, k, tokens, &resolved));
    row = &k_variants[resolved];
    if (!row->runs_on(facts) || row->launch == nullptr) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s is not available on %s", row->info.name,
                        facts.host ? "the CPU" : "this GPU");
    }
    if (!ciq_registry_covers(*row, type)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "kernel variant %s does not multiply %s weights", row->info.name,
                        ciq_type_name(type));
    }
    if (k % row->info.k_multiple != 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "kernel variant %s needs K a multiple of %lld, got %lld",
                        row->info.name, (long long)row->info.k_multiple, (long long)k);
    }
    const uint32_t listed = facts.host ? row->info.host_semantics : row->info.gpu_semantics;
    const uint32_t implemented = ciq_registry_semantics(*row, type, facts.host);
    if (implemented != listed && (semantics == CIQ_SEMANTICS_ANY ? implemented == 0 : !(implemented & (1u << semantics)))) {
        if (implemented == 0) {
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s does not run %s weights on %s", row->info.name,
                            ciq_type_name(type), facts.host ? "the CPU" : "a GPU");
        }
        char names[32];
        semantics_names(implemented, names);
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s runs %s weights in %s semantics only on %s, not %s",
                        row->info.name, ciq_type_name(type), names, facts.host ? "the CPU" : "a GPU",
                        ciq_semantics_name(semantics));
    }
    ciq_semantics resolved_semantics = semantics;
    if (semantics == CIQ_SEMANTICS_ANY) {  // the variant's own; where it does not run that on this device, its first
        resolved_semantics = row->info.semantics;
        for (int s = CIQ_SEMANTICS_ANY - 1; s >= CIQ_SEMANTICS_CPU; --s) {
            if (!(implemented & (1u << resolved_semantics)) && (implemented & (1u << s))) resolved_semantics = (ciq_semantics)s;
        }
    } else if (!(implemented & (1u << semantics))) {
        char names[32];
        semantics_names(implemented, names);
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "kernel variant %s implements %s semantics on %s, not %s",
                        row->info.name, names, facts.host ? "the CPU" : "a GPU", ciq_semantics_name(semantics));
    }
    if (tokens < row->info.min_tokens || tokens > row->info.max_tokens) {
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "kernel variant %s runs %lld..%lld tokens, not %lld", row->info.name,
                        (long long)row->info.min_tokens, (long long)row->info.max_tokens, (long long)tokens);
    }
    ciq_plan result{};
    result.variant = resolved;
    result.semantics = resolved_semantics;
    CIQ_TRY(ciq_activations_layout(resolved_semantics, type, &result.activation_layout));
    CIQ_TRY(ciq_activations_size(result.activation_layout, tokens, k, &result.activation_bytes));
    CIQ_TRY(offload_decision(facts, resolved, type, rows, k, tokens, &result.offload));
    *plan = result;
    return CIQ_OK;
}
