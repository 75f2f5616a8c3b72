// hip_nogpuinc.h - the few HIP declarations the kernels (quantize, gemm_wmma, gemm_q32, ops, attention) need, for
// tools/hip_compile_check.sh: a device-code-only compile with clang -nogpuinc, no ROCm installed. vendor.cuh includes it instead of the ROCm
// headers when GGML_CIQ_HIP_NOGPUINC is defined; no build uses it. The device functions follow HIP's own
// definitions (so the emitted code is representative), the host API is declared only (the device pass parses it).
#pragma once

#include <cstddef>
#include <cstdint>

#define __host__ __attribute__((host))
#define __device__ __attribute__((device))
#define __global__ __attribute__((global))
#define __shared__ __attribute__((shared))
#define __forceinline__ inline __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds_1(threads) __attribute__((amdgpu_flat_work_group_size(1, threads)))
#define __launch_bounds_2(threads, waves) \
    __attribute__((amdgpu_flat_work_group_size(1, threads), amdgpu_waves_per_eu(waves)))
#define __launch_bounds_select(_1, _2, name, ...) name
#define __launch_bounds__(...) __launch_bounds_select(__VA_ARGS__, __launch_bounds_2, __launch_bounds_1, )(__VA_ARGS__)

// ---- host API (declarations) ----
enum hipError_t { hipSuccess = 0 };
enum hipFuncAttribute { hipFuncAttributeMaxDynamicSharedMemorySize = 8 };
typedef struct ihipStream_t *hipStream_t;
struct dim3 {
    uint32_t x, y, z;
    constexpr dim3(uint32_t x_ = 1, uint32_t y_ = 1, uint32_t z_ = 1) : x(x_), y(y_), z(z_) {}
};
enum hipDeviceAttribute_t { hipDeviceAttributeMultiprocessorCount = 63 };
hipError_t hipGetLastError();
hipError_t hipGetDevice(int *device);
hipError_t hipDeviceGetAttribute(int *value, hipDeviceAttribute_t attr, int device);
const char *hipGetErrorString(hipError_t error);
hipError_t hipFuncSetAttribute(const void *func, hipFuncAttribute attr, int value);
extern "C" hipError_t __hipPushCallConfiguration(dim3 grid, dim3 block, size_t shared = 0, hipStream_t stream = 0);

// ---- built-in variables and synchronization ----
struct ciq_hip_index {
    uint32_t x, y, z;
};
static __device__ __forceinline__ ciq_hip_index ciq_hip_thread_idx() {
    return {__builtin_amdgcn_workitem_id_x(), __builtin_amdgcn_workitem_id_y(), __builtin_amdgcn_workitem_id_z()};
}
static __device__ __forceinline__ ciq_hip_index ciq_hip_block_idx() {
    return {__builtin_amdgcn_workgroup_id_x(), __builtin_amdgcn_workgroup_id_y(), __builtin_amdgcn_workgroup_id_z()};
}
static __device__ __forceinline__ ciq_hip_index ciq_hip_block_dim() {
    return {__builtin_amdgcn_workgroup_size_x(), __builtin_amdgcn_workgroup_size_y(), __builtin_amdgcn_workgroup_size_z()};
}
static __device__ __forceinline__ ciq_hip_index ciq_hip_grid_dim() {
    const ciq_hip_index b = ciq_hip_block_dim();
    return {__builtin_amdgcn_grid_size_x() / b.x, __builtin_amdgcn_grid_size_y() / b.y, __builtin_amdgcn_grid_size_z() / b.z};
}
#define threadIdx (ciq_hip_thread_idx())
#define blockIdx (ciq_hip_block_idx())
#define blockDim (ciq_hip_block_dim())
#define gridDim (ciq_hip_grid_dim())

static __device__ __forceinline__ void __syncthreads() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}

extern "C" __device__ int __ockl_wgred_or_i32(int);  // ROCm's device library (declarations: compile only)
extern "C" __device__ int __ockl_wgred_and_i32(int);
static __device__ __forceinline__ int __syncthreads_or(int predicate) { return __ockl_wgred_or_i32(!!predicate); }
static __device__ __forceinline__ int __syncthreads_and(int predicate) { return __ockl_wgred_and_i32(!!predicate); }

static __device__ __forceinline__ int __shfl_xor(int var, int lane_mask, int width = 32) {
    const int self = (int)__builtin_amdgcn_mbcnt_lo(~0u, 0u);  // wave32
    int index = self ^ lane_mask;
    index = index >= ((self + width) & ~(width - 1)) ? self : index;
    return __builtin_amdgcn_ds_bpermute(index << 2, var);
}
static __device__ __forceinline__ float __shfl_xor(float var, int lane_mask, int width = 32) {
    return __builtin_bit_cast(float, __shfl_xor(__builtin_bit_cast(int, var), lane_mask, width));
}

