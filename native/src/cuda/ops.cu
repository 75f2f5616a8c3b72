// ops.cu - the prefill engine's elementwise, norm, RoPE and row ops on the GPU (attention: attention.cu), in the
// host's float order (CIQ_ORDER_HOST); llama.cpp CUDA's order of the norm, RoPE and GLU is ops_llamacpp.cu.
//
// Float order, where it differs from the host (cpu/ops.cpp):
//   rms_norm : squares summed in float32 (rows of d <= 1024, d % 4 == 0, 16-byte aligned: a warp a row, lane j's
//              float4s j, j + 32, ... summed in order, then the xor butterfly; such rows up to 8192: a block a row,
//              thread j's float4s j, j + 256, ...; other rows: a block a row, per-thread sums strided by 256; a
//              block's warp trees then its 8 warp sums in order), mean = sum / d in float;
//              then 1/sqrtf(mean + eps), (x * scale) * weight as on the host (IEEE division and square root), then
//              + add in its own rounding.
//   rope     : the host's order exactly (theta stepped by the same float products, separate roundings), but CUDA's
//              cosf/sinf (<= 2 ulp) instead of the host libm's.
//   glu gelu : tanh GELU computed in float, as llama.cpp CUDA does (no fp16 table, no cut-offs).
//   silu, add, scale, kv_store, rows_set_f16, get_rows, bf16: the host's values bit for bit.
// Every kernel is a grid-stride loop over int64 indices, 256 threads per block.
#include "common.cuh"

#include "../dequantize.h"

#include <algorithm>
#include <cmath>

namespace {

constexpr int OPS_THREADS = CIQ_ELEMENTWISE_THREADS;

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {  // round to nearest even, NaN stays NaN
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 64);
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// 1 / sqrt(mean + eps) from a row's sum of squares, IEEE division and square root (the host's order).
__device__ __forceinline__ float rms_scale(float sum, int64_t d, float eps) {
    return __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sum, (float)d), eps)));
}

// A block's sum of its threads' sums: each warp's xor tree, then the warp sums in warp order (every thread gets it).
__device__ __forceinline__ float block_sum(float sum, float *warp_sums) {
    sum = ciq_warp_sum(sum);
    if (threadIdx.x % CIQ_WARP_SIZE == 0) warp_sums[threadIdx.x / CIQ_WARP_SIZE] = sum;
    __syncthreads();
    sum = 0.0f;
#pragma unroll
    for (int w = 0; w < OPS_THREADS / CIQ_WARP_SIZE; ++w) sum += warp_sums[w];
    return sum;
}

// One block per row.
__global__ void __launch_bounds__(OPS_THREADS)
rms_norm_kernel(const float *x, const float *__restrict__ weight, const float *add, float eps, int64_t d, float *out) {
    __shared__ float warp_sums[OPS_THREADS / CIQ_WARP_SIZE];
    const float *xr = x + (int64_t)blockIdx.x * d;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += OPS_THREADS) sum = __fadd_rn(sum, __fmul_rn(xr[i], xr[i]));
    const float scale = rms_scale(block_sum(sum, warp_sums), d, eps);
    float *o = out + (int64_t)blockIdx.x * d;
    const float *ar = add ? add + (int64_t)blockIdx.x * d : nullptr;
    for (int64_t i = threadIdx.x; i < d; i += OPS_THREADS) {
        const float v = __fmul_rn(xr[i], scale);
        const float w = weight ? __fmul_rn(v, weight[i]) : v;
        o[i] = ar ? __fadd_rn(w, ar[i]) : w;
    }
}

// Rows of d <= RMS_NORM_WARP_MAX values, d a multiple of 4, 16-byte aligned rows: a warp per row, RMS_NORM_ROWS rows per
// block. Lane j holds float4 j, j + 32, ... (V of them) in registers: every load is issued before the first add, then
// squares summed per lane in that order, the xor butterfly, and the outputs from the registers (out may be x or
// add: each lane rewrites what it read). q/k norms over 256-value heads and 640..1024-value hidden rows: one wave.
constexpr int64_t RMS_NORM_WARP_MAX = 1024;
constexpr int RMS_NORM_ROWS = 4;

// Which row kernel the host-order norm takes for rows of d (and so its float order), one choice for ciq_rms_norm and
// its f16 form: a warp a row (warp, v float4s a lane: 2, 4, 6, 8), a block a row with the row in registers (v float4s a
// thread: 2, 4, 8), or (v == 0) the strided kernel (other alignments, d % 4 != 0, d > 8192).
struct RmsRows {
    bool warp;
    int v;
};
RmsRows rms_rows(int64_t d, bool aligned) {
    if (!aligned || d % 4 != 0 || d > 8 * 4 * OPS_THREADS) return {false, 0};
    const bool warp = d <= RMS_NORM_WARP_MAX;
    const int64_t lanes = warp ? CIQ_WARP_SIZE : OPS_THREADS, per = (d / 4 + lanes - 1) / lanes;
    return {warp, per <= 2 ? 2 : per <= 4 ? 4 : warp && per <= 6 ? 6 : 8};
}

