// wmma_fragment.cuh - the 16x16x16 int8 WMMA fragments of the GEMM kernels: nvcuda::wmma on CUDA, the wave32 iu8
// builtins of RDNA3 (gfx11) and RDNA4 (gfx12) with explicit lane layouts on AMD.
//
// Contract, every architecture: one warp (wave32) of 32 lanes; operands are 16x16 int8 tiles in shared memory with
// 16-byte rows: weights A[row][k] at 16*row + k, tokens B[k][col] at 16*col + k (B column-major); the int32 result
// D = A*B + C (signed x signed, no saturation) is stored row-major, D[row][col] at 16*row + col.
//
// Register element v (0..n-1) of lane l (0..31) holds, per operand: A[first][second] (first = row, second = k),
// B[second][first] (first = col, second = k), C/D[first][second] (first = row, second = col). '/' and '%' are
// integer operations. ggml_ciq/wmma_layouts.py holds the same table; tests/test_wmma_layouts.py checks the two
// agree, that the Layout structs below implement it, and that each layout yields the plain matrix product.
//
// LAYOUT TABLE
//   arch  | operand | n  | first             | second
//   sm80  | A       | 8  | l/4 + 8*(v/4)     | 4*(l%4) + v%4
//   sm80  | B       | 8  | l/4 + 8*(v/4)     | 4*(l%4) + v%4
//   sm80  | C       | 8  | l/4 + 8*((v/2)%2) | 2*(l%4) + v%2 + 8*(v/4)
//   gfx11 | A       | 16 | l%16              | v
//   gfx11 | B       | 16 | l%16              | v
//   gfx11 | C       | 8  | 2*v + l/16        | l%16
//   gfx12 | A       | 8  | l%16              | 8*(l/16) + v
//   gfx12 | B       | 8  | l%16              | 8*(l/16) + v
//   gfx12 | C       | 8  | v + 8*(l/16)      | l%16
// END LAYOUT TABLE
//
// sm80: our code never sees it (load/store_matrix_sync with ldm 16 do the mapping). Listed for the emulation: PTX's
//   mma.m16n8k16 .s8 fragments (ISA "Matrix Fragments for mma.m16n8k16"), once per 8-column half; our sm_90a SASS
//   runs each wmma::mma_sync as two IMMA.16816.S8.S8.
// gfx11 (__builtin_amdgcn_wmma_i32_16x16x16_iu8_w32: v4i32 A, v4i32 B, v8i32 C): a lane holds a whole 16-byte row
//   of A / column of B, lanes 16-31 repeat lanes 0-15; C rows interleave between the lane halves. Sources: AMD
//   GPUOpen "How to accelerate AI applications on RDNA 3 using WMMA" (a_frag[ele] = a[16*lane%16 + ele],
//   c row = 2*ele + lane/16); llama.cpp ggml-cuda/mma.cuh (RDNA3: A/B DATA_LAYOUT_I_MAJOR_MIRRORED, int C
//   J_MAJOR with i = 2*l + lane/16, j = lane%16).
// gfx12 (__builtin_amdgcn_wmma_i32_16x16x16_iu8_w32_gfx12: v2i32 A, v2i32 B, v8i32 C): no repetition, lanes 16-31
//   hold k 8..15 and C rows 8..15. Source: llama.cpp ggml-cuda/mma.cuh (RDNA4: tile<16,4,int> get_i = lane%16,
//   get_j = 2*(lane/16) + l; C J_MAJOR with i = 8*(lane/16) + l, j = lane%16), composable_kernel ck_tile
//   wmma_gfx12.hpp for the builtin's operands (signed A, signed B, clamp).
#pragma once
#include "vendor.cuh"

#include <cstdint>

#if !defined(GGML_CIQ_HIP)
#include <mma.h>
#endif

