// quantize.cu - activation quantization on the GPU, byte-identical to the CPU reference (docs/SEMANTICS.md).
//
// Layouts, said once:
//   x        : float32 [tokens][K], token-major, at least 4-byte aligned (float4 loads when 16-byte aligned).
//   Q8_K     : [tokens][K/256] blocks of 292 B: float d, int8 qs[256], int16 bsums[16] (4-byte aligned output).
//   q8_1-mmq : [K/128][tokens] blocks of 144 B: 4 scale words (DS4: half2 {d, sum}; D4: float d; one per 32
//              values), then int8 qs[128].
// Each kernel gives one warp one output block. Lane l holds values 4l..4l+3 (Q8_K also 128+4l..128+4l+3), so a
// lane's quantized bytes are whole 32-bit words. Float arithmetic uses explicit round-to-nearest intrinsics, so a
// fast-math build produces the same bytes.
#include "common.cuh"

#include <cstddef>

namespace {

constexpr int QUANTIZE_WARPS_PER_BLOCK = 8;

__device__ __forceinline__ float4 load_float4(const float *p, bool aligned16) {
    if (aligned16) return *reinterpret_cast<const float4 *>(p);
    return make_float4(p[0], p[1], p[2], p[3]);
}

__device__ __forceinline__ uint32_t pack_int8x4(int a, int b, int c, int d) {
    return (uint32_t)(a & 0xFF) | (uint32_t)(b & 0xFF) << 8 | (uint32_t)(c & 0xFF) << 16 | (uint32_t)(d & 0xFF) << 24;
}

// One warp per Q8_K block (one token, 256 values); blocks are numbered token-major, matching x.
__global__ void __launch_bounds__(QUANTIZE_WARPS_PER_BLOCK * CIQ_WARP_SIZE)
quantize_q8_K_kernel(const float *__restrict__ x, uint8_t *__restrict__ out, int64_t blocks, bool x_aligned16) {
    const int64_t block = (int64_t)blockIdx.x * QUANTIZE_WARPS_PER_BLOCK + threadIdx.x / CIQ_WARP_SIZE;
    if (block >= blocks) return;  // the whole warp leaves together
    const int lane = threadIdx.x % CIQ_WARP_SIZE;

    const float *xb = x + block * QK_K;
    const float4 lo = load_float4(xb + 4 * lane, x_aligned16);
    const float4 hi = load_float4(xb + QK_K / 2 + 4 * lane, x_aligned16);
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};

    // The signed value with the largest |x|, the first index winning ties: strict '>' in index order within a
    // lane, then the lowest index among equal magnitudes across lanes.
    float amax = 0.f, vmax = 0.f;
    int imax = QK_K;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float a = fabsf(v[i]);
        if (a > amax) {
            amax = a;
            vmax = v[i];
            imax = (i < 4 ? 0 : QK_K / 2 - 4) + 4 * lane + i;
        }
    }
#pragma unroll
    for (int offset = CIQ_WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const float other_amax = __shfl_xor_sync(0xFFFFFFFF, amax, offset);
        const float other_vmax = __shfl_xor_sync(0xFFFFFFFF, vmax, offset);
        const int other_imax = __shfl_xor_sync(0xFFFFFFFF, imax, offset);
        if (other_amax > amax || (other_amax == amax && other_imax < imax)) {
            amax = other_amax;
            vmax = other_vmax;
            imax = other_imax;
        }
    }

    // An all-zero block gets iscale 0, hence qs = 0, bsums = 0 and d = 0.
    const bool nonzero = amax != 0.f;
    const float iscale = nonzero ? __fdiv_rn(-127.f, vmax) : 0.f;
    int q[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) q[i] = min(127, __float2int_rn(__fmul_rn(iscale, v[i])));  // round half to even

    // bsums[i] covers values 16i..16i+15 = the lo (or hi) words of lanes 4i..4i+3 (i-8 for the hi half).
    int sum_lo = q[0] + q[1] + q[2] + q[3];
    int sum_hi = q[4] + q[5] + q[6] + q[7];
