// CUDA device management for the C API: enumeration, memory, and one growable scratch buffer per device.
#include "common.cuh"

#include <cstdio>
#include <mutex>
#include <vector>

#define CIQ_CUDA_CHECK(call, what)                                                                     \
    do {                                                                                               \
        cudaError_t err_ = (call);                                                                     \
        if (err_ != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "%s: %s", what, cudaGetErrorString(err_)); \
    } while (0)

ciq_status ciq_cuda_device_count(int *count) {
    *count = 0;
    if (cudaGetDeviceCount(count) != cudaSuccess) {
        cudaGetLastError();  // no driver or no device: zero GPUs, not an error
        *count = 0;
    }
    return CIQ_OK;
}

ciq_status ciq_cuda_set_device(int device) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    return CIQ_OK;
}

ciq_status ciq_cuda_device_name(int device, char *buffer, size_t buffer_size) {
    cudaDeviceProp prop;
    CIQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    std::snprintf(buffer, buffer_size, "%s (sm_%d%d, %d SMs)", prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    return CIQ_OK;
}

ciq_status ciq_cuda_compute_capability(int device, int *major, int *minor) {
    cudaDeviceProp prop;
    CIQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
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

ciq_status ciq_cuda_scratch(int device, size_t nbytes, void **ptr) {
    static std::mutex mutex;
    static std::vector<std::pair<void *, size_t>> buffers;
    std::lock_guard<std::mutex> lock(mutex);
    if ((size_t)device >= buffers.size()) buffers.resize(device + 1, {nullptr, 0});
    auto &buffer = buffers[device];
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
