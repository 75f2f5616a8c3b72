/* ggml_ciq.h - the contract of libggml_ciq: keep-quant (CIQ) GEMM over GGUF blocks (Q4_K, Q6_K; Q4_0, Q5_0, Q8_0;
 * Q4_1, Q5_1: host in cpu, mmq and mmvq semantics, GPU in mmq, f16 and mmvq; Q5_K: host cpu and mmvq, GPU mmq, f16
 * and mmvq).
 *
 * Conventions, said once:
 *   weight W   : [rows = output features][K = input features], raw GGUF blocks, row-major by block
 *                (Q4_K 144 B / 256 values, Q6_K 210 B / 256, Q4_0 18 B / 32, Q5_0 22 B / 32, Q8_0 34 B / 32,
 *                Q4_1 20 B / 32, Q5_1 24 B / 32, Q5_K 176 B / 256).
 *   activations: X[tokens][K] float32, token-major.
 *   output     : out[tokens][rows] = X @ W^T, token-major, float32 or bf16.
 *   device     : CIQ_DEVICE_CPU (-1) is the host; 0..n-1 are GPUs. Pointers live on the device named.
 *   Activation layouts (ciq_layout; ciq_activations_size gives the bytes):
 *   Q8_K       : [tokens][K/256] blocks of 292 B (float d, int8 qs[256], int16 bsums[16]), as ggml.
 *   q8_1-mmq   : [ceil(K/128)][tokens] blocks of 144 B, as llama.cpp CUDA MMQ's block_q8_1_mmq: 4 scale words then
 *                int8 qs[128]; DS4 (half2 d,s per 32) for Q4_K/Q5_K/Q4_0/Q4_1/Q5_1, D4 (float d per 32) for the rest;
 *                K a multiple of 32, the values past K zeros (q 0, d 0, s 0: llama.cpp's padding of src1).
 *   f16        : f16 [tokens][K] of x * 2^-e_t, then (at a 256-byte boundary) float scale[tokens] = 2^e_t, with
 *                e_t putting the token's largest |x| in [2^14, 2^15).
 *   q8_0 (host): int8 [tokens][K] as ggml's AVX2 quantize_row_q8_0, then float d[tokens][K/32] (fp16-rounded).
 *   q8_1       : [tokens][K/32] ggml block_q8_1 of 36 B (half d, half sum, int8 qs[32]), as llama.cpp's quantize_q8_1.
 *   q8_1-cpu (host): the same blocks as ggml's x86 AVX2 quantize_row_q8_1 makes them: d = fp16(amax/127), q =
 *                round-half-even(x * (127/amax)), s = fp16((amax/127) * sum(q)) (from the quants, not the floats).
 *
 * Every function returns a ciq_status (but ciq_last_error); on failure ciq_last_error() (thread-local) says why.
 * Names are ciq_<object>_<verb> (ciq_memory_alloc, ciq_gemm_plan, ciq_activations_quantize); the transformer ops are
 * named for the op (ciq_rms_norm, ciq_rope, ciq_attention).
 * Kernel variants, their semantics, layouts, architectures, AUTO order and offload thresholds: native/src/registry.cpp.
 * The region between the CDEF markers is plain C that Python's cffi parses directly. Any change to it raises
 * GGML_CIQ_API_VERSION (tests/test_native.py records the region's hash next to the version).
 */
#ifndef GGML_CIQ_H
#define GGML_CIQ_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GGML_CIQ_API_VERSION 31

/* CDEF-BEGIN */
typedef enum { CIQ_DEVICE_CPU = -1 } ciq_device_index; /* the host as a device; GPUs are 0..n-1 */

typedef enum {
    CIQ_OK = 0,
    CIQ_ERR_INVALID_ARGUMENT = 1, /* null pointer, bad size, K not a multiple of the block, unknown enum */
    CIQ_ERR_UNSUPPORTED = 2,      /* valid request this build or device cannot run */
    CIQ_ERR_BACKEND = 3,          /* CUDA/HIP runtime failure */
    CIQ_ERR_OUT_OF_MEMORY = 4
} ciq_status;

typedef enum {             /* ggml's type ids; the one type parameter type everywhere */
    CIQ_TYPE_F32 = 0,
    CIQ_TYPE_F16 = 1,
    CIQ_TYPE_Q4_0 = 2,
    CIQ_TYPE_Q4_1 = 3,
    CIQ_TYPE_Q5_0 = 6,
    CIQ_TYPE_Q5_1 = 7,
    CIQ_TYPE_Q8_0 = 8,
    CIQ_TYPE_Q4_K = 12,
    CIQ_TYPE_Q5_K = 13,
    CIQ_TYPE_Q6_K = 14,
    CIQ_TYPE_BF16 = 30
} ciq_type;