// ---- vector types ----
struct __align__(16) int4 {
    int x, y, z, w;
};
struct __align__(16) uint4 {
    unsigned int x, y, z, w;
};
struct __align__(16) float4 {
    float x, y, z, w;
};
static __host__ __device__ __forceinline__ int4 make_int4(int x, int y, int z, int w) { return {x, y, z, w}; }
static __host__ __device__ __forceinline__ uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z,
                                                            unsigned int w) {
    return {x, y, z, w};
}
static __host__ __device__ __forceinline__ float4 make_float4(float x, float y, float z, float w) {
    return {x, y, z, w};
}
struct __align__(8) float2 {
    float x, y;
};
static __host__ __device__ __forceinline__ float2 make_float2(float x, float y) { return {x, y}; }
struct __align__(8) uint2 {
    unsigned int x, y;
};
static __host__ __device__ __forceinline__ uint2 make_uint2(unsigned int x, unsigned int y) { return {x, y}; }

// ---- half, bfloat16 ----
typedef _Float16 __half;
struct __hip_bfloat16 {
    unsigned short data;
};
static __device__ __forceinline__ __half __ushort_as_half(unsigned short bits) {
    return __builtin_bit_cast(__half, bits);
}
static __device__ __forceinline__ unsigned short __half_as_ushort(__half h) {
    return __builtin_bit_cast(unsigned short, h);
}
static __device__ __forceinline__ float __half2float(__half h) { return (float)h; }
struct __align__(4) __half2 {
    __half x, y;
};
static __device__ __forceinline__ float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
static __device__ __forceinline__ __half __float2half_rn(float f) { return (__half)f; }
static __device__ __forceinline__ __hip_bfloat16 __float2bfloat16(float f) {  // round to nearest even, NaN stays NaN
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return {(unsigned short)((u >> 16) | 0x40)};
    u += 0x7FFFu + ((u >> 16) & 1u);
    return {(unsigned short)(u >> 16)};
}

// ---- float math ----
static __device__ __forceinline__ float fabsf(float x) { return __builtin_fabsf(x); }
static __device__ __forceinline__ float fmaxf(float a, float b) { return __builtin_fmaxf(a, b); }
static __device__ __forceinline__ float roundf(float x) { return __builtin_roundf(x); }
static __device__ __forceinline__ int min(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ float __fdiv_rn(float a, float b) { return a / b; }
static __device__ __forceinline__ float __fmul_rn(float a, float b) { return a * b; }
static __device__ __forceinline__ float __fadd_rn(float a, float b) { return a + b; }
static __device__ __forceinline__ float __fmaf_rn(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
static __device__ __forceinline__ float __fsub_rn(float a, float b) { return a - b; }
static __device__ __forceinline__ float __fsqrt_rn(float x) { return __builtin_sqrtf(x); }
static __device__ __forceinline__ int max(int a, int b) { return a > b ? a : b; }
static __device__ __forceinline__ int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }  // HIP's overloads
static __device__ __forceinline__ int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
static __device__ __forceinline__ float max(float a, float b) { return __builtin_fmaxf(a, b); }
static __device__ __forceinline__ float min(float a, float b) { return __builtin_fminf(a, b); }
static __device__ __forceinline__ float __uint_as_float(unsigned int x) { return __builtin_bit_cast(float, x); }
// libm functions: ROCm's device library (ocml) implements them; declared only (no device library is linked).
extern "C" __device__ float __ocml_exp_f32(float);
extern "C" __device__ float __ocml_tanh_f32(float);
extern "C" __device__ float __ocml_cos_f32(float);
extern "C" __device__ float __ocml_sin_f32(float);
extern "C" __device__ float __ocml_pow_f32(float, float);
extern "C" __device__ float __ocml_rsqrt_f32(float);
extern "C" __device__ float __ocml_log_f32(float);
static __device__ __forceinline__ float expf(float x) { return __ocml_exp_f32(x); }
static __device__ __forceinline__ float tanhf(float x) { return __ocml_tanh_f32(x); }
static __device__ __forceinline__ float cosf(float x) { return __ocml_cos_f32(x); }
static __device__ __forceinline__ float sinf(float x) { return __ocml_sin_f32(x); }
static __device__ __forceinline__ float powf(float x, float y) { return __ocml_pow_f32(x, y); }
static __device__ __forceinline__ float rsqrtf(float x) { return __ocml_rsqrt_f32(x); }
static __device__ __forceinline__ float logf(float x) { return __ocml_log_f32(x); }
static __device__ __forceinline__ int __float2int_rn(float x) { return (int)__builtin_rintf(x); }
static __device__ __forceinline__ unsigned int __float_as_uint(float x) { return __builtin_bit_cast(unsigned int, x); }
