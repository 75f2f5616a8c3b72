// CUDA device management for the C API: enumeration, memory, and growable scratch buffers per device.
#include "common.cuh"

#include <cstdio>
#include <mutex>
#include <vector>

#define CIQ_CUDA_CHECK(call, what)                                                                     \
    do {                                                                                               \
        cudaError_t err_ = (call);                                                                     \
        if (err_ != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(err_)); \
    } while (0)

// Device count and properties are read once: the GEMM path checks them on every call.
static const std::vector<cudaDeviceProp> &device_properties() {
    static const std::vector<cudaDeviceProp> props = [] {
        std::vector<cudaDeviceProp> result;
        int count = 0;
        if (cudaGetDeviceCount(&count) != cudaSuccess) {
            cudaGetLastError();  // no driver or no device: zero GPUs, not an error
            count = 0;
        }
        for (int i = 0; i < count; ++i) {
            cudaDeviceProp prop;
            if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) result.push_back(prop);
        }
        return result;
    }();
    return props;
}

ciq_status ciq_cuda_device_count(int *count) {
    *count = (int)device_properties().size();
    return CIQ_OK;
}

ciq_status ciq_cuda_set_device(int device) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    return CIQ_OK;
}

ciq_status ciq_cuda_device_name(int device, char *buffer, size_t buffer_size) {
    const cudaDeviceProp &prop = device_properties().at(device);
    std::snprintf(buffer, buffer_size, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    return CIQ_OK;
}

ciq_status ciq_cuda_compute_capability(int device, int *major, int *minor) {
    const cudaDeviceProp &prop = device_properties().at(device);
    *major = prop.major;
    *minor = prop.minor;
    return CIQ_OK;
}

ciq_status ciq_cuda_malloc(int device, size_t nbytes, void **ptr) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    if (cudaMalloc(ptr, nbytes ? nbytes : 1) != cudaSuccess) {
        cudaGetLastError();
        *ptr = nullptr;
        return ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "cudaMalloc of %zu bytes failed on GPU %d", nbytes, device);
    }
    return CIQ_OK;
}

ciq_status ciq_cuda_free(int device, void *ptr) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaFree(ptr), "cudaFree");
    return CIQ_OK;
}

ciq_status ciq_cuda_memcpy(int device, void *dst, const void *src, size_t nbytes, bool to_device) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost), "cudaMemcpy");
    return CIQ_OK;
}

ciq_status ciq_cuda_memset(int device, void *dst, int value, size_t nbytes) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaMemset(dst, value, nbytes), "cudaMemset");
    return CIQ_OK;
}

ciq_status ciq_cuda_synchronize(int device) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaDeviceSynchronize(), "kernel execution");
    return CIQ_OK;
}

ciq_status ciq_cuda_scratch(int device, int slot, size_t nbytes, void **ptr) {
    static std::mutex mutex;
    static std::vector<std::pair<void *, size_t>> buffers;  // [device * CIQ_SCRATCH_SLOTS + slot]
    std::lock_guard<std::mutex> lock(mutex);
    const size_t index = (size_t)device * CIQ_SCRATCH_SLOTS + slot;
    if (index >= buffers.size()) buffers.resize(index + 1, {nullptr, 0});
    auto &buffer = buffers[index];
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    if (buffer.second < nbytes) {
        if (buffer.first) CIQ_CUDA_CHECK(cudaFree(buffer.first), "cudaFree");  // implicit sync: prior users done
        buffer = {nullptr, 0};
        if (ciq_cuda_malloc(device, nbytes, &buffer.first) != CIQ_OK) return CIQ_ERR_OUT_OF_MEMORY;
        buffer.second = nbytes;
    }
    *ptr = buffer.first;
    return CIQ_OK;
}

ciq_status ciq_cuda_event_record(int device, void **event) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    cudaEvent_t e;
    CIQ_CUDA_CHECK(cudaEventCreate(&e), "cudaEventCreate");
    CIQ_CUDA_CHECK(cudaEventRecord(e, 0), "cudaEventRecord");
    *event = (void *)e;
    return CIQ_OK;
}

ciq_status ciq_cuda_event_elapsed(void *start, void *stop, float *milliseconds) {
    cudaEvent_t a = (cudaEvent_t)start, b = (cudaEvent_t)stop;
    if (b == nullptr) {  // no stop event: only free the start
        cudaEventDestroy(a);
        return CIQ_OK;
    }
    cudaError_t err = cudaEventSynchronize(b);
    if (err == cudaSuccess) err = cudaEventElapsedTime(milliseconds, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (err != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "timer: %s", cudaGetErrorString(err));
    return CIQ_OK;
}
