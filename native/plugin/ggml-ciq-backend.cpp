// ggml-ciq-backend.cpp - a ggml backend (loadable plugin) whose MUL_MATs run through libggml_ciq. docs/PLUGIN.md.
//
// Shaped like ggml-blas: one registry, a device that accelerates MUL_MAT and nothing else, a graph_compute that
// walks the nodes. It is a thin adapter from ggml tensors onto the libggml_ciq C API: which kernel runs, and
// whether it is worth taking the op at all, is asked of the library (ciq_gemm_adapter below), never decided here.
//
// Devices (chosen when ggml loads the plugin):
//   CIQi     GGML_BACKEND_DEVICE_TYPE_GPU, one for each CUDAi of the ggml it is loaded into (i = 0, 1, ... while ggml
//            has CUDAi and libggml_ciq sees GPU i: both count the CUDA runtime's devices in its order). CIQi hands out
//            CUDAi's own buffer type, so weights, KV cache and activations stay in CUDAi's memory and its MUL_MATs
//            read tensor->data as device pointers (libggml_ciq device i). Run as `-dev CIQ0/CUDA0 -ts 0/1`; over
//            several GPUs `-dev CIQ0/CUDA0/CIQ1/CUDA1 -ts 0/1/0/1` (llama.cpp's layer split: each layer's weights in
//            one CUDAi's buffers, its MUL_MATs on CIQi).
//   CIQ_CPU  GGML_BACKEND_DEVICE_TYPE_ACCEL over a ggml without GPU devices: the CPU buffer type (as ggml-blas),
//            our CPU kernels in llama.cpp CPU's semantics. Weights must be raw GGUF blocks: load the model without
//            CPU repacking (llama_model_params.use_extra_bufts = false, `--no-repack`); repacked buffers are not host
//            buffers in ggml's sense, so this device never claims their ops.
//
// It must run inside exactly the ggml it was compiled against (GGML_BACKEND_API_VERSION does not change when ggml's
// op enum or tensor struct do): ggml_backend_init returns NULL with one log line otherwise.

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"

#include "ggml_ciq.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#if !defined(CIQ_PLUGIN_GGML_VERSION) || !defined(CIQ_PLUGIN_LLAMACPP_COMMIT) || !defined(CIQ_PLUGIN_LLAMA_CPP_PYTHON)
#error "native/plugin/CMakeLists.txt defines the versions this plugin is built against"
#endif

