/* ggml_ciq.h - the contract of libggml_ciq: keep-quant (CIQ) GEMM over GGUF Q4_K/Q6_K blocks.
 *
 * Conventions, said once:
 *   weight W   : [rows = output features][K = input features], K % 256 == 0, raw GGUF blocks
 *                (Q4_K 144 B / 256 values, Q6_K 210 B / 256 values), row-major by block.
 *   activations: X[tokens][K] float32, token-major.
 *   output     : out[tokens][rows] = X @ W^T, token-major, float32 or bf16.
 *   Q8_K       : [tokens][K/256] blocks of 292 B (float d, int8 qs[256], int16 bsums[16]), as ggml.
 *   q8_1-mmq   : [K/128][tokens] blocks of 144 B, as llama.cpp CUDA MMQ's block_q8_1_mmq:
 *                4 scale words then int8 qs[128]; DS4 (half2 d,s per 32) for Q4_K, D4 (float d per 32) for Q6_K.
 *   f16        : f16 [tokens][K] of x * 2^-e_t, then (at a 256-byte boundary) float scale[tokens] = 2^e_t, with
 *                e_t putting the token's largest |x| in [2^14, 2^15) (ciq_f16_size bytes in all).
 *   device     : CIQ_DEVICE_CPU (-1) is the host; 0..n-1 are GPUs. Pointers live on the device named.
 *
 * Every function returns a ciq_status; on failure ciq_last_error() (thread-local) says why.
 * The region between the CDEF markers is plain C that Python's cffi parses directly.
 */
#ifndef GGML_CIQ_H
#define GGML_CIQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_CIQ_API_VERSION 1
#define CIQ_DEVICE_CPU (-1)

/* CDEF-BEGIN */
typedef enum {
    CIQ_OK = 0,
    CIQ_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad size, K % 256 != 0, unknown enum */
    CIQ_ERR_UNSUPPORTED = 2,      /* valid request this build or device cannot run */
    CIQ_ERR_BACKEND = 3,          /* CUDA/HIP runtime failure */
    CIQ_ERR_OUT_OF_MEMORY = 4
} ciq_status;

typedef enum {             /* values are ggml's type ids */
    CIQ_TYPE_Q4_K = 12,
    CIQ_TYPE_Q6_K = 14
} ciq_weight_type;

typedef enum {
    CIQ_SEMANTICS_CPU = 0, /* Q8_K activations, integer sub-block sums, float per super-block (llama.cpp CPU) */
    CIQ_SEMANTICS_MMQ = 1, /* q8_1-mmq activations, fp16-rounded d*sc and dmin*m (llama.cpp CUDA MMQ) */
    CIQ_SEMANTICS_F16 = 2, /* f16 activations (per-token power-of-two scale), weights dequantized to f16, fp32 sums */
    CIQ_SEMANTICS_ANY = 3  /* ciq_gemm and ciq_resolve_variant only: whatever the variant AUTO picks implements */
} ciq_semantics;

typedef enum {
    CIQ_VARIANT_AUTO = 0,         /* GGML_CIQ_VARIANT from the environment, else the tuned table */
    CIQ_VARIANT_CPU = 1,          /* host kernel: AVX2 or scalar int8 dot, threaded; either semantics */
    CIQ_VARIANT_WMMA = 2,         /* warp-private 16x16 WMMA tile, 4 warps (CPU semantics) */
    CIQ_VARIANT_WMMA_WIDE = 3,    /* the same, 8 warps */
    CIQ_VARIANT_WMMA_SHARED = 4,  /* 8 warps, activation rows staged in shared memory */
    CIQ_VARIANT_WMMA_BIGTILE = 5, /* 8 warps, 2-D grid, 48 staged activation rows reused */
    CIQ_VARIANT_MMA = 6,          /* MMQ-class 128-row tile, mma.sync m16n8k32 (MMQ semantics) */
    CIQ_VARIANT_WGMMA = 7,        /* Hopper (sm_90a): TMA + warp-specialized wgmma on f16 (F16 semantics) */
    CIQ_VARIANT_COUNT = 8
} ciq_variant;

typedef enum {
    CIQ_OUT_F32 = 0,
    CIQ_OUT_BF16 = 1
} ciq_out_type;

int         ciq_api_version(void);
const char *ciq_last_error(void);
/* JSON object: version, api_version, backends, cuda_archs, hip_archs, cpu_features, threads. */
const char *ciq_build_info(void);
const char *ciq_variant_name(ciq_variant variant);
ciq_semantics ciq_variant_semantics(ciq_variant variant);