typedef enum {
    CIQ_SEMANTICS_CPU = 0, /* llama.cpp x86 CPU's: Q8_K (K-quants), q8_0 (Q4_0/Q5_0/Q8_0) or q8_1-cpu (Q4_1/Q5_1) */
    CIQ_SEMANTICS_MMQ = 1, /* llama.cpp CUDA MMQ's: q8_1-mmq activations, fp16-rounded scales */
    CIQ_SEMANTICS_F16 = 2, /* f16 activations (per-token power-of-two scale), weights dequantized to f16, fp32 sums */
    CIQ_SEMANTICS_MMVQ = 3, /* llama.cpp CUDA mul_mat_vec_q's (1..8 tokens): q8_1 activations, its float order */
    CIQ_SEMANTICS_ANY = 4  /* planning only: whatever the resolved variant implements (ciq_variant_info.semantics) */
} ciq_semantics;

typedef enum {
    CIQ_VARIANT_AUTO = 0,         /* GGML_CIQ_VARIANT from the environment (GPU), else the registry's AUTO order */
    CIQ_VARIANT_CPU = 1,          /* host K-quant kernel: AVX-VNNI, AVX2 or scalar int8 dot, threaded; Q5_K: cpu only */
    CIQ_VARIANT_WMMA = 2,         /* warp-private 16x16 WMMA tile, 4 warps */
    CIQ_VARIANT_WMMA_WIDE = 3,    /* the same, 8 warps */
    CIQ_VARIANT_WMMA_SHARED = 4,  /* 8 warps, activation rows staged in shared memory */
    CIQ_VARIANT_WMMA_BIGTILE = 5, /* 8 warps, 2-D grid, 48 staged activation rows reused */
    CIQ_VARIANT_MMA = 6,          /* MMQ-class 128-row tile, mma.sync m16n8k32 */
    CIQ_VARIANT_WGMMA = 7,        /* Hopper (sm_90a): TMA + warp-specialized wgmma on f16, every type of this header */
    CIQ_VARIANT_Q32 = 8,          /* the 32-block types (Q4_0, Q5_0, Q8_0, Q4_1, Q5_1): host cpu|mmq, GPU mmq */
    CIQ_VARIANT_MMVQ = 9,         /* llama.cpp's mul_mat_vec_q, 1..8 tokens, every type of this header: host and GPU */
    CIQ_VARIANT_COUNT = 10
} ciq_variant;

typedef enum {                    /* activation layouts (the header's comment describes each) */
    CIQ_LAYOUT_Q8_K = 0,
    CIQ_LAYOUT_Q8_1_MMQ_DS4 = 1,
    CIQ_LAYOUT_Q8_1_MMQ_D4 = 2,
    CIQ_LAYOUT_F16 = 3,
    CIQ_LAYOUT_Q8_0 = 4,          /* host only */
    CIQ_LAYOUT_Q8_1 = 5,          /* MMVQ's */
    CIQ_LAYOUT_Q8_1_CPU = 6,      /* host only: llama.cpp x86 CPU's q8_1 (Q4_1, Q5_1) */
    CIQ_LAYOUT_COUNT = 7
} ciq_layout;

typedef enum {
    CIQ_OUT_F32 = 0,
    CIQ_OUT_BF16 = 1
} ciq_out_type;

typedef struct {
    const char   *name;             /* as GGML_CIQ_VARIANT, the CLI and the dispatch counters spell it */
    ciq_semantics semantics;        /* what CIQ_SEMANTICS_ANY resolves to (AUTO: CIQ_SEMANTICS_ANY) */
    uint32_t      host_semantics;   /* bit (1 << s) per semantics it implements on the host; 0: not a host kernel */
    uint32_t      gpu_semantics;    /* the same on a GPU; 0: not a GPU kernel */
    int           weight_type_count;
    ciq_type      weight_types[8];  /* the weight types it multiplies */
    int64_t       min_tokens;       /* the token range it runs */
    int64_t       max_tokens;
    int64_t       k_multiple;       /* K must be a multiple of this too (beyond the weight type's block); AUTO skips the
                                       variant where it is not */
    const char   *description;      /* one line */
} ciq_variant_info;

