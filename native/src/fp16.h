// The one fp16 helper of the library, shared by the host (cpu/, dequantize.h) and the GPU side (cuda/): IEEE half
// and bf16 <-> float conversions in portable C++ (exact; round to nearest even), as ggml does them, and the
// bit-pattern reads both sides make (ciq_half_to_float, ciq_bits_to_float, ciq_float_to_bits), which device code
// compiles to the CUDA/HIP intrinsics (a .cu file includes this after vendor.cuh's cuda_fp16.h: common.cuh does).
#pragma once
#include <cstdint>
#include <cstring>

// A function for both passes of a CUDA/HIP compile (static inline in host-only C++ and the CUDA-on-CPU emulation).
#if defined(__CUDACC__) || defined(__HIPCC__)
#define CIQ_HOST_DEVICE static __host__ __device__ __forceinline__
#else
#define CIQ_HOST_DEVICE static inline
#endif
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define CIQ_FP16_DEVICE_PASS 1  // the device intrinsics below
#endif

#ifdef CIQ_FP16_DEVICE_PASS  // device code: the intrinsics
CIQ_HOST_DEVICE float ciq_bits_to_float(uint32_t bits) { return __uint_as_float(bits); }
CIQ_HOST_DEVICE uint32_t ciq_float_to_bits(float f) { return __float_as_uint(f); }
#else  // host code: the bytes
CIQ_HOST_DEVICE float ciq_bits_to_float(uint32_t bits) { float f; std::memcpy(&f, &bits, 4); return f; }
CIQ_HOST_DEVICE uint32_t ciq_float_to_bits(float f) { uint32_t bits; std::memcpy(&bits, &f, 4); return bits; }
#endif

static inline float ciq_fp16_to_fp32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const float normalized = ciq_bits_to_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
    const float denormalized = ciq_bits_to_float((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result = sign | (two_w < (1u << 27) ? ciq_float_to_bits(denormalized) : ciq_float_to_bits(normalized));
    return ciq_bits_to_float(result);
}

static inline uint16_t ciq_fp32_to_fp16(float f) {
    float base = (f < 0 ? -f : f) * 0x1.0p+112f * 0x1.0p-110f;
    const uint32_t w = ciq_float_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = ciq_bits_to_float((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = ciq_float_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : exp_bits + mantissa_bits));
}

// The host's conversions (ggml's fp32 <-> fp16 bit tricks; bf16 with round to nearest even and a quiet NaN).
static inline uint16_t ciq_fp32_to_bf16(float f) {
    uint32_t bits = ciq_float_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 64);  // quiet NaN
    return (uint16_t)((bits + (0x7fffu + ((bits >> 16) & 1))) >> 16);
}

// A half bit pattern's value: __half2float in device code, ciq_fp16_to_fp32 on the host (the same exact value).
CIQ_HOST_DEVICE float ciq_half_to_float(uint16_t bits) {
#ifdef CIQ_FP16_DEVICE_PASS
    return __half2float(__ushort_as_half(bits));
#else
    return ciq_fp16_to_fp32(bits);
#endif
}