namespace {

// ---------------------------------------------------------------------------------------------------------------
// The adapter: the one place that speaks libggml_ciq's GEMM API. execute = false asks only whether to take the
// op (*offload); execute = true runs it. ciq_gemm_plan resolves the kernel once and carries the registry's offload
// decision (its measured table; GGML_CIQ_OFFLOAD=all|none overrides); ciq_gemm runs it.

struct gemm_request {
    int device;            // libggml_ciq device: CIQ_DEVICE_CPU or a GPU index
    ggml_type type;        // the weight's
    int64_t rows, k, tokens;
    const void *weight = nullptr;
    size_t weight_nbytes = 0;
    const float *x = nullptr;
    float *out = nullptr;
};

ciq_status ciq_gemm_adapter(const gemm_request &r, bool execute, bool *offload) {
    // The host device promises llama.cpp CPU's semantics; a GPU runs whatever its fastest kernel implements.
    const ciq_semantics semantics = r.device == CIQ_DEVICE_CPU ? CIQ_SEMANTICS_CPU : CIQ_SEMANTICS_ANY;
    const ciq_type type = (ciq_type)r.type;  // ciq_type values are ggml's type ids
    *offload = false;
    if (execute) {
        return ciq_gemm(r.device, CIQ_VARIANT_AUTO, semantics, type, r.weight, r.weight_nbytes, r.rows, r.k, r.x,
                        r.tokens, r.out, CIQ_OUT_F32);
    }
    ciq_plan plan;
    const ciq_status status = ciq_gemm_plan(r.device, CIQ_VARIANT_AUTO, semantics, type, r.rows, r.k, r.tokens, &plan);
    *offload = status == CIQ_OK && plan.offload;
    return status;
}

// ---------------------------------------------------------------------------------------------------------------
// MUL_MAT: what we take, and running it.

// The request for a MUL_MAT node, or false when its layout is one we decline: weight and activations contiguous and
// 2-D (no broadcast batch, nothing permuted), activations and output f32. ggml's shapes: src0 [k, rows],
// src1 [k, tokens], dst [rows, tokens].
bool mul_mat_request(int device, const ggml_tensor *node, gemm_request *r) {
    const ggml_tensor *w = node->src[0], *x = node->src[1];
    if (w == nullptr || x == nullptr || x->type != GGML_TYPE_F32 || node->type != GGML_TYPE_F32) return false;
    if (!ggml_is_contiguous(w) || !ggml_is_contiguous(x) || !ggml_is_contiguous(node)) return false;
    if (w->ne[2] != 1 || w->ne[3] != 1 || x->ne[2] != 1 || x->ne[3] != 1) return false;
    if (x->ne[0] != w->ne[0] || node->ne[0] != w->ne[1] || node->ne[1] != x->ne[1]) return false;
    *r = gemm_request{device, w->type, w->ne[1], w->ne[0], x->ne[1]};
    r->weight = w->data;
    r->weight_nbytes = ggml_nbytes(w);
    r->x = (const float *)x->data;
    r->out = (float *)node->data;
    return true;
}

bool mul_mat_offloaded(int device, const ggml_tensor *node) {
    gemm_request r{};
    bool offload = false;
    return mul_mat_request(device, node, &r) && ciq_gemm_adapter(r, false, &offload) == CIQ_OK && offload;
}

// ---------------------------------------------------------------------------------------------------------------
// Devices.

struct device_context {
    int ciq_device;                    // CIQ_DEVICE_CPU or 0
    ggml_backend_dev_t cuda = nullptr; // GPU: CUDA0, whose buffer type we hand out
    std::string name, description;
};

constexpr int MAX_DEVICES = 16;  // ggml's GGML_CUDA_MAX_DEVICES
device_context g_devices[MAX_DEVICES];
ggml_backend_device g_ggml_devices[MAX_DEVICES];
int g_device_count = 0;

ggml_guid_t backend_guid() {
    static ggml_guid guid = {0x63, 0x69, 0x71, 0x2d, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x62, 0x61, 0x63, 0x6b, 0x65, 0x6e, 0x64};
    return &guid;
}

// -- backend (stream) --

const char *backend_get_name(ggml_backend_t backend) {
    return ((device_context *)backend->device->context)->name.c_str();
}

void backend_free(ggml_backend_t backend) { delete backend; }

bool gpu_idle(const device_context *dev);

void backend_synchronize(ggml_backend_t backend) { gpu_idle((const device_context *)backend->device->context); }

// Waits for everything queued on the GPU (CUDA0's streams included): ciq_device_synchronize is cudaDeviceSynchronize.
bool gpu_idle(const device_context *dev) {
    if (dev->ciq_device == CIQ_DEVICE_CPU || ciq_device_synchronize(dev->ciq_device) == CIQ_OK) return true;
    GGML_LOG_ERROR("ggml-ciq: %s: %s\n", dev->name.c_str(), ciq_last_error());
    return false;
}

// Runs the split's MUL_MATs in order between two waits for the whole GPU (docs/PLUGIN.md, "Ordering"). Our kernels
// run on libggml_ciq's stream, which does not order itself against CUDA0's non-blocking streams, and the scheduler
// synchronizes the previous backend at a backend switch only when the next split copies no inputs: the wait before
// covers a split that does, the wait after orders us before whatever runs next. (A split always starts with a
// MUL_MAT - the scheduler cuts none at a view - so both waits happen once per split.)
ggml_status backend_graph_compute(ggml_backend_t backend, ggml_cgraph *graph) {
    const device_context *dev = (const device_context *)backend->device->context;
    bool ran = false;
    for (int i = 0; i < graph->n_nodes; i++) {
        ggml_tensor *node = graph->nodes[i];
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) continue;
        switch (node->op) {
            case GGML_OP_NONE:
            case GGML_OP_RESHAPE:
            case GGML_OP_VIEW:
            case GGML_OP_PERMUTE:
            case GGML_OP_TRANSPOSE:
                break;
            case GGML_OP_MUL_MAT: {
                gemm_request r{};
                bool unused;
                if (!mul_mat_request(dev->ciq_device, node, &r)) {
                    GGML_LOG_ERROR("ggml-ciq: %s: MUL_MAT %s has a layout this device declines\n", dev->name.c_str(),
                                   node->name);
                    return GGML_STATUS_FAILED;
                }
                if (!ran && !gpu_idle(dev)) return GGML_STATUS_FAILED;
                ran = true;
                if (ciq_gemm_adapter(r, true, &unused) != CIQ_OK) {
                    GGML_LOG_ERROR("ggml-ciq: %s: MUL_MAT %s: %s\n", dev->name.c_str(), node->name, ciq_last_error());
                    return GGML_STATUS_FAILED;
                }
                break;
            }
            default:
                GGML_LOG_ERROR("ggml-ciq: %s: unsupported op %s\n", dev->name.c_str(), ggml_op_desc(node));
                return GGML_STATUS_FAILED;
        }
    }
    return !ran || gpu_idle(dev) ? GGML_STATUS_SUCCESS : GGML_STATUS_FAILED;
}