typedef struct {
    ciq_variant   variant;           /* resolved: never AUTO */
    ciq_semantics semantics;         /* resolved: never ANY */
    ciq_layout    activation_layout; /* what ciq_activations_quantize writes for this plan */
    size_t        activation_bytes;  /* bytes of the quantized activations for tokens x k */
    int           offload;           /* 1 where the registry's measured table says this kernel is faster than llama.cpp's
                                        own mul_mat for this type, weight size (rows x k) and token count on this device
                                        (the ggml plugin takes the op only then); GGML_CIQ_OFFLOAD=all|none in the
                                        environment overrides */
} ciq_plan;

const char *ciq_last_error(void);
ciq_status ciq_api_version(int *version);
/* JSON object: version, commit, api_version, backends, cuda_archs, hip, cpu_isa, threads; valid until the next call. */
ciq_status ciq_build_info(const char **json);
/* An on/off runtime switch (GGML_CIQ_FUSE, GGML_CIQ_FUSE_GLU, GGML_CIQ_ATTENTION_WGMMA, GGML_CIQ_PLUGIN_GRAPHS,
 * GGML_CIQ_PLUGIN_FUSE_RULE, GGML_CIQ_PLUGIN_STATS, GGML_CIQ_PLUGIN_ATTENTION, GGML_CIQ_PLUGIN_GROUP,
 * GGML_CIQ_PLUGIN_TIMELINE since API v30, GGML_CIQ_PLUGIN_ROPE_KV since v31) as the environment sets it now: *on 1
 * or 0 (1/on/true/yes, 0/off/false/no, any case; unset or empty: its default, off for GGML_CIQ_PLUGIN_GRAPHS,
 * GGML_CIQ_PLUGIN_STATS, GGML_CIQ_PLUGIN_ATTENTION and GGML_CIQ_PLUGIN_TIMELINE, else on; GGML_CIQ_PLUGIN_GROUP on
 * since API v29). Another name, or a value the switch does not take: CIQ_ERR_INVALID_ARGUMENT naming it. */
ciq_status ciq_switch_on(const char *name, int *on);
/* The registry's facts about a variant (CIQ_VARIANT_AUTO included). */
ciq_status ciq_variant_describe(ciq_variant variant, ciq_variant_info *info);

/* Devices and memory. */
ciq_status ciq_device_count(int *count);
ciq_status ciq_device_name(int device, char *buffer, size_t buffer_size);
ciq_status ciq_variant_available(int device, ciq_variant variant, int *available);
ciq_status ciq_memory_alloc(int device, size_t nbytes, void **ptr);
ciq_status ciq_memory_free(int device, void *ptr);
ciq_status ciq_memory_upload(int device, void *dst, const void *host_src, size_t nbytes);
ciq_status ciq_memory_download(int device, void *host_dst, const void *src, size_t nbytes);
ciq_status ciq_memory_fill(int device, void *dst, int value, size_t nbytes);
ciq_status ciq_device_synchronize(int device);
ciq_status ciq_threads_set(int threads); /* CPU kernels; <= 0 means all cores */

/* Activations. The layout a semantics uses for a weight type; its size; X quantized (or converted) into it.
 * K must be a multiple of 256 (Q8_K), 128 (q8_1-mmq), 64 (f16) or 32 (q8_0 and q8_1-cpu host only, q8_1). */
ciq_status ciq_activations_layout(ciq_semantics semantics, ciq_type type, ciq_layout *layout);
ciq_status ciq_activations_size(ciq_layout layout, int64_t tokens, int64_t k, size_t *bytes);
ciq_status ciq_activations_quantize(int device, ciq_layout layout, const float *x, void *out, int64_t tokens, int64_t k);

/* Resolve once: AUTO via GGML_CIQ_VARIANT or the registry's AUTO order, availability, semantics, shape and type
 * checks. */
ciq_status ciq_gemm_plan(int device, ciq_variant variant, ciq_semantics semantics, ciq_type type,
                         int64_t rows, int64_t k, int64_t tokens, ciq_plan *plan);