/* Devices and memory. */
ciq_status ciq_device_count(int *count);
ciq_status ciq_device_name(int device, char *buffer, size_t buffer_size);
ciq_status ciq_variant_available(int device, ciq_variant variant, int *available);
ciq_status ciq_malloc(int device, size_t nbytes, void **ptr);
ciq_status ciq_free(int device, void *ptr);
ciq_status ciq_memcpy_to_device(int device, void *dst, const void *host_src, size_t nbytes);
ciq_status ciq_memcpy_to_host(int device, void *host_dst, const void *src, size_t nbytes);
ciq_status ciq_memset(int device, void *dst, int value, size_t nbytes);
ciq_status ciq_synchronize(int device);
ciq_status ciq_set_num_threads(int threads); /* CPU kernels; <= 0 means all cores */

/* Activation quantization. Sizes in bytes of the quantized activations. */
size_t     ciq_q8_K_size(int64_t tokens, int64_t k);
size_t     ciq_q8_1_mmq_size(int64_t tokens, int64_t k);
ciq_status ciq_quantize_q8_K(int device, const float *x, void *out, int64_t tokens, int64_t k);
/* q8_1-mmq: DS4 layout for layout_for Q4_K, D4 for Q6_K; K a multiple of 128 (the other layouts: of 256). */
ciq_status ciq_quantize_q8_1_mmq(int device, ciq_weight_type layout_for, const float *x, void *out,
                                 int64_t tokens, int64_t k);
size_t     ciq_f16_size(int64_t tokens, int64_t k);
ciq_status ciq_convert_f16(int device, const float *x, void *out, int64_t tokens, int64_t k);

/* Which variant ciq_gemm would run for this problem: AUTO resolved, availability and semantics checked.
 * With CIQ_SEMANTICS_ANY the resolved variant's own semantics apply (ciq_variant_semantics). */
ciq_status ciq_resolve_variant(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type,
                               int64_t rows, int64_t k, int64_t tokens, ciq_variant *resolved);

/* out = X @ W^T. Quantizes X itself (semantics picks Q8_K, q8_1-mmq or f16) into an internal scratch buffer.
 * weight_nbytes must equal rows * (K/256) * block bytes. */
ciq_status ciq_gemm(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type,
                    const void *weight, size_t weight_nbytes, int64_t rows, int64_t k,
                    const float *x, int64_t tokens, void *out, ciq_out_type out_type);
/* The same on activations already quantized in the semantics' layout (GEMM-only timing). */
ciq_status ciq_gemm_quantized(int device, ciq_variant variant, ciq_semantics semantics, ciq_weight_type type,
                              const void *weight, size_t weight_nbytes, int64_t rows, int64_t k,
                              const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type);

/* Dense bf16 GEMM (cuBLAS, GPU only), out = X @ W^T with W [rows][K] and X [tokens][K] in bf16: the ceiling
 * keep-quant kernels are compared with. */
ciq_status ciq_dense_gemm_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x,
                               int64_t tokens, void *out, ciq_out_type out_type);

/* Device timing on the stream the kernels use (host wall clock on the CPU): start; optionally mark the end without
 * waiting for the device; stop returns the milliseconds from start to the mark (or to now, unmarked), waiting for
 * the device if needed, and frees the timer. */
ciq_status ciq_timer_start(int device, void **timer);
ciq_status ciq_timer_mark(void *timer);
ciq_status ciq_timer_stop(void *timer, float *milliseconds);

/* Dispatch counters: kernel launches per resolved variant and weight type since the last reset. */
ciq_status ciq_dispatch_count(ciq_variant variant, ciq_weight_type type, uint64_t *count);
void       ciq_dispatch_reset(void);
/* Transformer ops for the prefill engine. Tensors are contiguous and row-major (rows first, features last), all
 * float math is float32, f16 is IEEE half (the K/V cache), bf16 the upper half of a float32. out may equal an
 * input (same shape) except for ciq_attention. Float order per device: native/src/cpu/ops.cpp, cuda/ops.cu. */
typedef enum {             /* ggml's rope modes */
    CIQ_ROPE_NORM = 0,     /* rotates dimension pairs (2i, 2i+1) */
    CIQ_ROPE_NEOX = 2      /* rotates dimension pairs (i, i + head_dim/2) */
} ciq_rope_mode;

typedef enum {
    CIQ_GLU_SILU = 0,      /* silu(gate) * up */
    CIQ_GLU_GELU = 1       /* tanh-GELU(gate) * up: CPU through ggml's fp16 table, GPU in float */
} ciq_glu_kind;

