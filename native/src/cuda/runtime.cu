// CUDA device management for the C API: enumeration, memory, growable scratch buffers per device, and CUDA graphs of
// a thread's calls: captured on a non-blocking stream of the thread's own per device (so the capture does not tie up
// the legacy default stream of other threads and libraries), replayed on the legacy default stream, where every call
// outside a capture runs: uploads before a replay and downloads after it are ordered with it.
#include "common.cuh"

#include <cstdio>
#include <mutex>
#include <vector>

namespace {
thread_local cudaStream_t t_stream = nullptr;             // ciq_stream(): nullptr is the legacy default stream
thread_local std::vector<cudaStream_t> t_capture_streams;  // this thread's capture stream per GPU, created once
thread_local int t_capture_device = -1;                   // the GPU this thread is capturing on, -1: none
thread_local uint64_t t_capture_generation = 0;           // the scratch generation when the capture began
std::atomic<uint64_t> g_scratch_generation{0};            // raised whenever a scratch buffer has moved
}  // namespace

// Calls that would run eagerly on the legacy stream (not into the graph) are refused while this thread captures.
static ciq_status refuse_in_capture(const char *what) {
    if (t_capture_device < 0) return CIQ_OK;
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s cannot run inside a graph capture (it would not be captured)", what);
}

cudaStream_t ciq_stream() { return t_stream; }

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
    CIQ_TRY(refuse_in_capture("freeing device memory"));
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaFree(ptr), "cudaFree");
    return CIQ_OK;
}

ciq_status ciq_cuda_memcpy(int device, void *dst, const void *src, size_t nbytes, bool to_device) {
    CIQ_TRY(refuse_in_capture(to_device ? "an upload" : "a download"));
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaMemcpy(dst, src, nbytes, to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost), "cudaMemcpy");
    return CIQ_OK;
}

ciq_status ciq_cuda_memset(int device, void *dst, int value, size_t nbytes) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaMemsetAsync(dst, value, nbytes, ciq_stream()), "cudaMemsetAsync");  // captured in a graph
    return CIQ_OK;
}

ciq_status ciq_cuda_copy_2d(void *dst, size_t dst_pitch, const void *src, size_t src_pitch, size_t width,
                            size_t height) {
    CIQ_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice,
                                     ciq_stream()), "cudaMemcpy2DAsync");  // captured in a graph
    return CIQ_OK;
}

ciq_status ciq_cuda_synchronize(int device) {
    CIQ_TRY(refuse_in_capture("a device synchronize"));
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
        if (t_capture_device >= 0) {  // cudaFree cannot run in a capture, and a graph would keep the old address
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "a call in this graph capture needs %zu bytes of scratch, %zu "
                            "are allocated: run the same calls once before capturing them", nbytes, buffer.second);
        }
        if (buffer.first) {  // the old address goes: graphs that baked it are stale (a first allocation moves nothing)
            CIQ_CUDA_CHECK(cudaFree(buffer.first), "cudaFree");  // implicit sync: prior users done
            g_scratch_generation.fetch_add(1);
        }
        buffer = {nullptr, 0};
        if (ciq_cuda_malloc(device, nbytes, &buffer.first) != CIQ_OK) return CIQ_ERR_OUT_OF_MEMORY;
        buffer.second = nbytes;
    }
    *ptr = buffer.first;
    return CIQ_OK;
}

ciq_status ciq_cuda_stream_wait_event(int device, void *event) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaStreamWaitEvent(ciq_stream(), (cudaEvent_t)event, 0), "cudaStreamWaitEvent");
    return CIQ_OK;
}

ciq_status ciq_cuda_stream_record_event(int device, void *event) {
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaEventRecord((cudaEvent_t)event, ciq_stream()), "cudaEventRecord");
    return CIQ_OK;
}

