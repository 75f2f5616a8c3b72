// Maps the CUDA names the kernels use onto HIP, so one source builds for both (after ggml-cuda's vendors/hip.h).
// GGML_CIQ_HIP_NOGPUINC (tools/hip_compile_check.sh only) takes the HIP names from hip_nogpuinc.h instead of ROCm.
#pragma once

#if defined(GGML_CIQ_HIP)
#if defined(GGML_CIQ_HIP_NOGPUINC)
#include "hip_nogpuinc.h"
#else
#define HIP_DISABLE_WARP_SYNC_BUILTINS 1  // the *_sync shuffles are mapped below, as in llama.cpp
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <hip/hip_bf16.h>
#endif
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaGetLastError hipGetLastError
#define cudaGetErrorString hipGetErrorString
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaDeviceProp hipDeviceProp_t
#define cudaSetDevice hipSetDevice
#define cudaGetDevice hipGetDevice
#define cudaDeviceGetAttribute hipDeviceGetAttribute
#define cudaDevAttrMultiProcessorCount hipDeviceAttributeMultiprocessorCount
#define cudaMalloc hipMalloc
#define cudaFree hipFree
#define cudaMemcpy hipMemcpy
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define cudaMemcpy2DAsync hipMemcpy2DAsync
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaStream_t hipStream_t
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaEvent_t hipEvent_t
#define cudaEventCreate hipEventCreate
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventDestroy hipEventDestroy
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define __nv_bfloat16 __hip_bfloat16
// No member masks on AMD; the width defaults to warpSize (32: the kernels run wave32).
#define __shfl_xor_sync(mask, ...) __shfl_xor(__VA_ARGS__)
// A wave runs in lockstep: __syncwarp only orders the wave's shared-memory accesses (as HIP's own __syncwarp).
#define __syncwarp()                                             \
    do {                                                         \
        __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");   \
        __builtin_amdgcn_wave_barrier();                         \
        __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");   \
    } while (0)
// HIP's __launch_bounds__(threads, n) reads n as minimum waves per SIMD, not blocks per SM. For the kernels' n (4 or
// 2) a wave keeps its 256-VGPR maximum (gfx11/gfx12 SIMDs have >= 1024 VGPRs per lane), so it constrains nothing.
#define CIQ_WARP_SIZE 32  // RDNA wave32
#else
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define CIQ_WARP_SIZE 32
#endif
