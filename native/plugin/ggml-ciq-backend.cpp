// ggml-ciq-backend.cpp - a ggml backend (loadable plugin) whose MUL_MATs run through libggml_ciq. docs/PLUGIN.md.
//
// A thin adapter from ggml tensors onto the libggml_ciq C API: which kernel runs, and whether it is worth taking a
// MUL_MAT at all, is asked of the library (ciq_gemm_adapter below), never decided here.
//
// Devices (chosen when ggml loads the plugin):
//   CIQi     GGML_BACKEND_DEVICE_TYPE_GPU, one for each CUDAi of the ggml it is loaded into (i = 0, 1, ... while ggml
//            has CUDAi and libggml_ciq sees GPU i: both count the CUDA runtime's devices in its order). CIQi is CUDAi
//            with our GEMMs: it hands out CUDAi's buffer types, claims every op CUDAi claims, and its graph_compute
//            runs the MUL_MATs the library takes itself and every other run of nodes through a CUDAi backend of its
//            own (ggml-cuda's kernels, fusions and CUDA graphs), the two streams ordered by events: a micro-batch is
//            one split and no host wait. Run as `-dev CIQ0`; over several GPUs `-dev CIQ0/CIQ1 -sm layer`.
//   CIQ_CPU  GGML_BACKEND_DEVICE_TYPE_ACCEL over a ggml without GPU devices: the CPU buffer type (as ggml-blas), a
//            device that takes MUL_MATs only, our CPU kernels in llama.cpp CPU's semantics. Weights must be raw GGUF
//            blocks: load the model without CPU repacking (llama_model_params.use_extra_bufts = false,
//            `--no-repack`); repacked buffers are not host buffers in ggml's sense, so it never claims their ops.
//
// It must run inside exactly the ggml it was compiled against (GGML_BACKEND_API_VERSION does not change when ggml's
// op enum or tensor struct do): ggml_backend_init returns NULL with one log line otherwise.

#include "ggml.h"
#include "ggml-impl.h"
#include "ggml-backend.h"
#include "ggml-backend-impl.h"

#include "ggml_ciq.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

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

#define CIQ_TRY_PLUGIN(call)                  \
    do {                                      \
        const ciq_status status_ = (call);    \
        if (status_ != CIQ_OK) return status_; \
    } while (0)

// The host device promises llama.cpp CPU's semantics; a GPU runs whatever its fastest kernel implements.
ciq_semantics semantics_on(int device) { return device == CIQ_DEVICE_CPU ? CIQ_SEMANTICS_CPU : CIQ_SEMANTICS_ANY; }

// The library's plan for a request (AUTO's kernel, its activation layout, the offload verdict).
ciq_status plan_request(const gemm_request &r, ciq_plan *plan) {
    return ciq_gemm_plan(r.device, CIQ_VARIANT_AUTO, semantics_on(r.device), (ciq_type)r.type, r.rows, r.k, r.tokens,
                         plan);  // ciq_type values are ggml's type ids
}

ciq_status ciq_gemm_adapter(const gemm_request &r, bool execute, bool *offload) {
    *offload = false;
    if (execute) {
        return ciq_gemm(r.device, CIQ_VARIANT_AUTO, semantics_on(r.device), (ciq_type)r.type, r.weight, r.weight_nbytes,
                        r.rows, r.k, r.x, r.tokens, r.out, CIQ_OUT_F32);
    }
    ciq_plan plan;
    const ciq_status status = plan_request(r, &plan);
    *offload = status == CIQ_OK && plan.offload;
    return status;
}

// The activations one graph_compute has converted into a plan's layout, kept for the next MUL_MATs on the same
// tensor (q/k/v, gate/up): ciq_gemm's values (it is plan, convert, ciq_gemm_quantized), one conversion. The caller
// forgets them (valid = false) whenever a node may have written over the tensor since.
struct converted_activations {
    bool valid = false;
    const void *x = nullptr;
    int64_t tokens = 0, k = 0;
    ciq_layout layout{};
    void *buffer = nullptr;  // libggml_ciq device memory, grown on demand
    size_t capacity = 0;
    bool only_copy = false;  // made by a fused step: x's float32 values were never written
};

// Bumped whenever a converted-activations buffer is replaced: CUDA graphs captured before hold its old address.
std::atomic<uint64_t> g_buffer_generation{0};

// Our buffer for converted activations holds at least `bytes` (a bigger one replaces it; freeing waits for readers).
ciq_status reserve_activations(int device, converted_activations *c, size_t bytes) {
    if (c->capacity >= bytes) return CIQ_OK;
    c->valid = false;
    g_buffer_generation++;
    if (c->buffer != nullptr) CIQ_TRY_PLUGIN(ciq_memory_free(device, c->buffer));
    c->buffer = nullptr;
    c->capacity = 0;
    CIQ_TRY_PLUGIN(ciq_memory_alloc(device, bytes, &c->buffer));
    c->capacity = bytes;
    return CIQ_OK;
}

// ciq_gemm's values for r under plan (plan_request's for r), its activations converted unless c holds their
// conversion; with `add` (float32, r's output shape) the product plus add written to r.out
// (ciq_gemm_quantized_outputs' addend: ADD after MUL_MAT).
ciq_status convert_once(const gemm_request &r, const ciq_plan &plan, converted_activations *c) {
    const bool same = c->valid && c->x == r.x && c->tokens == r.tokens && c->k == r.k && c->layout == plan.activation_layout;
    if (!same && c->valid && c->x == r.x && c->only_copy) {  // the plan promised every reader the fused layout
        GGML_LOG_ERROR("ggml-ciq: a fused step's product was asked for in another layout (a plan bug)\n");
        return CIQ_ERR_BACKEND;
    }
    if (!same) {
        c->valid = false;
        CIQ_TRY_PLUGIN(reserve_activations(r.device, c, plan.activation_bytes));
        CIQ_TRY_PLUGIN(ciq_activations_quantize(r.device, plan.activation_layout, r.x, c->buffer, r.tokens, r.k));
        *c = converted_activations{true, r.x, r.tokens, r.k, plan.activation_layout, c->buffer, c->capacity};
    }
    return CIQ_OK;
}

ciq_status ciq_gemm_converting_once(const gemm_request &r, const ciq_plan &plan, converted_activations *c,
                                    const float *add) {
    CIQ_TRY_PLUGIN(convert_once(r, plan, c));
    if (add == nullptr) {
        return ciq_gemm_quantized(r.device, &plan, (ciq_type)r.type, r.weight, r.weight_nbytes, r.rows, r.k, c->buffer,
                                  r.tokens, r.out, CIQ_OUT_F32);
    }
    const ciq_gemm_output output{r.rows, r.out, add};
    return ciq_gemm_quantized_outputs(r.device, &plan, (ciq_type)r.type, r.weight, r.weight_nbytes, r.rows, r.k,
                                      c->buffer, r.tokens, &output, 1, CIQ_OUT_F32);
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
    int ciq_device;                    // CIQ_DEVICE_CPU or the GPU's index
    ggml_backend_dev_t cuda = nullptr; // GPU: CUDAi, whose buffer types, ops and kernels CIQi builds on
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

const device_context *device_of(ggml_backend_t backend) { return (const device_context *)backend->device->context; }

// Input and view ops: no computation of their own (ggml-cuda's ggml_cuda_is_view_or_noop, with empty tensors).
bool is_view_op(ggml_op op) {
    return op == GGML_OP_NONE || op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE ||
           op == GGML_OP_TRANSPOSE;
}

const char *backend_get_name(ggml_backend_t backend) { return device_of(backend)->name.c_str(); }

// A MUL_MAT's weight where our kernels can read it: on the host any, on a GPU in CUDAi's plain buffers (not the
// row-split buffer type of `-sm row`, whose tensor->data is no device pointer); unallocated only where the caller
// asks before allocation (supports_op: test-backend-ops asks first).
bool weight_readable(const device_context *dev, const ggml_tensor *node, bool allocated) {
    if (dev->cuda == nullptr) return true;
    const ggml_tensor *w = node->src[0]->view_src != nullptr ? node->src[0]->view_src : node->src[0];
    if (w->buffer == nullptr) return !allocated;
    return ggml_backend_buffer_get_type(w->buffer) == ggml_backend_dev_buffer_type(dev->cuda);
}

// A MUL_MAT the library takes on this device: a layout we accept, the plan's offload verdict, a weight we can read.
bool mul_mat_ours(const device_context *dev, const ggml_tensor *node) {
    return node->op == GGML_OP_MUL_MAT && mul_mat_offloaded(dev->ciq_device, node) && weight_readable(dev, node, false);
}

// -- the host device (CIQ_CPU): MUL_MATs only; the CPU backend runs everything else --

// Runs the split's MUL_MATs in order (the scheduler hands this device nothing else but views).
ggml_status cpu_graph_compute(ggml_backend_t backend, ggml_cgraph *graph) {
    const device_context *dev = device_of(backend);
    for (int i = 0; i < graph->n_nodes; i++) {
        ggml_tensor *node = graph->nodes[i];
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0 || is_view_op(node->op)) continue;
        gemm_request r{};
        bool unused;
        if (node->op != GGML_OP_MUL_MAT) {
            GGML_LOG_ERROR("ggml-ciq: %s: unsupported op %s\n", dev->name.c_str(), ggml_op_desc(node));
            return GGML_STATUS_FAILED;
        }
        if (!mul_mat_request(dev->ciq_device, node, &r)) {
            GGML_LOG_ERROR("ggml-ciq: %s: MUL_MAT %s has a layout this device declines\n", dev->name.c_str(),
                           node->name);
            return GGML_STATUS_FAILED;
        }
        if (ciq_gemm_adapter(r, true, &unused) != CIQ_OK) {
            GGML_LOG_ERROR("ggml-ciq: %s: MUL_MAT %s: %s\n", dev->name.c_str(), node->name, ciq_last_error());
            return GGML_STATUS_FAILED;
        }
    }
    return GGML_STATUS_SUCCESS;
}

void cpu_backend_free(ggml_backend_t backend) { delete backend; }