ciq_status ciq_cuda_event_record(int device, void **event) {
    if (t_capture_device >= 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "timers do not run inside a graph capture");
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

#if !defined(GGML_CIQ_HIP)
namespace {
struct Graph {
    cudaGraphExec_t exec;
    int device;
    uint64_t scratch_generation;
};
}  // namespace

static ciq_status capture_stream(int device, cudaStream_t *stream) {
    if ((int)t_capture_streams.size() <= device) t_capture_streams.resize(device + 1, nullptr);
    if (t_capture_streams[device] == nullptr) {
        CIQ_CUDA_CHECK(cudaStreamCreateWithFlags(&t_capture_streams[device], cudaStreamNonBlocking), "cudaStreamCreate");
    }
    *stream = t_capture_streams[device];
    return CIQ_OK;
}

ciq_status ciq_cuda_graph_begin(int device) {
    if (t_capture_device >= 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "this thread is already capturing a graph (on GPU %d)", t_capture_device);
    }
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t stream;
    CIQ_TRY(capture_stream(device, &stream));
    // Relaxed: the thread may still allocate (the pool's buffers; a graph keeps their addresses, its owner keeps them)
    CIQ_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    t_stream = stream;
    t_capture_device = device;
    t_capture_generation = g_scratch_generation.load();
    return CIQ_OK;
}

ciq_status ciq_cuda_graph_end(int device, void **graph) {
    if (t_capture_device < 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_graph_capture_end: no capture is open");
    if (device != t_capture_device) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_graph_capture_end on GPU %d, the capture is on GPU %d", device,
                        t_capture_device);
    }
    const cudaStream_t stream = t_stream;
    t_stream = nullptr;
    t_capture_device = -1;
    CIQ_CUDA_CHECK(cudaSetDevice(device), "cudaSetDevice");
    cudaGraph_t g = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream, &g);  // fails if a call inside broke the capture
    cudaGraphExec_t exec = nullptr;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, g, 0);
    if (g) cudaGraphDestroy(g);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return ciq_fail(CIQ_ERR_BACKEND, "graph capture: %s", cudaGetErrorString(err));
    }
    const uint64_t generation = g_scratch_generation.load();
    if (generation != t_capture_generation) {  // another thread moved a scratch buffer during the capture
        cudaGraphExecDestroy(exec);
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "this graph is stale: the library's scratch buffers moved during its "
                        "capture: capture it again");
    }
    *graph = new Graph{exec, device, generation};
    return CIQ_OK;
}

ciq_status ciq_cuda_graph_launch(void *graph) {
    const Graph *g = (const Graph *)graph;
    CIQ_TRY(refuse_in_capture("a graph launch"));
    if (g->scratch_generation != g_scratch_generation.load()) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "this graph is stale: the library's scratch buffers moved after its "
                        "capture (a larger GEMM or split attention ran since): capture it again");
    }
    CIQ_CUDA_CHECK(cudaSetDevice(g->device), "cudaSetDevice");
    CIQ_CUDA_CHECK(cudaGraphLaunch(g->exec, nullptr), "cudaGraphLaunch");  // the legacy stream: ordered with all calls
    return CIQ_OK;
}

ciq_status ciq_cuda_graph_free(void *graph) {
    Graph *g = (Graph *)graph;
    cudaSetDevice(g->device);
    cudaError_t err = cudaGraphExecDestroy(g->exec);
    delete g;
    if (err != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "cudaGraphExecDestroy: %s", cudaGetErrorString(err));
    return CIQ_OK;
}
#else
ciq_status ciq_cuda_graph_begin(int) { return ciq_fail(CIQ_ERR_UNSUPPORTED, "graphs are CUDA-only in this build"); }
ciq_status ciq_cuda_graph_end(int, void **) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "graphs are CUDA-only in this build");
}
ciq_status ciq_cuda_graph_launch(void *) { return ciq_fail(CIQ_ERR_UNSUPPORTED, "graphs are CUDA-only in this build"); }
ciq_status ciq_cuda_graph_free(void *) { return CIQ_OK; }
#endif