/* out[tokens][rows] = X @ W^T for every weight type a variant covers. Plans once, quantizes X into internal scratch,
 * runs, counts the dispatch. weight_nbytes must equal rows * (K / block values) * block bytes.
 * 32-block types (the q32 variant), llama.cpp's formulas:
 * MMQ semantics (host and GPU; K a multiple of 128): X as q8_1-mmq (D4; DS4 for Q4_0, whose d8 is then the fp16
 * one), weights as int8 (Q4_0 q-8, Q5_0 q-16, Q8_0 q) with their fp16 d; per 32-value block in K order,
 * acc = fma(float(isum) * d_w, d8, acc).
 * CPU semantics (host only; K a multiple of 32), llama.cpp x86 CPU's (llamafile tinyBLAS_Q0_AVX): X as q8_0, eight
 * lanes of 4-value integer dot products per block, lane l = fma(d_w * d_x, lane sum, lane l) over the blocks,
 * out = ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)). Q4_1 / Q5_1 (CPU semantics only, host only), llama.cpp x86 CPU's
 * ggml_vec_dot_q{4,5}_1_q8_1: X as q8_1-cpu, the same eight lanes of the unsigned weight quants (0..15 / 0..31),
 * lane l = fma(d_w * d_x, lane sum, lane l), beside summs = fma(m_w, s_x, summs) over the blocks in order,
 * out = ((l4+l0)+(l6+l2)) + ((l5+l1)+(l7+l3)) + summs. The q32 variant writes float32 only. */
ciq_status ciq_gemm(int device, ciq_variant variant, ciq_semantics semantics, ciq_type type,
                    const void *weight, size_t weight_nbytes, int64_t rows, int64_t k,
                    const float *x, int64_t tokens, void *out, ciq_out_type out_type);
/* The same on activations already quantized per plan->activation_layout: no re-resolution. */
ciq_status ciq_gemm_quantized(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                              size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized,
                              int64_t tokens, void *out, ciq_out_type out_type);
/* One output of ciq_gemm_quantized_outputs: the next `rows` rows of the product. */
typedef struct {
    int64_t      rows;
    void        *out;  /* [tokens][rows] of the call's out_type */
    const float *add;  /* NULL, or float32 [tokens][rows] added to the product (CIQ_OUT_F32 only; no output may
                          overlap an addend or another output) */
} ciq_gemm_output;
/* ciq_gemm_quantized of one weight whose rows are several matrices of one type and K stacked (q/k/v, gate/up),
 * its product split among n_outputs (1..4) outputs, each plus an optional addend (a residual): the values of
 * ciq_gemm_quantized of the whole weight, then ciq_add. wgmma writes the outputs and adds from its epilogue (one
 * launch, counted once) where every output but the last has a multiple of 128 rows; elsewhere the whole product goes
 * to internal scratch, is copied out and added (the same values). The outputs' rows sum to rows. */
ciq_status ciq_gemm_quantized_outputs(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                                      size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized,
                                      int64_t tokens, const ciq_gemm_output *outputs, int n_outputs,
                                      ciq_out_type out_type);
/* One weight of ciq_gemm_quantized_group: ciq_gemm_quantized_outputs' arguments but the shared K and activations. */
typedef struct {
    const ciq_plan        *plan;
    ciq_type               type;
    const void            *weight;
    size_t                 weight_nbytes;
    int64_t                rows;
    const ciq_gemm_output *outputs;
    int                    n_outputs;
} ciq_gemm_weight;
/* ciq_gemm_quantized_outputs of n_weights (1..3) weights of one K on the same activations x_quantized (the layout of
 * every plan): the semantics of those calls, in one launch where wgmma can (q, k and v apart: llama.cpp's tensors):
 * every plan wgmma's, every weight staged by TMA (Q4_K, Q5_K; Q6_K with K a multiple of 2048; the RS form), of one
 * type, or Q4_K ones and Q6_K ones (launched Q4_K first: the outputs follow their weights), each weight but the last of
 * that order a multiple of 128 rows and all outputs 1..4; GGML_CIQ_WGMMA_GROUP=0 turns it off, =1 (the default) keeps
 * it where the time model gains. One plan then covers the problems, so its split-K may differ from theirs apart
 * (float32 sums in another order, as a stacked weight's). Elsewhere one call per weight. Counts one dispatch per
 * weight; a grouped launch counts CIQ_WGMMA_FORM_GROUPED too. No output may overlap another output or an addend. */
ciq_status ciq_gemm_quantized_group(int device, const ciq_gemm_weight *weights, int n_weights, int64_t k,
                                    const void *x_quantized, int64_t tokens, ciq_out_type out_type);
