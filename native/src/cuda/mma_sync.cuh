// mma_sync.cuh - the sm_80+ tensor-core instructions the attention kernels use (attention.cu, attention_llamacpp.cu),
// said once. Fragment layouts are the PTX ISA's m16n8k16: lane = 4 g + tig; A a0/a1 rows g / g + 8 at k 2tig..+1,
// a2/a3 the same rows at k 2tig + 8..+9; B b0 (b1) k 2tig..+1 (+8) at column g; C c0..c1 row g, c2..c3 row g + 8,
// columns 2tig, 2tig + 1. tests/test_cuda_emulation.py rewrites the PTX statements of this file for the CPU.
#pragma once
#include "common.cuh"

#if !defined(GGML_CIQ_HIP)
// c += A B, float32 accumulators.
__device__ __forceinline__ void mma_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                          uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// c (two half2: rows g and g + 8, columns 2 tig, +1) += A B, accumulated in f16 (llama.cpp's P V on NVIDIA).
__device__ __forceinline__ void mma_16816_f16(uint32_t c[2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0,%1}, {%2,%3,%4,%5}, {%6,%7}, {%0,%1};"
                 : "+r"(c[0]), "+r"(c[1])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// B fragments of V for O += P V: ldmatrix.x4.trans at a lane's row address (see the callers for which rows).
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t &b0, uint32_t &b1, uint32_t &b2, uint32_t &b3,
                                                  const void *row) {
    const uint32_t address = (uint32_t)__cvta_generic_to_shared(row);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                 : "r"(address));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}
#endif  // !GGML_CIQ_HIP