typedef enum {
    CIQ_ATTENTION_AUTO = 0, /* CPU: cpu; GPU: mma where available, else simt */
    CIQ_ATTENTION_CPU = 1,  /* host kernel */
    CIQ_ATTENTION_SIMT = 2, /* GPU, CUDA cores: float32 q.k and p.v */
    CIQ_ATTENTION_MMA = 3,  /* GPU sm_80+ (CUDA), mma.sync m16n8k16: q and p rounded to f16, float32 accumulation */
    CIQ_ATTENTION_GGML = 4  /* host, llama.cpp x86 CPU's arithmetic without flash attention (cpu/ops.cpp) */
} ciq_attention_kernel;

/* out[n][d] = x * 1/sqrt(mean(x^2) + eps), then * weight[d] unless weight is NULL (ggml rms_norm, mul). */
ciq_status ciq_rms_norm(int device, const float *x, const float *weight, float eps, int64_t n, int64_t d, float *out);
/* RoPE on x[tokens][heads][head_dim] over all head_dim dims: angle positions[t] * base^(-2i/head_dim). */
ciq_status ciq_rope(int device, ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens,
                    int64_t heads, int64_t head_dim, float base, float *out);
/* Causal GQA: out[t][h*head_dim + e] from q[t][h][:], caches [cache_rows][heads_kv][head_dim] f16 holding
 * positions 0..n_past+tokens-1. Query t (position n_past + t) sees key p when p <= n_past + t and (window == 0 or
 * n_past + t - p < window); head h reads kv head h / (heads / heads_kv). Softmax of scale * q.k in float32. */
ciq_status ciq_attention(int device, ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                         const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim,
                         int64_t cache_rows, int64_t n_past, float scale, int64_t window, float *out);
/* Which kernel ciq_attention runs for this request on this device (AUTO resolved, availability checked). */
ciq_status ciq_attention_resolve(int device, ciq_attention_kernel kernel, int64_t head_dim,
                                 ciq_attention_kernel *resolved);
/* cache[start + t][:] = x[t][:] rounded to f16 (nearest even); row_values = heads_kv * head_dim. */
ciq_status ciq_kv_store(int device, uint16_t *cache, int64_t start, const float *x, int64_t tokens,
                        int64_t row_values);
/* out[i] = act(gate[i]) * up[i] for n values. */
ciq_status ciq_glu(int device, ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out);
/* out[i] = a[i] + b[i % b_n] for n values (b_n divides n: a bias row repeated over rows). */
ciq_status ciq_add(int device, const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_scale(int device, const float *x, float s, int64_t n, float *out);       /* out = x * s */
/* out[i][:] = row ids[i] of table [table_rows][k] dequantized to float32 as ggml does. ggml_type: F32 0, F16 1,
 * Q4_0 2, Q5_0 6, Q8_0 8, Q4_K 12, Q5_K 13, Q6_K 14, BF16 30. */
ciq_status ciq_get_rows(int device, int ggml_type, const void *table, int64_t table_rows, int64_t k,
                        const int32_t *ids, int64_t n, float *out);
/* A whole [rows][k] tensor of ggml_type dequantized to bf16 (float32 value rounded to nearest even). */
ciq_status ciq_dequantize_bf16(int device, int ggml_type, const void *data, int64_t rows, int64_t k, void *out);
/* out[i] = x[i] rounded to bf16 (nearest even), n values. */
ciq_status ciq_convert_bf16(int device, const float *x, int64_t n, void *out);
/* out[t][r] = X @ W^T for Q4_0, Q5_0 or Q8_0 weights (ggml_type 2, 6, 8; [rows][k]).
 * CIQ_SEMANTICS_MMQ (host and GPU; k a multiple of 128), llama.cpp CUDA MMQ's: X quantized to q8_1 per 32 values as
 * ciq_quantize_q8_1_mmq does (D4 layout; DS4 for Q4_0, whose d8 is then the fp16 one), weights as int8 (Q4_0 q-8,
 * Q5_0 q-16, Q8_0 q) with their fp16 d; per 32-value block in K order, acc = fma(float(isum) * d_w, d8, acc).
 * CIQ_SEMANTICS_CPU (host only; k a multiple of 32), llama.cpp x86 CPU's (llamafile tinyBLAS_Q0_AVX): X quantized
 * to q8_0 as ggml's AVX2 quantize_row_q8_0, eight lanes of 4-value integer dot products per block, lane l =
 * fma(d_w * d_x, lane sum, lane l) over the blocks, out = ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)). */
ciq_status ciq_gemm_q32(int device, ciq_semantics semantics, int ggml_type, const void *weight, int64_t rows,
                        int64_t k, const float *x, int64_t tokens, float *out);
/* ciq_gemm_q32 calls since ciq_dispatch_reset that ran on the host (device -1) or on a GPU (device >= 0). */
ciq_status ciq_q32_dispatch_count(int device, int ggml_type, uint64_t *count);
/* CDEF-END */

#ifdef __cplusplus
}
#endif
#endif /* GGML_CIQ_H */