/* Launches per resolved variant and weight type since the last reset (every variant, q32 included). */
ciq_status ciq_dispatch_count(ciq_variant variant, ciq_type type, uint64_t *count);
/* Zeroes every dispatch counter: GEMM (wgmma's forms too) and attention. */
ciq_status ciq_dispatch_reset(void);
/* The wgmma variant's kernel launches by form since ciq_dispatch_reset (a plan with a tail launches two kernels): SS,
 * the A tiles dequantized into shared memory by producer warps; RS, the A fragments dequantized in the consumer warps'
 * registers (Q4_K, Q6_K with K % 2048 == 0: the weights staged by TMA; GGML_CIQ_WGMMA_RS=0 turns it off); STREAM_K,
 * the launches of either form that stream K units between CTAs (GGML_CIQ_WGMMA_STREAMK); GROUPED, the RS launches over
 * two weights (ciq_gemm_quantized_group); GLU, the launches whose epilogue applied a GLU (ciq_gemm_quantized_glu).
 * 0 where nothing ran them. */
typedef enum {
    CIQ_WGMMA_FORM_SS = 0, CIQ_WGMMA_FORM_RS = 1, CIQ_WGMMA_FORM_STREAM_K = 2, CIQ_WGMMA_FORM_GROUPED = 3,
    CIQ_WGMMA_FORM_GLU = 4
} ciq_wgmma_form;
ciq_status ciq_wgmma_launch_count(ciq_wgmma_form form, uint64_t *count);

/* Dense bf16 GEMM (cuBLAS, GPU only), out = X @ W^T with W [rows][K] and X [tokens][K] in bf16: the ceiling
 * keep-quant kernels are compared with. */
ciq_status ciq_gemm_dense_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x,
                               int64_t tokens, void *out, ciq_out_type out_type);

/* Device timing on the stream the kernels use (host wall clock on the CPU): start; optionally mark the end without
 * waiting for the device; stop returns the milliseconds from start to the mark (or to now, unmarked), waiting for
 * the device if needed, and frees the timer. */
ciq_status ciq_timer_start(int device, void **timer);
ciq_status ciq_timer_mark(void *timer);
ciq_status ciq_timer_stop(void *timer, float *milliseconds);

/* CUDA graphs of a sequence of GPU calls. Between ciq_graph_capture_begin and ciq_graph_capture_end this thread's
 * calls on that GPU are recorded into a graph, not run (on a stream of the thread's own; other threads are not
 * captured). Inside a capture: no ciq_memory_upload/download and no timers (they would fail or end the capture), and
 * every GEMM must have run once with the same shapes before (its scratch buffer cannot grow in a capture). The graph
 * keeps every address it was captured with: the caller keeps those buffers alive and fills its inputs before each
 * ciq_graph_launch, which replays it after the work already issued on the legacy default stream (and before any
 * issued after). A launch fails as stale once the library's scratch buffers have moved (capture it again). CPU:
 * CIQ_ERR_UNSUPPORTED. */
ciq_status ciq_graph_capture_begin(int device);
ciq_status ciq_graph_capture_end(int device, void **graph);
ciq_status ciq_graph_launch(void *graph);
ciq_status ciq_graph_free(void *graph);

/* Ordering this thread's GPU calls against another library's CUDA streams (the ggml plugin against ggml-cuda's)
 * without a host wait. event is a cudaEvent_t created on that GPU by the other library. wait: this thread's later
 * calls on device run after the work event recorded (cudaStreamWaitEvent on the stream they are issued to); record:
 * event records this thread's calls issued so far on device (cudaEventRecord), for the other library to wait on.
 * Both may run inside a capture. CPU: CIQ_ERR_UNSUPPORTED. */
ciq_status ciq_stream_wait_event(int device, void *event);
ciq_status ciq_stream_record_event(int device, void *event);

/* Transformer ops for the prefill engine. Tensors are contiguous and row-major (rows first, features last), all
 * float math is float32, f16 is IEEE half (the K/V cache), bf16 the upper half of a float32. out may equal an
 * input (same shape) except for ciq_attention. Float order per device and ciq_op_order: native/src/cpu/ops.cpp,
 * cuda/ops.cu, cuda/ops_llamacpp.cu. */
typedef enum {             /* ggml's rope modes */
    CIQ_ROPE_NORM = 0,     /* rotates dimension pairs (2i, 2i+1) */
    CIQ_ROPE_NEOX = 2      /* rotates dimension pairs (i, i + head_dim/2) */
} ciq_rope_mode;

typedef enum {
    CIQ_GLU_SILU = 0,      /* silu(gate) * up */
    CIQ_GLU_GELU = 1       /* tanh-GELU(gate) * up: CPU through ggml's fp16 table, GPU in float */
} ciq_glu_kind;