// A row held as float4s in registers, V a thread: float4 first + step * j (the row's float4 j... are values 4j..4j+3).
template <int V> struct Row4 {
    float4 v[V];
    __device__ __forceinline__ void load(const float *x, int first, int step, int d4) {
        const float4 *x4 = reinterpret_cast<const float4 *>(x);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const int i = first + step * j;
            v[j] = i < d4 ? x4[i] : float4{0.0f, 0.0f, 0.0f, 0.0f};
        }
    }
    __device__ __forceinline__ float sum_squares() const {  // the float4s in order, x y z w each
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < V; ++j) {
            sum = __fadd_rn(sum, __fmul_rn(v[j].x, v[j].x));
            sum = __fadd_rn(sum, __fmul_rn(v[j].y, v[j].y));
            sum = __fadd_rn(sum, __fmul_rn(v[j].z, v[j].z));
            sum = __fadd_rn(sum, __fmul_rn(v[j].w, v[j].w));
        }
        return sum;
    }
    // (v[j] * scale) * weight's float4 i (unless NULL): the norm's roundings.
    __device__ __forceinline__ float4 scaled(int j, int i, float scale, const float4 *w4) const {
        float4 r = {__fmul_rn(v[j].x, scale), __fmul_rn(v[j].y, scale), __fmul_rn(v[j].z, scale), __fmul_rn(v[j].w, scale)};
        if (w4) {
            const float4 w = w4[i];
            r = {__fmul_rn(r.x, w.x), __fmul_rn(r.y, w.y), __fmul_rn(r.z, w.z), __fmul_rn(r.w, w.w)};
        }
        return r;
    }
    // v = scaled(v) in place (store's values without the add).
    __device__ __forceinline__ void normalize(float scale, const float *weight, int first, int step, int d4) {
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const int i = first + step * j;
            if (i >= d4) break;
            v[j] = scaled(j, i, scale, reinterpret_cast<const float4 *>(weight));
        }
    }
    __device__ __forceinline__ float abs_max() const {  // past the row: zeros (load's padding)
        float m = 0.0f;
#pragma unroll
        for (int j = 0; j < V; ++j) m = fmaxf(m, fmaxf(fmaxf(fabsf(v[j].x), fabsf(v[j].y)), fmaxf(fabsf(v[j].z), fabsf(v[j].w))));
        return m;
    }
    // out = (v * scale) * weight (unless NULL) + add (unless NULL), rms_norm_kernel's roundings.
    __device__ __forceinline__ void store(float scale, const float *weight, const float *add, float *out, int first,
                                          int step, int d4) const {
        const float4 *w4 = reinterpret_cast<const float4 *>(weight), *a4 = reinterpret_cast<const float4 *>(add);
        float4 *o4 = reinterpret_cast<float4 *>(out);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const int i = first + step * j;
            if (i >= d4) break;
            float4 r = scaled(j, i, scale, w4);
            if (a4) {
                const float4 a = a4[i];
                r = {__fadd_rn(r.x, a.x), __fadd_rn(r.y, a.y), __fadd_rn(r.z, a.z), __fadd_rn(r.w, a.w)};
            }
            o4[i] = r;
        }
    }
};

template <int V>
__global__ void __launch_bounds__(RMS_NORM_ROWS * CIQ_WARP_SIZE)
rms_norm_warp_kernel(const float *x, const float *__restrict__ weight, const float *add, float eps, int64_t n, int d,
                     float *out) {
    const int64_t row = (int64_t)blockIdx.x * RMS_NORM_ROWS + threadIdx.x / CIQ_WARP_SIZE;
    if (row >= n) return;  // a whole warp
    const int lane = threadIdx.x % CIQ_WARP_SIZE, d4 = d / 4;
    Row4<V> r;
    r.load(x + row * d, lane, CIQ_WARP_SIZE, d4);
    r.store(rms_scale(ciq_warp_sum(r.sum_squares()), d, eps), weight, add ? add + row * d : nullptr, out + row * d, lane, CIQ_WARP_SIZE, d4);
}