namespace ciq_wmma {

constexpr int DIM = 16;  // m = n = k

#if !defined(GGML_CIQ_HIP)

namespace wmma = nvcuda::wmma;
using FragWeights = wmma::fragment<wmma::matrix_a, DIM, DIM, DIM, signed char, wmma::row_major>;
using FragTokens = wmma::fragment<wmma::matrix_b, DIM, DIM, DIM, signed char, wmma::col_major>;
using FragSum = wmma::fragment<wmma::accumulator, DIM, DIM, DIM, int>;

__device__ __forceinline__ void frag_zero(FragSum &c) { wmma::fill_fragment(c, 0); }
__device__ __forceinline__ void frag_load(FragWeights &a, const int8_t *tile) {
    wmma::load_matrix_sync(a, reinterpret_cast<const signed char *>(tile), DIM);
}
__device__ __forceinline__ void frag_load(FragTokens &b, const int8_t *tile) {
    wmma::load_matrix_sync(b, reinterpret_cast<const signed char *>(tile), DIM);
}
__device__ __forceinline__ void frag_mma(FragSum &c, const FragWeights &a, const FragTokens &b) {
    wmma::mma_sync(c, a, b, c);
}
__device__ __forceinline__ void frag_store(int *tile, const FragSum &c) {
    wmma::store_matrix_sync(tile, c, DIM, wmma::mem_row_major);
}

#else

typedef int SumRegs __attribute__((ext_vector_type(8)));

// The gfx11 and gfx12 rows of the table as code: ab_index(l) is the A row / B column of lane l, ab_k(l, v) the k of
// its element v, c_row(l, v) and c_col(l) the accumulator element v. A lane loads its A/B elements as one vector
// from 16*ab_index(l) + ab_k(l, 0) (ab_k(l, v) = ab_k(l, 0) + v).
struct LayoutGfx11 {
    typedef int ABRegs __attribute__((ext_vector_type(4)));
    static __device__ __forceinline__ int ab_index(int l) { return l % 16; }
    static __device__ __forceinline__ int ab_k(int, int v) { return v; }
    static __device__ __forceinline__ int c_row(int l, int v) { return 2 * v + l / 16; }
    static __device__ __forceinline__ int c_col(int l) { return l % 16; }
    static __device__ __forceinline__ SumRegs mma(ABRegs a, ABRegs b, SumRegs c) {
        return __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32(true, a, true, b, c, false);
    }
};

struct LayoutGfx12 {
    typedef int ABRegs __attribute__((ext_vector_type(2)));
    static __device__ __forceinline__ int ab_index(int l) { return l % 16; }
    static __device__ __forceinline__ int ab_k(int l, int v) { return 8 * (l / 16) + v; }
    static __device__ __forceinline__ int c_row(int l, int v) { return v + 8 * (l / 16); }
    static __device__ __forceinline__ int c_col(int l) { return l % 16; }
    static __device__ __forceinline__ SumRegs mma(ABRegs a, ABRegs b, SumRegs c) {
        return __builtin_amdgcn_wmma_i32_16x16x16_iu8_w32_gfx12(true, a, true, b, c, false);
    }
};

// gfx12 devices use the gfx12 builtin; everything else (gfx11, and the host pass) the gfx11 one, which fails to
// compile for a target without it.
#if defined(__GFX12__)
using Layout = LayoutGfx12;
#else
using Layout = LayoutGfx11;
#endif

struct FragWeights {
    Layout::ABRegs x;
};
struct FragTokens {
    Layout::ABRegs x;
};
struct FragSum {
    SumRegs x;
};

__device__ __forceinline__ int lane_id() { return (int)__builtin_amdgcn_mbcnt_lo(~0u, 0u); }  // wave32

__device__ __forceinline__ Layout::ABRegs load_ab(const int8_t *tile) {
    const int l = lane_id();
    return *reinterpret_cast<const Layout::ABRegs *>(tile + DIM * Layout::ab_index(l) + Layout::ab_k(l, 0));
}

__device__ __forceinline__ void frag_zero(FragSum &c) { c.x = SumRegs{}; }
__device__ __forceinline__ void frag_load(FragWeights &a, const int8_t *tile) { a.x = load_ab(tile); }
__device__ __forceinline__ void frag_load(FragTokens &b, const int8_t *tile) { b.x = load_ab(tile); }
__device__ __forceinline__ void frag_mma(FragSum &c, const FragWeights &a, const FragTokens &b) {
    c.x = Layout::mma(a.x, b.x, c.x);
}
__device__ __forceinline__ void frag_store(int *tile, const FragSum &c) {
    const int l = lane_id();
#pragma unroll
    for (int v = 0; v < 8; ++v) tile[DIM * Layout::c_row(l, v) + Layout::c_col(l)] = c.x[v];
}

#endif

}  // namespace ciq_wmma
