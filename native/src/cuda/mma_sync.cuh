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

// The attention kernels' two products for one warp's 16 query rows, from f16 tiles staged in shared memory with rows
// STRIDE halves apart. S = Q K^T over KEYS keys: s[n] is n-tile n (keys 8n..8n+7) in the C layout, D summed in steps
// of 16 into float32 from 0.
template <int D, int KEYS, int STRIDE>
__device__ __forceinline__ void warp_scores(float (&s)[KEYS / 8][4], const __half *q_rows, const __half *k_rows,
                                            int lane) {
    const int g = lane / 4, tig = lane % 4;
#pragma unroll
    for (int n = 0; n < KEYS / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const __half *qa = q_rows + g * STRIDE + 16 * kk + 2 * tig;
        const uint32_t a0 = *(const uint32_t *)qa, a1 = *(const uint32_t *)(qa + 8 * STRIDE);
        const uint32_t a2 = *(const uint32_t *)(qa + 8), a3 = *(const uint32_t *)(qa + 8 * STRIDE + 8);
#pragma unroll
        for (int n = 0; n < KEYS / 8; ++n) {
            const __half *kp = k_rows + (8 * n + g) * STRIDE + 16 * kk + 2 * tig;
            mma_16816(s[n], a0, a1, a2, a3, *(const uint32_t *)kp, *(const uint32_t *)(kp + 8));
        }
    }
}

__device__ __forceinline__ void mma_acc(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1) {
    mma_16816(c, a0, a1, a2, a3, b0, b1);
}
__device__ __forceinline__ void mma_acc(uint32_t (&c)[2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
    mma_16816_f16(c, a0, a1, a2, a3, b0, b1);
}

// O += P V over KEYS keys: P's A fragments are the score accumulators of n-tiles 2kk, 2kk + 1 rounded to f16; V's B
// fragments come by ldmatrix.trans (lanes 0-7 / 8-15 address keys 16kk + 0..7 / 8..15 at dims 16np, lanes 16-31 the
// same keys at dims 16np + 8; b0, b1 (b2, b3) are n-tile 2np's (2np + 1's)). o[n]: float32 C fragments, or two half2
// (rows g, g + 8) summed in f16.
template <int D, int KEYS, int STRIDE, class Acc>
__device__ __forceinline__ void warp_pv(Acc (&o)[D / 8], const float (&p)[KEYS / 8][4], const __half *v_rows, int lane) {
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
        const uint32_t a0 = pack_half2(p[2 * kk][0], p[2 * kk][1]), a1 = pack_half2(p[2 * kk][2], p[2 * kk][3]);
        const uint32_t a2 = pack_half2(p[2 * kk + 1][0], p[2 * kk + 1][1]);
        const uint32_t a3 = pack_half2(p[2 * kk + 1][2], p[2 * kk + 1][3]);
        const __half *vrow = v_rows + (16 * kk + (lane % 16)) * STRIDE + 8 * (lane / 16);
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
            uint32_t b0, b1, b2, b3;
            ldmatrix_x4_trans(b0, b1, b2, b3, vrow + 16 * np);
            mma_acc(o[2 * np], a0, a1, a2, a3, b0, b1);
            mma_acc(o[2 * np + 1], a0, a1, a2, a3, b2, b3);
        }
    }
}
#endif  // !GGML_CIQ_HIP