// Rows of RMS_NORM_WARP_MAX < d <= 8192 values (d % 4 == 0, 16-byte aligned): a block of OPS_THREADS per row, thread
// j holding float4 j, j + OPS_THREADS, ... (V of them) in registers; the per-thread sums (float4s in order), the
// warp trees and the 8 warp sums in order as rms_norm_kernel.
template <int V>
__global__ void __launch_bounds__(OPS_THREADS)
rms_norm_block4_kernel(const float *x, const float *__restrict__ weight, const float *add, float eps, int d, float *out) {
    __shared__ float warp_sums[OPS_THREADS / CIQ_WARP_SIZE];
    const int d4 = d / 4;
    const int64_t row = blockIdx.x;
    Row4<V> r;
    r.load(x + row * d, threadIdx.x, OPS_THREADS, d4);
    r.store(rms_scale(block_sum(r.sum_squares(), warp_sums), d, eps), weight, add ? add + row * d : nullptr, out + row * d, threadIdx.x, OPS_THREADS, d4);
}

template <int V>
ciq_status launch_rms_norm_block4(const float *x, const float *weight, const float *add, float eps, int64_t n, int d,
                                  float *out) {
    for (int64_t row = 0; row < n; row += 65535) {  // grid.x limit per launch
        const int64_t rows = std::min<int64_t>(n - row, 65535);
        rms_norm_block4_kernel<V><<<(unsigned)rows, OPS_THREADS, 0, ciq_stream()>>>(
            x + row * d, weight, add ? add + row * d : nullptr, eps, d, out + row * d);
        CIQ_CUDA_LAUNCH_CHECK("rms_norm");
    }
    return CIQ_OK;
}

template <int V>
ciq_status launch_rms_norm_warp(const float *x, const float *weight, const float *add, float eps, int64_t n, int d,
                                float *out) {
    constexpr int64_t per_launch = (int64_t)RMS_NORM_ROWS << 30;  // grid.x < 2^31
    for (int64_t row = 0; row < n; row += per_launch) {
        const int64_t rows = std::min<int64_t>(n - row, per_launch);
        rms_norm_warp_kernel<V><<<(unsigned)((rows + RMS_NORM_ROWS - 1) / RMS_NORM_ROWS), RMS_NORM_ROWS * CIQ_WARP_SIZE,
                                  0, ciq_stream()>>>(x + row * d, weight, add ? add + row * d : nullptr, eps, rows, d,
                                                     out + row * d);
        CIQ_CUDA_LAUNCH_CHECK("rms_norm");
    }
    return CIQ_OK;
}

// ---- rms_norm into the f16 activation layout (ciq_rms_norm_activations; CUDA only, as the f16 layout) ------------
#if !defined(GGML_CIQ_HIP)
// The norm's values as ciq_cuda_rms_norm computes them for the row's shape (the warp, block4 or strided kernel's
// order, weight and no add), then convert_f16.cu's conversion: the token's largest |value| picks 2^e (ciq_f16_up_scale),
// xh = f16(value * 2^-e), scales[row] = 2^e. No float32 intermediate in memory.
// WARP: a warp per row (rms_norm_warp_kernel's order, RMS_NORM_ROWS rows a block); else a block per row
// (rms_norm_block4_kernel's).
template <int V, bool WARP>
__global__ void __launch_bounds__(WARP ? RMS_NORM_ROWS * CIQ_WARP_SIZE : OPS_THREADS)
rms_norm_f16_kernel(const float *x, const float *__restrict__ weight, float eps, int64_t n, int d, __half *xh,
                    float *scales) {
    ciq_launch_dependents();  // the GEMM after it (convert_f16.cu's kernel does the same)
    __shared__ float warp_sums[OPS_THREADS / CIQ_WARP_SIZE];
    const int64_t row = WARP ? (int64_t)blockIdx.x * RMS_NORM_ROWS + threadIdx.x / CIQ_WARP_SIZE : (int64_t)blockIdx.x;
    if (WARP && row >= n) return;  // a whole warp (no block-wide barrier in the warp form)
    const int d4 = d / 4, first = WARP ? (int)threadIdx.x % CIQ_WARP_SIZE : (int)threadIdx.x;
    const int step = WARP ? CIQ_WARP_SIZE : OPS_THREADS;
    Row4<V> r;
    r.load(x + row * d, first, step, d4);
    const float sum = WARP ? ciq_warp_sum(r.sum_squares()) : block_sum(r.sum_squares(), warp_sums);
    r.normalize(rms_scale(sum, d, eps), weight, first, step, d4);
    const float amax = WARP ? ciq_warp_max(r.abs_max()) : ciq_block_max(r.abs_max());
    const float up = ciq_f16_up_scale(amax, first == 0 ? scales + row : nullptr);
    __half *h = xh + row * d;
#pragma unroll
    for (int j = 0; j < V; ++j) {
        const int i = first + step * j;
        if (i >= d4) break;
        const __half2 lo = __floats2half2_rn(r.v[j].x * up, r.v[j].y * up), hi = __floats2half2_rn(r.v[j].z * up, r.v[j].w * up);
        *reinterpret_cast<__half2 *>(h + 4 * i) = lo;
        *reinterpret_cast<__half2 *>(h + 4 * i + 2) = hi;
    }
}

