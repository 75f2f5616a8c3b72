#!/usr/bin/env python3
"""The ggml plugin's plan over llama.cpp's own graph, on a machine without a GPU (issue 37).

llama.cpp CPU prefills TOKENS tokens of MODEL in one micro-batch; the eval callback records the graph's nodes, whose
tensors stay allocated (ggml-alloc's in-place and free-block reuse, as on a GPU up to alignment); a ggml_cgraph is
rebuilt in their order and handed to the plugin's plan hook ("ggml_ciq_plugin_plan", CIQ_CPU's library answers with
GGML_CIQ_OFFLOAD=all), for API v19's plan, the fused plan without and with the attention steps
(GGML_CIQ_PLUGIN_ATTENTION) or the ROPE_KV steps (GGML_CIQ_PLUGIN_ROPE_KV) and the default (the rule): how many CUDAi runs and steps of ours each makes. Needs a CPU-only llama.cpp (llama-cpp-python's) and the plugin built against it.

    python3 tools/plugin_plan.py smollm2-135m --tokens 512 [--show 30]
"""
import argparse
import collections
import os
import sys

KINDS = ("RUN", "MUL_MAT", "NORM_ACT", "GLU_ACT", "NORM_ADD", "ROPE", "NORM_ROPE", "BIAS", "SCALE", "SET_ROWS",
         "ATTN", "GLU_PAIR", "ROPE_KV")  # ggml-ciq-backend.cpp step_kind

CDEF = """
struct ggml_context; struct ggml_tensor; struct ggml_cgraph; struct ggml_backend_device; struct ggml_backend_reg;
struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
struct ggml_context * ggml_init(struct ggml_init_params params);
void ggml_free(struct ggml_context * ctx);
struct ggml_cgraph * ggml_new_graph_custom(struct ggml_context * ctx, size_t size, bool grads);
void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);
int ggml_graph_n_nodes(struct ggml_cgraph * cgraph);
struct ggml_tensor * ggml_graph_node(struct ggml_cgraph * cgraph, int i);
const char * ggml_op_desc(const struct ggml_tensor * t);
struct ggml_backend_device * ggml_backend_dev_by_name(const char * name);
struct ggml_backend_reg * ggml_backend_dev_backend_reg(struct ggml_backend_device * device);
void * ggml_backend_reg_get_proc_address(struct ggml_backend_reg * reg, const char * name);
"""


# label: GGML_CIQ_FUSE, GGML_CIQ_PLUGIN_FUSE_RULE, GGML_CIQ_PLUGIN_ATTENTION, GGML_CIQ_PLUGIN_ROPE_KV (None: unset, the
# default)
PLANS = (("API v19's plan", "0", "1", "0", "0"), ("fused plan", "1", "0", "0", "0"),
         ("fused plan with attention", "1", "0", "1", "0"), ("fused plan with ROPE_KV", "1", "0", "0", "1"),
         ("default", "1", "1", None, None))
SWITCHES = ("GGML_CIQ_OFFLOAD", "GGML_CIQ_FUSE", "GGML_CIQ_PLUGIN_FUSE_RULE", "GGML_CIQ_PLUGIN_ATTENTION",
            "GGML_CIQ_PLUGIN_ROPE_KV")