#pragma unroll
    for (int offset = 1; offset < 4; offset <<= 1) {
        sum_lo += __shfl_xor_sync(0xFFFFFFFF, sum_lo, offset);
        sum_hi += __shfl_xor_sync(0xFFFFFFFF, sum_hi, offset);
    }

    uint8_t *yb = out + block * Q8_K_BLOCK_BYTES;
    uint32_t *qs = reinterpret_cast<uint32_t *>(yb + offsetof(block_q8_K, qs));
    qs[lane] = pack_int8x4(q[0], q[1], q[2], q[3]);
    qs[QK_K / 8 + lane] = pack_int8x4(q[4], q[5], q[6], q[7]);
    if (lane % 4 == 0) {
        int16_t *bsums = reinterpret_cast<int16_t *>(yb + offsetof(block_q8_K, bsums));
        bsums[lane / 4] = (int16_t)sum_lo;
        bsums[QK_K / 32 + lane / 4] = (int16_t)sum_hi;
    }
    if (lane == 0) *reinterpret_cast<float *>(yb) = nonzero ? __fdiv_rn(1.f, iscale) : 0.f;
}

// llama.cpp builds ggml-cuda with -use_fast_math, so its quantize_mmq_q8_1 divides with div.approx.ftz, takes
// d = rcp.approx.ftz(d_inv) and flushes subnormals in products and sums. We issue the same instructions, so the
// mma kernel sees llama.cpp's exact activation bytes (docs/SEMANTICS.md: the IEEE host reference can differ by
// an ulp in d and by one in q at rounding ties).
#if defined(GGML_CIQ_HIP)
// HIP: the same reciprocal-based approximate division on v_rcp_f32. AMD keeps f32 denormals, so subnormal products
// and sums are not flushed: those inputs can give other bytes than llama.cpp's CUDA build. (No product here feeds
// an addition, so nothing can contract into an FMA.)
static __device__ __forceinline__ float fast_div(float a, float b) { return a * __builtin_amdgcn_rcpf(b); }
static __device__ __forceinline__ float fast_rcp(float a) { return __builtin_amdgcn_rcpf(a); }
static __device__ __forceinline__ float ftz_mul(float a, float b) { return a * b; }
static __device__ __forceinline__ float ftz_add(float a, float b) { return a + b; }
#else
static __device__ __forceinline__ float fast_div(float a, float b) {
    float r;
    asm("div.approx.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
static __device__ __forceinline__ float fast_rcp(float a) {
    float r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
static __device__ __forceinline__ float ftz_mul(float a, float b) {
    float r;
    asm("mul.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
static __device__ __forceinline__ float ftz_add(float a, float b) {
    float r;
    asm("add.ftz.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}
#endif

// One warp per q8_1-mmq block (128 values of one token); warps are numbered token-major, matching x.
// Lanes 8i..8i+7 form the 32-value group i. The xor butterfly over offsets 4, 2, 1 adds the per-lane sums in
// exactly llama.cpp's order: ((t0+t4)+(t2+t6))+((t1+t5)+(t3+t7)).
__global__ void __launch_bounds__(QUANTIZE_WARPS_PER_BLOCK * CIQ_WARP_SIZE)
quantize_q8_1_mmq_kernel(const float *__restrict__ x, uint8_t *__restrict__ out, int64_t tokens, int64_t k,
                         int64_t chunks_per_token, bool ds4, bool x_aligned16) {
    const int64_t chunk = (int64_t)blockIdx.x * QUANTIZE_WARPS_PER_BLOCK + threadIdx.x / CIQ_WARP_SIZE;
    if (chunk >= tokens * chunks_per_token) return;  // the whole warp leaves together
    const int lane = threadIdx.x % CIQ_WARP_SIZE;
    const int64_t token = chunk / chunks_per_token;
    const int64_t k_chunk = chunk % chunks_per_token;
    const int64_t column = k_chunk * Q8_1_MMQ_VALUES + 4 * lane;  // past K (a multiple of 32): zeros, as llama.cpp pads

    const float4 v = column < k ? load_float4(x + token * k + column, x_aligned16) : make_float4(0.f, 0.f, 0.f, 0.f);

    float amax = fmaxf(fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fabsf(v.z)), fabsf(v.w));
    float sum = ftz_add(ftz_add(ftz_add(v.x, v.y), v.z), v.w);
#pragma unroll
    for (int offset = 4; offset > 0; offset >>= 1) {
        amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFF, amax, offset));
        sum = ftz_add(sum, __shfl_xor_sync(0xFFFFFFFF, sum, offset));
    }

    const float d_inv = fast_div(127.f, amax);
    const float d = fast_rcp(d_inv);  // 0 when amax == 0 (d_inv = inf)
    const bool nonzero = amax != 0.f;
    const int qx = nonzero ? (int)roundf(ftz_mul(v.x, d_inv)) : 0;  // round half away from zero
    const int qy = nonzero ? (int)roundf(ftz_mul(v.y, d_inv)) : 0;
    const int qz = nonzero ? (int)roundf(ftz_mul(v.z, d_inv)) : 0;
    const int qw = nonzero ? (int)roundf(ftz_mul(v.w, d_inv)) : 0;

    uint8_t *yb = out + (k_chunk * tokens + token) * Q8_1_MMQ_BLOCK_BYTES;
    reinterpret_cast<uint32_t *>(yb + offsetof(block_q8_1_mmq, qs))[lane] = pack_int8x4(qx, qy, qz, qw);
    if (lane % 8 == 0) {
        uint32_t word;
        if (ds4) {
            word = (uint32_t)__half_as_ushort(__float2half_rn(d)) |
                   (uint32_t)__half_as_ushort(__float2half_rn(sum)) << 16;
        } else {
            word = __float_as_uint(d);
        }
        reinterpret_cast<uint32_t *>(yb)[lane / 8] = word;
    }
}

bool is_aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

ciq_status ciq_cuda_quantize_q8_K(const float *x, void *out, int64_t tokens, int64_t k) {
    const int64_t blocks = tokens * (k / QK_K);
    if (blocks == 0) return CIQ_OK;
    const int64_t grid = (blocks + QUANTIZE_WARPS_PER_BLOCK - 1) / QUANTIZE_WARPS_PER_BLOCK;
    quantize_q8_K_kernel<<<(unsigned)grid, QUANTIZE_WARPS_PER_BLOCK * CIQ_WARP_SIZE, 0, ciq_stream()>>>(
        x, static_cast<uint8_t *>(out), blocks, is_aligned16(x));
    CIQ_CUDA_LAUNCH_CHECK("quantize_q8_K");
    return CIQ_OK;
}

ciq_status ciq_cuda_quantize_q8_1_mmq(bool ds4, const float *x, void *out, int64_t tokens, int64_t k) {
    const int64_t chunks_per_token = CIQ_Q8_1_MMQ_BLOCKS(k);
    const int64_t chunks = tokens * chunks_per_token;
    if (chunks == 0) return CIQ_OK;
    const int64_t grid = (chunks + QUANTIZE_WARPS_PER_BLOCK - 1) / QUANTIZE_WARPS_PER_BLOCK;
    quantize_q8_1_mmq_kernel<<<(unsigned)grid, QUANTIZE_WARPS_PER_BLOCK * CIQ_WARP_SIZE, 0, ciq_stream()>>>(
        x, static_cast<uint8_t *>(out), tokens, k, chunks_per_token, ds4, is_aligned16(x));
    CIQ_CUDA_LAUNCH_CHECK("quantize_q8_1_mmq");
    return CIQ_OK;
}