// Other rows (unaligned, or d > 8192): a block per row, rms_norm_kernel's strided sums; the values computed twice.
__global__ void __launch_bounds__(OPS_THREADS)
rms_norm_f16_strided_kernel(const float *x, const float *__restrict__ weight, float eps, int64_t d, __half *xh,
                            float *scales) {
    ciq_launch_dependents();
    __shared__ float warp_sums[OPS_THREADS / CIQ_WARP_SIZE];
    const int64_t row = blockIdx.x;
    const float *xr = x + row * d;
    float sum = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += OPS_THREADS) sum = __fadd_rn(sum, __fmul_rn(xr[i], xr[i]));
    const float scale = rms_scale(block_sum(sum, warp_sums), d, eps);
    auto value = [&](int64_t i) {
        const float v = __fmul_rn(xr[i], scale);
        return weight ? __fmul_rn(v, weight[i]) : v;
    };
    float m = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += OPS_THREADS) m = fmaxf(m, fabsf(value(i)));
    const float up = ciq_f16_up_scale(ciq_block_max(m), threadIdx.x == 0 ? scales + row : nullptr);
    __half *h = xh + row * d;
    for (int64_t i = 2 * threadIdx.x; i < d; i += 2 * OPS_THREADS)
        *reinterpret_cast<__half2 *>(h + i) = __floats2half2_rn(value(i) * up, value(i + 1) * up);
}

template <int V, bool WARP>
ciq_status launch_rms_norm_f16(const float *x, const float *weight, float eps, int64_t n, int d, __half *xh,
                               float *scales) {
    constexpr int64_t per_launch = WARP ? (int64_t)RMS_NORM_ROWS * 65535 : 65535;
    for (int64_t row = 0; row < n; row += per_launch) {
        const int64_t rows = std::min<int64_t>(n - row, per_launch);
        const unsigned grid = (unsigned)(WARP ? (rows + RMS_NORM_ROWS - 1) / RMS_NORM_ROWS : rows);
        rms_norm_f16_kernel<V, WARP><<<grid, WARP ? RMS_NORM_ROWS * CIQ_WARP_SIZE : OPS_THREADS, 0, ciq_stream()>>>(
            x + row * d, weight, eps, rows, d, xh + row * d, scales + row);
        CIQ_CUDA_LAUNCH_CHECK("rms_norm + convert_f16");
    }
    return CIQ_OK;
}
#endif  // !GGML_CIQ_HIP

// One thread per (token, group of ROPE_HEADS heads, dimension pair i), i fastest: theta_i = pos * theta_scale^i by the
// host's chain of float products (each group's thread computes it again: the same value), then the group's heads.
constexpr int64_t ROPE_HEADS = 4;

// Grid index idx of a RoPE launch over `groups` head groups a token: its token t, head group, the dimension pair's
// indices a, b (NORM: 2i, 2i + 1; NEOX: i, i + D/2) and the angle's cosine and sine, the angle position * theta_scale^i
// by the host's chain of float products.
struct RopeSlot {
    int64_t t, group, a, b;
    float c, s;
};
__device__ __forceinline__ RopeSlot rope_slot(int64_t idx, int64_t groups, int64_t half, const int32_t *positions,
                                              float theta_scale, bool neox) {
    const int64_t t = idx / (groups * half), group = idx / half % groups, i = idx % half;
    float theta = (float)positions[t];
    for (int64_t j = 0; j < i; ++j) theta = __fmul_rn(theta, theta_scale);
    return {t, group, neox ? i : 2 * i, neox ? i + half : 2 * i + 1, cosf(theta), sinf(theta)};
}

// One pair (x0, x1) rotated by the angle whose cosine and sine are c, s: the host's roundings.
__device__ __forceinline__ float2 rope_pair(float x0, float x1, float c, float s) {
    return float2{__fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s)), __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c))};
}

__device__ __forceinline__ uint16_t f16_bits(float x) { return __half_as_ushort(__float2half_rn(x)); }

__global__ void __launch_bounds__(OPS_THREADS)
rope_kernel(const float *__restrict__ x, const int32_t *__restrict__ positions, int64_t tokens, int64_t heads,
            int64_t head_dim, float theta_scale, bool neox, float *__restrict__ out) {
    const int64_t half = head_dim / 2, groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    for (int64_t idx = ciq_first_index(); idx < tokens * groups * half; idx += ciq_index_stride()) {
        const RopeSlot p = rope_slot(idx, groups, half, positions, theta_scale, neox);
        for (int64_t h = p.group * ROPE_HEADS; h < min(heads, (p.group + 1) * ROPE_HEADS); ++h) {
            const int64_t base = (p.t * heads + h) * head_dim;
            const float2 r = rope_pair(x[base + p.a], x[base + p.b], p.c, p.s);
            out[base + p.a] = r.x;
            out[base + p.b] = r.y;
        }
    }
}

