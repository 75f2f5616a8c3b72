// Dense bf16 GEMM through cuBLAS: the ceiling the keep-quant kernels are measured against. libcublas is opened at
// run time, so libggml_ciq has no link dependency on it and loads on machines without it.
#include "common.cuh"

#if !defined(GGML_CIQ_HIP)

#include <dlfcn.h>
#include <library_types.h>

#include <mutex>
#include <vector>

namespace {

// The four cuBLAS v2 entry points used, declared from cublas_api.h (its header is not part of every toolkit
// install; the ABI is stable across CUDA 12 and 13).
typedef void *cublasHandle_t;
typedef int (*cublas_create_fn)(cublasHandle_t *);
typedef int (*cublas_set_stream_fn)(cublasHandle_t, cudaStream_t);
typedef int (*cublas_set_workspace_fn)(cublasHandle_t, void *, size_t);
typedef int (*cublas_gemm_ex_fn)(cublasHandle_t, int transa, int transb, int m, int n, int k, const void *alpha,
                                 const void *a, cudaDataType a_type, int lda, const void *b, cudaDataType b_type,
                                 int ldb, const void *beta, void *c, cudaDataType c_type, int ldc, int compute_type,
                                 int algo);
constexpr int CUBLAS_STATUS_SUCCESS = 0, CUBLAS_OP_N = 0, CUBLAS_OP_T = 1, CUBLAS_COMPUTE_32F = 68,
              CUBLAS_GEMM_DEFAULT = -1;

struct Cublas {
    cublas_create_fn create = nullptr;
    cublas_set_stream_fn set_stream = nullptr;
    cublas_set_workspace_fn set_workspace = nullptr;
    std::vector<void *> workspaces;  // per GPU, kept for the process: the same algorithms eager and in a graph capture,
                                     // no allocation inside a capture, and no address a graph holds ever freed
    std::mutex call;            // one GEMM at a time on the shared handle (its stream is set per call)
    cublas_gemm_ex_fn gemm = nullptr;
    cublasHandle_t handle = nullptr;
    int device = -1;
};

ciq_status open_cublas(int device, Cublas **out) {
    static Cublas cublas;
    static std::mutex mutex;
    std::lock_guard<std::mutex> lock(mutex);
    if (cublas.gemm == nullptr) {
        void *lib = nullptr;
        for (const char *name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}) {
            if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
        }
        if (lib == nullptr) return ciq_fail(CIQ_ERR_UNSUPPORTED, "dense bf16 GEMM needs libcublas: %s", dlerror());
        cublas.create = (cublas_create_fn)dlsym(lib, "cublasCreate_v2");
        cublas.set_stream = (cublas_set_stream_fn)dlsym(lib, "cublasSetStream_v2");
        cublas.set_workspace = (cublas_set_workspace_fn)dlsym(lib, "cublasSetWorkspace_v2");
        cublas.gemm = (cublas_gemm_ex_fn)dlsym(lib, "cublasGemmEx");
        if (cublas.create == nullptr || cublas.set_stream == nullptr || cublas.set_workspace == nullptr ||
            cublas.gemm == nullptr) {
            cublas.gemm = nullptr;
            return ciq_fail(CIQ_ERR_UNSUPPORTED,
                            "libcublas lacks cublasCreate_v2/cublasSetStream_v2/cublasSetWorkspace_v2/cublasGemmEx");
        }
    }
    if (cublas.device != device) {  // one handle, for the last device used
        if (cublas.create(&cublas.handle) != CUBLAS_STATUS_SUCCESS) {
            return ciq_fail(CIQ_ERR_BACKEND, "cublasCreate failed on GPU %d", device);
        }
        constexpr size_t WORKSPACE = 32u << 20;  // cuBLAS's own default on Hopper
        if ((int)cublas.workspaces.size() <= device) cublas.workspaces.resize(device + 1, nullptr);
        void *&workspace = cublas.workspaces[device];
        if (workspace == nullptr && cudaMalloc(&workspace, WORKSPACE) != cudaSuccess) {
            cudaGetLastError();
            workspace = nullptr;
            return ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "cuBLAS workspace of %zu bytes on GPU %d", WORKSPACE, device);
        }
        if (cublas.set_workspace(cublas.handle, workspace, WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
            return ciq_fail(CIQ_ERR_BACKEND, "cublasSetWorkspace failed on GPU %d", device);
        }
        cublas.device = device;
    }
    *out = &cublas;
    return CIQ_OK;
}

}  // namespace

ciq_status ciq_cuda_dense_gemm_bf16(int device, const void *weight, int64_t rows, int64_t k, const void *x,
                                    int64_t tokens, void *out, ciq_out_type out_type) {
    Cublas *cublas;
    ciq_status status = open_cublas(device, &cublas);
    if (status != CIQ_OK) return status;
    // Column-major view: out (rows x tokens) = W^T (rows x k, W stored k-contiguous) * X (k x tokens).
    const float alpha = 1.0f, beta = 0.0f;
    std::lock_guard<std::mutex> lock(cublas->call);
    if (cublas->set_stream(cublas->handle, ciq_stream()) != CUBLAS_STATUS_SUCCESS) {  // this thread's (graph) stream
        return ciq_fail(CIQ_ERR_BACKEND, "cublasSetStream failed");
    }
    const int s = cublas->gemm(cublas->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)tokens, (int)k,
                                          &alpha, weight, CUDA_R_16BF, (int)k, x, CUDA_R_16BF, (int)k, &beta, out,
                                          out_type == CIQ_OUT_F32 ? CUDA_R_32F : CUDA_R_16BF, (int)rows,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return ciq_fail(CIQ_ERR_BACKEND, "cublasGemmEx failed (status %d)", (int)s);
    return CIQ_OK;
}

#else  // HIP: no cuBLAS (hipBLAS is not wired up)

ciq_status ciq_cuda_dense_gemm_bf16(int, const void *, int64_t, int64_t, const void *, int64_t, void *, ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_gemm_dense_bf16 needs cuBLAS: not part of the HIP build");
}

#endif