const ggml_backend_i cpu_backend_interface = {
    /* .get_name            = */ backend_get_name,
    /* .free                = */ cpu_backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ nullptr,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ cpu_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

// -- the GPU devices (CIQi): CUDAi with our MUL_MATs --
//
// Streams. CUDAi's backend (ggml-cuda) queues its work on a non-blocking stream of its own; libggml_ciq queues ours
// on this thread's stream. Two ggml events of CUDAi (cudaEvents) order them without a host wait: before our first
// MUL_MAT after CUDAi's work, CUDAi records to_ciq and our stream waits for it (ciq_stream_wait_event); before CUDAi's
// first node after our MUL_MATs, our stream records to_cuda and CUDAi's stream waits for it (ggml_backend_event_wait).
// graph_compute ends with CUDAi's stream behind everything it queued, so CUDAi's async copies, its synchronize and
// the scheduler's own ordering hold for CIQi as they do for CUDAi.

// A graph's plan: the steps graph_compute runs, in order. Made once per graph the scheduler hands over (ggml gives
// each split graph a uid; the same uid is the same graph, nodes and addresses: ggml-cuda skips its own checks on it
// too), so a replayed micro-batch or decode step costs no walk over its nodes.
//
// Steps (GGML_CIQ_FUSE=0: RUN and MUL_MAT alone, no ADD taken, nothing moved; API v19's plan):
//   RUN       CUDAi's nodes between ours, in graph order (less the nodes our steps took), run as one graph view.
//   MUL_MAT   one of the MUL_MATs the library takes; with `add`, the ADD of its product and a residual that follows
//             it, written in the same call as product + residual (ciq_gemm_quantized_outputs' addend, the values of
//             ADD after MUL_MAT: one float32 sum).
//   NORM_ACT  RMS_NORM, then MUL by a weight row, whose product only our MUL_MATs read: `fused` (all of them on the
//             f16 layout) ciq_rms_norm_activations straight into their shared activations, no float32 product
//             written; otherwise ciq_rms_norm in llama.cpp CUDA's order into MUL's tensor (CUDAi's values), which the
//             MUL_MATs then convert.
//   GLU_ACT   SWIGLU / GEGLU (split, gate first) whose product only our MUL_MATs read: ciq_glu_activations / ciq_glu
//             the same way.
//   NORM_ADD  RMS_NORM, MUL by a weight row, ADD of a residual, right after a step of ours (Gemma's post-norms):
//             ciq_rms_norm with weight and addend in llama.cpp CUDA's order (its fused kernel's values) into ADD's
//             tensor.
//   ROPE      a ROPE right after a step of ours whose product no SET_ROWS reads (q's; k's stays CUDAi's, fused there
//             with its KV write): ciq_rope in llama.cpp CUDA's order into the ROPE's tensor (rope_ours: the
//             parameters our kernel computes as ggml-cuda does).
//   NORM_ROPE RMS_NORM, MUL by a head_dim weight row, ROPE, consecutive nodes right after a step of ours (Gemma 3's and
//             Qwen 3's q and k norms): ciq_rms_norm_rope in llama.cpp CUDA's order (ggml-cuda's fused kernel's
//             values) into the ROPE's tensor.
//   BIAS      an ADD of a float32 row broadcast over its other operand's rows, right after a step of ours (Qwen 2's
//             q/k/v biases): ciq_add into the ADD's tensor (one float32 add a value, CUDAi's values; a RoPE after it
//             then extends the stretch too).
//   ROPE_KV   (GGML_CIQ_PLUGIN_ROPE_KV) k's ROPE, its VIEW and K cache write (ggml-cuda's fused ROPE + VIEW + SET_ROWS),
//             with the V cache write when it is the next node computing, right after a step of ours;
//             q's ROPE step joins it where it can wait (merge_rope_q): ciq_rope_rows_set_f16 in llama.cpp CUDA's
//             order, one launch (ggml-cuda's values: its RoPE, its fused store, its SET_ROWS). graph_optimize keeps
//             q's product allocated until k's RoPE, so q, v and k become adjacent MUL_MATs: one grouped launch.
// A step of ours that reads nothing the pending CUDAi run writes and writes nothing that run reads or writes runs
// before it when the step before the run is ours: ggml orders q's RoPE (Gemma: q's norm, RoPE and scale) between the
// q and the k/v projections, which then run back to back, and a llama or Gemma layer is one CUDAi run (its RoPEs, KV
// writes and attention) between two of our stretches: two stream hand-overs a layer where API v19's plan had ten.
enum step_kind : int {
    STEP_RUN = 0, STEP_MUL_MAT = 1, STEP_NORM_ACT = 2, STEP_GLU_ACT = 3, STEP_NORM_ADD = 4, STEP_ROPE = 5,
    STEP_NORM_ROPE = 6, STEP_BIAS = 7, STEP_SCALE = 8, STEP_SET_ROWS = 9, STEP_ATTN = 10, STEP_GLU_PAIR = 11,
    STEP_ROPE_KV = 12
};
constexpr int STEP_KINDS = 13;
constexpr const char *k_step_kind_names[STEP_KINDS] = {"RUN", "MUL_MAT", "NORM_ACT", "GLU_ACT", "NORM_ADD", "ROPE",
                                                       "NORM_ROPE", "BIAS", "SCALE", "SET_ROWS", "ATTN", "GLU_PAIR",
                                                       "ROPE_KV"};

struct step {
    step_kind kind = STEP_RUN;
    int node = -1;          // RUN: its first node; else the MUL_MAT, RMS_NORM, GLU, ROPE, ADD, SCALE, SET_ROWS or
                            // FLASH_ATTN_EXT
    int mul = -1;           // NORM_ACT / NORM_ADD / NORM_ROPE: the MUL by the norm's weight
    int rope = -1;          // NORM_ROPE: the ROPE
    int add = -1;           // MUL_MAT / NORM_ADD: the ADD of a residual (-1: none)
    int glu = -1;           // GLU_PAIR: the GLU of gate's product (node, a MUL_MAT) and up's (mul, a MUL_MAT)
    int rope_q = -1;        // ROPE_KV (node: k's ROPE): q's ROPE joined to it (-1: none)
    int set_k = -1;         // ROPE_KV: the K cache write (SET_ROWS of the VIEW of k's ROPE)
    int set_v = -1;         // ROPE_KV: the V cache write after it, by its own ids (-1: none)
    std::vector<int> group; // MUL_MAT: the MUL_MATs on the same activations launched with it (k and v: one launch)
    std::vector<ciq_plan> group_plans;  // ... and the library's plans for them
    bool fresh_x = false;   // MUL_MAT: convert its activations (else ours converted them last and nothing wrote since)
    bool fused = false;     // NORM_ACT / GLU_ACT: into the shared activations, no float32 product written
    int stretch = -1;       // the first step of a stretch of ours: its index in graph_plan.stretches
    ciq_plan gemm_plan{};   // MUL_MAT: the library's plan for it (made once per shape: no planning per call)
    std::vector<ggml_tensor *> run;  // RUN: its nodes, in order
    std::vector<int> run_index;      // RUN: their indices in the graph (the tests' view)
};

// A stretch of steps of ours between two CUDAi runs, run eagerly the first time, captured as a CUDA graph the second
// (every GEMM's scratch then sized) and replayed after that (GGML_CIQ_PLUGIN_GRAPHS=0: always eagerly). A replay is
// one launch where the stretch was ~10 library calls a layer, each planning and launching its kernels on the host.
struct stretch_graph {
    void *graph = nullptr;        // ciq_graph_*; NULL: none captured (yet)
    uint64_t generation = 0;      // g_buffer_generation at its capture
    int runs = 0;                 // eager runs so far
    bool never = false;           // its capture failed: eager from now on
    converted_activations x_after;  // what ours had converted when it ended (a replay leaves the same)
};

struct graph_plan {
    uint64_t uid = 0;  // 0: not cached (a graph without a uid)
    ggml_tensor **nodes = nullptr;
    int n_nodes = 0;
    bool whole = false;  // nothing ours: the graph goes to CUDAi as it is
    std::vector<step> steps;
    std::vector<stretch_graph> stretches;  // one per stretch of ours (step.stretch on its first step)
};

void free_graphs(graph_plan *plan) {
    for (stretch_graph &g : plan->stretches) {
        if (g.graph != nullptr) ciq_graph_free(g.graph);
        g.graph = nullptr;
    }
}

// The library's answer for one MUL_MAT shape on this device: whether it takes it, and its plan's activation layout.
struct mul_mat_answer {
    bool offload = false;
    ciq_plan plan{};  // the library's plan (its layout: plan.activation_layout), made once per shape
};

struct gpu_backend {
    ggml_backend_t cuda = nullptr;           // CUDAi's backend: every node but ours, tensor copies, syncs
    ggml_backend_event_t to_ciq = nullptr;   // recorded on CUDAi's stream, waited for by ours
    ggml_backend_event_t to_cuda = nullptr;  // recorded on ours, waited for by CUDAi's stream
    bool fuse = true;                        // GGML_CIQ_FUSE when the backend started: fused steps, steps moved
    bool fuse_rule = true;                   // GGML_CIQ_PLUGIN_FUSE_RULE: the fused plan only where it halves the runs
    bool attention = false;                  // GGML_CIQ_PLUGIN_ATTENTION: SCALE, SET_ROWS and ATTN steps
    bool group = false;                      // GGML_CIQ_PLUGIN_GROUP: grouped MUL_MATs and GLU_PAIR steps
    bool rope_kv = false;                    // GGML_CIQ_PLUGIN_ROPE_KV: ROPE_KV steps, q's product kept for them
    bool graphs = false;                     // GGML_CIQ_PLUGIN_GRAPHS when it started: stretches of ours as CUDA graphs
    converted_activations x;                 // shared by the MUL_MATs of one graph_compute on the same activations
    std::vector<graph_plan> plans;           // the recent graphs' plans (the scheduler alternates a few graphs)
    // The library's answer per (weight type, rows, K, tokens): a rebuilt graph (a new uid: llama.cpp builds one per
    // decode step it cannot reuse) is planned without asking the library per MUL_MAT again. Read once per backend:
    // GGML_CIQ_OFFLOAD and the rest of the switches are fixed for a backend's life.
    std::map<std::tuple<int, int64_t, int64_t, int64_t>, mul_mat_answer> answers;
    // What this backend did, logged (ggml's debug level: llama.cpp tools with -v) when it is freed, and printed on
    // stderr under GGML_CIQ_PLUGIN_STATS (llama-bench without -v silences ggml's log): whether a benchmark's
    // micro-batches found their plans and replayed their stretches, and where the host's time went (nanoseconds).
    struct host_times {
        uint64_t ns_compute = 0, ns_cuda = 0, ns_ours = 0, ns_handover = 0, ns_sync = 0, syncs = 0, ns_outside = 0;
        uint64_t ns_kind[STEP_KINDS] = {}, n_kind[STEP_KINDS] = {};  // eager steps of ours by kind
    };
    struct {
        uint64_t computes = 0, plans = 0, eager = 0, captured = 0, replayed = 0, stale = 0, failed = 0;
        host_times t;         // since the backend started
        host_times t_warm;    // t when the first k_warm_graphs graphs had run (first runs: lazy module loads, captures)
        int64_t last_end = 0;  // steady clock at the end of the last graph_compute or synchronize (0: none yet)
    } stats;
    bool print_stats = false;  // GGML_CIQ_PLUGIN_STATS when it started
    // GGML_CIQ_PLUGIN_TIMELINE: where a micro-batch's time goes on the GPU against the host. The graphs after the first
    // k_warm_graphs are traced: before each, once CUDAi's stream is idle (in synchronize), timers start on our idle
    // stream (ciq_timer_start: their start events pass at once, so a timer's host start time is its GPU time); in the
    // graph each boundary marks one: the end of a stretch of ours, and of a CUDAi run where our stream waits for it
    // (the to_ciq wait every stretch already makes; after the last run one more). Read in the next synchronize.
    struct timeline {
        bool on = false;
        std::vector<void *> timers;        // started, not yet read
        std::vector<int64_t> started;      // each timer's host start, steady clock ns
        size_t used = 0;                   // marks made in the traced graph
        bool tracing = false;              // this graph_compute marks
        bool pending = false;              // a traced graph waits for its readout
        int64_t t0 = 0;                    // the traced graph's graph_compute entry
        int64_t returned = 0;              // its return, ns from t0
        std::vector<int64_t> host;         // per mark: the host's ns from t0 when it issued the mark
        std::vector<std::string> labels;   // per mark: what ended there
        std::vector<std::string> names;    // the first traced graph's labels: the graphs summed have the same
        std::vector<double> sum_host, sum_gpu;
        std::vector<double> spans;         // per graph summed: the GPU's ns from t0 to the last mark
        double sum_returned = 0, sum_synced = 0;
        uint64_t graphs = 0, skipped = 0;
    } tl;
    size_t last_marks = 0;  // the timers the last graph's plan needs traced (GGML_CIQ_PLUGIN_TIMELINE)
};

constexpr uint64_t k_warm_graphs = 3;  // the stats line's host times leave out a backend's first graphs

int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

// The backend's stats line (gpu_backend.stats): host times over the graphs after the first k_warm_graphs (all of
// them when there were no more).
std::string stats_line(const std::string &name, const decltype(gpu_backend::stats) &st) {
    const bool warm = st.computes > k_warm_graphs;
    const uint64_t graphs = warm ? st.computes - k_warm_graphs : st.computes;
    auto since = [&](uint64_t all, uint64_t at_warm) { return (double)(warm ? all - at_warm : all); };
    const double per = graphs > 0 ? 1e-3 / (double)graphs : 0.0;  // ns in all -> us per graph
    char kinds[512];
    int used = 0;
    for (int k = 1; k < STEP_KINDS && used < (int)sizeof(kinds); k++) {
        const double n = since(st.t.n_kind[k], st.t_warm.n_kind[k]);
        if (n > 0)
            used += std::snprintf(kinds + used, sizeof(kinds) - used, " %s %.2f us x %.1f;", k_step_kind_names[k],
                                  1e-3 * since(st.t.ns_kind[k], st.t_warm.ns_kind[k]) / n, n * per * 1e3);
    }
    if (used == 0) std::snprintf(kinds, sizeof(kinds), " none;");
    char line[1024];
    std::snprintf(line, sizeof(line),
                  "ggml-ciq: %s: %llu graphs computed, %llu plans made; stretches of ours: %llu eager, %llu captured, "
                  "%llu replayed, %llu stale, %llu captures failed; host us a graph over the last %llu: graph_compute "
                  "%.1f (CUDA runs %.1f, ours %.1f, hand-overs %.1f), synchronize %.1f (%.1f calls), outside %.1f; "
                  "eager steps:%s\n",
                  name.c_str(), (unsigned long long)st.computes, (unsigned long long)st.plans,
                  (unsigned long long)st.eager, (unsigned long long)st.captured, (unsigned long long)st.replayed,
                  (unsigned long long)st.stale, (unsigned long long)st.failed, (unsigned long long)graphs,
                  since(st.t.ns_compute, st.t_warm.ns_compute) * per, since(st.t.ns_cuda, st.t_warm.ns_cuda) * per,
                  since(st.t.ns_ours, st.t_warm.ns_ours) * per, since(st.t.ns_handover, st.t_warm.ns_handover) * per,
                  since(st.t.ns_sync, st.t_warm.ns_sync) * per, since(st.t.syncs, st.t_warm.syncs) * per * 1e3,
                  since(st.t.ns_outside, st.t_warm.ns_outside) * per, kinds);
    return line;
}

gpu_backend *gpu_of(ggml_backend_t backend) { return (gpu_backend *)backend->context; }

// -- GGML_CIQ_PLUGIN_TIMELINE (gpu_backend::timeline) --

void timeline_discard(gpu_backend *ctx) {  // timers not to be read: stopped (each waits for its events) and dropped
    float ms = 0;
    for (void *t : ctx->tl.timers) ciq_timer_stop(t, &ms);
    ctx->tl.timers.clear();
    ctx->tl.started.clear();
    ctx->tl.used = 0;
    ctx->tl.pending = ctx->tl.tracing = false;
}

// Timers for the next graph, started while our stream is idle (after CUDAi's stream synchronized: every step of ours
// precedes a CUDAi node that stream waited for). Only after the first k_warm_graphs graphs.
void timeline_prestart(const device_context *dev, gpu_backend *ctx) {
    auto &tl = ctx->tl;
    if (!tl.on || tl.pending || !tl.timers.empty() || ctx->stats.computes < k_warm_graphs) return;
    const size_t n = ctx->last_marks + 2;  // and begin
    for (size_t i = 0; i < n; i++) {
        void *timer = nullptr;
        if (ciq_timer_start(dev->ciq_device, &timer) != CIQ_OK) {
            GGML_LOG_ERROR("ggml-ciq: %s: GGML_CIQ_PLUGIN_TIMELINE: %s; no timeline\n", dev->name.c_str(),
                           ciq_last_error());
            tl.on = false;
            timeline_discard(ctx);
            return;
        }
        tl.timers.push_back(timer);
        tl.started.push_back(now_ns());
    }
}

// Marks the next timer on our stream: what was issued on it so far has run (the GPU's time there).
void timeline_mark(const device_context *dev, gpu_backend *ctx, const std::string &label) {
    auto &tl = ctx->tl;
    if (!tl.tracing || tl.used >= tl.timers.size()) return;
    tl.host.push_back(now_ns() - tl.t0);
    tl.labels.push_back(label);
    if (ciq_timer_mark(tl.timers[tl.used]) != CIQ_OK)
        GGML_LOG_ERROR("ggml-ciq: %s: GGML_CIQ_PLUGIN_TIMELINE: %s\n", dev->name.c_str(), ciq_last_error());
    tl.used++;
}

// A traced graph's first mark, "begin": our stream is idle, so the GPU passes it as soon as it is issued (how far
// apart the two clocks read).
void timeline_begin(const device_context *dev, gpu_backend *ctx, int64_t t_start) {
    auto &tl = ctx->tl;
    if (tl.used > 0 && !tl.pending) timeline_discard(ctx);  // a traced graph that failed half way
    tl.tracing = tl.on && !tl.pending && !tl.timers.empty();
    if (!tl.tracing) return;
    tl.t0 = t_start;
    tl.used = 0;
    tl.host.clear();
    tl.labels.clear();
    timeline_mark(dev, ctx, "begin");
}

// Our stream's later work waits for what CUDAi's stream holds now (to_ciq), without a host wait; false: the wait
// could not be queued (ciq_last_error says why).
bool ours_after_cuda(const device_context *dev, gpu_backend *ctx) {
    ggml_backend_event_record(ctx->to_ciq, ctx->cuda);
    return ciq_stream_wait_event(dev->ciq_device, ctx->to_ciq->context) == CIQ_OK;
}

// The end of a CUDAi run no stretch of ours follows: our stream waits for it, then marks.
void timeline_mark_run(const device_context *dev, gpu_backend *ctx, const std::string &label) {
    if (ctx->tl.tracing && ours_after_cuda(dev, ctx)) timeline_mark(dev, ctx, label);
}

void timeline_end(gpu_backend *ctx) {
    auto &tl = ctx->tl;
    if (!tl.tracing) return;
    tl.returned = now_ns() - tl.t0;
    tl.tracing = false;
    tl.pending = true;
}

// In synchronize, CUDAi's stream idle: the traced graph's marks read and summed (graphs whose marks name the same
// boundaries as the first one's), the rest of the timers stopped.
void timeline_read(gpu_backend *ctx, int64_t synced) {
    auto &tl = ctx->tl;
    if (tl.pending) {
        std::vector<double> gpu(tl.used);
        bool ok = true;
        for (size_t i = 0; i < tl.timers.size(); i++) {
            float ms = 0;
            const bool read = ciq_timer_stop(tl.timers[i], &ms) == CIQ_OK;
            if (i < tl.used) {
                ok = ok && read;
                gpu[i] = (double)(tl.started[i] - tl.t0) + 1e6 * (double)ms;
            }
        }
        tl.timers.clear();
        tl.started.clear();
        tl.pending = false;
        if (tl.graphs == 0 && ok && tl.used > 0) {
            tl.names = tl.labels;
            tl.sum_host.assign(tl.used, 0.0);
            tl.sum_gpu.assign(tl.used, 0.0);
        }
        if (ok && tl.used > 0 && tl.labels == tl.names) {
            for (size_t i = 0; i < tl.used; i++) tl.sum_host[i] += (double)tl.host[i], tl.sum_gpu[i] += gpu[i];
            tl.sum_returned += (double)tl.returned;
            tl.sum_synced += (double)(synced - tl.t0);
            tl.spans.push_back(gpu[tl.used - 1]);
            tl.graphs++;
        } else {
            tl.skipped++;
        }
        tl.used = 0;
    }
}

// The timeline line: per boundary, microseconds from graph_compute's start when the host issued the mark and when the
// GPU passed it (averages over the graphs summed); then graph_compute's return, synchronize's return, the GPU span.
std::string timeline_line(const std::string &name, const gpu_backend::timeline &tl) {
    std::string line = "ggml-ciq: " + name + ": timeline over " + std::to_string(tl.graphs) + " graphs (" +
                       std::to_string(tl.skipped) + " not summed), us from graph_compute's start, host issued -> GPU "
                       "passed:";
    char item[160];
    const double per = tl.graphs > 0 ? 1e-3 / (double)tl.graphs : 0.0;
    for (size_t i = 0; i < tl.names.size() && tl.graphs > 0; i++) {
        std::snprintf(item, sizeof(item), " %s %.1f -> %.1f;", tl.names[i].c_str(), tl.sum_host[i] * per,
                      tl.sum_gpu[i] * per);
        line += item;
    }
    std::vector<double> spans = tl.spans;
    std::sort(spans.begin(), spans.end());
    std::snprintf(item, sizeof(item), " graph_compute returned %.1f, synchronize returned %.1f; GPU span median %.1f "
                  "(min %.1f)\n", tl.sum_returned * per, tl.sum_synced * per,
                  spans.empty() ? 0.0 : 1e-3 * spans[spans.size() / 2], spans.empty() ? 0.0 : 1e-3 * spans.front());
    return line + item;
}

// The inner backend a CIQi backend stands for (ggml-cuda's async copies accept only CUDA backends); others as given.
ggml_backend_t cuda_of(ggml_backend_t backend);

void gpu_backend_free(ggml_backend_t backend) {
    gpu_backend *ctx = gpu_of(backend);
    const std::string line = stats_line(device_of(backend)->name, ctx->stats);
    GGML_LOG_DEBUG("%s", line.c_str());
    if (ctx->print_stats) std::fputs(line.c_str(), stderr);
    if (ctx->cuda != nullptr) ggml_backend_synchronize(ctx->cuda);
    if (ctx->tl.on) {
        timeline_read(ctx, now_ns());
        timeline_discard(ctx);
        const std::string tline = timeline_line(device_of(backend)->name, ctx->tl);
        GGML_LOG_DEBUG("%s", tline.c_str());
        std::fputs(tline.c_str(), stderr);
    }
    if (!ctx->plans.empty()) ciq_device_synchronize(device_of(backend)->ciq_device);  // graphs in flight done
    for (graph_plan &p : ctx->plans) free_graphs(&p);
    if (ctx->x.buffer != nullptr) ciq_memory_free(device_of(backend)->ciq_device, ctx->x.buffer);
    if (ctx->to_ciq != nullptr) ggml_backend_event_free(ctx->to_ciq);
    if (ctx->to_cuda != nullptr) ggml_backend_event_free(ctx->to_cuda);
    if (ctx->cuda != nullptr) ggml_backend_free(ctx->cuda);
    delete ctx;
    delete backend;
}

void gpu_set_tensor_async(ggml_backend_t backend, ggml_tensor *tensor, const void *data, size_t offset, size_t size) {
    ggml_backend_tensor_set_async(gpu_of(backend)->cuda, tensor, data, offset, size);
}

void gpu_get_tensor_async(ggml_backend_t backend, const ggml_tensor *tensor, void *data, size_t offset, size_t size) {
    ggml_backend_tensor_get_async(gpu_of(backend)->cuda, tensor, data, offset, size);
}

void gpu_set_tensor_2d_async(ggml_backend_t backend, ggml_tensor *tensor, const void *data, size_t offset, size_t size,
                             size_t n_copies, size_t stride_tensor, size_t stride_data) {
    ggml_backend_tensor_set_2d_async(gpu_of(backend)->cuda, tensor, data, offset, size, n_copies, stride_tensor,
                                     stride_data);
}

void gpu_get_tensor_2d_async(ggml_backend_t backend, const ggml_tensor *tensor, void *data, size_t offset, size_t size,
                             size_t n_copies, size_t stride_tensor, size_t stride_data) {
    ggml_backend_tensor_get_2d_async(gpu_of(backend)->cuda, tensor, data, offset, size, n_copies, stride_tensor,
                                     stride_data);
}

bool gpu_cpy_tensor_async(ggml_backend_t backend_src, ggml_backend_t backend_dst, const ggml_tensor *src,
                          ggml_tensor *dst) {
    ggml_backend_t cuda_dst = cuda_of(backend_dst);
    return cuda_dst->iface.cpy_tensor_async != nullptr &&
           cuda_dst->iface.cpy_tensor_async(cuda_of(backend_src), cuda_dst, src, dst);
}

void gpu_synchronize(ggml_backend_t backend) {
    gpu_backend *ctx = gpu_of(backend);
    const int64_t t0 = now_ns();
    ggml_backend_synchronize(ctx->cuda);
    const int64_t t1 = now_ns();
    ctx->stats.t.syncs++;
    ctx->stats.t.ns_sync += t1 - t0;
    if (ctx->stats.last_end != 0) ctx->stats.t.ns_outside += t0 - ctx->stats.last_end;
    ctx->stats.last_end = t1;
    if (ctx->tl.on) {
        timeline_read(ctx, t1);
        timeline_prestart(device_of(backend), ctx);  // the next graph's timers
    }
}

// A node CUDAi computes nothing for (ggml-cuda's ggml_cuda_is_view_or_noop): a run of them needs no call into it.
bool computes_nothing(const ggml_tensor *node) {
    return is_view_op(node->op) || ggml_is_empty(node) || (node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0;
}

// Memory a step or node reads or writes: [p, p + n).
struct span {
    const char *p = nullptr;
    size_t n = 0;
};

span span_of(const ggml_tensor *t) {
    return t != nullptr && t->data != nullptr ? span{(const char *)t->data, ggml_nbytes(t)} : span{};
}

bool overlap(span a, span b) { return a.p != nullptr && b.p != nullptr && a.p < b.p + b.n && b.p < a.p + a.n; }

bool overlaps(const ggml_tensor *t, const void *begin, size_t nbytes) {
    return overlap(span_of(t), span{(const char *)begin, nbytes});
}

// The library's answer for a MUL_MAT, remembered per shape; false for a node that is not a MUL_MAT we accept.
bool mul_mat_answer_of(const device_context *dev, gpu_backend *ctx, const ggml_tensor *node, mul_mat_answer *answer) {
    if (node->op != GGML_OP_MUL_MAT || node->src[0] == nullptr || node->src[1] == nullptr) return false;
    gemm_request r{};
    if (!mul_mat_request(dev->ciq_device, node, &r)) return false;
    const std::tuple<int, int64_t, int64_t, int64_t> key{r.type, r.rows, r.k, r.tokens};
    auto found = ctx->answers.find(key);
    if (found == ctx->answers.end()) {
        mul_mat_answer a;
        if (plan_request(r, &a.plan) == CIQ_OK) a.offload = a.plan.offload != 0;
        found = ctx->answers.emplace(key, a).first;
    }
    *answer = found->second;
    return true;
}

// mul_mat_ours with the library's answer remembered per shape.
bool mul_mat_ours_remembered(const device_context *dev, gpu_backend *ctx, const ggml_tensor *node,
                             ciq_plan *plan = nullptr) {
    mul_mat_answer a;
    if (!mul_mat_answer_of(dev, ctx, node, &a) || !a.offload || !weight_readable(dev, node, true)) return false;
    if (plan != nullptr) *plan = a.plan;
    return true;
}

// -- pattern checks for the fused steps (ggml's own conditions for its fusions: ggml_node_has_n_uses) --

// Float32, contiguous, 2-D: the tensors our row ops take.
bool plain_f32(const ggml_tensor *t) {
    return t != nullptr && t->type == GGML_TYPE_F32 && ggml_is_contiguous(t) && t->ne[2] == 1 && t->ne[3] == 1;
}

// How many nodes of the graph (the whole micro-batch's: split graphs share their parent's counts) read t; -1 if
// the graph does not know t.
int uses_of(const ggml_cgraph *graph, const ggml_tensor *t) {
    if (graph->use_counts == nullptr || graph->visited_hash_set.keys == nullptr) return -1;
    const size_t pos = ggml_hash_find(&graph->visited_hash_set, t);
    if (pos == GGML_HASHSET_FULL || !ggml_bitset_get(graph->visited_hash_set.used, pos) ||
        graph->visited_hash_set.keys[pos] != t)
        return -1;
    return graph->use_counts[pos];
}

// A result no one may read in memory but its `n` readers: not a view, not an output, read n times.
bool read_only_by(const ggml_cgraph *graph, const ggml_tensor *t, int n) {
    return t->view_src == nullptr && (t->flags & GGML_TENSOR_FLAG_OUTPUT) == 0 && uses_of(graph, t) == n;
}

// The next node after i that computes something, or -1.
int next_computing(const ggml_cgraph *graph, int i) {
    for (int j = i + 1; j < graph->n_nodes; j++)
        if (!computes_nothing(graph->nodes[j])) return j;
    return -1;
}

// The operand of a two-operand node that is not t (NULL when neither is t).
const ggml_tensor *other_operand(const ggml_tensor *node, const ggml_tensor *t) {
    return node->src[0] == t ? node->src[1] : node->src[1] == t ? node->src[0] : nullptr;
}

// A MUL by a float32 weight row of norm's width (either operand order; any contiguous float32 MUL of norm's shape):
// the weight, or NULL.
const ggml_tensor *norm_weight(const ggml_tensor *mul, const ggml_tensor *norm) {
    if (mul->op != GGML_OP_MUL || mul->type != GGML_TYPE_F32 || !ggml_is_contiguous(mul) ||
        !ggml_are_same_shape(mul, norm))
        return nullptr;
    const ggml_tensor *w = other_operand(mul, norm);
    if (w == nullptr || w == norm || w->type != GGML_TYPE_F32 || !ggml_is_contiguous(w) || w->ne[0] != norm->ne[0] ||
        ggml_nrows(w) != 1)
        return nullptr;
    return w;
}

// A ROPE our kernels compute as ggml-cuda does: float32 [head_dim, heads, tokens] contiguous in and out, int32
// positions [tokens], every dim rotated (n_dims = head_dim), NORM or NEOX mode, no frequency factors, no scaling or
// YaRN (freq_scale 1, ext_factor 0, attn_factor 1: ggml-cuda's factors are then exact 1s), no position offset.
bool rope_ours(const ggml_tensor *rope) {
    if (rope->op != GGML_OP_ROPE || rope->type != GGML_TYPE_F32 || !ggml_is_contiguous(rope) || rope->ne[3] != 1)
        return false;
    const ggml_tensor *x = rope->src[0], *pos = rope->src[1];
    if (x == nullptr || x->type != GGML_TYPE_F32 || !ggml_is_contiguous(x) || !ggml_are_same_shape(x, rope) ||
        pos == nullptr || pos->type != GGML_TYPE_I32 || !ggml_is_contiguous(pos) || pos->ne[0] != rope->ne[2] ||
        rope->src[2] != nullptr)
        return false;
    // ggml_rope_impl's op_params: 1 n_dims, 2 mode, 5..8 freq_base, freq_scale, ext_factor, attn_factor, 15 n_offs
    const int mode = ggml_get_op_params_i32(rope, 2);
    return ggml_get_op_params_i32(rope, 1) == rope->ne[0] && rope->ne[0] % 2 == 0 &&
           (mode == GGML_ROPE_TYPE_NORMAL || mode == GGML_ROPE_TYPE_NEOX) && ggml_get_op_params_f32(rope, 5) > 0.0f &&
           ggml_get_op_params_f32(rope, 6) == 1.0f && ggml_get_op_params_f32(rope, 7) == 0.0f &&
           ggml_get_op_params_f32(rope, 8) == 1.0f && ggml_get_op_params_i32(rope, 15) == 0;
}

float rope_base(const ggml_tensor *rope) { return ggml_get_op_params_f32(rope, 5); }

ciq_rope_mode rope_mode(const ggml_tensor *rope) {
    return ggml_get_op_params_i32(rope, 2) == GGML_ROPE_TYPE_NEOX ? CIQ_ROPE_NEOX : CIQ_ROPE_NORM;
}

// An ADD of a float32 row broadcast over the rows of its first operand (ggml_add(x, bias): a bias), out of place or in
// place over x, the row apart from both: the row, or NULL.
const ggml_tensor *bias_row(const ggml_tensor *add) {
    if (add->op != GGML_OP_ADD || !plain_f32(add)) return nullptr;
    const ggml_tensor *x = add->src[0], *b = add->src[1];
    if (x == nullptr || b == nullptr || !plain_f32(x) || !ggml_are_same_shape(x, add) || !plain_f32(b) ||
        b->ne[0] != add->ne[0] || ggml_nrows(b) != 1 || ggml_nrows(add) < 2)
        return nullptr;
    if (overlap(span_of(b), span_of(add)) || overlap(span_of(b), span_of(x)) ||
        (overlap(span_of(x), span_of(add)) && x->data != add->data))
        return nullptr;
    return b;
}

// A SCALE without a bias of float32 values (contiguous, in place or apart): ciq_scale's values (ggml-cuda's x * s + 0).
bool scale_ours(const ggml_tensor *n) {
    if (n->op != GGML_OP_SCALE || n->type != GGML_TYPE_F32 || !ggml_is_contiguous(n)) return false;
    const ggml_tensor *x = n->src[0];
    return x != nullptr && x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && ggml_are_same_shape(x, n) &&
           ggml_get_op_params_f32(n, 1) == 0.0f && (x->data == n->data || !overlap(span_of(x), span_of(n)));
}

// A SET_ROWS of float32 rows into an f16 tensor by int64 ids (llama.cpp's K/V cache writes; ggml_set_rows' node is a
// view of the destination, src[0] the rows, src[1] the ids): 2-D contiguous rows, one id a row, destination rows as
// wide at any stride: ciq_rows_set_f16's values (ggml-cuda's float -> half, nearest even).
bool set_rows_ours(const ggml_tensor *n) {
    if (n->op != GGML_OP_SET_ROWS || n->type != GGML_TYPE_F16) return false;
    const ggml_tensor *x = n->src[0], *ids = n->src[1];
    return x != nullptr && ids != nullptr && x->type == GGML_TYPE_F32 && ggml_is_contiguous(x) && x->ne[2] == 1 &&
           x->ne[3] == 1 && ids->type == GGML_TYPE_I64 && ggml_is_contiguous(ids) && ids->ne[0] == x->ne[1] &&
           ggml_nrows(ids) == 1 && n->ne[0] == x->ne[0] && n->nb[0] == sizeof(uint16_t) &&
           n->nb[1] % sizeof(uint16_t) == 0 && n->ne[2] == 1 && n->ne[3] == 1 && !overlap(span_of(x), span_of(n)) &&
           !overlap(span_of(ids), span_of(n));
}

// The arguments of a FLASH_ATTN_EXT that ciq_attention_masked computes (AUTO: wgmma on Hopper, else mma): q float32 [D, T, H] viewed from
// [D, H, T] memory (ggml_permute of q), K and V f16 views [D, n_kv, Hkv] of a cache whose rows hold Hkv * D values
// (V not transposed: llama.cpp's flash-attention layout), an f16 mask [>= n_kv, >= T], out float32 [D, H, T]
// contiguous, no ALiBi (max_bias 0), no soft-capping, no sinks, a head_dim mma is built for; else false.
struct attention_args {
    const float *q = nullptr;
    const uint16_t *k = nullptr, *v = nullptr, *mask = nullptr;
    float *out = nullptr;
    int64_t head_dim = 0, tokens = 0, heads = 0, heads_kv = 0, n_kv = 0, mask_row = 0;
    float scale = 0.0f;
};

bool attention_of(const ggml_tensor *n, attention_args *a) {
    if (n->op != GGML_OP_FLASH_ATTN_EXT || n->type != GGML_TYPE_F32 || !ggml_is_contiguous(n) || n->ne[3] != 1)
        return false;
    const ggml_tensor *q = n->src[0], *k = n->src[1], *v = n->src[2], *mask = n->src[3];
    if (q == nullptr || k == nullptr || v == nullptr || mask == nullptr || n->src[4] != nullptr) return false;
    // ggml_flash_attn_ext's op_params: 0 scale, 1 max_bias, 2 logit_softcap, 3 precision
    if (ggml_get_op_params_f32(n, 1) != 0.0f || ggml_get_op_params_f32(n, 2) != 0.0f) return false;
    const int64_t d = q->ne[0], t = q->ne[1], h = q->ne[2], n_kv = k->ne[1], hkv = k->ne[2];
    if (q->type != GGML_TYPE_F32 || q->ne[3] != 1 || q->nb[0] != sizeof(float) || q->nb[2] != d * sizeof(float) ||
        q->nb[1] != h * d * sizeof(float) || hkv <= 0 || h % hkv != 0)
        return false;
    for (const ggml_tensor *kv : {k, v}) {
        if (kv->type != GGML_TYPE_F16 || kv->ne[0] != d || kv->ne[1] != n_kv || kv->ne[2] != hkv || kv->ne[3] != 1 ||
            kv->nb[0] != sizeof(uint16_t) || kv->nb[2] != d * sizeof(uint16_t) ||
            kv->nb[1] != hkv * d * sizeof(uint16_t) || ((uintptr_t)kv->data & 15) != 0)
            return false;
    }
    if (mask->type != GGML_TYPE_F16 || mask->ne[0] < n_kv || mask->ne[1] < t || mask->ne[2] != 1 ||
        mask->ne[3] != 1 || mask->nb[0] != sizeof(uint16_t) || mask->nb[1] % sizeof(uint16_t) != 0)
        return false;
    if (n->ne[0] != d || n->ne[1] != h || n->ne[2] != t) return false;
    if (d != 64 && d != 96 && d != 128 && d != 256) return false;  // the head dims mma is built for (wgmma: not 96)
    *a = attention_args{(const float *)q->data, (const uint16_t *)k->data, (const uint16_t *)v->data,
                        (const uint16_t *)mask->data, (float *)n->data, d, t, h, hkv, n_kv,
                        (int64_t)(mask->nb[1] / sizeof(uint16_t)), ggml_get_op_params_f32(n, 0)};
    return true;
}

// Whether a SET_ROWS after node `from` writes t (or a view of it) into a cache: ggml-cuda fuses a ROPE with that
// write, so a ROPE feeding one is left to CUDAi unless the write is ours too (GGML_CIQ_PLUGIN_ATTENTION).
bool feeds_set_rows(const ggml_cgraph *graph, int from, const ggml_tensor *t) {
    for (int k = from; k < graph->n_nodes; k++) {
        const ggml_tensor *n = graph->nodes[k];
        if (n->op == GGML_OP_SET_ROWS && n->src[0] != nullptr && (n->src[0] == t || n->src[0]->view_src == t))
            return true;
    }
    return false;
}

// An ADD of `sum`'s product and a residual of its shape (either order), sum read by nothing else: the residual, or
// NULL. The ADD may take the product's memory but must not partly overlap the residual (`exact`: an ADD in place over
// the residual allowed, as ciq_rms_norm's out may equal its add; otherwise no overlap at all, as the GEMM's addend).
const ggml_tensor *residual_of(const ggml_cgraph *graph, const ggml_tensor *add, const ggml_tensor *sum, bool exact) {
    if (add->op != GGML_OP_ADD || !plain_f32(add) || !ggml_are_same_shape(add, sum)) return nullptr;
    const ggml_tensor *r = other_operand(add, sum);
    if (r == nullptr || r == sum || !plain_f32(r) || !ggml_are_same_shape(r, sum) || !read_only_by(graph, sum, 1))
        return nullptr;
    if (overlap(span_of(r), span_of(add)) && !(exact && r->data == add->data)) return nullptr;
    return r;
}

// Whether every reader of t is a MUL_MAT of ours taking t as its activations (counted against ggml's use count),
// and whether they all take the f16 layout (*f16: the fused conversion's).
bool read_by_our_mul_mats(const device_context *dev, gpu_backend *ctx, const ggml_cgraph *graph, int from,
                          const ggml_tensor *t, bool *f16) {
    int readers = 0;
    *f16 = true;
    for (int k = from; k < graph->n_nodes; k++) {
        const ggml_tensor *node = graph->nodes[k];
        bool reads = false;
        for (int s = 0; s < GGML_MAX_SRC; s++) reads = reads || node->src[s] == t;
        if (!reads) continue;
        ciq_plan plan{};
        if (node->src[1] != t || node->src[0] == t || !mul_mat_ours_remembered(dev, ctx, node, &plan)) return false;
        *f16 = *f16 && plan.activation_layout == CIQ_LAYOUT_F16;
        readers++;
    }
    return readers > 0 && read_only_by(graph, t, readers);
}

// -- planning --

struct planner {
    const device_context *dev;
    gpu_backend *ctx;
    ggml_cgraph *graph;
    const std::vector<int> &declined;  // fused steps (their first node) that must write their float32 product
    bool fuse;                         // fused steps and steps moved before a run (else API v19's plan)
    graph_plan plan;
    std::vector<char> taken;           // nodes a step of ours covers
    std::vector<int> pending;          // CUDAi's nodes since our last step
    bool pending_computes = false;
    const ggml_tensor *x = nullptr;    // the tensor ours converted last, while nothing wrote over it since
    bool x_fused = false;              // ... made by a fused step (no float32 in memory: only its readers may follow)
    int x_readers_left = 0;            // fused: its readers not yet planned
    int x_step_node = -1;              // fused: the step's first node
    int failed = -1;                   // a fused step whose readers do not follow it: plan again with it declined

    ggml_tensor *node(int i) const { return graph->nodes[i]; }

    void memory_of(const step &s, std::vector<span> *reads, std::vector<span> *writes) const {
        auto read = [&](const ggml_tensor *t) { reads->push_back(span_of(t)); };
        switch (s.kind) {
            case STEP_MUL_MAT:
                read(node(s.node)->src[0]);
                read(node(s.node)->src[1]);
                for (int g : s.group) {
                    read(node(g)->src[0]);
                    writes->push_back(span_of(node(g)));
                }
                if (s.add >= 0) {
                    const ggml_tensor *a = node(s.add);
                    read(other_operand(a, node(s.node)));
                    writes->push_back(span_of(a));
                } else {
                    writes->push_back(span_of(node(s.node)));
                }
                break;
            case STEP_NORM_ACT:
                read(node(s.node)->src[0]);
                read(norm_weight(node(s.mul), node(s.node)));
                if (!s.fused) writes->push_back(span_of(node(s.mul)));
                break;
            case STEP_GLU_ACT:
                read(node(s.node)->src[0]);
                read(node(s.node)->src[1]);
                if (!s.fused) writes->push_back(span_of(node(s.node)));
                break;
            case STEP_GLU_PAIR:  // planned after the rest (merge_steps): gate's and up's weights and x, the GLU
                read(node(s.node)->src[0]);
                read(node(s.mul)->src[0]);
                read(node(s.node)->src[1]);
                writes->push_back(span_of(node(s.glu)));
                break;
            case STEP_NORM_ADD: {
                const ggml_tensor *a = node(s.add);
                read(node(s.node)->src[0]);
                read(norm_weight(node(s.mul), node(s.node)));
                read(other_operand(a, node(s.mul)));
                writes->push_back(span_of(a));
                break;
            }
            case STEP_ROPE:      // x and positions
            case STEP_BIAS:      // x and the row
            case STEP_SCALE:     // x
            case STEP_SET_ROWS:  // the rows and their ids; writes the destination (the node is its view)
            case STEP_ATTN:      // q, K, V and the mask
                for (int k = 0; k < GGML_MAX_SRC; k++) read(node(s.node)->src[k]);
                writes->push_back(span_of(node(s.node)));
                break;
            case STEP_ROPE_KV: {
                const ggml_tensor *k = node(s.node), *set_k = node(s.set_k);
                read(k->src[0]);
                read(k->src[1]);
                read(set_k->src[1]);
                writes->push_back(span_of(set_k));
                if (s.set_v >= 0) {
                    read(node(s.set_v)->src[0]);
                    read(node(s.set_v)->src[1]);
                    writes->push_back(span_of(node(s.set_v)));
                }
                if (s.rope_q >= 0) {
                    read(node(s.rope_q)->src[0]);
                    read(node(s.rope_q)->src[1]);
                    writes->push_back(span_of(node(s.rope_q)));
                }
                break;
            }
            case STEP_NORM_ROPE: {
                const ggml_tensor *mul = node(s.mul), *rope = node(s.rope);
                read(node(s.node)->src[0]);
                read(other_operand(mul, node(s.node)));
                read(rope->src[1]);
                writes->push_back(span_of(rope));
                break;
            }
            case STEP_RUN: break;
        }
    }

    // Whether s may run before the pending run: it reads nothing the run writes, writes nothing the run touches.
    bool independent_of_pending(const step &s) const {
        std::vector<span> reads, writes;
        memory_of(s, &reads, &writes);
        for (int i : pending) {
            const ggml_tensor *n = node(i);
            if (computes_nothing(n)) continue;
            const span dst = span_of(n);
            for (const span &w : writes) {
                if (overlap(w, dst)) return false;
                for (int k = 0; k < GGML_MAX_SRC; k++)
                    if (overlap(w, span_of(n->src[k]))) return false;
            }
            for (const span &r : reads)
                if (overlap(r, dst)) return false;
        }
        return true;
    }

    void flush_run() {
        if (pending_computes) {
            step r;
            r.kind = STEP_RUN;
            r.node = pending.front();
            for (int i : pending) {
                r.run.push_back(node(i));
                r.run_index.push_back(i);
            }
            plan.steps.push_back(std::move(r));
        }
        pending.clear();  // a run of nodes that compute nothing needs no call into CUDAi
        pending_computes = false;
    }

    // A fused step's activations are the only copy of its product: anything but its readers converting next fails it.
    bool conversion_starts() {
        if (x_fused && x_readers_left > 0) {
            failed = x_step_node;
            return false;
        }
        return true;
    }

    void emit(step s) {
        const bool before_run = fuse && pending_computes && !plan.steps.empty() &&
                                plan.steps.back().kind != STEP_RUN && independent_of_pending(s);
        if (!before_run) flush_run();
        taken[s.node] = 1;
        if (s.mul >= 0) taken[s.mul] = 1;
        if (s.rope >= 0) taken[s.rope] = 1;
        if (s.add >= 0) taken[s.add] = 1;
        if (s.set_k >= 0) taken[s.set_k] = 1;
        if (s.set_v >= 0) taken[s.set_v] = 1;
        if (s.kind == STEP_MUL_MAT) {
            const ggml_tensor *src = node(s.node)->src[1];
            s.fresh_x = src != x;
            if (!s.fresh_x && x_fused) x_readers_left--;
            if (s.fresh_x && !conversion_starts()) return;
            if (s.fresh_x) {
                x = src;
                x_fused = false;
            }
        } else if (s.kind == STEP_NORM_ACT || s.kind == STEP_GLU_ACT) {
            if (!conversion_starts()) return;
            const ggml_tensor *product = node(s.kind == STEP_NORM_ACT ? s.mul : s.node);
            x = s.fused ? product : nullptr;
            x_fused = s.fused;
            x_readers_left = s.fused ? uses_of(graph, product) : 0;
            x_step_node = s.node;
        }
        if (x != nullptr && !x_fused) {  // a step that writes over the converted tensor makes it stale
            std::vector<span> reads, writes;
            memory_of(s, &reads, &writes);
            for (const span &w : writes)
                if (overlap(w, span_of(x))) x = nullptr;
        }
        plan.steps.push_back(std::move(s));
    }

    bool declined_here(int i) const {
        for (int d : declined)
            if (d == i) return true;
        return false;
    }

    // A q/k norm + RoPE at node i (ggml-cuda's fused RMS_NORM + MUL + ROPE: consecutive nodes, each product read by
    // the next alone, the weight a head_dim row as MUL's second operand): the step, else kind STEP_RUN.
    step match_norm_rope(int i) const {
        step s;
        const ggml_tensor *n = node(i);
        if (i + 2 >= graph->n_nodes) return s;
        const ggml_tensor *mul = node(i + 1), *rope = node(i + 2);
        if (n->type != GGML_TYPE_F32 || !ggml_is_contiguous(n) || n->src[0] == nullptr ||
            n->src[0]->type != GGML_TYPE_F32 || !ggml_is_contiguous(n->src[0]) || mul->src[0] != n ||
            norm_weight(mul, n) == nullptr || !rope_ours(rope) || rope->src[0] != mul || !read_only_by(graph, n, 1) ||
            !read_only_by(graph, mul, 1))
            return s;
        s.kind = STEP_NORM_ROPE;
        s.node = i;
        s.mul = i + 1;
        s.rope = i + 2;
        return s;
    }

    // k's RoPE at node i with its VIEW and K cache write (ggml-cuda's fused ROPE + VIEW + SET_ROWS: consecutive nodes,
    // the RoPE read by the view alone, the view a flat contiguous view of it read by the write alone), and the V cache
    // write of as many rows when it is the next node computing (its own ids: llama.cpp's v_idxs): a ROPE_KV step,
    // else kind STEP_RUN.
    step match_rope_kv(int i) const {
        step s;
        if (i + 2 >= graph->n_nodes) return s;
        const ggml_tensor *rope = node(i), *view = node(i + 1), *set_k = node(i + 2);
        if (!rope_ours(rope) || view->op != GGML_OP_VIEW || view->view_src != rope || view->src[0] != rope ||
            view->view_offs != 0 || !ggml_is_contiguous(view) || view->ne[0] != rope->ne[0] * rope->ne[1] ||
            set_k->src[0] != view || !set_rows_ours(set_k) || set_k->src[1]->ne[0] != rope->ne[2] ||
            set_k->ne[0] != view->ne[0] || !read_only_by(graph, rope, 1) || uses_of(graph, view) != 1 ||
            overlap(span_of(rope->src[0]), span_of(set_k)))
            return s;
        s.kind = STEP_ROPE_KV;
        s.node = i;
        s.set_k = i + 2;
        const int j = next_computing(graph, i + 2);
        if (j < 0) return s;
        const ggml_tensor *set_v = node(j);
        if (set_rows_ours(set_v) && set_v->src[0]->ne[1] == rope->ne[2] && !overlap(span_of(set_v), span_of(set_k)) &&
            !overlap(span_of(set_v->src[0]), span_of(set_k)) && !overlap(span_of(rope->src[0]), span_of(set_v)))
            s.set_v = j;
        return s;
    }

    // The fused step starting at node i, if one matches (kind STEP_RUN: none).
    step match_fused(int i) {
        step s;
        ggml_tensor *n = node(i);
        // A RoPE, bias or q/k norm + RoPE step extends the stretch of ours before it, never starts one: the run
        // pending since must have nothing to compute, or the step must be able to go before it (a RoPE reading what
        // CUDAi computed after our MUL_MAT stays CUDAi's: taking it would end that run no earlier and add a call).
        const bool after_ours = !plan.steps.empty() && plan.steps.back().kind != STEP_RUN;
        auto extends_ours = [&](const step &r) { return !pending_computes || independent_of_pending(r); };
        if (n->op == GGML_OP_ROPE && after_ours && ctx->rope_kv) {
            s = match_rope_kv(i);
            if (s.kind != STEP_RUN) return extends_ours(s) ? s : step{};
        }
        if (n->op == GGML_OP_ROPE && after_ours && rope_ours(n) &&
            (ctx->attention || !feeds_set_rows(graph, i + 1, n))) {
            s.kind = STEP_ROPE;
            s.node = i;
            return extends_ours(s) ? s : step{};
        }
        if (n->op == GGML_OP_ADD && after_ours && bias_row(n) != nullptr) {
            s.kind = STEP_BIAS;
            s.node = i;
            return extends_ours(s) ? s : step{};
        }
        attention_args attention;
        if (ctx->attention && after_ours &&
            (scale_ours(n) || set_rows_ours(n) || (n->op == GGML_OP_FLASH_ATTN_EXT && attention_of(n, &attention)))) {
            s.kind = n->op == GGML_OP_SCALE ? STEP_SCALE : n->op == GGML_OP_SET_ROWS ? STEP_SET_ROWS : STEP_ATTN;
            s.node = i;
            return extends_ours(s) ? s : step{};
        }
        if (n->op == GGML_OP_RMS_NORM && after_ours) {
            s = match_norm_rope(i);
            if (s.kind != STEP_RUN) return extends_ours(s) ? s : step{};
        }
        if (n->op == GGML_OP_RMS_NORM && plain_f32(n) && plain_f32(n->src[0]) && read_only_by(graph, n, 1)) {
            const int j = next_computing(graph, i);
            if (j < 0 || norm_weight(node(j), n) == nullptr) return s;
            const int k = next_computing(graph, j);
            if (k >= 0 && !plan.steps.empty() && plan.steps.back().kind != STEP_RUN && !pending_computes &&
                residual_of(graph, node(k), node(j), true) != nullptr) {
                s.kind = STEP_NORM_ADD;
                s.node = i;
                s.mul = j;
                s.add = k;
                return s;
            }
            bool f16 = false;
            if (read_by_our_mul_mats(dev, ctx, graph, j + 1, node(j), &f16)) {
                s.kind = STEP_NORM_ACT;
                s.node = i;
                s.mul = j;
                s.fused = f16 && !declined_here(i);
            }
            return s;
        }
        if (n->op == GGML_OP_GLU && n->src[1] != nullptr && ggml_get_op_params_i32(n, 1) == 0 &&
            (ggml_get_glu_op(n) == GGML_GLU_OP_SWIGLU || ggml_get_glu_op(n) == GGML_GLU_OP_GEGLU) && plain_f32(n) &&
            plain_f32(n->src[0]) && plain_f32(n->src[1]) && ggml_are_same_shape(n, n->src[0]) &&
            ggml_are_same_shape(n, n->src[1])) {
            bool f16 = false;
            if (read_by_our_mul_mats(dev, ctx, graph, i + 1, n, &f16)) {
                s.kind = STEP_GLU_ACT;
                s.node = i;
                s.fused = f16 && !declined_here(i);
            }
        }
        return s;
    }

    // Whether step p can run where step r stands instead (p before r in one stretch): nothing from p to r writes
    // what p reads or reads or writes what p writes, p's write apart from r's reads and writes (q's RoPE in place is
    // its own business).
    bool can_wait(size_t p, size_t r) const {
        std::vector<span> p_reads, p_writes;
        memory_of(plan.steps[p], &p_reads, &p_writes);
        for (size_t i = p + 1; i <= r; i++) {
            std::vector<span> reads, writes;
            memory_of(plan.steps[i], &reads, &writes);
            for (const span &w : writes) {
                for (const span &pr : p_reads)
                    if (overlap(w, pr)) return false;
                for (const span &pw : p_writes)
                    if (overlap(w, pw)) return false;
            }
            for (const span &rd : reads)
                for (const span &pw : p_writes)
                    if (overlap(rd, pw)) return false;
        }
        return true;
    }

    // After planning (GGML_CIQ_PLUGIN_ROPE_KV): a ROPE step (q's) before a ROPE_KV step in the same stretch, on the
    // same positions, head_dim, mode and base, joins it where it can wait (can_wait: the addresses ggml-alloc gave,
    // with or without graph_optimize's dependency); the MUL_MATs between (v, k) then follow q's.
    void merge_rope_q() {
        std::vector<step> &steps = plan.steps;
        for (size_t r = 0; r < steps.size(); r++) {
            if (steps[r].kind != STEP_ROPE_KV) continue;
            const ggml_tensor *k = node(steps[r].node);
            for (size_t p = r; p-- > 0 && steps[p].kind != STEP_RUN;) {
                if (steps[p].kind != STEP_ROPE) continue;
                const ggml_tensor *q = node(steps[p].node);
                if (q->src[1] != k->src[1] || q->ne[0] != k->ne[0] || q->ne[2] != k->ne[2] ||
                    rope_mode(q) != rope_mode(k) || rope_base(q) != rope_base(k) || !can_wait(p, r))
                    break;
                steps[r].rope_q = steps[p].node;
                steps.erase(steps.begin() + (long)p);
                r--;
                break;
            }
        }
    }

    // After planning (GGML_CIQ_PLUGIN_GROUP, the fused plan): adjacent steps of ours that one launch can run.
    // - [MUL_MAT gate][MUL_MAT up][GLU_ACT] (either MUL_MAT first), both on the same activations and weights of one
    //   type and shape that wgmma's epilogue takes, each product read by the GLU alone: one GLU_PAIR step, the GLU from wgmma's epilogue
    //   (ciq_gemm_quantized_glu_pair); the GLU's float32 product is then written, and its first MUL_MAT reader converts it.
    // - MUL_MATs without an ADD, each after the first on the activations it converted (k and v), all staged: one
    //   MUL_MAT step with a group (ciq_gemm_quantized_group: one launch where the kernel takes the types and rows and
    //   the time model gains; the library runs them apart otherwise).
    // A weight wgmma's RS kernels stage by TMA (Q4_K, Q5_K; Q6_K with K % 2048 == 0: 16-byte rows), planned for wgmma:
    // what a grouped launch and the GLU pair's epilogue take (elsewhere the library runs the calls apart).
    static bool staged(const ggml_tensor *w, const ciq_plan &plan) {
        return plan.variant == CIQ_VARIANT_WGMMA && (w->type == GGML_TYPE_Q4_K || w->type == GGML_TYPE_Q5_K ||
                                                     (w->type == GGML_TYPE_Q6_K && w->ne[0] % 2048 == 0));
    }
    bool glu_pair_of(const step &a, const step &b, const step &g, int *gate, int *up) const {
        const ggml_tensor *glu = node(g.node), *na = node(a.node), *nb = node(b.node);
        if (glu->src[0] == na && glu->src[1] == nb) *gate = a.node, *up = b.node;
        else if (glu->src[0] == nb && glu->src[1] == na) *gate = b.node, *up = a.node;
        else return false;
        // only where wgmma's epilogue takes it (ciq_gemm_quantized_glu_pair: both staged by TMA, whole 64-row boxes);
        // elsewhere the library would run the two GEMMs and a GLU, a launch more than GLU_ACT's fused conversion
        const ggml_tensor *wa = na->src[0], *wb = nb->src[0];
        return na->src[1] == nb->src[1] && wa->type == wb->type && ggml_are_same_shape(wa, wb) &&
               staged(wa, a.gemm_plan) && staged(wb, b.gemm_plan) && wa->ne[1] % CIQ_GLU_INTERLEAVE == 0 &&
               a.gemm_plan.activation_layout == b.gemm_plan.activation_layout && read_only_by(graph, na, 1) &&
               read_only_by(graph, nb, 1);
    }
    bool groups_with(const step &first, const step &s) const {
        const ggml_tensor *a = node(first.node), *b = node(s.node);
        return s.kind == STEP_MUL_MAT && s.add < 0 && !s.fresh_x && b->src[1] == a->src[1] &&
               s.gemm_plan.activation_layout == first.gemm_plan.activation_layout && staged(a->src[0], first.gemm_plan) &&
               staged(b->src[0], s.gemm_plan);
    }
    void merge_steps() {
        std::vector<step> merged;
        std::vector<step> &steps = plan.steps;
        for (size_t i = 0; i < steps.size(); i++) {
            const step &s = steps[i];
            int gate = -1, up = -1;
            if (s.kind == STEP_MUL_MAT && s.add < 0 && i + 2 < steps.size() && steps[i + 1].kind == STEP_MUL_MAT &&
                steps[i + 1].add < 0 && !steps[i + 1].fresh_x && steps[i + 2].kind == STEP_GLU_ACT &&
                glu_pair_of(s, steps[i + 1], steps[i + 2], &gate, &up)) {
                step p = s;
                p.kind = STEP_GLU_PAIR;
                p.node = gate;
                p.mul = up;
                p.glu = steps[i + 2].node;
                p.fused = false;
                merged.push_back(std::move(p));
                // the GLU's product is now written: its first MUL_MAT reader converts it (a fused GLU_ACT had)
                const ggml_tensor *product = node(steps[i + 2].node);
                for (size_t j = i + 3; j < steps.size(); j++) {
                    if (steps[j].kind == STEP_MUL_MAT && node(steps[j].node)->src[1] == product) {
                        steps[j].fresh_x = true;
                        break;
                    }
                }
                i += 2;
                continue;
            }
            if (s.kind == STEP_MUL_MAT && s.add < 0) {
                step m = s;
                size_t j = i + 1;
                while (j < steps.size() && m.group.size() < 2 && groups_with(s, steps[j])) {
                    m.group.push_back(steps[j].node);
                    m.group_plans.push_back(steps[j++].gemm_plan);
                }
                merged.push_back(std::move(m));
                i = j - 1;
                continue;
            }
            merged.push_back(s);
        }
        steps = std::move(merged);
    }

    void make() {
        plan = graph_plan{graph->uid, graph->nodes, graph->n_nodes, false, {}, {}};
        bool any = false;  // nothing ours (a decode step): the whole graph to CUDAi, no pattern search over it
        for (int i = 0; i < graph->n_nodes && !any; i++) any = mul_mat_ours_remembered(dev, ctx, node(i));
        if (!any) {
            plan.whole = true;
            return;
        }
        taken.assign(graph->n_nodes, 0);
        for (int i = 0; i < graph->n_nodes && failed < 0; i++) {
            if (taken[i]) continue;
            ggml_tensor *n = node(i);
            if (computes_nothing(n)) {
                pending.push_back(i);
                continue;
            }
            ciq_plan gemm_plan{};
            if (mul_mat_ours_remembered(dev, ctx, n, &gemm_plan)) {
                step s;
                s.kind = STEP_MUL_MAT;
                s.node = i;
                s.gemm_plan = gemm_plan;
                const int j = fuse ? next_computing(graph, i) : -1;
                if (j >= 0 && residual_of(graph, node(j), n, false) != nullptr) s.add = j;
                emit(std::move(s));
                continue;
            }
            if (fuse) {
                step s = match_fused(i);
                if (s.kind != STEP_RUN) {
                    emit(std::move(s));
                    continue;
                }
            }
            pending.push_back(i);
            pending_computes = true;
            if (x != nullptr && !x_fused && overlaps(n, x->data, ggml_nbytes(x))) x = nullptr;
        }
        if (failed < 0 && x_fused && x_readers_left > 0) failed = x_step_node;
        flush_run();
        if (fuse && ctx->rope_kv && failed < 0) merge_rope_q();
        if (fuse && ctx->group && failed < 0) merge_steps();
        bool ours = false;
        for (size_t i = 0; i < plan.steps.size(); i++) {
            step &s = plan.steps[i];
            if (s.kind == STEP_RUN) continue;
            ours = true;
            if (i == 0 || plan.steps[i - 1].kind == STEP_RUN) {
                s.stretch = (int)plan.stretches.size();
                plan.stretches.emplace_back();
            }
        }
        plan.whole = !ours;
    }
};

// A graph's plan with or without fused steps: fused steps whose readers do not follow them are declined (they then
// write their product) until none is left.
graph_plan plan_with(const device_context *dev, gpu_backend *ctx, ggml_cgraph *graph, bool fuse) {
    std::vector<int> declined;
    for (;;) {
        planner p{dev, ctx, graph, declined, fuse, {}, {}, {}};
        p.make();
        if (p.failed < 0) return std::move(p.plan);
        declined.push_back(p.failed);
    }
}

int runs_of(const graph_plan &plan) {
    int runs = plan.whole ? 1 : 0;
    for (const step &s : plan.steps) runs += s.kind == STEP_RUN;
    return runs;
}

// The fused plan where it at least halves CUDAi's runs, else API v19's (GGML_CIQ_PLUGIN_FUSE_RULE=0: the fused plan
// whenever GGML_CIQ_FUSE is on). Measured on an H100 (plugin-fused-h100): a llama layer goes from five runs to one and
// its prefill gains (synthetic 8B pp512 +8%, SmolLM2 +15%); in Gemma 3 the q/k norms and RoPEs stay CUDAi's between
// q, k and v (ggml-alloc gives k's product the memory q's norm reads, so k cannot run before it), a layer keeps three
// runs, and our extra calls cost more than the two runs saved (pp512 -15%, pp4096 -32% against API v19's plan).
//
// A graph without a uid gets API v19's plan: the scheduler hands an eval callback (llama-imatrix, our `capture`) views
// of uid 0 that end at each node it asks about, and the callback reads that node's sources, which a fused step would
// leave unwritten (its readers' use counts are the whole graph's).
graph_plan make_plan(const device_context *dev, gpu_backend *ctx, ggml_cgraph *graph, uint64_t uid) {
    graph_plan plain = plan_with(dev, ctx, graph, false);
    if (!ctx->fuse || plain.whole || uid == 0) return plain;
    graph_plan fused = plan_with(dev, ctx, graph, true);
    if (ctx->fuse_rule && 2 * runs_of(fused) > runs_of(plain)) return plain;
    return fused;
}

graph_plan &plan_of(const device_context *dev, gpu_backend *ctx, ggml_cgraph *graph) {
    constexpr size_t kept = 16;
    if (graph->uid != 0) {
        for (graph_plan &p : ctx->plans)
            if (p.uid == graph->uid && p.nodes == graph->nodes && p.n_nodes == graph->n_nodes) return p;
        if (ctx->plans.size() == kept) {
            free_graphs(&ctx->plans.front());
            ctx->plans.erase(ctx->plans.begin());
        }
        ctx->plans.push_back(make_plan(dev, ctx, graph, graph->uid));
        ctx->stats.plans++;
        return ctx->plans.back();
    }
    static thread_local graph_plan uncached;
    uncached = make_plan(dev, ctx, graph, 0);
    ctx->stats.plans++;
    return uncached;
}

// A uid of a run of a graph with a uid: the same run of the same graph gets the same one, in a range ggml's counter
// (ggml_graph_next_uid, from 1 up) never reaches.
uint64_t run_uid(uint64_t graph_uid, size_t step) {
    if (graph_uid == 0) return 0;
    return (uint64_t(1) << 63) | ((graph_uid & ((uint64_t(1) << 43) - 1)) << 20) | (step & ((1u << 20) - 1));
}

// -- running a plan --

// The steps CIQi backends have run since the last reset, by kind (STEP_RUN .. STEP_NORM_ADD), then MUL_MATs with their
// ADD, fused NORM_ACT / GLU_ACT steps, and stretches of ours replayed as CUDA graphs: which path ran, for the GPU
// tests ("ggml_ciq_plugin_steps").
constexpr int STEP_COUNTS = 18;  // RUN .. NORM_ADD, MUL_MAT + ADD, fused, replays, ROPE, NORM_ROPE, BIAS, SCALE,
                                 // SET_ROWS, ATTN, GLU_PAIR, MUL_MATs grouped with the one before, ROPE_KV, ROPE_KV
                                 // with q's RoPE
constexpr int k_count_of_kind[] = {0, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14, 16};  // step_kind -> its counter
static_assert(sizeof(k_count_of_kind) / sizeof(k_count_of_kind[0]) == STEP_KINDS, "a counter per step kind");
std::atomic<uint64_t> g_step_counts[STEP_COUNTS];

void count_step(const step &s) {
    g_step_counts[k_count_of_kind[s.kind]]++;
    if (s.kind == STEP_MUL_MAT && s.add >= 0) g_step_counts[5]++;
    g_step_counts[15] += s.group.size();
    if (s.fused) g_step_counts[6]++;
    if (s.kind == STEP_ROPE_KV && s.rope_q >= 0) g_step_counts[17]++;
}

// counts[0..STEP_COUNTS): g_step_counts; reset != 0 zeroes them after reading.
void steps_for_tests(uint64_t *counts, int reset) {
    for (int i = 0; i < STEP_COUNTS; i++) counts[i] = reset ? g_step_counts[i].exchange(0) : g_step_counts[i].load();
}

// A step of ours as the library calls' arguments, read from its nodes (apart from the calls, so that the plan hook
// reads them on a machine without a GPU as graph_compute does).
struct step_call {
    gemm_request gemm{};             // MUL_MAT (out: the ADD's tensor with an ADD), GLU_PAIR's gate (out: the GLU's)
    gemm_request more[2]{};          // MUL_MAT: its group's; GLU_PAIR: more[0] up's
    const float *x = nullptr;        // the norm's or the GLU's input (gate)
    const float *up = nullptr;       // GLU
    const float *weight = nullptr;   // the norm's weight row
    const float *addend = nullptr;   // the residual (MUL_MAT with ADD, NORM_ADD)
    float *out = nullptr;            // the float32 product (unfused steps, NORM_ADD)
    const void *product = nullptr;   // fused: the tensor whose conversion the step makes (never written)
    int64_t tokens = 0, k = 0;
    float eps = 0.0f;
    ciq_glu_kind glu = CIQ_GLU_SILU;
    const int32_t *positions = nullptr;  // ROPE, NORM_ROPE
    int64_t heads = 0, head_dim = 0;     // ROPE, NORM_ROPE (tokens: the rope's third dim)
    float base = 0.0f;
    ciq_rope_mode mode = CIQ_ROPE_NORM;
    float scale = 0.0f;                  // SCALE
    const int64_t *ids = nullptr;        // SET_ROWS (x: the rows, k values each, tokens of them)
    uint16_t *table = nullptr;
    int64_t table_rows = 0, row_stride = 0;
    attention_args attention;            // ATTN
    // ROPE_KV: k (x), its positions, head_dim, heads (k's), tokens, base and mode as ROPE's; ids, table (K's),
    // table_rows and row_stride as SET_ROWS'; q's RoPE (q NULL: none) and the V cache write (v NULL: none)
    const float *q = nullptr;
    float *q_out = nullptr;
    int64_t heads_q = 0;
    const float *v = nullptr;
    int64_t v_k = 0;
    const int64_t *v_ids = nullptr;
    uint16_t *v_table = nullptr;
    int64_t v_table_rows = 0, v_row_stride = 0;
};

// A ROPE's arguments (its positions, head_dim, heads, tokens, base, mode) into c.
void rope_args(const ggml_tensor *rope, step_call *c) {
    c->positions = (const int32_t *)rope->src[1]->data;
    c->head_dim = rope->ne[0];
    c->heads = rope->ne[1];
    c->tokens = rope->ne[2];
    c->base = rope_base(rope);
    c->mode = rope_mode(rope);
}

// A SET_ROWS' destination as ciq_rows_set_f16 takes it: its ids, the table (the node, a view of the cache), its rows
// and their stride in values.
void set_rows_args(const ggml_tensor *set_rows, const int64_t **ids, uint16_t **table, int64_t *rows,
                   int64_t *row_stride) {
    *ids = (const int64_t *)set_rows->src[1]->data;
    *table = (uint16_t *)set_rows->data;
    *rows = set_rows->ne[1];
    *row_stride = (int64_t)(set_rows->nb[1] / sizeof(uint16_t));
}

step_call call_of(int device, ggml_cgraph *graph, const step &s) {
    step_call c;
    ggml_tensor *n = graph->nodes[s.node];
    if (s.kind == STEP_GLU_PAIR) {
        mul_mat_request(device, n, &c.gemm);
        mul_mat_request(device, graph->nodes[s.mul], &c.more[0]);
        ggml_tensor *glu = graph->nodes[s.glu];
        c.gemm.out = (float *)glu->data;
        c.glu = ggml_get_glu_op(glu) == GGML_GLU_OP_GEGLU ? CIQ_GLU_GELU : CIQ_GLU_SILU;
    } else if (s.kind == STEP_MUL_MAT) {
        mul_mat_request(device, n, &c.gemm);  // the plan took it: a layout mul_mat_ours accepted
        for (size_t g = 0; g < s.group.size(); g++) mul_mat_request(device, graph->nodes[s.group[g]], &c.more[g]);
        if (s.add >= 0) {
            ggml_tensor *a = graph->nodes[s.add];
            c.addend = (const float *)other_operand(a, n)->data;
            c.gemm.out = (float *)a->data;
        }
    } else if (s.kind == STEP_NORM_ACT || s.kind == STEP_NORM_ADD) {
        ggml_tensor *mul = graph->nodes[s.mul];
        ggml_tensor *dst = s.kind == STEP_NORM_ADD ? graph->nodes[s.add] : mul;
        c.x = (const float *)n->src[0]->data;
        c.weight = (const float *)norm_weight(mul, n)->data;
        c.eps = ggml_get_op_params_f32(n, 0);
        c.k = dst->ne[0];
        c.tokens = dst->ne[1];
        c.out = (float *)dst->data;
        if (s.kind == STEP_NORM_ADD) c.addend = (const float *)other_operand(dst, mul)->data;
    } else if (s.kind == STEP_GLU_ACT) {
        c.x = (const float *)n->src[0]->data;
        c.up = (const float *)n->src[1]->data;
        c.glu = ggml_get_glu_op(n) == GGML_GLU_OP_GEGLU ? CIQ_GLU_GELU : CIQ_GLU_SILU;
        c.k = n->ne[0];
        c.tokens = n->ne[1];
        c.out = (float *)n->data;
    } else if (s.kind == STEP_BIAS) {
        c.x = (const float *)n->src[0]->data;
        c.addend = (const float *)n->src[1]->data;
        c.k = n->ne[0];
        c.tokens = ggml_nrows(n);
        c.out = (float *)n->data;
    } else if (s.kind == STEP_SCALE) {
        c.x = (const float *)n->src[0]->data;
        c.scale = ggml_get_op_params_f32(n, 0);
        c.k = ggml_nelements(n);
        c.tokens = 1;
        c.out = (float *)n->data;
    } else if (s.kind == STEP_SET_ROWS) {
        c.x = (const float *)n->src[0]->data;
        c.k = n->src[0]->ne[0];
        c.tokens = n->src[0]->ne[1];
        set_rows_args(n, &c.ids, &c.table, &c.table_rows, &c.row_stride);
    } else if (s.kind == STEP_ROPE_KV) {
        c.x = (const float *)n->src[0]->data;
        rope_args(n, &c);
        set_rows_args(graph->nodes[s.set_k], &c.ids, &c.table, &c.table_rows, &c.row_stride);
        if (s.rope_q >= 0) {
            ggml_tensor *q = graph->nodes[s.rope_q];
            c.q = (const float *)q->src[0]->data;
            c.q_out = (float *)q->data;
            c.heads_q = q->ne[1];
        }
        if (s.set_v >= 0) {
            const ggml_tensor *set_v = graph->nodes[s.set_v];
            c.v = (const float *)set_v->src[0]->data;
            c.v_k = set_v->src[0]->ne[0];
            set_rows_args(set_v, &c.v_ids, &c.v_table, &c.v_table_rows, &c.v_row_stride);
        }
    } else if (s.kind == STEP_ATTN) {
        attention_of(n, &c.attention);  // the plan took it: its arguments are there
    } else if (s.kind == STEP_ROPE || s.kind == STEP_NORM_ROPE) {
        ggml_tensor *rope = s.kind == STEP_ROPE ? n : graph->nodes[s.rope];
        c.x = (const float *)n->src[0]->data;
        if (s.kind == STEP_NORM_ROPE) {
            c.weight = (const float *)graph->nodes[s.mul]->src[1]->data;
            c.eps = ggml_get_op_params_f32(n, 0);
        }
        rope_args(rope, &c);
        c.out = (float *)rope->data;
    }
    if (s.fused) {
        c.product = c.out;
        c.out = nullptr;
    }
    return c;
}

// One step of ours on our stream.
ciq_status run_ours(const device_context *dev, gpu_backend *ctx, ggml_cgraph *graph, const step &s) {
    const int device = dev->ciq_device;
    const step_call c = call_of(device, graph, s);
    switch (s.kind) {
        case STEP_MUL_MAT: {
            if (s.fresh_x) ctx->x.valid = false;
            if (s.group.empty()) return ciq_gemm_converting_once(c.gemm, s.gemm_plan, &ctx->x, c.addend);
            CIQ_TRY_PLUGIN(convert_once(c.gemm, s.gemm_plan, &ctx->x));
            ciq_gemm_output outs[3];
            ciq_gemm_weight weights[3];
            const int n = 1 + (int)s.group.size();
            for (int i = 0; i < n; i++) {
                const gemm_request &r = i == 0 ? c.gemm : c.more[i - 1];
                outs[i] = ciq_gemm_output{r.rows, r.out, nullptr};
                weights[i] = ciq_gemm_weight{i == 0 ? &s.gemm_plan : &s.group_plans[i - 1], (ciq_type)r.type, r.weight,
                                             r.weight_nbytes, r.rows, &outs[i], 1};
            }
            return ciq_gemm_quantized_group(device, weights, n, c.gemm.k, ctx->x.buffer, c.gemm.tokens, CIQ_OUT_F32);
        }
        case STEP_GLU_PAIR: {
            if (s.fresh_x) ctx->x.valid = false;
            CIQ_TRY_PLUGIN(convert_once(c.gemm, s.gemm_plan, &ctx->x));
            return ciq_gemm_quantized_glu_pair(device, &s.gemm_plan, (ciq_type)c.gemm.type, c.gemm.weight,
                                               c.more[0].weight, c.gemm.weight_nbytes, c.gemm.rows, c.gemm.k,
                                               ctx->x.buffer, c.gemm.tokens, c.glu, c.gemm.out);
        }
        case STEP_NORM_ACT:
        case STEP_GLU_ACT: {
            const bool norm = s.kind == STEP_NORM_ACT;
            if (!s.fused) {
                ctx->x.valid = false;  // the product's float32 values change: whatever ours converted is stale
                return norm ? ciq_rms_norm(device, CIQ_ORDER_LLAMACPP_CUDA, c.x, c.weight, nullptr, c.eps, c.tokens, c.k,
                                           c.out)
                            : ciq_glu(device, CIQ_ORDER_LLAMACPP_CUDA, c.glu, c.x, c.up, c.tokens * c.k, c.out);
            }
            size_t bytes = 0;
            CIQ_TRY_PLUGIN(ciq_activations_size(CIQ_LAYOUT_F16, c.tokens, c.k, &bytes));
            CIQ_TRY_PLUGIN(reserve_activations(device, &ctx->x, bytes));
            ctx->x.valid = false;
            CIQ_TRY_PLUGIN(norm ? ciq_rms_norm_activations(device, CIQ_ORDER_HOST, c.x, c.weight, c.eps, c.tokens, c.k,
                                                           CIQ_LAYOUT_F16, ctx->x.buffer)
                                : ciq_glu_activations(device, CIQ_ORDER_HOST, c.glu, c.x, c.up, c.tokens, c.k,
                                                      CIQ_LAYOUT_F16, ctx->x.buffer));
            ctx->x = converted_activations{true, c.product, c.tokens, c.k, CIQ_LAYOUT_F16, ctx->x.buffer,
                                           ctx->x.capacity, true};
            return CIQ_OK;
        }
        case STEP_NORM_ADD:
            return ciq_rms_norm(device, CIQ_ORDER_LLAMACPP_CUDA, c.x, c.weight, c.addend, c.eps, c.tokens, c.k, c.out);
        case STEP_ROPE:
        case STEP_NORM_ROPE:
            return s.kind == STEP_ROPE
                       ? ciq_rope(device, CIQ_ORDER_LLAMACPP_CUDA, c.mode, c.x, c.positions, c.tokens, c.heads,
                                  c.head_dim, c.base, c.out)
                       : ciq_rms_norm_rope(device, CIQ_ORDER_LLAMACPP_CUDA, c.mode, c.x, c.weight, c.eps, c.positions,
                                           c.tokens, c.heads, c.head_dim, c.base, c.out);
        case STEP_BIAS: return ciq_add(device, c.x, c.tokens * c.k, c.addend, c.k, c.out);
        case STEP_SCALE: return ciq_scale(device, c.x, c.scale, c.k, c.out);
        case STEP_SET_ROWS:
            return ciq_rows_set_f16(device, c.x, c.tokens, c.k, c.ids, c.table, c.table_rows, c.row_stride);
        case STEP_ROPE_KV:
            return ciq_rope_rows_set_f16(device, CIQ_ORDER_LLAMACPP_CUDA, c.mode, c.positions, c.tokens, c.head_dim,
                                         c.base, c.q, c.heads_q, c.q_out, c.x, c.heads, c.v, c.v_k, c.ids, c.table,
                                         c.table_rows, c.row_stride, c.v_ids, c.v_table, c.v_table_rows,
                                         c.v_row_stride);
        case STEP_ATTN: {
            const attention_args &a = c.attention;
            return ciq_attention_masked(device, CIQ_ATTENTION_AUTO, a.q, a.k, a.v, a.mask, a.mask_row, a.tokens,
                                        a.heads, a.heads_kv, a.head_dim, a.n_kv, a.scale, a.out);
        }
        case STEP_RUN: break;
    }
    return CIQ_OK;
}

// GGML_CIQ_PLUGIN_ROPE_KV: what graph_optimize keeps allocated, as (kept, until) node indices. For each RoPE of ours
// of the product of a MUL_MAT of ours that feeds no SET_ROWS (q's), and the next RoPE on the same positions that feeds
// its VIEW's SET_ROWS (k's): q's product kept until k's RoPE. ggml-alloc would otherwise give v's or k's product q's
// memory once q's RoPE had read it, and q's RoPE could not wait for the ROPE_KV step (merge_rope_q checks the
// addresses whatever was kept).
std::vector<std::pair<int, int>> rope_kv_alloc_deps(const device_context *dev, gpu_backend *ctx,
                                                    const ggml_cgraph *graph) {
    std::vector<std::pair<int, int>> deps;
    for (int i = 0; i < graph->n_nodes; i++) {
        const ggml_tensor *q = graph->nodes[i];
        if (q->op != GGML_OP_ROPE || !rope_ours(q)) continue;
        const ggml_tensor *product = q->src[0]->view_src != nullptr ? q->src[0]->view_src : q->src[0];
        int kept = -1;
        for (int j = i - 1; j >= 0 && kept < 0; j--)
            if (graph->nodes[j] == product) kept = j;
        if (kept < 0 || !mul_mat_ours_remembered(dev, ctx, product) || feeds_set_rows(graph, i + 1, q)) continue;
        for (int j = i + 1; j < graph->n_nodes; j++) {
            const ggml_tensor *k = graph->nodes[j];
            if (k->op != GGML_OP_ROPE || k->src[1] != q->src[1]) continue;
            if (j + 2 < graph->n_nodes && graph->nodes[j + 1]->view_src == k &&
                graph->nodes[j + 2]->op == GGML_OP_SET_ROWS && graph->nodes[j + 2]->src[0] == graph->nodes[j + 1])
                deps.emplace_back(kept, j);
            break;
        }
    }
    return deps;
}

// CUDAi's own node order and fusion lifetimes, so that what CUDAi runs is what it would run alone (not under
// GGML_CUDA_GRAPH_OPT=1: its concurrent-stream regions span whole graphs, and CIQi hands CUDAi runs of nodes); then
// the allocation dependencies of the ROPE_KV steps (GGML_CIQ_PLUGIN_ROPE_KV with the fused plan).
void gpu_graph_optimize(ggml_backend_t backend, ggml_cgraph *graph, ggml_backend_graph_optimize_params *params) {
    static const bool concurrent_regions = [] {
        const char *env = std::getenv("GGML_CUDA_GRAPH_OPT");
        return env != nullptr && std::atoi(env) == 1;
    }();
    gpu_backend *ctx = gpu_of(backend);
    ggml_backend_t cuda = ctx->cuda;
    if (!concurrent_regions && cuda->iface.graph_optimize != nullptr) cuda->iface.graph_optimize(cuda, graph, params);
    if (!ctx->fuse || !ctx->rope_kv || params == nullptr || params->add_alloc_dep == nullptr) return;
    for (const auto &dep : rope_kv_alloc_deps(device_of(backend), ctx, graph))
        params->add_alloc_dep(params->user_data, graph->nodes[dep.first], graph->nodes[dep.second]);
}

// graph_optimize's allocation dependencies for a graph, for the tests ("ggml_ciq_plugin_alloc_deps", as the plan hook:
// plugin device `index`'s library answers, GGML_CIQ_PLUGIN_ROPE_KV as the environment sets it now): (kept, until)
// node index pairs into pairs (at most max_pairs), their count; -1 for a device index out of range or a switch value
// it does not take.
int alloc_deps_for_tests(ggml_cgraph *graph, int index, int32_t *pairs, int max_pairs) {
    if (index < 0 || index >= g_device_count) return -1;
    device_context probe = g_devices[index];
    probe.cuda = nullptr;
    gpu_backend scratch;
    int rope_kv = 1;
    if (ciq_switch_on("GGML_CIQ_PLUGIN_ROPE_KV", &rope_kv) != CIQ_OK) return -1;
    if (rope_kv == 0) return 0;
    const auto deps = rope_kv_alloc_deps(&probe, &scratch, graph);
    for (size_t i = 0; i < deps.size() && (int)i < max_pairs; i++) {
        pairs[2 * i] = deps[i].first;
        pairs[2 * i + 1] = deps[i].second;
    }
    return (int)deps.size();
}

// The plan CIQi's graph_compute runs for a graph, for the tests (CI has no GPU; reached through the registry's
// get_proc_address as "ggml_ciq_plugin_plan"): plugin device `index`'s plan with the library's answers for it but no
// buffer-type check, GGML_CIQ_FUSE and GGML_CIQ_PLUGIN_FUSE_RULE as the environment sets them now, planned and each
// step's run uid made as if the graph's uid were `uid` (0: API v19's plan), and each step of ours read into its calls'
// arguments (call_of: what graph_compute reads). Per step, rows
// {kind, node, mul (ROPE_KV: q's ROPE), add (NORM_ROPE: its ROPE; GLU_PAIR: its GLU; ROPE_KV: the V cache write),
// fresh_x | fused << 1 | group size << 2, run length}; the runs' node indices one after
// another into run_nodes (room for the graph's node count). Returns the step count (at most max_steps rows are
// written), -1 for a device index out of range or a GGML_CIQ_FUSE it does not take.
int plan_for_tests(ggml_cgraph *graph, int index, uint64_t uid, int32_t *rows, uint64_t *uids, int32_t *run_nodes,
                   int max_steps) {
    if (index < 0 || index >= g_device_count) return -1;
    device_context probe = g_devices[index];
    probe.cuda = nullptr;  // the library's answers for that device, no buffer-type check: any graph's tensors will do
    gpu_backend scratch;
    int fuse = 1, rule = 1, attention = 0, group = 1, rope_kv = 1;
    if (ciq_switch_on("GGML_CIQ_FUSE", &fuse) != CIQ_OK || ciq_switch_on("GGML_CIQ_PLUGIN_FUSE_RULE", &rule) != CIQ_OK ||
        ciq_switch_on("GGML_CIQ_PLUGIN_ATTENTION", &attention) != CIQ_OK ||
        ciq_switch_on("GGML_CIQ_PLUGIN_GROUP", &group) != CIQ_OK ||
        ciq_switch_on("GGML_CIQ_PLUGIN_ROPE_KV", &rope_kv) != CIQ_OK)
        return -1;
    scratch.group = group != 0;
    scratch.rope_kv = rope_kv != 0;
    scratch.fuse = fuse != 0;
    scratch.fuse_rule = rule != 0;
    scratch.attention = attention != 0;
    const graph_plan plan = make_plan(&probe, &scratch, graph, uid);
    int written = 0;
    for (size_t i = 0; i < plan.steps.size() && (int)i < max_steps; i++) {
        const step &st = plan.steps[i];
        if (st.kind != STEP_RUN) call_of(probe.ciq_device, graph, st);  // the arguments graph_compute would pass
        int32_t *row = rows + 6 * i;
        row[0] = st.kind, row[1] = st.node, row[2] = st.kind == STEP_ROPE_KV ? st.rope_q : st.mul;
        row[3] = st.kind == STEP_NORM_ROPE ? st.rope : st.kind == STEP_GLU_PAIR ? st.glu
                 : st.kind == STEP_ROPE_KV ? st.set_v : st.add;
        row[4] = (st.fresh_x ? 1 : 0) | (st.fused ? 2 : 0) | (int)st.group.size() << 2;
        row[5] = (int32_t)st.run.size();
        for (int k : st.run_index)
            if (written < graph->n_nodes) run_nodes[written++] = k;
        uids[i] = run_uid(uid, i);
    }
    return (int)plan.steps.size();
}

// Steps [first, end) of a plan, a stretch of ours: eagerly, or as the CUDA graph captured from them on their second
// run (a cached plan, GGML_CIQ_PLUGIN_GRAPHS on). A graph whose addresses moved (our buffer replaced, or the
// library's scratch: ciq_graph_launch refuses it as stale) is captured again; a capture that fails leaves the stretch
// eager for good. *failed: the step that failed.
ciq_status run_stretch(const device_context *dev, gpu_backend *ctx, ggml_cgraph *graph, graph_plan &plan,
                       size_t first, size_t end, size_t *failed) {
    auto eager = [&]() -> ciq_status {
        ctx->stats.eager++;
        for (size_t i = first; i < end; i++) {
            const int64_t t0 = now_ns();
            const ciq_status status = run_ours(dev, ctx, graph, plan.steps[i]);
            ctx->stats.t.ns_kind[plan.steps[i].kind] += now_ns() - t0;
            ctx->stats.t.n_kind[plan.steps[i].kind]++;
            if (status != CIQ_OK) {
                *failed = i;
                return status;
            }
        }
        return CIQ_OK;
    };
    stretch_graph &g = plan.stretches[plan.steps[first].stretch];
    if (!ctx->graphs || plan.uid == 0 || g.never) return eager();
    const uint64_t generation = g_buffer_generation.load();
    if (g.graph != nullptr && g.generation == generation) {
        if (ciq_graph_launch(g.graph) == CIQ_OK) {
            ctx->x = g.x_after;
            g_step_counts[7]++;
            ctx->stats.replayed++;
            return CIQ_OK;
        }
        ctx->stats.stale++;
        g.runs = 0;  // stale: run it eagerly once more, then capture it again
    }
    if (g.graph != nullptr) {  // stale, or our buffer moved: run eagerly once more (sizes the scratch), then capture
        if (g.generation != generation) ctx->stats.stale++;
        ciq_graph_free(g.graph);
        g.graph = nullptr;
        g.runs = 0;
    }
    if (g.runs++ == 0) return eager();
    const converted_activations before = ctx->x;
    bool captured = ciq_graph_capture_begin(dev->ciq_device) == CIQ_OK;
    if (captured) {
        for (size_t i = first; i < end && captured; i++) captured = run_ours(dev, ctx, graph, plan.steps[i]) == CIQ_OK;
        void *made = nullptr;
        captured = ciq_graph_capture_end(dev->ciq_device, &made) == CIQ_OK && captured;  // ends the capture always
        if (captured) {
            g = stretch_graph{made, generation, g.runs, false, ctx->x};
            captured = g_buffer_generation.load() == generation && ciq_graph_launch(made) == CIQ_OK;
        } else if (made != nullptr) {
            ciq_graph_free(made);
        }
    }
    if (captured) {
        ctx->stats.captured++;
        return CIQ_OK;
    }
    ctx->stats.failed++;
    GGML_LOG_DEBUG("ggml-ciq: %s: a stretch of %zu steps runs without a CUDA graph: %s\n", dev->name.c_str(),
                   end - first, ciq_last_error());
    if (g.graph != nullptr) ciq_graph_free(g.graph);
    g.graph = nullptr;
    g.runs = 0;
    g.never = g_buffer_generation.load() == generation;  // a buffer that moved meanwhile: try again later
    ctx->x = before;  // the capture ran nothing
    return eager();
}

// One micro-batch: CUDAi's runs through CUDAi as graph views of the plan's node lists (its fusions and CUDA graphs,
// keyed by a view's first node and uid; the whole graph as it is when nothing is ours), our steps between them, the
// streams ordered by the two events.
ggml_status gpu_graph_compute(ggml_backend_t backend, ggml_cgraph *graph) {
    const device_context *dev = device_of(backend);
    gpu_backend *ctx = gpu_of(backend);
    const int64_t t_start = now_ns();
    auto &st = ctx->stats;
    if (st.computes == k_warm_graphs) st.t_warm = st.t;  // the stats line's times: the graphs from here on
    if (st.last_end != 0) st.t.ns_outside += t_start - st.last_end;
    timeline_begin(dev, ctx, t_start);
    struct timed {  // graph_compute's host time, however it returns
        decltype(st) &stats;
        int64_t start;
        ~timed() {
            stats.last_end = now_ns();
            stats.t.ns_compute += stats.last_end - start;
        }
    } timer{st, t_start};
    graph_plan &plan = plan_of(dev, ctx, graph);
    st.computes++;
    if (ctx->tl.on) {  // the timers the next traced graph needs: one after each CUDAi run and each stretch of ours
        size_t marks = 1;
        for (size_t i = 0; i < plan.steps.size(); i++)
            marks += plan.steps[i].kind == STEP_RUN || i + 1 == plan.steps.size() || plan.steps[i + 1].kind == STEP_RUN;
        ctx->last_marks = marks;
    }
    if (plan.whole) {
        g_step_counts[STEP_RUN]++;
        const ggml_status status = ggml_backend_graph_compute_async(ctx->cuda, graph);
        st.t.ns_cuda += now_ns() - t_start;
        timeline_mark_run(dev, ctx, "run 0 (whole graph)");
        timeline_end(ctx);
        return status;
    }
    std::string run_label;   // traced: the CUDAi run our stream has not waited for yet
    bool cuda_ahead = true;  // CUDAi's stream may hold work ours has not waited for (the scheduler's input copies)
    bool ciq_ahead = false;  // ours holds steps CUDAi's stream has not waited for
    ctx->x.valid = false;    // a new graph: nothing converted is known to be current

    auto cuda_after_ciq = [&]() -> bool {
        if (!ciq_ahead) return true;
        ciq_ahead = false;
        const int64_t t0 = now_ns();
        if (ciq_stream_record_event(dev->ciq_device, ctx->to_cuda->context) != CIQ_OK) {
            ciq_device_synchronize(dev->ciq_device);  // no event: our steps done before anything that follows
            return false;
        }
        ggml_backend_event_wait(ctx->cuda, ctx->to_cuda);
        st.t.ns_handover += now_ns() - t0;
        return true;
    };
    auto fail = [&](const ggml_tensor *node) {  // node NULL: ordering CUDAi after our steps failed
        if (node != nullptr)
            GGML_LOG_ERROR("ggml-ciq: %s: %s %s: %s\n", dev->name.c_str(), ggml_op_desc(node), node->name,
                           ciq_last_error());
        else
            GGML_LOG_ERROR("ggml-ciq: %s: %s\n", dev->name.c_str(), ciq_last_error());
        cuda_after_ciq();
        return GGML_STATUS_FAILED;
    };

    for (size_t i = 0; i < plan.steps.size(); i++) {
        const step &s = plan.steps[i];
        count_step(s);
        if (s.kind == STEP_RUN) {
            if (!cuda_after_ciq()) return fail(nullptr);
            if (ctx->tl.tracing) run_label = "run " + std::to_string(i) + " (" + std::to_string(s.run.size()) + " nodes)";
            ggml_cgraph view = ggml_graph_view(graph, 0, 0);  // the parent's use counts and hash set
            view.nodes = const_cast<ggml_tensor **>(s.run.data());
            view.n_nodes = (int)s.run.size();
            view.uid = run_uid(graph->uid, i);
            const int64_t t0 = now_ns();
            const ggml_status status = ggml_backend_graph_compute_async(ctx->cuda, &view);
            st.t.ns_cuda += now_ns() - t0;
            if (status != GGML_STATUS_SUCCESS) return status;
            cuda_ahead = true;
            continue;
        }
        if (cuda_ahead) {
            const int64_t t0 = now_ns();
            if (!ours_after_cuda(dev, ctx)) return fail(graph->nodes[s.node]);
            cuda_ahead = false;
            st.t.ns_handover += now_ns() - t0;
            if (!run_label.empty()) timeline_mark(dev, ctx, run_label);  // our stream past CUDAi's run
            run_label.clear();
        }
        ciq_ahead = true;
        size_t end = i + 1, failed = i;
        while (end < plan.steps.size() && plan.steps[end].kind != STEP_RUN) count_step(plan.steps[end++]);
        const int64_t t0 = now_ns();
        const ciq_status ours = run_stretch(dev, ctx, graph, plan, i, end, &failed);
        st.t.ns_ours += now_ns() - t0;
        if (ours != CIQ_OK) return fail(graph->nodes[plan.steps[failed].node]);
        if (ctx->tl.tracing)
            timeline_mark(dev, ctx, "ours " + std::to_string(i) + " (" + std::to_string(end - i) + " steps)");
        i = end - 1;
    }
    if (!cuda_after_ciq()) return fail(nullptr);
    if (!run_label.empty()) timeline_mark_run(dev, ctx, run_label);
    timeline_end(ctx);
    return GGML_STATUS_SUCCESS;
}

const ggml_backend_i gpu_backend_interface = {
    /* .get_name            = */ backend_get_name,
    /* .free                = */ gpu_backend_free,
    /* .set_tensor_async    = */ gpu_set_tensor_async,
    /* .get_tensor_async    = */ gpu_get_tensor_async,
    /* .set_tensor_2d_async = */ gpu_set_tensor_2d_async,
    /* .get_tensor_2d_async = */ gpu_get_tensor_2d_async,
    /* .cpy_tensor_async    = */ gpu_cpy_tensor_async,
    /* .synchronize         = */ gpu_synchronize,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ gpu_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ gpu_graph_optimize,
};

ggml_backend_t cuda_of(ggml_backend_t backend) {
    return backend != nullptr && backend->iface.graph_compute == gpu_graph_compute ? gpu_of(backend)->cuda : backend;
}

// -- device --

const char *device_get_name(ggml_backend_dev_t dev) { return ((device_context *)dev->context)->name.c_str(); }

const char *device_get_description(ggml_backend_dev_t dev) {
    return ((device_context *)dev->context)->description.c_str();
}

// CIQi's tensors live in CUDAi's memory, which it reports (llama.cpp's --fit and default split read it); the host
// device owns none (0/0: llama.cpp then reads host memory, as for ggml-blas).
void device_get_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
    const device_context *ctx = (const device_context *)dev->context;
    *free = 0;
    *total = 0;
    if (ctx->cuda != nullptr) ggml_backend_dev_memory(ctx->cuda, free, total);
}

enum ggml_backend_dev_type device_get_type(ggml_backend_dev_t dev) {
    return ((device_context *)dev->context)->ciq_device == CIQ_DEVICE_CPU ? GGML_BACKEND_DEVICE_TYPE_ACCEL
                                                                          : GGML_BACKEND_DEVICE_TYPE_GPU;
}

void device_get_props(ggml_backend_dev_t dev, ggml_backend_dev_props *props) {
    const device_context *ctx = (const device_context *)dev->context;
    const bool gpu = ctx->cuda != nullptr;
    ggml_backend_dev_props cuda{};
    if (gpu) ggml_backend_dev_get_props(ctx->cuda, &cuda);
    props->name = device_get_name(dev);
    props->description = device_get_description(dev);
    props->type = device_get_type(dev);
    // CUDAi's PCI id: llama.cpp's default device list (no -dev) keeps one device per id, CUDAi (registered first), so
    // a plain run never splits a model over CUDAi and CIQi (one GPU counted twice); -dev CIQi names it explicitly.
    props->device_id = gpu ? cuda.device_id : nullptr;
    device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {
        /* .async                = */ gpu && cuda.caps.async,        // CUDAi's async copies, delegated
        /* .host_buffer          = */ gpu && cuda.caps.host_buffer,  // CUDAi's pinned host buffers
        /* .buffer_from_host_ptr = */ !gpu,
        /* .events               = */ false,  // keeps llama.cpp's pipeline parallelism (events on all devices) off
        // Weights load as CUDAi's (its buffer type) or as the CPU's, from an mmap'd file as theirs do; false here
        // would turn mmap off for the whole model (llama-model.cpp asks every device of the model).
        /* .mmap_support         = */ true,
    };
}

ggml_backend_t device_init_backend(ggml_backend_dev_t dev, const char *params) {
    const device_context *ctx = (const device_context *)dev->context;
    if (ctx->cuda == nullptr) return new ggml_backend{backend_guid(), cpu_backend_interface, dev, nullptr};
    gpu_backend *gpu = new gpu_backend;
    int fuse = 1;
    ciq_switch_on("GGML_CIQ_FUSE", &fuse);  // both checked when the plugin started (switches_valid)
    gpu->fuse = fuse != 0;
    int graphs = 0, rule = 1;
    ciq_switch_on("GGML_CIQ_PLUGIN_GRAPHS", &graphs);
    ciq_switch_on("GGML_CIQ_PLUGIN_FUSE_RULE", &rule);
    int stats = 0, attention = 0;
    ciq_switch_on("GGML_CIQ_PLUGIN_STATS", &stats);
    ciq_switch_on("GGML_CIQ_PLUGIN_ATTENTION", &attention);
    int group = 1, timeline = 0;
    ciq_switch_on("GGML_CIQ_PLUGIN_GROUP", &group);
    ciq_switch_on("GGML_CIQ_PLUGIN_TIMELINE", &timeline);
    int rope_kv = 1;
    ciq_switch_on("GGML_CIQ_PLUGIN_ROPE_KV", &rope_kv);
    gpu->rope_kv = rope_kv != 0;
    gpu->tl.on = timeline != 0;
    gpu->group = group != 0;
    gpu->print_stats = stats != 0;
    gpu->attention = attention != 0;
    gpu->graphs = graphs != 0;
    gpu->fuse_rule = rule != 0;
    gpu->cuda = ggml_backend_dev_init(ctx->cuda, params);
    if (gpu->cuda != nullptr) {
        gpu->to_ciq = ggml_backend_event_new(ctx->cuda);
        gpu->to_cuda = ggml_backend_event_new(ctx->cuda);
    }
    ggml_backend_t backend = new ggml_backend{backend_guid(), gpu_backend_interface, dev, gpu};
    if (gpu->cuda == nullptr || gpu->to_ciq == nullptr || gpu->to_cuda == nullptr) {
        GGML_LOG_ERROR("ggml-ciq: %s: cannot start %s's backend and events\n", ctx->name.c_str(),
                       ggml_backend_dev_name(ctx->cuda));
        gpu_backend_free(backend);
        return nullptr;
    }
    return backend;
}

ggml_backend_buffer_type_t device_get_buffer_type(ggml_backend_dev_t dev) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda ? ggml_backend_dev_buffer_type(ctx->cuda) : ggml_backend_cpu_buffer_type();
}