// rope_kernel over q's head groups and then k's, a token's q and k groups from one angle computation each: q into
// q_out (float32; may be q), k rounded to f16 into k_out (its cache rows), v (unless NULL) rounded into v_out.
__global__ void __launch_bounds__(OPS_THREADS)
rope_kv_kernel(const float *q, const float *__restrict__ k, const float *__restrict__ v,
               const int32_t *__restrict__ positions, int64_t tokens, int64_t heads, int64_t heads_kv,
               int64_t head_dim, float theta_scale, bool neox, float *q_out, uint16_t *__restrict__ k_out,
               uint16_t *__restrict__ v_out) {
    const int64_t half = head_dim / 2, groups_q = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    const int64_t groups = groups_q + (heads_kv + ROPE_HEADS - 1) / ROPE_HEADS;
    for (int64_t idx = ciq_first_index(); idx < tokens * groups * half; idx += ciq_index_stride()) {
        const RopeSlot p = rope_slot(idx, groups, half, positions, theta_scale, neox);
        const int64_t a = p.a, b = p.b;
        if (p.group < groups_q) {
            for (int64_t h = p.group * ROPE_HEADS; h < min(heads, (p.group + 1) * ROPE_HEADS); ++h) {
                const int64_t base = (p.t * heads + h) * head_dim;
                const float2 r = rope_pair(q[base + a], q[base + b], p.c, p.s);
                q_out[base + a] = r.x;
                q_out[base + b] = r.y;
            }
        } else {
            const int64_t g = p.group - groups_q;
            for (int64_t h = g * ROPE_HEADS; h < min(heads_kv, (g + 1) * ROPE_HEADS); ++h) {
                const int64_t base = (p.t * heads_kv + h) * head_dim;
                const float2 r = rope_pair(k[base + a], k[base + b], p.c, p.s);
                k_out[base + a] = f16_bits(r.x);
                k_out[base + b] = f16_bits(r.y);
                if (v) {
                    v_out[base + a] = f16_bits(v[base + a]);
                    v_out[base + b] = f16_bits(v[base + b]);
                }
            }
        }
    }
}

__global__ void __launch_bounds__(OPS_THREADS)
kv_store_kernel(uint16_t *__restrict__ dst, const float *__restrict__ x, int64_t n) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) dst[i] = f16_bits(x[i]);
}

// ciq_rows_set_f16: value i of the n x k rows goes to table[ids[i / k]][i % k]; a row whose id is outside the table
// is skipped (ggml asserts it on the host; here ids are device data). Index is uint32_t where n * k fits an int32_t (every
// cache write: a 32-bit division a value, not a 64-bit one), else int64_t.
template <typename Index>
__global__ void __launch_bounds__(OPS_THREADS)
rows_set_f16_kernel(const float *__restrict__ x, Index n, Index k, const int64_t *__restrict__ ids,
                    uint16_t *__restrict__ table, int64_t table_rows, int64_t row_stride) {
    for (Index i = (Index)ciq_first_index(); i < n * k; i += (Index)ciq_index_stride()) {
        const Index r = i / k;
        const int64_t id = ids[r];
        if (id >= 0 && id < table_rows) table[id * row_stride + i % k] = f16_bits(x[i]);
    }
}

__global__ void __launch_bounds__(OPS_THREADS)
glu_kernel(bool gelu, const float *__restrict__ gate, const float *__restrict__ up, int64_t n, float *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) {
        out[i] = ciq_glu_value(gelu, gate[i], up[i]);
    }
}

// glu on float4s (n % 4 == 0, 16-byte aligned): the same per-value expression, a quarter of the memory instructions.
__global__ void __launch_bounds__(OPS_THREADS)
glu4_kernel(bool gelu, const float4 *__restrict__ gate, const float4 *__restrict__ up, int64_t n4,
            float4 *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n4; i += ciq_index_stride()) {
        const float4 g = gate[i], u = up[i];
        const float gv[4] = {g.x, g.y, g.z, g.w}, uv[4] = {u.x, u.y, u.z, u.w};
        float r[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) r[e] = ciq_glu_value(gelu, gv[e], uv[e]);
        out[i] = float4{r[0], r[1], r[2], r[3]};
    }
}

__global__ void __launch_bounds__(OPS_THREADS)
add4_kernel(const float4 *__restrict__ a, const float4 *__restrict__ b, int64_t n4, float4 *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n4; i += ciq_index_stride()) {
        const float4 x = a[i], y = b[i];
        out[i] = float4{__fadd_rn(x.x, y.x), __fadd_rn(x.y, y.y), __fadd_rn(x.z, y.z), __fadd_rn(x.w, y.w)};
    }
}