typedef enum {
    CIQ_ATTENTION_AUTO = 0, /* CPU: cpu; GPU: wgmma, else mma, else simt, the first that runs */
    CIQ_ATTENTION_CPU = 1,  /* host kernel */
    CIQ_ATTENTION_SIMT = 2, /* GPU, CUDA cores: float32 q.k and p.v */
    CIQ_ATTENTION_MMA = 3,  /* GPU sm_80+ (CUDA), mma.sync m16n8k16: q and p rounded to f16, float32 accumulation */
    CIQ_ATTENTION_GGML = 4, /* host, llama.cpp x86 CPU's arithmetic without flash attention (cpu/ops.cpp) */
    CIQ_ATTENTION_MMA_LLAMACPP = 5, /* GPU sm_80+ (CUDA): llama.cpp CUDA's flash attention for prefill, operation for
                                      operation: its tiles, key chunks, f16 p.v sums and stream-k split (its CTAs
                                      per SM: GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM, default 2) */
    CIQ_ATTENTION_WGMMA = 6 /* GPU sm_90a (a build carrying it), head_dim 64/128/256: mma's semantics (q and p rounded
                               to f16, float32 softmax and accumulation) on wgmma + TMA, 64-128 queries a CTA. AUTO takes
                               it where it runs unless GGML_CIQ_ATTENTION_WGMMA=0 */
} ciq_attention_kernel;

typedef enum {                 /* whose float order the norm, RoPE and GLU ops follow */
    CIQ_ORDER_HOST = 0,         /* llama.cpp CPU's (x86) order with IEEE float ops, on either device */
    CIQ_ORDER_LLAMACPP_CUDA = 1, /* GPU only: llama.cpp CUDA's kernels' expressions and its -use_fast_math build */
    CIQ_ORDER_LLAMACPP_CPU = 2   /* host only: llama.cpp x86 AVX2 build's SIMD expressions where they are not HOST's:
                                    SiLU as ggml_vec_swiglu_f32 (per 8 values from 0: x / (1 + ggml_v_expf(-x)); the
                                    n % 8 last: expf). Every other op: HOST's values */
} ciq_op_order;

/* out[n][d] = x * 1/sqrt(mean(x^2) + eps), then * weight[d] unless weight is NULL (ggml rms_norm, mul), then
 * + add[n][d] unless add is NULL (ggml add; with a weight llama.cpp CUDA fuses it: one FMA in its order). */
ciq_status ciq_rms_norm(int device, ciq_op_order order, const float *x, const float *weight, const float *add,
                        float eps, int64_t n, int64_t d, float *out);
/* RoPE on x[tokens][heads][head_dim] over all head_dim dims: angle positions[t] * base^(-2i/head_dim). */
ciq_status ciq_rope(int device, ciq_op_order order, ciq_rope_mode mode, const float *x, const int32_t *positions,
                    int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out);
/* ciq_rms_norm (with a weight[head_dim], over rows x[tokens][heads][:]) then ciq_rope, as one op: the host order
 * runs the two in turn; llama.cpp CUDA's order is its fused RMS_NORM + MUL + ROPE kernel, which ggml-cuda runs where
 * a graph ropes a normed q or k (Gemma 3, Qwen 3) and whose float order is not its separate kernels'. */
ciq_status ciq_rms_norm_rope(int device, ciq_op_order order, ciq_rope_mode mode, const float *x, const float *weight,
                             float eps, const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                             float base, float *out);
/* Causal GQA: out[t][h*head_dim + e] from q[t][h][:], caches [cache_rows][heads_kv][head_dim] f16 holding
 * positions 0..n_past+tokens-1. Query t (position n_past + t) sees key p when p <= n_past + t and (window == 0 or
 * n_past + t - p < window); head h reads kv head h / (heads / heads_kv). Softmax of scale * q.k in float32. */
ciq_status ciq_attention(int device, ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                         const uint16_t *v_cache, int64_t tokens, int64_t heads, int64_t heads_kv, int64_t head_dim,
                         int64_t cache_rows, int64_t n_past, float scale, int64_t window, float *out);
/* ggml's FLASH_ATTN_EXT without ALiBi, soft-capping or sinks (the ggml plugin's attention): out[t][h*head_dim + e]
 * from q[t][h][:] and the first n_kv rows of the caches ([rows][heads_kv][head_dim] f16, heads a multiple of heads_kv),
 * each score scale * q.k + mask[t * mask_row + p] (f16; llama.cpp's masks hold 0 and -inf, and a key at -inf weighs
 * nothing). Keys ascending as ciq_attention's; a row whose keys are all at -inf gets zeros. kernel: AUTO (as
 * ciq_attention's: a GPU's wgmma, mma or simt; the host: cpu), CPU, SIMT, MMA or WGMMA (GGML and MMA_LLAMACPP:
 * CIQ_ERR_UNSUPPORTED). A GPU first marks the 64 x 64 mask tiles (one launch for all heads): none above -inf, all 0
 * (read no mask there), or mixed; a query tile walks its key tiles from the first marked to the last. */
