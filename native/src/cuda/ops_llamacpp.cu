// ops_llamacpp.cu - the norm, RoPE and GLU ops in llama.cpp CUDA's float order (CIQ_ORDER_LLAMACPP_CUDA): the
// expressions of llama.cpp's kernels (ggml-cuda/norm.cu rms_norm_f32, rope.cu rope_norm/rope_neox and the fused
// rms_norm_mul_rope_f32, unary.cu's gated GELU/SiLU), in a translation unit built with llama.cpp's CUDA flag
// -use_fast_math (native/CMakeLists.txt), so that nvcc makes the same choices: FMA contraction, x / y as __fdividef,
// cosf/sinf/powf/expf as __cosf/__sinf/__powf/__expf, denormals flushed. The host order is ops.cu. A HIP build
// compiles this file without the flag (llama.cpp's HIP kernels are not what it reproduces).
//
//   rms_norm : per thread `tmp += x*x` over columns tid, tid + B, ... (B = 256 below 1024 columns, else 1024), a warp
//              butterfly (xor 16..1), the warps' sums through shared memory into a second butterfly (lanes past the
//              warp count add 0); scale = rsqrtf(tmp / d + eps); out = scale * x * weight (+ add, contracted to
//              one FMA as llama.cpp's fused RMS_NORM + MUL + ADD; without a weight the add rounds on its own, as
//              llama.cpp fuses no norm + add without the multiply).
//   rope     : theta = pos * powf(theta_scale, i) (theta_scale = powf(base, -2/head_dim) on the host),
//              x0 * cos - x1 * sin, x0 * sin + x1 * cos (freq_scale 1, no YaRN: llama.cpp's factors are exact 1s).
//   rms_norm_rope: llama.cpp's fused RMS_NORM + MUL + ROPE kernel (one block per row; its own contraction, below).
//   rope_rows_set: rope's expressions for q and k; k's and v's values rounded to half (__float2half_rn, ggml-cuda's
//              __float2half) into cache rows.
//   glu      : gelu(g) = 0.5f * g * (1 + tanhf(sqrt(2/pi) * g * (1 + 0.044715 * g * g))), silu(g) = g / (1 + expf(-g)),
//              times up.
// One row per block for rms_norm; a grid-stride loop over (row, pair) and over values for the others.
#include "common.cuh"

#include <algorithm>
#include <cmath>