__global__ void __launch_bounds__(OPS_THREADS)
add_kernel(const float *__restrict__ a, int64_t n, const float *__restrict__ b, int64_t b_n, float *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) out[i] = __fadd_rn(a[i], b[b_n == n ? i : i % b_n]);
}

__global__ void __launch_bounds__(OPS_THREADS) scale_kernel(const float *__restrict__ x, float s, int64_t n, float *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) out[i] = __fmul_rn(x[i], s);
}

// One thread per output value; rows of ids outside [0, table_rows) are NaN.
__global__ void __launch_bounds__(OPS_THREADS)
get_rows_kernel(int type, const uint8_t *__restrict__ table, int64_t table_rows, int64_t k,
                const int32_t *__restrict__ ids, int64_t n, float *__restrict__ out) {
    const int values = ciq_block_values(type), bytes = ciq_block_bytes(type);
    const int64_t row_bytes = k / values * bytes;
    for (int64_t idx = ciq_first_index(); idx < n * k; idx += ciq_index_stride()) {
        const int64_t r = idx / k, i = idx % k;
        const int32_t id = ids[r];
        out[idx] = id < 0 || id >= table_rows
                       ? __uint_as_float(0x7FC00000u)
                       : ciq_dequantize_value(type, table + id * row_bytes + i / values * bytes, (int)(i % values));
    }
}

__global__ void __launch_bounds__(OPS_THREADS)
dequantize_bf16_kernel(int type, const uint8_t *__restrict__ data, int64_t rows, int64_t k, uint16_t *__restrict__ out) {
    const int values = ciq_block_values(type), bytes = ciq_block_bytes(type);
    const int64_t row_bytes = k / values * bytes;
    for (int64_t idx = ciq_first_index(); idx < rows * k; idx += ciq_index_stride()) {
        const int64_t r = idx / k, i = idx % k;
        out[idx] = float_to_bf16_bits(ciq_dequantize_value(type, data + r * row_bytes + i / values * bytes, (int)(i % values)));
    }
}

__global__ void __launch_bounds__(OPS_THREADS) convert_bf16_kernel(const float *__restrict__ x, int64_t n, uint16_t *__restrict__ out) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) out[i] = float_to_bf16_bits(x[i]);
}

}  // namespace

ciq_status ciq_cuda_rms_norm(ciq_op_order order, const float *x, const float *weight, const float *add, float eps,
                             int64_t n, int64_t d, float *out) {
    if (order == CIQ_ORDER_LLAMACPP_CUDA) return ciq_cuda_llamacpp_rms_norm(x, weight, add, eps, n, d, out);
    const RmsRows rows = rms_rows(d, ((uintptr_t)x | (uintptr_t)weight | (uintptr_t)add | (uintptr_t)out) % 16 == 0);
    if (rows.warp) {  // float4 j of a row is values 4j..4j+3
        if (rows.v == 2) return launch_rms_norm_warp<2>(x, weight, add, eps, n, (int)d, out);
        if (rows.v == 4) return launch_rms_norm_warp<4>(x, weight, add, eps, n, (int)d, out);
        if (rows.v == 6) return launch_rms_norm_warp<6>(x, weight, add, eps, n, (int)d, out);
        return launch_rms_norm_warp<8>(x, weight, add, eps, n, (int)d, out);
    }
    if (rows.v) {
        if (rows.v == 2) return launch_rms_norm_block4<2>(x, weight, add, eps, n, (int)d, out);
        if (rows.v == 4) return launch_rms_norm_block4<4>(x, weight, add, eps, n, (int)d, out);
        return launch_rms_norm_block4<8>(x, weight, add, eps, n, (int)d, out);
    }
    for (int64_t row = 0; row < n; row += 65535) {  // grid.x limit per launch
        const int64_t rows = std::min<int64_t>(n - row, 65535);
        rms_norm_kernel<<<(unsigned)rows, OPS_THREADS, 0, ciq_stream()>>>(x + row * d, weight, add ? add + row * d : nullptr, eps, d,
                                                         out + row * d);
        CIQ_CUDA_LAUNCH_CHECK("rms_norm");
    }
    return CIQ_OK;
}