ggml_backend_buffer_type_t device_get_host_buffer_type(ggml_backend_dev_t dev) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda ? ggml_backend_dev_host_buffer_type(ctx->cuda) : nullptr;
}

ggml_backend_buffer_t device_buffer_from_host_ptr(ggml_backend_dev_t, void *ptr, size_t size, size_t) {
    return ggml_backend_cpu_buffer_from_ptr(ptr, size);
}

// Host device, input and view nodes: test-backend-ops asks about every tensor of a case before it allocates any, and
// counts 0/0 without them (as ggml-blas). In a llama.cpp graph the scheduler would hand an allocated view (of a
// compute buffer) to the first device that accepts its buffer, so they are claimed only while unallocated or over a
// weights buffer, and CIQ_CPU holds nothing but what it computes.
bool view_taken(const ggml_tensor *op) {
    const ggml_tensor *base = op->view_src != nullptr ? op->view_src : op;
    return base->buffer == nullptr || ggml_backend_buffer_get_usage(base->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
}

// GPU: what CUDAi takes, and the MUL_MATs the library takes. Host: MUL_MATs the library takes, and views.
bool device_supports_op(ggml_backend_dev_t dev, const ggml_tensor *op) {
    const device_context *ctx = (const device_context *)dev->context;
    if (ctx->cuda != nullptr) return mul_mat_ours(ctx, op) || ggml_backend_dev_supports_op(ctx->cuda, op);
    return is_view_op(op->op) ? view_taken(op) : mul_mat_ours(ctx, op);
}

// GPU: CUDAi's buffer types. Host: host buffers in ggml's standard layout (plain and mmap'd CPU buffers; not the CPU
// backend's repacked "extra" buffers, whose is_host is false).
bool device_supports_buft(ggml_backend_dev_t dev, ggml_backend_buffer_type_t buft) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda ? ggml_backend_dev_supports_buft(ctx->cuda, buft) : ggml_backend_buft_is_host(buft);
}