const ggml_backend_i backend_interface = {
    /* .get_name            = */ backend_get_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ backend_synchronize,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

// -- device --

const char *device_get_name(ggml_backend_dev_t dev) { return ((device_context *)dev->context)->name.c_str(); }

const char *device_get_description(ggml_backend_dev_t dev) {
    return ((device_context *)dev->context)->description.c_str();
}

void device_get_memory(ggml_backend_dev_t, size_t *free, size_t *total) {
    *free = 0;  // no memory of its own: the GPU device's tensors live in CUDA0's buffers, the CPU one's in host memory
    *total = 0;
}

enum ggml_backend_dev_type device_get_type(ggml_backend_dev_t dev) {
    return ((device_context *)dev->context)->ciq_device == CIQ_DEVICE_CPU ? GGML_BACKEND_DEVICE_TYPE_ACCEL
                                                                          : GGML_BACKEND_DEVICE_TYPE_GPU;
}

void device_get_props(ggml_backend_dev_t dev, ggml_backend_dev_props *props) {
    const bool host = ((device_context *)dev->context)->ciq_device == CIQ_DEVICE_CPU;
    props->name = device_get_name(dev);
    props->description = device_get_description(dev);
    props->type = device_get_type(dev);
    props->device_id = nullptr;  // not CUDA0's PCI id: llama.cpp would drop one of two devices with the same id
    device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {
        /* .async                = */ false,
        /* .host_buffer          = */ false,
        /* .buffer_from_host_ptr = */ host,
        /* .events               = */ false,  // also keeps llama.cpp's pipeline parallelism (events on all) off
        // Weights load as CUDA0's (its buffer type) or as the CPU's, from an mmap'd file as theirs do; false here
        // would turn mmap off for the whole model (llama-model.cpp asks every device of the model).
        /* .mmap_support         = */ true,
    };
}

ggml_backend_t device_init_backend(ggml_backend_dev_t dev, const char *) {
    return new ggml_backend{backend_guid(), backend_interface, dev, nullptr};
}

ggml_backend_buffer_type_t device_get_buffer_type(ggml_backend_dev_t dev) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda ? ggml_backend_dev_buffer_type(ctx->cuda) : ggml_backend_cpu_buffer_type();
}

ggml_backend_buffer_t device_buffer_from_host_ptr(ggml_backend_dev_t, void *ptr, size_t size, size_t) {
    return ggml_backend_cpu_buffer_from_ptr(ptr, size);
}