#if defined(GGML_CIQ_HIP)
ciq_status ciq_cuda_rms_norm_convert_f16(const float *, const float *, float, void *, int64_t, int64_t) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "f16 semantics (the wgmma kernel) are CUDA-only");
}
#else
ciq_status ciq_cuda_rms_norm_convert_f16(const float *x, const float *weight, float eps, void *out, int64_t tokens,
                                         int64_t k) {
    __half *xh = (__half *)out;
    float *scales = (float *)((uint8_t *)out + ciq_f16_scale_offset(tokens, k));
    const int64_t n = tokens, d = k;
    // ciq_cuda_rms_norm's kernel, row for row (chosen on x and weight: out's __half2 stores need 4 bytes, and the f16
    // layout's K, a multiple of 64, keeps every row so)
    const RmsRows rows = rms_rows(d, ((uintptr_t)x | (uintptr_t)weight) % 16 == 0);
    if (rows.warp) {
        if (rows.v == 2) return launch_rms_norm_f16<2, true>(x, weight, eps, n, (int)d, xh, scales);
        if (rows.v == 4) return launch_rms_norm_f16<4, true>(x, weight, eps, n, (int)d, xh, scales);
        if (rows.v == 6) return launch_rms_norm_f16<6, true>(x, weight, eps, n, (int)d, xh, scales);
        return launch_rms_norm_f16<8, true>(x, weight, eps, n, (int)d, xh, scales);
    }
    if (rows.v) {
        if (rows.v == 2) return launch_rms_norm_f16<2, false>(x, weight, eps, n, (int)d, xh, scales);
        if (rows.v == 4) return launch_rms_norm_f16<4, false>(x, weight, eps, n, (int)d, xh, scales);
        return launch_rms_norm_f16<8, false>(x, weight, eps, n, (int)d, xh, scales);
    }
    for (int64_t row = 0; row < n; row += 65535) {
        const int64_t rows = std::min<int64_t>(n - row, 65535);
        rms_norm_f16_strided_kernel<<<(unsigned)rows, OPS_THREADS, 0, ciq_stream()>>>(x + row * d, weight, eps, d,
                                                                                     xh + row * d, scales + row);
        CIQ_CUDA_LAUNCH_CHECK("rms_norm + convert_f16");
    }
    return CIQ_OK;
}
#endif

ciq_status ciq_cuda_rope(ciq_op_order order, ciq_rope_mode mode, const float *x, const int32_t *positions,
                         int64_t tokens, int64_t heads, int64_t head_dim, float base, float *out) {
    if (order == CIQ_ORDER_LLAMACPP_CUDA) return ciq_cuda_llamacpp_rope(mode, x, positions, tokens, heads, head_dim, base, out);
    const float theta_scale = std::pow(base, -2.0f / (float)head_dim);  // on the host, as the CPU path computes it
    const int64_t groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS;
    rope_kernel<<<ciq_grid_for(tokens * groups * (head_dim / 2)), OPS_THREADS, 0, ciq_stream()>>>(x, positions, tokens, heads, head_dim, theta_scale,
                                                                  mode == CIQ_ROPE_NEOX, out);
    CIQ_CUDA_LAUNCH_CHECK("rope");
    return CIQ_OK;
}

// The host order: the two ops one after the other (rope in place on the normed rows); llama.cpp CUDA's order: its
// fused kernel (ops_llamacpp.cu), whose float order differs from its two separate kernels'.
ciq_status ciq_cuda_rms_norm_rope(ciq_op_order order, ciq_rope_mode mode, const float *x, const float *weight, float eps,
                                  const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                                  float base, float *out) {
    if (order == CIQ_ORDER_LLAMACPP_CUDA) {
        return ciq_cuda_llamacpp_rms_norm_rope(mode, x, weight, eps, positions, tokens, heads, head_dim, base, out);
    }
    const ciq_status status = ciq_cuda_rms_norm(order, x, weight, nullptr, eps, tokens * heads, head_dim, out);
    if (status != CIQ_OK) return status;
    return ciq_cuda_rope(order, mode, out, positions, tokens, heads, head_dim, base, out);
}

ciq_status ciq_cuda_kv_store(uint16_t *cache, int64_t start, const float *x, int64_t tokens, int64_t row_values) {
    kv_store_kernel<<<ciq_grid_for(tokens * row_values), OPS_THREADS, 0, ciq_stream()>>>(cache + start * row_values, x, tokens * row_values);
    CIQ_CUDA_LAUNCH_CHECK("kv_store");
    return CIQ_OK;
}

ciq_status ciq_cuda_rows_set_f16(const float *x, int64_t n, int64_t k, const int64_t *ids, uint16_t *table,
                                 int64_t table_rows, int64_t row_stride) {
    if (n * k <= (int64_t)INT32_MAX) {  // i + the grid stride then stays below 2^32
        rows_set_f16_kernel<uint32_t><<<ciq_grid_for(n * k), OPS_THREADS, 0, ciq_stream()>>>(
            x, (uint32_t)n, (uint32_t)k, ids, table, table_rows, row_stride);
    } else {
        rows_set_f16_kernel<int64_t><<<ciq_grid_for(n * k), OPS_THREADS, 0, ciq_stream()>>>(x, n, k, ids, table,
                                                                                         table_rows, row_stride);
    }
    CIQ_CUDA_LAUNCH_CHECK("rows_set_f16");
    return CIQ_OK;
}