def plans(model_path, tokens: int, plugin_path) -> tuple:
    """(node count, {label: [(kind name, node, mul, add, flags, run length), ...]}, op of each node index, the
    allocation dependencies the plugin's graph_optimize would add as (kept, until) node pairs) of the plugin's plans over
    llama.cpp CPU's allocated graph of a `tokens`-token prefill of model_path (allocated without those dependencies:
    llama.cpp CPU's scheduler never calls the plugin's graph_optimize). Sets SWITCHES while it plans and restores
    them."""
    import cffi

    from ggml_ciq import llama_model as lm
    from ggml_ciq import plugin
    from ggml_ciq.errors import CiqError
    from ggml_ciq.llamacpp import LlamaCpp, _lib_file

    saved = {k: os.environ.get(k) for k in SWITCHES}
    os.environ.pop("GGML_CIQ_OFFLOAD", None)  # llama.cpp alone allocates the graph; the plan asks with "all" after
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    lib = ffi.dlopen(str(_lib_file(LlamaCpp.load().lib_dir, "ggml")))
    nodes = []
    original = lm.LlamaContext._on_eval

    def on_eval(self, t, ask, user):  # every node the scheduler computes, in order; no data asked for
        if ask:
            nodes.append(int(lm.ffi.cast("uintptr_t", t)))
        return False

    lm.LlamaContext._on_eval = on_eval
    try:
        with plugin.Plugin(plugin_path):
            dev = lib.ggml_backend_dev_by_name(b"CIQ_CPU")
            if dev == ffi.NULL:
                raise CiqError("the plugin offers no CIQ_CPU here (a CPU-only llama.cpp is needed)")
            address = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev),
                                                            b"ggml_ciq_plugin_plan")
            hook = ffi.cast("int (*)(struct ggml_cgraph *, int, uint64_t, int32_t *, uint64_t *, int32_t *, int)",
                            address)
            deps_hook = ffi.cast("int (*)(struct ggml_cgraph *, int, int32_t *, int)", lib.ggml_backend_reg_get_proc_address(
                lib.ggml_backend_dev_backend_reg(dev), b"ggml_ciq_plugin_alloc_deps"))
            with lm.LlamaModel(model_path) as model, \
                    model.context(max(256, -(-tokens // 256) * 256), n_batch=tokens, flash_attn=True,
                                  eval_callback=True) as ctx:
                ctx.prefill(list(range(100, 100 + tokens)), all_logits=False)
                gctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [64 << 20, ffi.NULL, True])[0])
                try:
                    graph = lib.ggml_new_graph_custom(gctx, 4 * len(nodes) + 64, False)
                    for address_ in dict.fromkeys(nodes):
                        lib.ggml_build_forward_expand(graph, ffi.cast("struct ggml_tensor *", address_))
                    n = lib.ggml_graph_n_nodes(graph)
                    ops = [ffi.string(lib.ggml_op_desc(lib.ggml_graph_node(graph, i))).decode() for i in range(n)]
                    os.environ["GGML_CIQ_OFFLOAD"] = "all"
                    os.environ.pop("GGML_CIQ_PLUGIN_ROPE_KV", None)  # graph_optimize's dependencies, by default
                    pairs = ffi.new("int32_t[]", 2 * n)
                    deps = [tuple(pairs[2 * i:2 * i + 2]) for i in range(deps_hook(graph, 0, pairs, n))]
                    got = {}
                    for label, fuse, rule, attention, rope_kv in PLANS:
                        os.environ["GGML_CIQ_FUSE"], os.environ["GGML_CIQ_PLUGIN_FUSE_RULE"] = fuse, rule
                        for name, value in (("GGML_CIQ_PLUGIN_ATTENTION", attention),
                                            ("GGML_CIQ_PLUGIN_ROPE_KV", rope_kv)):
                            if value is None:
                                os.environ.pop(name, None)
                            else:
                                os.environ[name] = value
                        rows = ffi.new("int32_t[]", 6 * n)
                        steps = hook(graph, 0, 1, rows, ffi.new("uint64_t[]", n), ffi.new("int32_t[]", n), n)
                        got[label] = [(KINDS[rows[6 * i]], *rows[6 * i + 1:6 * i + 6]) for i in range(steps)]
                    return n, got, ops, deps
                finally:
                    lib.ggml_free(gctx)
    finally:
        lm.LlamaContext._on_eval = original
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a catalog name or a GGUF path")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--show", type=int, default=0, help="print the default plan's first N steps")
    args = p.parse_args(argv)
    from ggml_ciq import catalog, plugin
    from ggml_ciq.errors import CiqError

    try:
        path = plugin.find_plugin()
        if path is None:
            raise CiqError("no ggml plugin built (pip install . builds it next to the library)")
        model_path = catalog.resolve_model(args.model)
        n, got, ops, deps = plans(model_path, args.tokens, path)
    except CiqError as exc:
        print(f"plugin_plan: {exc}", file=sys.stderr)
        return 2
    print(f"{model_path.name}: graph_optimize would keep {len(deps)} products allocated longer (q's until k's RoPE"
          + (f", e.g. node {deps[0][0]} {ops[deps[0][0]]} until node {deps[0][1]} {ops[deps[0][1]]})" if deps else ")"))
    for label, steps in got.items():
        kinds = collections.Counter(row[0] for row in steps)
        print(f"{model_path.name}, {args.tokens} tokens, {n} nodes: {label}: {len(steps)} steps, "
              + ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k]))
        if label == "default":
            for row in steps[:args.show]:
                print("   ", row, ops[row[1]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