ciq_status ciq_attention_masked(int device, ciq_attention_kernel kernel, const float *q, const uint16_t *k_cache,
                                const uint16_t *v_cache, const uint16_t *mask, int64_t mask_row, int64_t tokens,
                                int64_t heads, int64_t heads_kv, int64_t head_dim, int64_t n_kv, float scale,
                                float *out);
/* Which kernel ciq_attention runs for this request on this device (AUTO resolved, availability checked). */
ciq_status ciq_attention_resolve(int device, ciq_attention_kernel kernel, int64_t head_dim,
                                 ciq_attention_kernel *resolved);
/* ciq_attention launches per resolved kernel since ciq_dispatch_reset. */
ciq_status ciq_attention_dispatch_count(ciq_attention_kernel kernel, uint64_t *count);
/* ciq_rope of q [tokens][heads][head_dim] into q_out (may be q), of k [tokens][heads_kv][head_dim] into rows start..
 * of k_cache as ciq_kv_store stores, and v (NULL: none) stored into v_cache likewise, in one call: the values of those
 * calls. A GPU fuses them in the host order (one kernel, no float32 roped k; llama.cpp CUDA's order
 * CIQ_ERR_UNSUPPORTED); the host runs them in turn. */
ciq_status ciq_rope_kv_store(int device, ciq_op_order order, ciq_rope_mode mode, const float *q, const float *k,
                             const float *v, const int32_t *positions, int64_t tokens, int64_t heads, int64_t heads_kv,
                             int64_t head_dim, float base, int64_t start, float *q_out, uint16_t *k_cache,
                             uint16_t *v_cache);
/* cache[start + t][:] = x[t][:] rounded to f16 (nearest even); row_values = heads_kv * head_dim. */
ciq_status ciq_kv_store(int device, uint16_t *cache, int64_t start, const float *x, int64_t tokens,
                        int64_t row_values);
/* table[ids[i]][0..k) = x[i][:] rounded to f16 (nearest even) for i < n: ggml's SET_ROWS of float32 rows into an f16
 * tensor (a K/V cache); table rows are row_stride values apart (>= k). ids are int64 (llama.cpp's KV indices); an id
 * outside [0, table_rows) is an error on the host and is skipped on a GPU (ids live in its memory). */
ciq_status ciq_rows_set_f16(int device, const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                            int64_t table_rows, int64_t row_stride);
/* llama.cpp's attention inputs as its graph writes them, in one call (the ggml plugin's q RoPE, k RoPE + K cache
 * write, V cache write): q [tokens][heads][head_dim] roped into q_out (may be q; q NULL: no q), k
 * [tokens][heads_kv][head_dim] roped and rounded to f16 into k_table row k_ids[t], v [tokens][v_k] (NULL: no v)
 * rounded into v_table row v_ids[t] (tables as ciq_rows_set_f16's: rows row_stride values apart; an id outside
 * [0, table_rows) is an error on the host, skipped on a GPU). RoPE as ciq_rope. order: HOST on the host (ciq_rope,
 * ciq_rope, ciq_rows_set_f16, ciq_rows_set_f16 in turn); LLAMACPP_CUDA on a GPU, one kernel with ggml-cuda's values
 * (its RoPE with the fused ROPE + VIEW + SET_ROWS store, its SET_ROWS); a GPU's host order: CIQ_ERR_UNSUPPORTED. */
ciq_status ciq_rope_rows_set_f16(int device, ciq_op_order order, ciq_rope_mode mode, const int32_t *positions,
                                 int64_t tokens, int64_t head_dim, float base, const float *q, int64_t heads,
                                 float *q_out, const float *k, int64_t heads_kv, const float *v, int64_t v_k,
                                 const int64_t *k_ids, uint16_t *k_table, int64_t k_table_rows, int64_t k_row_stride,
                                 const int64_t *v_ids, uint16_t *v_table, int64_t v_table_rows,
                                 int64_t v_row_stride);
/* out[i] = act(gate[i]) * up[i] for n values. */
ciq_status ciq_glu(int device, ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up,
                   int64_t n, float *out);