ciq_status ciq_cuda_rope_kv_store(ciq_rope_mode mode, const float *q, const float *k, const float *v,
                                  const int32_t *positions, int64_t tokens, int64_t heads, int64_t heads_kv,
                                  int64_t head_dim, float base, int64_t start, float *q_out, uint16_t *k_cache,
                                  uint16_t *v_cache) {
    const float theta_scale = std::pow(base, -2.0f / (float)head_dim);  // ciq_cuda_rope's
    const int64_t groups = (heads + ROPE_HEADS - 1) / ROPE_HEADS + (heads_kv + ROPE_HEADS - 1) / ROPE_HEADS;
    const int64_t row = heads_kv * head_dim;
    rope_kv_kernel<<<ciq_grid_for(tokens * groups * (head_dim / 2)), OPS_THREADS, 0, ciq_stream()>>>(
        q, k, v, positions, tokens, heads, heads_kv, head_dim, theta_scale, mode == CIQ_ROPE_NEOX, q_out,
        k_cache + start * row, v ? v_cache + start * row : nullptr);
    CIQ_CUDA_LAUNCH_CHECK("rope + kv_store");
    return CIQ_OK;
}

ciq_status ciq_cuda_glu(ciq_op_order order, ciq_glu_kind kind, const float *gate, const float *up, int64_t n,
                        float *out) {
    if (order == CIQ_ORDER_LLAMACPP_CUDA) return ciq_cuda_llamacpp_glu(kind, gate, up, n, out);
    if (n % 4 == 0 && ((uintptr_t)gate | (uintptr_t)up | (uintptr_t)out) % 16 == 0) {
        glu4_kernel<<<ciq_grid_for(n / 4), OPS_THREADS, 0, ciq_stream()>>>(kind == CIQ_GLU_GELU, (const float4 *)gate,
                                                                          (const float4 *)up, n / 4, (float4 *)out);
        CIQ_CUDA_LAUNCH_CHECK("glu");
        return CIQ_OK;
    }
    glu_kernel<<<ciq_grid_for(n), OPS_THREADS, 0, ciq_stream()>>>(kind == CIQ_GLU_GELU, gate, up, n, out);
    CIQ_CUDA_LAUNCH_CHECK("glu");
    return CIQ_OK;
}

ciq_status ciq_cuda_add(const float *a, int64_t n, const float *b, int64_t b_n, float *out) {
    if (b_n == n && n % 4 == 0 && ((uintptr_t)a | (uintptr_t)b | (uintptr_t)out) % 16 == 0) {
        add4_kernel<<<ciq_grid_for(n / 4), OPS_THREADS, 0, ciq_stream()>>>((const float4 *)a, (const float4 *)b, n / 4,
                                                                          (float4 *)out);
        CIQ_CUDA_LAUNCH_CHECK("add");
        return CIQ_OK;
    }
    add_kernel<<<ciq_grid_for(n), OPS_THREADS, 0, ciq_stream()>>>(a, n, b, b_n, out);
    CIQ_CUDA_LAUNCH_CHECK("add");
    return CIQ_OK;
}

ciq_status ciq_cuda_scale(const float *x, float s, int64_t n, float *out) {
    scale_kernel<<<ciq_grid_for(n), OPS_THREADS, 0, ciq_stream()>>>(x, s, n, out);
    CIQ_CUDA_LAUNCH_CHECK("scale");
    return CIQ_OK;
}

ciq_status ciq_cuda_get_rows(int type, const void *table, int64_t table_rows, int64_t k, const int32_t *ids, int64_t n,
                             float *out) {
    get_rows_kernel<<<ciq_grid_for(n * k), OPS_THREADS, 0, ciq_stream()>>>(type, (const uint8_t *)table, table_rows, k, ids, n, out);
    CIQ_CUDA_LAUNCH_CHECK("get_rows");
    return CIQ_OK;
}

ciq_status ciq_cuda_dequantize_bf16(int type, const void *data, int64_t rows, int64_t k, void *out) {
    dequantize_bf16_kernel<<<ciq_grid_for(rows * k), OPS_THREADS, 0, ciq_stream()>>>(type, (const uint8_t *)data, rows, k, (uint16_t *)out);
    CIQ_CUDA_LAUNCH_CHECK("dequantize_bf16");
    return CIQ_OK;
}

ciq_status ciq_cuda_convert_bf16(const float *x, int64_t n, void *out) {
    convert_bf16_kernel<<<ciq_grid_for(n), OPS_THREADS, 0, ciq_stream()>>>(x, n, (uint16_t *)out);
    CIQ_CUDA_LAUNCH_CHECK("convert_bf16");
    return CIQ_OK;
}
