// The C API's device calls: version and build facts, devices, memory, threads, timers and CUDA graphs.
#include "checks.h"
#include "switches.h"

#include <chrono>
#include <cstdio>
#include <mutex>
#include <unordered_set>
#include <cstdlib>
#include <cstring>
#include <string>

#ifndef GGML_CIQ_VERSION
#define GGML_CIQ_VERSION "0.0.0"
#endif
#ifndef GGML_CIQ_COMMIT
#define GGML_CIQ_COMMIT "unknown"
#endif
#ifndef GGML_CIQ_CUDA_ARCHS
#define GGML_CIQ_CUDA_ARCHS ""
#endif

ciq_status ciq_api_version(int *version) {
    if (version == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_api_version: version is NULL");
    *version = GGML_CIQ_API_VERSION;
    return CIQ_OK;
}

ciq_status ciq_switch_on(const char *name, int *on) {
    if (on == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_switch_on: on is NULL");
    bool value = true;
    CIQ_TRY(ciq_switches_on_off(name, &value));
    *on = value ? 1 : 0;
    return CIQ_OK;
}

ciq_status ciq_build_info(const char **json) {
    if (json == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_build_info: json is NULL");
    static thread_local std::string info;
    char buffer[512];
    std::snprintf(buffer, sizeof(buffer),
                  "{\"version\": \"%s\", \"commit\": \"%s\", \"api_version\": %d, \"backends\": [\"cpu\"%s], \"cuda_archs\": \"%s\", "
                  "\"hip\": %s, \"cpu_isa\": \"%s\", \"threads\": %d}",
                  GGML_CIQ_VERSION, GGML_CIQ_COMMIT, GGML_CIQ_API_VERSION,
#ifdef GGML_CIQ_WITH_CUDA
                  ", \"cuda\"",
#else
                  "",
#endif
                  GGML_CIQ_CUDA_ARCHS,
#ifdef GGML_CIQ_HIP
                  "true",
#else
                  "false",
#endif
                  ciq_cpu_features(), ciq_cpu_threads());
    info = buffer;
    *json = info.c_str();
    return CIQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Devices and memory

ciq_status ciq_device_count(int *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_device_count: count is NULL");
    *count = 0;
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_device_count(count);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_device_name(int device, char *buffer, size_t buffer_size) {
    if (buffer == nullptr || buffer_size == 0) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_device_name: empty buffer");
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        std::snprintf(buffer, buffer_size, "CPU (%s, %d threads)", ciq_cpu_features(), ciq_cpu_threads());
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_device_name(device, buffer, buffer_size);
#else
    return CIQ_OK;
#endif
}

// Host handles this library gave out (ciq_memory_alloc'd blocks, timers): a pointer it never gave out, or one already freed
// or stopped, is an error message instead of a double free.
namespace {
struct HandleSet {
    std::mutex mutex;
    std::unordered_set<const void *> live;
    void add(const void *p) {
        std::lock_guard<std::mutex> lock(mutex);
        live.insert(p);
    }
    bool remove(const void *p) {
        std::lock_guard<std::mutex> lock(mutex);
        return live.erase(p) == 1;
    }
    bool contains(const void *p) {
        std::lock_guard<std::mutex> lock(mutex);
        return live.count(p) == 1;
    }
};
HandleSet g_host_blocks, g_timers, g_graphs;
}  // namespace

ciq_status ciq_memory_alloc(int device, size_t nbytes, void **ptr) {
    if (ptr == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_memory_alloc: ptr is NULL");
    *ptr = nullptr;
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        *ptr = std::malloc(nbytes ? nbytes : 1);
        if (*ptr == nullptr) return ciq_fail(CIQ_ERR_OUT_OF_MEMORY, "ciq_memory_alloc: %zu bytes of host memory", nbytes);
        g_host_blocks.add(*ptr);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_malloc(device, nbytes, ptr);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_memory_free(int device, void *ptr) {
    CIQ_TRY(ciq_check_device(device));
    if (ptr == nullptr) return CIQ_OK;  // as free(NULL)
    if (device == CIQ_DEVICE_CPU) {
        if (!g_host_blocks.remove(ptr)) {
            return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_memory_free: %p is not a host block of ciq_memory_alloc (already freed?)",
                            ptr);
        }
        std::free(ptr);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_free(device, ptr);
#else
    return CIQ_OK;
#endif
}

static ciq_status copy(int device, void *dst, const void *src, size_t nbytes, bool to_device) {
    if ((dst == nullptr || src == nullptr) && nbytes) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "memcpy: NULL pointer");
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        if (nbytes) std::memcpy(dst, src, nbytes);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_memcpy(device, dst, src, nbytes, to_device);
#else
    (void)to_device;
    return CIQ_OK;
#endif
}

ciq_status ciq_memory_upload(int device, void *dst, const void *host_src, size_t nbytes) {
    return copy(device, dst, host_src, nbytes, true);
}

ciq_status ciq_memory_download(int device, void *host_dst, const void *src, size_t nbytes) {
    return copy(device, host_dst, src, nbytes, false);
}

ciq_status ciq_memory_fill(int device, void *dst, int value, size_t nbytes) {
    if (dst == nullptr && nbytes) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_memory_fill: dst is NULL");
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) {
        if (nbytes) std::memset(dst, value, nbytes);
        return CIQ_OK;
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_memset(device, dst, value, nbytes);
#else
    return CIQ_OK;
#endif
}

ciq_status ciq_device_synchronize(int device) {
    CIQ_TRY(ciq_check_device(device));
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) return ciq_cuda_synchronize(device);
#endif
    return CIQ_OK;
}

ciq_status ciq_threads_set(int threads) {
    ciq_cpu_set_threads(threads);
    return CIQ_OK;
}

// ---------------------------------------------------------------------------------------------
// Timers

struct Timer {
    int device;
    void *start, *stop;  // CUDA events, or nullptr on the host
    std::chrono::steady_clock::time_point host_start, host_stop;
    bool marked;
};

ciq_status ciq_timer_start(int device, void **timer) {
    if (timer == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_start: timer is NULL");
    CIQ_TRY(ciq_check_device(device));
    Timer *t = new Timer{device, nullptr, nullptr, std::chrono::steady_clock::now(), {}, false};
#ifdef GGML_CIQ_WITH_CUDA
    if (device != CIQ_DEVICE_CPU) {
        ciq_status status = ciq_cuda_event_record(device, &t->start);
        if (status != CIQ_OK) {
            delete t;
            return status;
        }
    }
#endif
    g_timers.add(t);
    *timer = t;
    return CIQ_OK;
}

ciq_status ciq_timer_mark(void *timer) {
    if (timer == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_mark: timer is NULL");
    if (!g_timers.contains(timer)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_mark: %p is not a running timer (stopped already?)", timer);
    }
    Timer *t = (Timer *)timer;
    if (t->marked) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_mark: the timer is marked already");
    t->host_stop = std::chrono::steady_clock::now();
#ifdef GGML_CIQ_WITH_CUDA
    if (t->start != nullptr) CIQ_TRY(ciq_cuda_event_record(t->device, &t->stop));
#endif
    t->marked = true;
    return CIQ_OK;
}

ciq_status ciq_timer_stop(void *timer, float *milliseconds) {
    if (timer == nullptr || milliseconds == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_stop: NULL");
    if (!g_timers.contains(timer)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_timer_stop: %p is not a running timer (stopped already?)", timer);
    }
    Timer *t = (Timer *)timer;
    ciq_status status = t->marked ? CIQ_OK : ciq_timer_mark(t);
    if (status == CIQ_OK && t->start == nullptr)
        *milliseconds = std::chrono::duration<float, std::milli>(t->host_stop - t->host_start).count();
#ifdef GGML_CIQ_WITH_CUDA
    if (t->start != nullptr) {
        if (status == CIQ_OK) status = ciq_cuda_event_elapsed(t->start, t->stop, milliseconds);  // frees both
        else ciq_cuda_event_elapsed(t->start, nullptr, milliseconds);  // frees start
    }
#endif
    g_timers.remove(t);
    delete t;
    return status;
}

// ---------------------------------------------------------------------------------------------
// Ordering against another library's streams

// record: the event records this thread's work on device; else this thread's later work waits for it.
static ciq_status stream_event(const char *what, int device, void *event, bool record) {
    if (event == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: event is NULL", what);
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: the host has no streams", what);
#ifdef GGML_CIQ_WITH_CUDA
    return record ? ciq_cuda_stream_record_event(device, event) : ciq_cuda_stream_wait_event(device, event);
#else
    (void)record;
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: this build has no CUDA", what);
#endif
}

ciq_status ciq_stream_wait_event(int device, void *event) {
    return stream_event("ciq_stream_wait_event", device, event, false);
}

ciq_status ciq_stream_record_event(int device, void *event) {
    return stream_event("ciq_stream_record_event", device, event, true);
}

// ---------------------------------------------------------------------------------------------
// CUDA graphs

static ciq_status graph_device(const char *what, int device) {
    CIQ_TRY(ciq_check_device(device));
    if (device == CIQ_DEVICE_CPU) return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: graphs are CUDA graphs: they need a GPU", what);
    return CIQ_OK;
}

ciq_status ciq_graph_capture_begin(int device) {
    CIQ_TRY(graph_device("ciq_graph_capture_begin", device));
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_graph_begin(device);
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_graph_capture_begin: this build has no CUDA");
#endif
}

ciq_status ciq_graph_capture_end(int device, void **graph) {
    if (graph == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_graph_capture_end: graph is NULL");
    *graph = nullptr;
    CIQ_TRY(graph_device("ciq_graph_capture_end", device));
#ifdef GGML_CIQ_WITH_CUDA
    CIQ_TRY(ciq_cuda_graph_end(device, graph));
    g_graphs.add(*graph);
    return CIQ_OK;
#else
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_graph_capture_end: this build has no CUDA");
#endif
}

ciq_status ciq_graph_launch(void *graph) {
    if (graph == nullptr || !g_graphs.contains(graph)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_graph_launch: %p is not a captured graph (freed already?)", graph);
    }
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_graph_launch(graph);
#else
    return CIQ_ERR_UNSUPPORTED;
#endif
}

ciq_status ciq_graph_free(void *graph) {
    if (graph == nullptr) return CIQ_OK;
    if (!g_graphs.contains(graph)) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_graph_free: %p is not a captured graph (freed already?)", graph);
    }
    g_graphs.remove(graph);
#ifdef GGML_CIQ_WITH_CUDA
    return ciq_cuda_graph_free(graph);
#else
    return CIQ_OK;
#endif
}
