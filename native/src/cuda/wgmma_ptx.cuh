// wgmma_ptx.cuh - the Hopper (sm_90a) PTX the wgmma GEMM (gemm_wgmma.cu) is built from, one inline wrapper per
// instruction family; no kernel logic here.
//   mbarriers  : mbar_init / mbar_arrive / mbar_arrive_expect_tx (TMA byte count) / mbar_wait (phase parity).
//   TMA        : tma_load_2d, a 2-D box of a CUtensorMap into shared memory, completing on an mbarrier.
//   wgmma      : smem_desc (K-major, 128-byte swizzle, 8-row groups 1024 B apart), fence / commit / wait, and
//                wgmma_tile<BN>: one m64nBNk16 f16 x f16 -> f32 step, D fragment acc[4j + e] = row lane/4 + 8(e/2) of
//                the warp's 16, token 8j + 2(lane%4) + e%2.
//   clusters   : cluster_sync, mapa (an address in another CTA's shared memory), ld_dsmem4 (distributed shared loads).
//   PDL        : wait_for_previous_grid (griddepcontrol.wait).
//   attention  : smem_desc_mn (MN-major B), tma_load_3d, fence_proxy_async, wgmma_rs<N> (A from registers,
//                B transposed); wgmma_rsk<N> (A from registers, B K-major: the GEMM's RS kernels); host:
//                tensor_map_encoder.
// CIQ_WGMMA_DEVICE is defined where these compile (the sm_90a device pass).
#pragma once
#include "common.cuh"

#if !defined(GGML_CIQ_HIP)
#include <cuda.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define CIQ_WGMMA_DEVICE 1
#endif

// Two halves as the 32-bit word a register holds.
static __device__ __forceinline__ uint32_t h2u(__half2 h) { return *(const uint32_t *)&h; }

#ifdef CIQ_WGMMA_DEVICE
static __device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Programmatic dependent launch (launch_wgmma unless GGML_CIQ_WGMMA_PDL=0): the kernel may start while the kernel
// before it in the stream (the activation conversion) still runs; every thread waits for that grid's completion and
// its memory before touching anything it wrote (x, the token scales) or writing output. Weights are read before the
// wait: no kernel writes them (they are uploaded). Without the launch attribute the wait returns at once.
static __device__ __forceinline__ void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

static __device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count));
}
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nwait_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra wait_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}

// B tile: K values k0 .. k0+63 of tokens tok0 .. tok0+BN-1 into 128-byte-swizzled shared memory.
static __device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int k0, int tok0, uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
        ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(k0), "r"(tok0), "r"(smem_u32(bar)) : "memory");
}

// wgmma shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 B apart.
static __device__ __forceinline__ uint64_t smem_desc(const void *p) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

static __device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
static __device__ __forceinline__ uint32_t mapa(uint32_t addr, int rank) {  // this address in CTA `rank`'s shared memory
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
static __device__ __forceinline__ float4 ld_dsmem4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr) : "memory");
    return v;
}
static __device__ __forceinline__ void bar_sync_all() { asm volatile("bar.sync 1, %0;" ::"r"(blockDim.x) : "memory"); }

static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The f32 accumulator operands of an m64nNk16 step (N/2 registers a thread): their "%i" list and "+f" constraints,
// shared by the shared-memory (SS) and register-A (RS) forms below.
#define CIQ_WGMMA_D32_REGS \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CIQ_WGMMA_D32_OUT \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define CIQ_WGMMA_D64_REGS CIQ_WGMMA_D32_REGS ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define CIQ_WGMMA_D64_OUT CIQ_WGMMA_D32_OUT, \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define CIQ_WGMMA_D128_REGS CIQ_WGMMA_D64_REGS ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define CIQ_WGMMA_D128_OUT CIQ_WGMMA_D64_OUT, \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// One m64nNk16 f16 x f16 -> f32 step, both operands shared-memory descriptors (no transpose): wgmma_m64n{64,128,256}k16.
// R: the accumulator registers (N/2); A, B: the descriptors' operand numbers (R, R + 1).
#define CIQ_WGMMA_SS(N, R, A, B)                                                                                      \
    static __device__ __forceinline__ void wgmma_m64n##N##k16(float (&d)[R], uint64_t a, uint64_t b) {               \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                       \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 {" CIQ_WGMMA_D##R##_REGS "}, %" #A ", %" #B \
                     ", p, 1, 1, 0, 0;\n}\n"                                                                            \
                     : CIQ_WGMMA_D##R##_OUT                                                                          \
                     : "l"(a), "l"(b));                                                                              \
    }
CIQ_WGMMA_SS(64, 32, 32, 33)
CIQ_WGMMA_SS(128, 64, 64, 65)
CIQ_WGMMA_SS(256, 128, 128, 129)

