// Argument checks (checks.cpp) and routing to the host (cpu/) or GPU (cuda/) backend, shared by the registry
// (registry.cpp) and the C API's files (api_device.cpp, api_gemm.cpp, api_ops.cpp). Layers, each calling only down:
// status, counters, switches -> cpu/, cuda/ -> checks -> registry -> api_*. Nothing in cpu/ or cuda/ includes this.
#pragma once
#include "blocks.h"
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
#include "status.h"

// CIQ_OK for the host and for a GPU index this build and machine have.
ciq_status ciq_check_device(int device);
// value >= 1, else "what: name must be >= 1, got value".
ciq_status ciq_check_count(const char *what, const char *name, int64_t value);

// Returns the host call on device -1, else selects the GPU and returns the CUDA call.
#ifdef GGML_CIQ_WITH_CUDA
#define CIQ_ROUTE(device, cpu_call, cuda_call)    \
    do {                                          \
        if ((device) != CIQ_DEVICE_CPU) {         \
            CIQ_TRY(ciq_cuda_set_device(device)); \
            return cuda_call;                     \
        }                                         \
        return cpu_call;                          \
    } while (0)
#define CIQ_GPU_CALL(cuda_call) (cuda_call)
#else
#define CIQ_ROUTE(device, cpu_call, cuda_call) return cpu_call
#define CIQ_GPU_CALL(cuda_call) CIQ_ERR_UNSUPPORTED  // a build without the CUDA backend: its calls are not declared
#endif
