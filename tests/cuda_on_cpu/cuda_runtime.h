// cuda_runtime.h for tests/test_cuda_emulation.py: runs the CUDA sources of the transformer ops (ops.cu,
// attention.cu) on the CPU, one std::thread per CUDA thread, so their index math, masks, barriers and warp
// collectives are tested on a machine without a GPU. The test rewrites kernel launches into ciq_emu::launch and the
// two PTX statements (mma.sync m16n8k16, ldmatrix.x4.trans) into ciq_emu::mma_16816 / ldmatrix_x4_trans, which
// implement the PTX ISA's fragment layouts at matrix level, independently of the kernels' use of them.
//
// Semantics: CTAs run one after another; __syncthreads is a barrier of the CTA's threads, a warp collective a
// barrier of its 32 lanes; a thread that returns drops out of both (as on the GPU). __shared__ variables are
// statics (one CTA at a time), dynamic shared memory is a buffer filled with 0xFF bytes (NaN) before each CTA.
#pragma once

#define CIQ_CUDA_EMULATION 1  // sources that write out nvcc's contraction compute it uncontracted here

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) alignas(n)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
inline thread_local dim3 threadIdx, blockIdx, blockDim, gridDim;

// ---- types and conversions ----
using __half = _Float16;
struct alignas(4) __half2 {
    __half x, y;
};
struct __nv_bfloat16 {
    uint16_t bits;
};
struct alignas(8) float2 {
    float x, y;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct alignas(8) uint2 {
    unsigned x, y;
};
inline uint2 make_uint2(unsigned x, unsigned y) { return {x, y}; }
inline float __half2float(__half h) { return (float)h; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline __half __ushort_as_half(unsigned short bits) {
    __half h;
    std::memcpy(&h, &bits, 2);
    return h;
}
inline unsigned short __half_as_ushort(__half h) {
    unsigned short bits;
    std::memcpy(&bits, &h, 2);
    return bits;
}
inline __half2 __floats2half2_rn(float lo, float hi) { return {(__half)lo, (__half)hi}; }
inline __half2 __float2half2_rn(float f) { return {(__half)f, (__half)f}; }
inline __half __hmul(__half a, __half b) { return (__half)((float)a * (float)b); }  // exact product, one rounding
inline __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return {(uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16)};
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float x) { return std::sqrt(x); }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
// The fast-math intrinsics as the host's accurate functions (the emulation checks index math, not rounding).
inline float __expf(float x) { return std::exp(x); }
inline float __int_as_float(int i) {
    float f;
    std::memcpy(&f, &i, 4);
    return f;
}
template <class T> T __ldg(const T *p) { return *p; }
inline unsigned __vsub4(unsigned a, unsigned b) {  // per byte, modulo 256
    unsigned r = 0;
    for (int j = 0; j < 4; ++j) r |= ((((a >> 8 * j) & 0xFF) - ((b >> 8 * j) & 0xFF)) & 0xFF) << 8 * j;
    return r;
}
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
[[noreturn]] inline void __trap() { std::abort(); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline int __dp4a(int a, int b, int c) {  // c + the dot product of the signed bytes of a and b
    for (int i = 0; i < 32; i += 8) c += (int)(signed char)(a >> i) * (int)(signed char)(b >> i);
    return c;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return a < b ? a : b; }  // CUDA's float overloads (ops_llamacpp.cu's YaRN ramp)
inline float max(float a, float b) { return a > b ? a : b; }

// ---- runtime API (what the host code of ops.cu / attention.cu / common.cuh calls) ----
typedef int cudaError_t;
typedef void *cudaStream_t;  // the launches' fourth argument (ciq_stream(): driver.cpp gives nullptr)
constexpr cudaError_t cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorLaunchFailure = 4;
constexpr int cudaFuncAttributeMaxDynamicSharedMemorySize = 8;
namespace ciq_emu {
inline cudaError_t last_error = cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
    const cudaError_t e = ciq_emu::last_error;
    ciq_emu::last_error = cudaSuccess;
    return e;
}
inline const char *cudaGetErrorString(cudaError_t e) { return e ? "emulated launch failure" : "no error"; }
inline cudaError_t cudaGetDevice(int *device) {
    *device = 0;
    return cudaSuccess;
}
template <class F> cudaError_t cudaFuncSetAttribute(F, int, int) { return cudaSuccess; }
constexpr int cudaDevAttrMultiProcessorCount = 16;
constexpr int cudaDevAttrComputeCapabilityMajor = 75;
constexpr int cudaDevAttrComputeCapabilityMinor = 76;
constexpr int cudaDevAttrMaxSharedMemoryPerBlockOptin = 97;
inline cudaError_t cudaDeviceGetAttribute(int *value, int attribute, int) {  // the emulated device is an H200 (sm_90)
    switch (attribute) {
        case cudaDevAttrMultiProcessorCount: *value = 132; break;
        case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
        case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
        case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
        default: return cudaErrorInvalidValue;
    }
    return cudaSuccess;
}

namespace ciq_emu {

constexpr size_t MAX_DYNAMIC_SMEM = 227 * 1024;  // sm_90's opt-in limit

struct Warp {
    explicit Warp(int lanes) : sync(lanes) {}
    std::barrier<> sync;
    alignas(16) unsigned char slots[32][64];
};

struct Cta {
    explicit Cta(int threads) : sync(threads) {
        for (int lane0 = 0; lane0 < threads; lane0 += 32) warps.emplace_back(new Warp(std::min(32, threads - lane0)));
    }
    std::barrier<> sync;
    std::atomic<int> vote{0};  // __syncthreads_or's and __syncthreads_and's
    std::vector<std::unique_ptr<Warp>> warps;
    std::vector<unsigned char> dynamic_smem;
};
inline thread_local Cta *cta = nullptr;

inline unsigned flat_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }
inline Warp &warp() { return *cta->warps[flat_thread() / 32]; }
inline int lane() { return (int)(flat_thread() % 32); }

// Every lane publishes `value`; returns what lane `source(lane)` published.
template <class T, class Source> T exchange(const T &value, Source source) {
    static_assert(sizeof(T) <= 64, "slot size");
    Warp &w = warp();
    std::memcpy(w.slots[lane()], &value, sizeof(T));
    w.sync.arrive_and_wait();
    T result;
    std::memcpy(&result, w.slots[source(lane())], sizeof(T));
    w.sync.arrive_and_wait();
    return result;
}

// The fragments of a whole warp (mma.sync's operands): every lane publishes `mine`; unpack(g, t, f) then runs on each
// lane l's fragments f, g = l / 4, t = l % 4 (the PTX ISA's fragment layouts are in those terms).
template <class T, class Unpack> void unpack_warp_fragments(const T &mine, Unpack unpack) {
    static_assert(sizeof(T) <= 64, "slot size");
    Warp &w = warp();
    std::memcpy(w.slots[lane()], &mine, sizeof(T));
    w.sync.arrive_and_wait();
    for (int l = 0; l < 32; ++l) {
        T f;
        std::memcpy(&f, w.slots[l], sizeof(T));
        unpack(l / 4, l % 4, f);
    }
    w.sync.arrive_and_wait();
}

inline unsigned char *dynamic_smem() { return cta->dynamic_smem.data(); }

// mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 (PTX ISA, "Matrix Fragments for mma.m16n8k16"), g = lane / 4,
// t = lane % 4: A (16x16, row) a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..];
// B (16x8, col) b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; C/D (16x8) c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..].
// The lower half of each 32-bit register is the lower column (A) or row (B) index.
struct MmaFragments {
    uint32_t a[4], b[2];
};
inline void mma_16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    float A[16][16], B[16][8];
    auto half_at = [](uint32_t reg, int which) {
        const uint16_t bits = (uint16_t)(which ? reg >> 16 : reg & 0xFFFF);
        return (float)__ushort_as_half(bits);
    };
    unpack_warp_fragments(MmaFragments{{a0, a1, a2, a3}, {b0, b1}}, [&](int g, int t, const MmaFragments &f) {
        for (int j = 0; j < 2; ++j) {
            A[g][2 * t + j] = half_at(f.a[0], j);
            A[g + 8][2 * t + j] = half_at(f.a[1], j);
            A[g][2 * t + 8 + j] = half_at(f.a[2], j);
            A[g + 8][2 * t + 8 + j] = half_at(f.a[3], j);
            B[2 * t + j][g] = half_at(f.b[0], j);
            B[2 * t + 8 + j][g] = half_at(f.b[1], j);
        }
    });
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        double sum = c[i];
        for (int k = 0; k < 16; ++k) sum += (double)A[row][k] * B[k][col];
        c[i] = (float)sum;
    }
}

// mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16: the same A and B fragments; C/D are two half2, c0 = C[g][2t..2t+1],
// c1 = C[g+8][2t..]. Emulated as the float32 form on C's values, each result rounded to f16 (the hardware's internal
// accumulation order and precision are not modelled).
inline void mma_16816_f16(uint32_t c[2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    float acc[4];
    for (int r = 0; r < 2; ++r) {
        __half2 h;
        std::memcpy(&h, &c[r], 4);
        acc[2 * r] = (float)h.x, acc[2 * r + 1] = (float)h.y;
    }
    mma_16816(acc, a0, a1, a2, a3, b0, b1);
    for (int r = 0; r < 2; ++r) {
        const __half2 h{(__half)acc[2 * r], (__half)acc[2 * r + 1]};
        std::memcpy(&c[r], &h, 4);
    }
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: lanes 8i..8i+7 give the addresses of the 8 rows (8 b16 each) of
// matrix i; register i of lane l holds stored[2(l%4)][l/4] (low half) and stored[2(l%4)+1][l/4] of matrix i.
inline void ldmatrix_x4_trans(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3, uint32_t address) {
    Warp &w = warp();
    std::memcpy(w.slots[lane()], &address, sizeof(address));
    w.sync.arrive_and_wait();
    uint32_t regs[4];
    const int l = lane();
    for (int i = 0; i < 4; ++i) {
        uint16_t element[2];
        for (int j = 0; j < 2; ++j) {
            const int row = 2 * (l % 4) + j, col = l / 4;
            uint32_t row_address;
            std::memcpy(&row_address, w.slots[8 * i + row], sizeof(row_address));
            if (row_address % 16 || row_address + 16 > cta->dynamic_smem.size()) {
                last_error = cudaErrorLaunchFailure;
                element[j] = 0;
            } else {
                std::memcpy(&element[j], dynamic_smem() + row_address + 2 * col, 2);
            }
        }
        regs[i] = element[0] | (uint32_t)element[1] << 16;
    }
    w.sync.arrive_and_wait();
    r0 = regs[0], r1 = regs[1], r2 = regs[2], r3 = regs[3];
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (PTX ISA, "Matrix Fragments for mma.m16n8k32" with .s8): byte j
// of a register is element j. A (16x32, row) a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..],
// a3 = A[g+8][16+4t..]; B (32x8, col) b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]; C/D int32 as in m16n8k16 (c0, c1 =
// D[g][2t..2t+1], c2, c3 = D[g+8][2t..]), D = A B + cin in every element (the kernels pass one C register four times).
// k16 = true: m16n8k16 .s8, A a0 = A[g][4t..4t+3], a1 = A[g+8][4t..]; B b0 = B[4t..4t+3][g]. Integer sums: exact.
struct MmaS8Fragments {
    int a[4], b[2];
};
inline void mma_s8(bool k16, int c[4], int a0, int a1, int a2, int a3, int b0, int b1, int cin) {
    int A[16][32] = {}, B[32][8] = {};
    auto byte_at = [](int reg, int j) { return (int)(int8_t)((uint32_t)reg >> (8 * j)); };
    unpack_warp_fragments(MmaS8Fragments{{a0, a1, a2, a3}, {b0, b1}}, [&](int g, int t, const MmaS8Fragments &f) {
        for (int j = 0; j < 4; ++j) {
            A[g][4 * t + j] = byte_at(f.a[0], j);
            A[g + 8][4 * t + j] = byte_at(f.a[1], j);
            B[4 * t + j][g] = byte_at(f.b[0], j);
            if (!k16) {
                A[g][16 + 4 * t + j] = byte_at(f.a[2], j);
                A[g + 8][16 + 4 * t + j] = byte_at(f.a[3], j);
                B[16 + 4 * t + j][g] = byte_at(f.b[1], j);
            }
        }
    });
    const int g = lane() / 4, t = lane() % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
        int sum = cin;
        for (int k = 0; k < (k16 ? 16 : 32); ++k) sum += A[row][k] * B[k][col];
        c[i] = sum;
    }
}
inline void mma_16832_s8(int c[4], int a0, int a1, int a2, int a3, int b0, int b1, int cin) {
    mma_s8(false, c, a0, a1, a2, a3, b0, b1, cin);
}
inline void mma_16816_s8(int c[4], int a0, int a1, int b0, int cin) { mma_s8(true, c, a0, a1, 0, 0, b0, 0, cin); }

// ldmatrix.sync.aligned.m8n8.x{4,2}.shared.b16: lanes 8i..8i+7 give the addresses of the 8 rows (16 bytes) of matrix i;
// register i of lane l holds bytes 4(l%4)..4(l%4)+3 of row l/4 of matrix i.
inline void ldmatrix_n(int n, uint32_t *regs, uint32_t address) {
    Warp &w = warp();
    std::memcpy(w.slots[lane()], &address, sizeof(address));
    w.sync.arrive_and_wait();
    const int l = lane();
    for (int i = 0; i < n; ++i) {
        uint32_t row_address;
        std::memcpy(&row_address, w.slots[8 * i + l / 4], sizeof(row_address));
        if (row_address % 16 || row_address + 16 > cta->dynamic_smem.size()) {
            last_error = cudaErrorLaunchFailure;
            regs[i] = 0;
        } else {
            std::memcpy(&regs[i], dynamic_smem() + row_address + 4 * (l % 4), 4);
        }
    }
    w.sync.arrive_and_wait();
}
inline void ldmatrix_x4(int &r0, int &r1, int &r2, int &r3, uint32_t address) {
    uint32_t regs[4];
    ldmatrix_n(4, regs, address);
    r0 = (int)regs[0], r1 = (int)regs[1], r2 = (int)regs[2], r3 = (int)regs[3];
}
inline void ldmatrix_x2(int &r0, int &r1, uint32_t address) {
    uint32_t regs[2];
    ldmatrix_n(2, regs, address);
    r0 = (int)regs[0], r1 = (int)regs[1];
}

struct Config {
    dim3 grid, block;
    size_t smem = 0;
    cudaStream_t stream = nullptr;  // one stream here: launches run in order
};

template <class... Params, class... Args> void launch(void (*kernel)(Params...), Config config, Args... args) {
    const unsigned threads = config.block.x * config.block.y * config.block.z;
    if (threads == 0 || threads > 1024 || config.smem > MAX_DYNAMIC_SMEM || config.grid.x == 0) {
        last_error = cudaErrorLaunchFailure;
        return;
    }
    for (unsigned bz = 0; bz < config.grid.z; ++bz)
        for (unsigned by = 0; by < config.grid.y; ++by)
            for (unsigned bx = 0; bx < config.grid.x; ++bx) {
                Cta block(threads);
                block.dynamic_smem.assign(config.smem, 0xFF);
                std::vector<std::thread> pool;
                for (unsigned t = 0; t < threads; ++t) {
                    pool.emplace_back([&, t] {
                        cta = &block;
                        blockDim = config.block;
                        gridDim = config.grid;
                        blockIdx = dim3(bx, by, bz);
                        threadIdx = dim3(t % config.block.x, t / config.block.x % config.block.y,
                                         t / (config.block.x * config.block.y));
                        kernel(args...);
                        warp().sync.arrive_and_drop();
                        block.sync.arrive_and_drop();
                    });
                }
                for (auto &thread : pool) thread.join();
            }
}

}  // namespace ciq_emu

inline void __syncthreads() { ciq_emu::cta->sync.arrive_and_wait(); }
inline int ciq_emu_vote(int predicate, bool all) {  // a barrier that also ORs (ANDs) the threads' predicates
    ciq_emu::Cta &c = *ciq_emu::cta;
    if (all ? !predicate : predicate != 0) c.vote.store(1);
    c.sync.arrive_and_wait();
    const int voted = c.vote.load();
    c.sync.arrive_and_wait();
    if (ciq_emu::flat_thread() == 0) c.vote.store(0);
    c.sync.arrive_and_wait();
    return all ? !voted : voted;
}
inline int __syncthreads_or(int predicate) { return ciq_emu_vote(predicate, false); }
inline int __syncthreads_and(int predicate) { return ciq_emu_vote(predicate, true); }
template <class T> T __shfl_xor_sync(unsigned, T value, int offset) {
    return ciq_emu::exchange(value, [&](int l) { return l ^ offset; });
}
inline uint32_t __cvta_generic_to_shared(const void *p) {
    return (uint32_t)((const unsigned char *)p - ciq_emu::dynamic_smem());
}
