// Shared device helpers for the CUDA kernels: block layouts, scale unpacking, output stores, error checks.
#pragma once
#include "cuda_backend.h"
#include "vendor.cuh"
#include "../fp16.h"  // after vendor.cuh (cuda_fp16.h): ciq_half_to_float and the bit-pattern reads

#include <algorithm>
#include <atomic>

// The stream every kernel of this library launches on (<<<grid, block, smem, ciq_stream()>>>): the legacy default
// stream, except on a thread that is capturing a CUDA graph (ciq_graph_capture_begin): then its capture stream.
cudaStream_t ciq_stream();

#define CIQ_CUDA_LAUNCH_CHECK(what)                                                                   \
    do {                                                                                              \
        cudaError_t err_ = cudaGetLastError();                                                        \
        if (err_ != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(err_)); \
    } while (0)

#if !defined(GGML_CIQ_HIP)
// Raises KERNEL's dynamic shared memory limit to `bytes`, once per device (GPUs past the 64th: on every call).
// CUDA-only, as its users (mma, wgmma) are.
template <auto KERNEL> static ciq_status ciq_raise_smem_limit(int bytes, const char *what) {
    static std::atomic<uint64_t> raised{0};
    int device = 64;
    cudaGetDevice(&device);
    const uint64_t bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
    if (bit && (raised.load() & bit)) return CIQ_OK;
    const cudaError_t err = cudaFuncSetAttribute(KERNEL, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();  // consumed here, not reported again by the next launch check
        return ciq_fail(CIQ_ERR_BACKEND, "%s: cudaFuncSetAttribute: %s", what, cudaGetErrorString(err));
    }
    raised.fetch_or(bit);
    return CIQ_OK;
}
#endif

// The current GPU and its SM count, for the kernels that size a grid as llama.cpp does (its stream-k grids).
static inline ciq_status ciq_current_gpu_sms(const char *what, int *device, int *sms) {
    *device = 0;
    *sms = 0;
    cudaGetDevice(device);
    if (cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *device) != cudaSuccess || *sms < 1) {
        cudaGetLastError();
        return ciq_fail(CIQ_ERR_BACKEND, "%s: cannot read GPU %d's SM count", what, *device);
    }
    return CIQ_OK;
}

// The GLU of one value in the host's float order (CIQ_ORDER_HOST: ciq_glu on a GPU, and the activation conversion
// that fuses it, convert_f16.cu): silu(g) = g / (1 + expf(-g)); gelu as llama.cpp CUDA's ggml_cuda_op_gelu_single
// (tanh GELU in float, no fp16 table); times up.
static __device__ __forceinline__ float ciq_gelu_float(float x) {
    const float inner = __fmul_rn(__fmul_rn(0.79788456080286535587989211986876f, x),
                                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(0.044715f, x), x)));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}
static __device__ __forceinline__ float ciq_glu_value(bool gelu, float g, float u) {
    const float act = gelu ? ciq_gelu_float(g) : __fdiv_rn(g, __fadd_rn(1.0f, expf(-g)));
    return __fmul_rn(act, u);
}

// Elementwise kernels (ops.cu, ops_llamacpp.cu): blocks of CIQ_ELEMENTWISE_THREADS, a grid-stride loop over int64
// indices from ciq_first_index() in steps of ciq_index_stride(), at most 8 x 65535 blocks.
constexpr int CIQ_ELEMENTWISE_THREADS = 256;
static inline unsigned ciq_grid_for(int64_t n) {
    return (unsigned)std::min<int64_t>((n + CIQ_ELEMENTWISE_THREADS - 1) / CIQ_ELEMENTWISE_THREADS, 65535 * 8);
}
static __device__ __forceinline__ int64_t ciq_first_index() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
static __device__ __forceinline__ int64_t ciq_index_stride() { return (int64_t)gridDim.x * blockDim.x; }