/* ciq_glu of gate, up [tokens][k] then ciq_activations_quantize of its output into layout, in one call: the same
 * bytes as the two calls. A GPU fuses the two for the host order and CIQ_LAYOUT_F16 (one kernel: no float32
 * intermediate; the layout of f16-semantics GEMMs such as a down projection after its gate/up GLU) and runs no other
 * combination (CIQ_ERR_UNSUPPORTED); the host runs the two in turn for every layout it makes. */
ciq_status ciq_glu_activations(int device, ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up,
                               int64_t tokens, int64_t k, ciq_layout layout, void *out);
/* A gate/up weight for ciq_gemm_quantized_glu: rows 128j .. 128j+63 are gate's rows 64j .. 64j+63, rows 128j+64 ..
 * 128j+127 up's same rows (both matrices [rows/2][K] of one type, rows/2 a multiple of 64). */
typedef enum { CIQ_GLU_INTERLEAVE = 64 } ciq_glu_interleave_rows;
/* out[tokens][rows/2] (float32) = ciq_glu (the host order) of the product's gate and up halves: the values of
 * ciq_gemm_quantized of the interleaved weight, its halves taken apart, then ciq_glu. wgmma applies the GLU in its
 * epilogue (one launch, counted CIQ_WGMMA_FORM_GLU too: no gate/up product in memory); every other plan writes the
 * product to internal scratch and runs the three steps. */
ciq_status ciq_gemm_quantized_glu(int device, const ciq_plan *plan, ciq_type type, const void *weight,
                                  size_t weight_nbytes, int64_t rows, int64_t k, const void *x_quantized,
                                  int64_t tokens, ciq_glu_kind kind, float *out);
/* ciq_gemm_quantized_glu's values from two matrices gate, up [rows][K] of one type (llama.cpp's ffn_gate and
 * ffn_up): out[tokens][rows] (float32) = ciq_glu (the host order) of ciq_gemm_quantized of gate and of up under plan
 * (planned for either; weight_nbytes each's). wgmma applies the GLU in its epilogue where both are staged by TMA
 * (Q4_K, Q5_K; Q6_K with K a multiple of 2048) and rows is a multiple of CIQ_GLU_INTERLEAVE (one launch, counted
 * CIQ_WGMMA_FORM_GLU: each tile stages 64 rows of each, ciq_gemm_quantized_glu's interleaved tile); every other plan
 * writes gate's product into out and up's into internal scratch, then runs ciq_glu. Counts two dispatches. out may not
 * overlap a weight or x_quantized. */
ciq_status ciq_gemm_quantized_glu_pair(int device, const ciq_plan *plan, ciq_type type, const void *gate,
                                       const void *up, size_t weight_nbytes, int64_t rows, int64_t k,
                                       const void *x_quantized, int64_t tokens, ciq_glu_kind kind, float *out);
/* ciq_rms_norm of x [tokens][k] (times weight unless NULL, no add) then ciq_activations_quantize of its output into
 * layout, in one call: the same bytes as the two calls. Fused on a GPU as ciq_glu_activations is (the host order, the
 * f16 layout; other combinations CIQ_ERR_UNSUPPORTED); the host runs the two in turn. */
ciq_status ciq_rms_norm_activations(int device, ciq_op_order order, const float *x, const float *weight, float eps,
                                    int64_t tokens, int64_t k, ciq_layout layout, void *out);
/* out[i] = a[i] + b[i % b_n] for n values (b_n divides n: a bias row repeated over rows). */
ciq_status ciq_add(int device, const float *a, int64_t n, const float *b, int64_t b_n, float *out);
ciq_status ciq_scale(int device, const float *x, float s, int64_t n, float *out);       /* out = x * s */
/* out[i][:] = row ids[i] of table [table_rows][k] (any ciq_type) dequantized to float32 as ggml does. */
ciq_status ciq_rows_get(int device, ciq_type type, const void *table, int64_t table_rows, int64_t k,
                        const int32_t *ids, int64_t n, float *out);
/* A whole [rows][k] tensor of any ciq_type dequantized to bf16 (float32 value rounded to nearest even). */
ciq_status ciq_tensor_dequantize_bf16(int device, ciq_type type, const void *data, int64_t rows, int64_t k, void *out);
/* out[i] = x[i] rounded to bf16 (nearest even), n values. */
ciq_status ciq_values_convert_bf16(int device, const float *x, int64_t n, void *out);
/* CDEF-END */

#ifdef __cplusplus
}
#endif
#endif /* GGML_CIQ_H */