namespace {

constexpr int LLAMA_WARP = 32;
constexpr int ELEMENTWISE_THREADS = CIQ_ELEMENTWISE_THREADS;

__device__ __forceinline__ float warp_reduce_sum(float x) {
#pragma unroll
    for (int offset = LLAMA_WARP / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xFFFFFFFF, x, offset);
    return x;
}

// llama.cpp's block_reduce of the row's squares (norm.cu, and rope.cu's fused kernel): per thread `tmp += x*x` over
// columns tid, tid + BLOCK, ..., a warp butterfly, the warps' sums through shared memory into a second butterfly.
template <int BLOCK> __device__ __forceinline__ float sum_of_squares(const float *x, const int ncols) {
    __shared__ float s_sum[LLAMA_WARP];
    const int tid = threadIdx.x;
    float tmp = 0.0f;
    for (int col = tid; col < ncols; col += BLOCK) {
        const float xi = x[col];
        tmp += xi * xi;
    }
    tmp = warp_reduce_sum(tmp);
    if (BLOCK > LLAMA_WARP) {
        const int warp_id = tid / LLAMA_WARP, lane_id = tid % LLAMA_WARP;
        if (lane_id == 0) s_sum[warp_id] = tmp;
        __syncthreads();
        tmp = 0.0f;
        if (lane_id < BLOCK / LLAMA_WARP) tmp = s_sum[lane_id];
        tmp = warp_reduce_sum(tmp);
    }
    return tmp;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
rms_norm_llamacpp_kernel(const float *x, const float *weight, const float *add, const float eps, const int ncols,
                         float *dst) {
    const int tid = threadIdx.x;
    x += (int64_t)blockIdx.x * ncols;
    dst += (int64_t)blockIdx.x * ncols;
    if (add) add += (int64_t)blockIdx.x * ncols;

    const float tmp = sum_of_squares<BLOCK>(x, ncols);
    const float mean = tmp / ncols;
    const float scale = rsqrtf(mean + eps);

    for (int col = tid; col < ncols; col += BLOCK) {
        if (weight && add) {
            dst[col] = scale * x[col] * weight[col] + add[col];
        } else if (weight) {
            dst[col] = scale * x[col] * weight[col];
        } else if (add) {  // llama.cpp fuses the add only with the multiply: here its own ggml_add rounding
            dst[col] = __fadd_rn(scale * x[col], add[col]);
        } else {
            dst[col] = scale * x[col];
        }
    }
}

// x0 * sin + x1 * cos as nvcc contracts it in ggml-cuda's rope_norm / rope_neox: fma(x0, sin, x1 * cos), written out
// (left to itself nvcc fused the other product in the ROPE_KV vector kernel: 1-ulp differences, seen on the H100).
// The CPU emulation (tests/cuda_on_cpu, -ffp-contract=off) computes it without contraction.
#ifdef CIQ_CUDA_EMULATION
#define ROPE_SECOND_LLAMACPP(x0, x1, c, s) ((x0) * (s) + (x1) * (c))
#else
#define ROPE_SECOND_LLAMACPP(x0, x1, c, s) __fmaf_rn((x0), (s), (x1) * (c))
#endif

// One RoPE pair in ggml-cuda's expressions (rope.cu; the angle pos * theta_scale^(i0/2) by powf), for
// rope_llamacpp_kernel and both ROPE_KV kernels: their PTX is mul, mul, sub for the first output and mul x1 * cos,
// then fma(x0, sin, it) for the second.
__device__ __forceinline__ void rope_pair_llamacpp(const float x0, const float x1, const int32_t p, const int i0,
                                                   const float theta_scale, float *r0, float *r1) {
    const float theta_base = p * powf(theta_scale, i0 / 2.0f);
    const float cos_theta = cosf(theta_base);
    const float sin_theta = sinf(theta_base);
    *r0 = x0 * cos_theta - x1 * sin_theta;
    *r1 = ROPE_SECOND_LLAMACPP(x0, x1, cos_theta, sin_theta);
}

__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
rope_llamacpp_kernel(const float *x, const int32_t *pos, int64_t tokens, int64_t heads, int head_dim,
                     float theta_scale, bool neox, float *dst) {
    const int half = head_dim / 2;
    const int64_t n = tokens * heads * half;
    for (int64_t idx = ciq_first_index(); idx < n; idx += ciq_index_stride()) {
        const int64_t row = idx / half;  // (token, head)
        const int pair = (int)(idx % half), i0 = 2 * pair;
        const int64_t t = row / heads;
        const int64_t a = row * head_dim + (neox ? pair : i0), b = a + (neox ? half : 1);
        float r0, r1;
        rope_pair_llamacpp(x[a], x[b], pos[t], i0, theta_scale, &r0, &r1);
        dst[a] = r0;
        dst[b] = r1;
    }
}

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
    return (uint32_t)__half_as_ushort(__float2half_rn(lo)) | (uint32_t)__half_as_ushort(__float2half_rn(hi)) << 16;
}

// llama.cpp's attention inputs in one launch (ciq_rope_rows_set_f16): q's RoPE (rope_llamacpp_kernel's expressions),
// k's RoPE with ggml-cuda's fused ROPE + VIEW + SET_ROWS store (rope.cu: the same float expression, rounded to half into
// row k_ids[t] of the table at head h's offset h * head_dim) and v's SET_ROWS into row v_ids[t] (set-rows.cu: float ->
// half). Grid indices [0, nq) are q's (token, head, pair)s, [nq, nq + nk) k's, then v's values. An id outside its
// table: skipped. Index is uint32_t where every index fits (a prefill's: 32-bit divisions), else int64_t.
template <typename Index>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
rope_rows_set_llamacpp_kernel(const float *q, float *q_out, Index heads, const float *k, Index heads_kv,
                              int head_dim, const float *v, Index v_k, const int32_t *pos, Index tokens,
                              float theta_scale, bool neox, const int64_t *k_ids, uint16_t *k_table,
                              int64_t k_table_rows, int64_t k_row_stride, const int64_t *v_ids, uint16_t *v_table,
                              int64_t v_table_rows, int64_t v_row_stride) {
    const Index half = (Index)(head_dim / 2);
    const Index nq = q != nullptr ? tokens * heads * half : 0, nk = tokens * heads_kv * half;
    const Index n = nq + nk + (v != nullptr ? tokens * v_k : 0);
    for (Index idx = (Index)ciq_first_index(); idx < n; idx += (Index)ciq_index_stride()) {
        if (idx >= nq + nk) {  // v's value (t, j)
            const Index i = idx - nq - nk, t = i / v_k;
            const int64_t id = v_ids[t];
            if (id >= 0 && id < v_table_rows) {
                v_table[id * v_row_stride + (int64_t)(i % v_k)] = __half_as_ushort(__float2half_rn(v[i]));
            }
            continue;
        }
        const bool is_q = idx < nq;
        const Index j = is_q ? idx : idx - nq, hs = is_q ? heads : heads_kv;
        const Index row = j / half;  // (token, head)
        const int pair = (int)(j % half), i0 = 2 * pair;
        const Index t = row / hs;
        const int off_a = neox ? pair : i0, off_b = off_a + (neox ? (int)half : 1);  // within the head's row
        const int64_t base = (int64_t)row * head_dim;
        const float *x = is_q ? q : k;
        float r0, r1;
        rope_pair_llamacpp(x[base + off_a], x[base + off_b], pos[t], i0, theta_scale, &r0, &r1);
        if (is_q) {
            q_out[base + off_a] = r0;
            q_out[base + off_b] = r1;
        } else {
            const int64_t id = k_ids[t];
            if (id < 0 || id >= k_table_rows) continue;
            uint16_t *dst = k_table + id * k_row_stride + (int64_t)(row % heads_kv) * head_dim;  // head h in row id
            dst[off_a] = __half_as_ushort(__float2half_rn(r0));
            dst[off_b] = __half_as_ushort(__float2half_rn(r1));
        }
    }
}

// rope_rows_set_llamacpp_kernel with two pairs a thread and vector accesses (head_dim % 4 == 0, rows and tables
// aligned: ciq_cuda_llamacpp_rope_rows_set_kernel): NORM's pairs 2g, 2g + 1 are one float4 (k: 4 halves, 8 bytes), NEOX's pairs
// g', g' + 1 (g' = 2g) two float2s half a row apart (k: 2 x 2 halves); v four values a thread (float4 -> 4 halves).
// Each value as the scalar kernel computes it: rope_pair_llamacpp per pair.
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
rope_rows_set_vec_llamacpp_kernel(const float *q, float *q_out, uint32_t heads, const float *k, uint32_t heads_kv,
                                  int head_dim, const float *v, uint32_t v_k, const int32_t *pos, uint32_t tokens,
                                  float theta_scale, bool neox, const int64_t *k_ids, uint16_t *k_table,
                                  int64_t k_table_rows, int64_t k_row_stride, const int64_t *v_ids,
                                  uint16_t *v_table, int64_t v_table_rows, int64_t v_row_stride) {
    const uint32_t quads = (uint32_t)head_dim / 4;  // two pairs a thread: head_dim / 4 threads a head's row
    const uint32_t nq = q != nullptr ? tokens * heads * quads : 0, nk = tokens * heads_kv * quads;
    const uint32_t n = nq + nk + (v != nullptr ? tokens * (v_k / 4) : 0);
    const int half = head_dim / 2;
    for (uint32_t idx = (uint32_t)ciq_first_index(); idx < n; idx += (uint32_t)ciq_index_stride()) {
        if (idx >= nq + nk) {  // v's values 4j .. 4j + 3 of token t
            const uint32_t i = idx - nq - nk, t = i / (v_k / 4), j = i % (v_k / 4);
            const int64_t id = v_ids[t];
            if (id < 0 || id >= v_table_rows) continue;
            const float4 x = reinterpret_cast<const float4 *>(v)[i];
            *reinterpret_cast<uint2 *>(v_table + id * v_row_stride + 4 * (int64_t)j) =
                make_uint2(half2_bits(x.x, x.y), half2_bits(x.z, x.w));
            continue;
        }
        const bool is_q = idx < nq;
        const uint32_t jj = is_q ? idx : idx - nq, hs = is_q ? heads : heads_kv;
        const uint32_t row = jj / quads, g = jj % quads, t = row / hs;  // (token, head), pairs 2g and 2g + 1
        const int32_t p = pos[t];
        const float *x = (is_q ? q : k) + (int64_t)row * head_dim;
        const int pair = 2 * (int)g;
        float r[4];
        int off0, off1;  // where r[0..3] go in the row: NORM at 4g (off1 -1); NEOX r[0..1] at 2g, r[2..3] at 2g + half
        if (!neox) {
            const float4 xv = *reinterpret_cast<const float4 *>(x + 4 * g);
            rope_pair_llamacpp(xv.x, xv.y, p, 2 * pair, theta_scale, &r[0], &r[1]);
            rope_pair_llamacpp(xv.z, xv.w, p, 2 * pair + 2, theta_scale, &r[2], &r[3]);
            off0 = 4 * (int)g, off1 = -1;
        } else {
            const float2 a = *reinterpret_cast<const float2 *>(x + pair);
            const float2 b = *reinterpret_cast<const float2 *>(x + pair + half);
            rope_pair_llamacpp(a.x, b.x, p, 2 * pair, theta_scale, &r[0], &r[2]);
            rope_pair_llamacpp(a.y, b.y, p, 2 * pair + 2, theta_scale, &r[1], &r[3]);
            off0 = pair, off1 = pair + half;  // r[0], r[1] at pair, pair + 1; r[2], r[3] at pair + half, ...
        }
        if (is_q) {
            float *o = q_out + (int64_t)row * head_dim;
            if (off1 < 0) {
                *reinterpret_cast<float4 *>(o + off0) = make_float4(r[0], r[1], r[2], r[3]);
            } else {
                *reinterpret_cast<float2 *>(o + off0) = make_float2(r[0], r[1]);
                *reinterpret_cast<float2 *>(o + off1) = make_float2(r[2], r[3]);
            }
        } else {
            const int64_t id = k_ids[t];
            if (id < 0 || id >= k_table_rows) continue;
            uint16_t *dst = k_table + id * k_row_stride + (int64_t)(row % heads_kv) * head_dim;  // head h in row id
            if (off1 < 0) {
                *reinterpret_cast<uint2 *>(dst + off0) = make_uint2(half2_bits(r[0], r[1]), half2_bits(r[2], r[3]));
            } else {
                *reinterpret_cast<uint32_t *>(dst + off0) = half2_bits(r[0], r[1]);
                *reinterpret_cast<uint32_t *>(dst + off1) = half2_bits(r[2], r[3]);
            }
        }
    }
}

// llama.cpp's fused RMS_NORM + MUL + ROPE (rope.cu rms_norm_mul_rope_f32, which ggml-cuda runs wherever a graph
// ropes a normed q or k: Gemma 3's and Qwen 3's q/k norms). Its expressions are copied as they stand, the exact 1s of
// YaRN (freq_scale, attn_factor; ext_factor 0) included, because nvcc contracts them otherwise than the two separate
// kernels: the second output is fma(x1, cos, x0 * sin) here, fma(x0, sin, x1 * cos) in rope_neox (their SASS,
// NOTES.md). One block per (token, head) row; pos[row / heads].
__device__ float rope_yarn_ramp_llamacpp(const float low, const float high, const int i0) {
    const float y = (i0 / 2 - low) / max(0.001f, high - low);
    return 1.0f - min(1.0f, max(0.0f, y));
}

__device__ void rope_yarn_llamacpp(const float theta_extrap, const float freq_scale, const float corr0, const float corr1,
                                   const int64_t i0, const float ext_factor, float mscale, float &cos_theta,
                                   float &sin_theta) {
    float theta_interp = freq_scale * theta_extrap;
    float theta = theta_interp;
    if (ext_factor != 0.0f) {
        float ramp_mix = rope_yarn_ramp_llamacpp(corr0, corr1, i0) * ext_factor;
        theta = theta_interp * (1 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0f + 0.1f * logf(1.0f / freq_scale);
    }
    cos_theta = cosf(theta) * mscale;
    sin_theta = sinf(theta) * mscale;
}

template <int BLOCK>
__global__ void __launch_bounds__(BLOCK)
rms_norm_rope_llamacpp_kernel(const float *x, float *dst, const int64_t row0, const int ncols, const float eps,
                              const float *mul, const int64_t heads, const int32_t *pos, const float freq_scale, const float ext_factor,
                              const float attn_factor, const float corr0, const float corr1, const float theta_scale,
                              const bool is_neox) {
    const int64_t row = row0 + blockIdx.x;
    const int tid = threadIdx.x;
    x += row * ncols;
    dst += row * ncols;

    const float tmp = sum_of_squares<BLOCK>(x, ncols);
    const float scale = rsqrtf(tmp / ncols + eps);
    const int n_dims = ncols;  // every dimension rotates

    for (int i0 = 2 * tid; i0 < ncols; i0 += 2 * BLOCK) {
        int ix0;
        int ix1;
        if (is_neox && i0 < n_dims) {
            ix0 = i0 / 2;
            ix1 = i0 / 2 + n_dims / 2;
        } else {
            ix0 = i0 + 0;
            ix1 = i0 + 1;
        }
        const float x0 = scale * x[ix0] * mul[ix0];
        const float x1 = scale * x[ix1] * mul[ix1];

        const float theta_base = pos[row / heads] * powf(theta_scale, i0 / 2.0f);
        const float freq_factor = 1.0f;
        float cos_theta;
        float sin_theta;
        rope_yarn_llamacpp(theta_base / freq_factor, freq_scale, corr0, corr1, i0, ext_factor, attn_factor, cos_theta,
                           sin_theta);
        dst[ix0] = x0 * cos_theta - x1 * sin_theta;
        dst[ix1] = x0 * sin_theta + x1 * cos_theta;
    }
}

__device__ __forceinline__ float op_gelu(float x) {
    const float GELU_COEF_A = 0.044715f;
    const float SQRT_2_OVER_PI = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}

__device__ __forceinline__ float op_silu(float x) { return x / (1.0f + expf(-x)); }

template <bool GELU>
__global__ void __launch_bounds__(ELEMENTWISE_THREADS)
glu_llamacpp_kernel(const float *gate, const float *up, int64_t n, float *dst) {
    for (int64_t i = ciq_first_index(); i < n; i += ciq_index_stride()) {
        dst[i] = (GELU ? op_gelu(gate[i]) : op_silu(gate[i])) * up[i];
    }
}

}  // namespace

ciq_status ciq_cuda_llamacpp_rms_norm(const float *x, const float *weight, const float *add, float eps, int64_t n,
                                      int64_t d, float *out) {
    for (int64_t row = 0; row < n; row += 65535) {  // grid.x limit per launch
        const int64_t rows = std::min<int64_t>(n - row, 65535);
        const float *add_rows = add ? add + row * d : nullptr;
        if (d < 1024) {
            rms_norm_llamacpp_kernel<256><<<(unsigned)rows, 256, 0, ciq_stream()>>>(x + row * d, weight, add_rows, eps, (int)d, out + row * d);
        } else {
            rms_norm_llamacpp_kernel<1024><<<(unsigned)rows, 1024, 0, ciq_stream()>>>(x + row * d, weight, add_rows, eps, (int)d, out + row * d);
        }
        CIQ_CUDA_LAUNCH_CHECK("rms_norm (llama.cpp order)");
    }
    return CIQ_OK;
}

ciq_status ciq_cuda_llamacpp_rope(ciq_rope_mode mode, const float *x, const int32_t *positions, int64_t tokens,
                                  int64_t heads, int64_t head_dim, float base, float *out) {
    const float theta_scale = powf(base, -2.0f / (float)head_dim);  // on the host, as llama.cpp's launcher
    rope_llamacpp_kernel<<<ciq_grid_for(tokens * heads * (head_dim / 2)), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(
        x, positions, tokens, heads, (int)head_dim, theta_scale, mode == CIQ_ROPE_NEOX, out);
    CIQ_CUDA_LAUNCH_CHECK("rope (llama.cpp order)");
    return CIQ_OK;
}

ciq_status ciq_cuda_llamacpp_rms_norm_rope(ciq_rope_mode mode, const float *x, const float *weight, float eps,
                                           const int32_t *positions, int64_t tokens, int64_t heads, int64_t head_dim,
                                           float base, float *out) {
    const float theta_scale = powf(base, -2.0f / (float)head_dim);  // on the host, as llama.cpp's launcher
    // llama.cpp's graphs pass freq_scale 1, ext_factor 0 (no YaRN), attn_factor 1; corr dims unused then.
    const float freq_scale = 1.0f, ext_factor = 0.0f, attn_factor = 1.0f, corr0 = 0.0f, corr1 = 0.0f;
    const bool neox = mode == CIQ_ROPE_NEOX;
    const int64_t n = tokens * heads;
    for (int64_t row = 0; row < n; row += 65535) {  // grid.x limit per launch
        const int64_t rows = std::min<int64_t>(n - row, 65535);
        if (head_dim < 1024) {
            rms_norm_rope_llamacpp_kernel<256><<<(unsigned)rows, 256, 0, ciq_stream()>>>(x, out, row, (int)head_dim, eps, weight, heads,
                positions, freq_scale, ext_factor, attn_factor, corr0, corr1, theta_scale, neox);
        } else {
            rms_norm_rope_llamacpp_kernel<1024><<<(unsigned)rows, 1024, 0, ciq_stream()>>>(x, out, row, (int)head_dim, eps, weight, heads,
                positions, freq_scale, ext_factor, attn_factor, corr0, corr1, theta_scale, neox);
        }
        CIQ_CUDA_LAUNCH_CHECK("rms_norm + rope (llama.cpp's fused order)");
    }
    return CIQ_OK;
}

// Which ROPE_KV kernel a call runs: the vector kernel where every access it makes is aligned (rows of head_dim % 4
// values, float4 rows of q, q_out, k and v (v_k % 4 == 0), 8-byte rows of halves in the tables) and its indices fit 32
// bits; else the scalar kernel with 32-bit or 64-bit indices.
int ciq_cuda_llamacpp_rope_rows_set_kernel(int64_t n, int64_t head_dim, const float *q, const float *q_out,
                                           const float *k, const float *v, int64_t v_k, const uint16_t *k_table,
                                           int64_t k_row_stride, const uint16_t *v_table, int64_t v_row_stride) {
    auto aligned = [](const void *ptr, uintptr_t to) { return ptr == nullptr || (uintptr_t)ptr % to == 0; };
    const bool vectors = head_dim % 4 == 0 && aligned(q, 16) && aligned(q_out, 16) && aligned(k, 16) &&
                         aligned(k_table, 8) && k_row_stride % 4 == 0 &&
                         (v == nullptr ||
                          (v_k % 4 == 0 && aligned(v, 16) && aligned(v_table, 8) && v_row_stride % 4 == 0));
    if (n > (int64_t)INT32_MAX) return CIQ_ROPE_ROWS_SET_SCALAR64;  // idx + the grid stride must stay below 2^32
    return vectors ? CIQ_ROPE_ROWS_SET_VECTORS : CIQ_ROPE_ROWS_SET_SCALAR32;
}

ciq_status ciq_cuda_llamacpp_rope_rows_set_f16(ciq_rope_mode mode, const int32_t *positions, int64_t tokens,
                                               int64_t head_dim, float base, const float *q, int64_t heads,
                                               float *q_out, const float *k, int64_t heads_kv, const float *v,
                                               int64_t v_k, const int64_t *k_ids, uint16_t *k_table,
                                               int64_t k_table_rows, int64_t k_row_stride, const int64_t *v_ids,
                                               uint16_t *v_table, int64_t v_table_rows, int64_t v_row_stride) {
    const float theta_scale = powf(base, -2.0f / (float)head_dim);  // on the host, as llama.cpp's launcher
    const int64_t n = (q != nullptr ? tokens * heads * (head_dim / 2) : 0) + tokens * heads_kv * (head_dim / 2) +
                      (v != nullptr ? tokens * v_k : 0);
    const int kernel = ciq_cuda_llamacpp_rope_rows_set_kernel(n, head_dim, q, q_out, k, v, v_k, k_table, k_row_stride,
                                                              v_table, v_row_stride);
    if (kernel == CIQ_ROPE_ROWS_SET_VECTORS) {
        const int64_t items = n / 2 - (v != nullptr ? tokens * v_k / 4 : 0);  // pairs by two; v's values by four
        rope_rows_set_vec_llamacpp_kernel<<<ciq_grid_for(items), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(
            q, q_out, (uint32_t)heads, k, (uint32_t)heads_kv, (int)head_dim, v, (uint32_t)v_k, positions,
            (uint32_t)tokens, theta_scale, mode == CIQ_ROPE_NEOX, k_ids, k_table, k_table_rows, k_row_stride, v_ids,
            v_table, v_table_rows, v_row_stride);
    } else if (kernel == CIQ_ROPE_ROWS_SET_SCALAR32) {
        rope_rows_set_llamacpp_kernel<uint32_t><<<ciq_grid_for(n), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(
            q, q_out, (uint32_t)heads, k, (uint32_t)heads_kv, (int)head_dim, v, (uint32_t)v_k, positions,
            (uint32_t)tokens, theta_scale, mode == CIQ_ROPE_NEOX, k_ids, k_table, k_table_rows, k_row_stride, v_ids,
            v_table, v_table_rows, v_row_stride);
    } else {
        rope_rows_set_llamacpp_kernel<int64_t><<<ciq_grid_for(n), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(
            q, q_out, heads, k, heads_kv, (int)head_dim, v, v_k, positions, tokens, theta_scale,
            mode == CIQ_ROPE_NEOX, k_ids, k_table, k_table_rows, k_row_stride, v_ids, v_table, v_table_rows,
            v_row_stride);
    }
    CIQ_CUDA_LAUNCH_CHECK("rope + rows_set_f16 (llama.cpp order)");
    return CIQ_OK;
}

ciq_status ciq_cuda_llamacpp_glu(ciq_glu_kind kind, const float *gate, const float *up, int64_t n, float *out) {
    if (kind == CIQ_GLU_GELU) {
        glu_llamacpp_kernel<true><<<ciq_grid_for(n), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(gate, up, n, out);
    } else {
        glu_llamacpp_kernel<false><<<ciq_grid_for(n), ELEMENTWISE_THREADS, 0, ciq_stream()>>>(gate, up, n, out);
    }
    CIQ_CUDA_LAUNCH_CHECK("glu (llama.cpp order)");
    return CIQ_OK;
}