// ggml's get_scale_min_k4: 6-bit scale and min of sub-block j (0..7) of a Q4_K super-block.
static __device__ __forceinline__ void ciq_q4_K_scale_min(int j, const uint8_t *q, int *sc, int *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

static __device__ __forceinline__ void ciq_store_out(void *out, int64_t index, float value, ciq_out_type out_type) {
    if (out_type == CIQ_OUT_F32) {
        ((float *)out)[index] = value;
    } else {
        ((__nv_bfloat16 *)out)[index] = __float2bfloat16(value);
    }
}

// Lets the grid launched after this one as a programmatic dependent (wgmma's PDL) start now; it waits for this
// grid's completion before reading its output (griddepcontrol.wait). sm_90 nvcc only: a no-op elsewhere.
static __device__ __forceinline__ void ciq_launch_dependents() {
#if defined(__CUDACC__) && !defined(GGML_CIQ_HIP) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// What every attention kernel is asked (ciq_cuda_attention*'s arguments; the window clamped to an int): each
// kernel's argument struct extends it (AttentionArgs, attention_split.cuh; LcArgs, attention_llamacpp.cu).
struct AttentionProblem {
    const float *q;
    const uint16_t *k, *v;
    float *out;
    int tokens, heads, heads_kv, n_past, window;
    float scale;
    // ciq_attention_masked (simt and mma only): keys 0..n_kv-1 for every query, each score plus mask[t * mask_row +
    // key] (f16 bits); marked[query tile * key_tiles + key tile] != 0 where that 64 x 64 mask tile holds a key above
    // -inf. mask == nullptr: positions, causality and the window as above.
    const uint16_t *mask = nullptr;
    int64_t mask_row = 0;
    const uint8_t *marked = nullptr;
    int n_kv = 0, key_tiles = 0;
};
static inline AttentionProblem attention_problem(const float *q, const uint16_t *k, const uint16_t *v, float *out,
                                                 int64_t tokens, int64_t heads, int64_t heads_kv, int64_t n_past,
                                                 int64_t window, float scale) {
    return {q, k, v, out, (int)tokens, (int)heads, (int)heads_kv, (int)n_past, (int)std::min<int64_t>(window, INT32_MAX),
            scale};
}

// A warp's xor-butterfly sum and maximum (every lane gets it).
static __device__ __forceinline__ float ciq_warp_sum(float v) {
#pragma unroll
    for (int offset = CIQ_WARP_SIZE / 2; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xFFFFFFFF, v, offset);
    return v;
}
static __device__ __forceinline__ float ciq_warp_max(float v) {
#pragma unroll
    for (int offset = CIQ_WARP_SIZE / 2; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFF, v, offset));
    return v;
}
// The maximum over a block of CIQ_ELEMENTWISE_THREADS threads (every thread gets it); once per kernel (its shared
// slots are not fenced for a second call).
static __device__ __forceinline__ float ciq_block_max(float v) {
    __shared__ float warp_max[CIQ_ELEMENTWISE_THREADS / CIQ_WARP_SIZE];
    v = ciq_warp_max(v);
    if (threadIdx.x % CIQ_WARP_SIZE == 0) warp_max[threadIdx.x / CIQ_WARP_SIZE] = v;
    __syncthreads();
    v = warp_max[0];
#pragma unroll
    for (int w = 1; w < CIQ_ELEMENTWISE_THREADS / CIQ_WARP_SIZE; ++w) v = fmaxf(v, warp_max[w]);
    return v;
}

// The f16 activation layout's scale (blocks.h ciq_f16_scale_offset): 2^e with amax * 2^-e in [2^14, 2^15) (e >= -100
// for amax 0); writes 2^e to *scale unless NULL and returns the factor 2^-e the values are multiplied by. CUDA only,
// as the f16 layout.
#if !defined(GGML_CIQ_HIP)
static __device__ __forceinline__ float ciq_f16_up_scale(float amax, float *scale) {
    int e = 0;
    frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
    e = max(e, -100);
    if (scale) *scale = ldexpf(1.0f, e - 15);
    return ldexpf(1.0f, 15 - e);
}
#endif

// c + the dot product of a's and b's four signed bytes (dp4a; a loop on HIP).
static __device__ __forceinline__ int ciq_dot4(int a, int b, int c) {
#if defined(GGML_CIQ_HIP)
    for (int i = 0; i < 32; i += 8) c += (int)(int8_t)(a >> i) * (int)(int8_t)(b >> i);
    return c;
#else
    return __dp4a(a, b, c);
#endif
}