// Input and view nodes: test-backend-ops asks about every tensor of a case before it allocates any, and counts 0/0
// without them (as ggml-blas). In a llama.cpp graph the scheduler would hand an allocated view (of the KV cache, of a
// compute buffer) to the first device that accepts its buffer - CIQ0 accepts CUDA0's - so they are claimed only while
// unallocated or over a weights buffer, and CIQ0 holds nothing but what it computes. This changes no split: the
// scheduler skips view ops when it cuts splits (GGML_SCHED_DEBUG=2 shows the same splits with and without it).
bool view_taken(const ggml_tensor *op) {
    const ggml_tensor *base = op->view_src != nullptr ? op->view_src : op;
    return base->buffer == nullptr || ggml_backend_buffer_get_usage(base->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}

bool device_supports_op(ggml_backend_dev_t dev, const ggml_tensor *op) {
    switch (op->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return view_taken(op);
        case GGML_OP_MUL_MAT:
            return mul_mat_offloaded(((device_context *)dev->context)->ciq_device, op);
        default:
            return false;
    }
}

// GPU: exactly CUDA0's buffer type. CPU: host buffers in ggml's standard layout (plain and mmap'd CPU buffers; not
// the CPU backend's repacked "extra" buffers, whose is_host is false).
bool device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda ? buft == ggml_backend_dev_buffer_type(ctx->cuda) : ggml_backend_buft_is_host(buft);
}

const ggml_backend_device_i device_interface = {
    /* .get_name             = */ device_get_name,
    /* .get_description      = */ device_get_description,
    /* .get_memory           = */ device_get_memory,
    /* .get_type             = */ device_get_type,
    /* .get_props            = */ device_get_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_get_buffer_type,
    /* .get_host_buffer_type = */ nullptr,
    /* .buffer_from_host_ptr = */ device_buffer_from_host_ptr,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ nullptr,
    /* .event_new            = */ nullptr,
    /* .event_free           = */ nullptr,
    /* .event_synchronize    = */ nullptr,
};

// -- registry --

const char *reg_get_name(ggml_backend_reg_t) { return "CIQ"; }

size_t reg_get_device_count(ggml_backend_reg_t) { return (size_t)g_device_count; }

ggml_backend_dev_t reg_get_device(ggml_backend_reg_t, size_t index) {
    GGML_ASSERT((int)index < g_device_count);
    return &g_ggml_devices[index];
}

void set_n_threads(ggml_backend_t backend, int n_threads) {
    if (((device_context *)backend->device->context)->ciq_device == CIQ_DEVICE_CPU) ciq_threads_set(n_threads);
}

const char *build_info_json() {
    return "{\"ggml_version\": \"" CIQ_PLUGIN_GGML_VERSION "\", \"llama_cpp_commit\": \"" CIQ_PLUGIN_LLAMACPP_COMMIT
           "\", \"llama_cpp_python\": \"" CIQ_PLUGIN_LLAMA_CPP_PYTHON "\"}";
}

void *reg_get_proc_address(ggml_backend_reg_t, const char *name) {
    if (std::strcmp(name, "ggml_backend_set_n_threads") == 0) return (void *)set_n_threads;
    if (std::strcmp(name, "ggml_ciq_plugin_info") == 0) return (void *)build_info_json;
    return nullptr;
}

const ggml_backend_reg_i reg_interface = {
    /* .get_name         = */ reg_get_name,
    /* .get_device_count = */ reg_get_device_count,
    /* .get_device       = */ reg_get_device,
    /* .get_proc_address = */ reg_get_proc_address,
};