template <int BN> static __device__ __forceinline__ void wgmma_tile(float (&d)[BN / 2], uint64_t a, uint64_t b) {
    if constexpr (BN == 64) wgmma_m64n64k16(d, a, b);
    else if constexpr (BN == 128) wgmma_m64n128k16(d, a, b);
    else wgmma_m64n256k16(d, a, b);
}

// wgmma shared-memory matrix descriptor: MN-major (the B operand transposed: N contiguous in 128-byte rows, one row
// per K index), 128-byte swizzle, 8-row K groups 1024 B apart, 64-value N blocks `n_block_bytes` apart (the leading
// byte offset of an MN-major swizzled layout; PTX ISA "Matrix Descriptor", canonical layout ((T,8,m),(8,k)):
// ((1,T,LBO),(8T,SBO))).
static __device__ __forceinline__ uint64_t smem_desc_mn(const void *p, uint32_t n_block_bytes) {
    return (uint64_t)((smem_u32(p) & 0x3FFFF) >> 4) | (uint64_t)((n_block_bytes & 0x3FFFF) >> 4) << 16 |
           (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

// A 3-D box of a CUtensorMap into shared memory, completing on an mbarrier (the attention kernel's K/V tiles).
static __device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, int c0, int c1, int c2,
                                                   uint64_t *bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];"
        ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar)) : "memory");
}

// Generic-proxy shared-memory stores made visible to the async proxy (wgmma's operand reads).
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// One m64nNk16 f16 x f16 -> f32 step with A from registers (the m16k16 fragment of mma.sync per warp: a[0] row
// lane/4, k 2(lane%4) +0,1; a[1] row +8; a[2] k +8; a[3] both) and B an MN-major descriptor (transposed: the
// instruction's imm-trans-b = 1).
// NAME: wgmma_rs (TRANS 1) or wgmma_rsk (TRANS 0: B K-major, the GEMM's activations as wgmma_tile reads them).
#define CIQ_WGMMA_RS(NAME, TRANS, N, R, A0, A1, A2, A3, B)                                                              \
    static __device__ __forceinline__ void NAME##_m64n##N##k16(float (&d)[R], const uint32_t (&a)[4], uint64_t b) {   \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                                       \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32.f16.f16 {" CIQ_WGMMA_D##R##_REGS "}, {%" #A0       \
                     ", %" #A1 ", %" #A2 ", %" #A3 "}, %" #B ", p, 1, 1, " #TRANS ";\n}\n"                             \
                     : CIQ_WGMMA_D##R##_OUT                                                                          \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));                                          \
    }
CIQ_WGMMA_RS(wgmma_rs, 1, 64, 32, 32, 33, 34, 35, 36)
CIQ_WGMMA_RS(wgmma_rs, 1, 128, 64, 64, 65, 66, 67, 68)
CIQ_WGMMA_RS(wgmma_rs, 1, 256, 128, 128, 129, 130, 131, 132)
CIQ_WGMMA_RS(wgmma_rsk, 0, 64, 32, 32, 33, 34, 35, 36)
CIQ_WGMMA_RS(wgmma_rsk, 0, 128, 64, 64, 65, 66, 67, 68)
CIQ_WGMMA_RS(wgmma_rsk, 0, 256, 128, 128, 129, 130, 131, 132)

template <int N> static __device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (N == 64) wgmma_rs_m64n64k16(d, a, b);
    else if constexpr (N == 128) wgmma_rs_m64n128k16(d, a, b);
    else wgmma_rs_m64n256k16(d, a, b);
}

// The same with B K-major (no transpose): the GEMM's A-from-registers form (gemm_wgmma.cu's RS kernels).
template <int N> static __device__ __forceinline__ void wgmma_rsk(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b) {
    if constexpr (N == 64) wgmma_rsk_m64n64k16(d, a, b);
    else if constexpr (N == 128) wgmma_rsk_m64n128k16(d, a, b);
    else wgmma_rsk_m64n256k16(d, a, b);
}
#endif  // CIQ_WGMMA_DEVICE

// cuTensorMapEncodeTiled through the runtime's driver entry point (no libcuda link), looked up once.
#include <cudaTypedefs.h>
#include <mutex>
using encode_tiled_fn = PFN_cuTensorMapEncodeTiled_v12000;
static inline ciq_status tensor_map_encoder(encode_tiled_fn *fn) {
    static encode_tiled_fn cached = nullptr;
    static std::once_flag once;
    std::call_once(once, [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult result;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &result) ==
                cudaSuccess && result == cudaDriverEntryPointSuccess)
            cached = (encode_tiled_fn)p;
        cudaGetLastError();
    });
    *fn = cached;
    return cached ? CIQ_OK : ciq_fail(CIQ_ERR_BACKEND, "the CUDA driver has no cuTensorMapEncodeTiled");
}
#endif  // !GGML_CIQ_HIP