// GPU: CUDAi's rule for ops on weights in host memory (large batches copy them over). Host: never.
bool device_offload_op(ggml_backend_dev_t dev, const ggml_tensor *op) {
    const device_context *ctx = (const device_context *)dev->context;
    return ctx->cuda != nullptr && ggml_backend_dev_offload_op(ctx->cuda, op);
}

const ggml_backend_device_i device_interface = {
    /* .get_name             = */ device_get_name,
    /* .get_description      = */ device_get_description,
    /* .get_memory           = */ device_get_memory,
    /* .get_type             = */ device_get_type,
    /* .get_props            = */ device_get_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_get_buffer_type,
    /* .get_host_buffer_type = */ device_get_host_buffer_type,
    /* .buffer_from_host_ptr = */ device_buffer_from_host_ptr,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ device_offload_op,
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
    if (std::strcmp(name, "ggml_ciq_plugin_plan") == 0) return (void *)plan_for_tests;
    if (std::strcmp(name, "ggml_ciq_plugin_steps") == 0) return (void *)steps_for_tests;
    if (std::strcmp(name, "ggml_ciq_plugin_alloc_deps") == 0) return (void *)alloc_deps_for_tests;
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

// The on/off switches a CIQi backend reads when it starts (device_init_backend).
constexpr const char *k_plugin_switches[] = {"GGML_CIQ_FUSE", "GGML_CIQ_PLUGIN_GRAPHS", "GGML_CIQ_PLUGIN_FUSE_RULE",
                                             "GGML_CIQ_PLUGIN_STATS", "GGML_CIQ_PLUGIN_ATTENTION", "GGML_CIQ_PLUGIN_GROUP",
                                             "GGML_CIQ_PLUGIN_TIMELINE", "GGML_CIQ_PLUGIN_ROPE_KV"};

// The library's runtime switches the plugin's planning reads (GGML_CIQ_OFFLOAD, GGML_CIQ_VARIANT...) are valid: a
// value they do not take is one log line and no plugin, never a silent "decline every op".
bool switches_valid() {
    ciq_plan plan;
    int fuse = 1;
    if (ciq_gemm_plan(CIQ_DEVICE_CPU, CIQ_VARIANT_AUTO, CIQ_SEMANTICS_ANY, CIQ_TYPE_Q4_K, 1, 256, 1, &plan) !=
            CIQ_ERR_INVALID_ARGUMENT &&
        std::all_of(std::begin(k_plugin_switches), std::end(k_plugin_switches),
                    [&](const char *name) { return ciq_switch_on(name, &fuse) == CIQ_OK; }))
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