// The ggml we were loaded into is the one we were compiled against: same version string, same ggml_tensor size
// (ggml_tensor_overhead() = the 32-byte object header + sizeof(ggml_tensor)). One log line otherwise.
bool ggml_matches() {
    const char *running = ggml_version();
    const bool same_version = std::strcmp(running, CIQ_PLUGIN_GGML_VERSION) == 0;
    if (same_version && ggml_tensor_overhead() == 32 + sizeof(ggml_tensor)) return true;
    GGML_LOG_ERROR("ggml-ciq: this plugin was built against ggml %s (llama.cpp %s, llama-cpp-python %s) and cannot "
                   "run in ggml %s%s; rebuild it against this llama.cpp's headers (docs/PLUGIN.md)\n",
                   CIQ_PLUGIN_GGML_VERSION, CIQ_PLUGIN_LLAMACPP_COMMIT, CIQ_PLUGIN_LLAMA_CPP_PYTHON, running,
                   same_version ? " (same version string, different ggml_tensor layout)" : "");
    return false;
}

// The library's runtime switches the plugin's planning reads (GGML_CIQ_OFFLOAD, GGML_CIQ_VARIANT...) are valid: a
// value they do not take is one log line and no plugin, never a silent "decline every op".
bool switches_valid() {
    ciq_plan plan;
    if (ciq_gemm_plan(CIQ_DEVICE_CPU, CIQ_VARIANT_AUTO, CIQ_SEMANTICS_ANY, CIQ_TYPE_Q4_K, 1, 256, 1, &plan) !=
        CIQ_ERR_INVALID_ARGUMENT)
        return true;
    GGML_LOG_ERROR("ggml-ciq: %s; the plugin offers no device (docs/PLUGIN.md)\n", ciq_last_error());
    return false;
}

// CIQi for CUDA0, CUDA1, ... as long as the ggml has CUDAi and libggml_ciq sees GPU i; CIQ_CPU when the ggml has no
// GPU device at all; none otherwise (a CUDA llama.cpp on a machine where our library has no GPU: nothing to offer).
void discover_devices() {
    bool ggml_has_gpu = false;
    for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
        const enum ggml_backend_dev_type type = ggml_backend_dev_type(ggml_backend_dev_get(i));
        ggml_has_gpu |= type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU;
    }
    int gpus = 0;
    if (ciq_device_count(&gpus) != CIQ_OK) gpus = 0;
    for (int i = 0; i < MAX_DEVICES && i < gpus; i++) {
        const std::string cuda_name = "CUDA" + std::to_string(i);
        ggml_backend_dev_t cuda = ggml_backend_dev_by_name(cuda_name.c_str());
        char name[256] = "";
        if (cuda == nullptr || ciq_device_name(i, name, sizeof name) != CIQ_OK) break;
        g_devices[i] = {i, cuda, "CIQ" + std::to_string(i),
                        std::string("ggml-ciq keep-quant GEMM on ") + name + " (" + cuda_name + "'s memory)"};
        g_device_count = i + 1;
    }
    if (g_device_count == 0 && !ggml_has_gpu) {
        g_devices[0] = {CIQ_DEVICE_CPU, nullptr, "CIQ_CPU", "ggml-ciq keep-quant GEMM on the CPU (llama.cpp CPU semantics)"};
        g_device_count = 1;
    } else if (g_device_count == 0) {
        GGML_LOG_INFO("ggml-ciq: %s, so the plugin offers no device\n",
                      ggml_backend_dev_by_name("CUDA0") == nullptr ? "this ggml has GPU devices but no CUDA0"
                                                                   : "libggml_ciq sees no CUDA GPU");
    }
}

}  // namespace

ggml_backend_reg_t ggml_backend_ciq_reg(void) {
    static ggml_backend_reg reg = {GGML_BACKEND_API_VERSION, reg_interface, nullptr};
    static bool usable = false;
    static std::once_flag once;
    std::call_once(once, [] {
        usable = ggml_matches() && switches_valid();
        if (usable) {
            discover_devices();
            for (int i = 0; i < g_device_count; i++) g_ggml_devices[i] = {device_interface, &reg, &g_devices[i]};
        }
    });
    return usable ? &reg : nullptr;
}

// Readable without loading the plugin into ggml (ggml_ciq/plugin.py build_info).
extern "C" __attribute__((visibility("default"))) const char *ggml_ciq_plugin_info(void) { return build_info_json(); }

GGML_BACKEND_DL_IMPL(ggml_backend_ciq_reg)
