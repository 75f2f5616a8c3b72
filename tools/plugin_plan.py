#!/usr/bin/env python3
"""The ggml plugin's plan over llama.cpp's own graph, on a machine without a GPU (issue 37).

llama.cpp CPU prefills TOKENS tokens of MODEL in one micro-batch; the eval callback records the graph's nodes, whose
tensors stay allocated (ggml-alloc's in-place and free-block reuse, as on a GPU up to alignment); a ggml_cgraph is
rebuilt in their order and handed to the plugin's plan hook ("ggml_ciq_plugin_plan", CIQ_CPU's library answers with
GGML_CIQ_OFFLOAD=all), for API v19's plan, the fused plan and the default (the rule): how many CUDAi runs and steps of
ours each makes. Needs a CPU-only llama.cpp (llama-cpp-python's) and the plugin built against it.

    python3 tools/plugin_plan.py smollm2-135m --tokens 512 [--show 30]
"""
import argparse
import collections
import os
import sys

KINDS = ("RUN", "MUL_MAT", "NORM_ACT", "GLU_ACT", "NORM_ADD")  # ggml-ciq-backend.cpp step_kind

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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a catalog name or a GGUF path")
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--show", type=int, default=0, help="print the fused plan's first N steps")
    args = p.parse_args(argv)
    os.environ.pop("GGML_CIQ_OFFLOAD", None)  # llama.cpp alone allocates the graph; the plan asks with "all" after
    import cffi

    from ggml_ciq import catalog, plugin
    from ggml_ciq import llama_model as lm
    from ggml_ciq.errors import CiqError
    from ggml_ciq.llamacpp import LlamaCpp, _lib_file

    try:
        llama = LlamaCpp.load()
        path = plugin.find_plugin()
        if path is None:
            raise CiqError("no ggml plugin built (pip install . builds it next to the library)")
        model_path = catalog.resolve_model(args.model)
    except CiqError as exc:
        print(f"plugin_plan: {exc}", file=sys.stderr)
        return 2
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    lib = ffi.dlopen(str(_lib_file(llama.lib_dir, "ggml")))
    nodes = []

    def on_eval(self, t, ask, user):  # every node the scheduler computes, in order; no data asked for
        if ask:
            nodes.append(int(lm.ffi.cast("uintptr_t", t)))
        return False

    lm.LlamaContext._on_eval = on_eval
    with plugin.Plugin(path):
        dev = lib.ggml_backend_dev_by_name(b"CIQ_CPU")
        if dev == ffi.NULL:
            print("plugin_plan: the plugin offers no CIQ_CPU here (a CPU-only llama.cpp is needed)", file=sys.stderr)
            return 2
        address = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev), b"ggml_ciq_plugin_plan")
        hook = ffi.cast("int (*)(struct ggml_cgraph *, int, uint64_t, int32_t *, uint64_t *, int32_t *, int)", address)
        with lm.LlamaModel(model_path) as model, \
                model.context(max(256, -(-args.tokens // 256) * 256), n_batch=args.tokens, flash_attn=True,
                              eval_callback=True) as ctx:
            ctx.prefill(list(range(100, 100 + args.tokens)), all_logits=False)
            gctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [64 << 20, ffi.NULL, True])[0])
            try:
                graph = lib.ggml_new_graph_custom(gctx, 4 * len(nodes) + 64, False)
                for address_ in dict.fromkeys(nodes):
                    lib.ggml_build_forward_expand(graph, ffi.cast("struct ggml_tensor *", address_))
                n = lib.ggml_graph_n_nodes(graph)
                os.environ["GGML_CIQ_OFFLOAD"] = "all"
                for label, fuse, rule in (("API v19's plan", "0", "1"), ("fused plan", "1", "0"), ("default", "1", "1")):
                    os.environ["GGML_CIQ_FUSE"], os.environ["GGML_CIQ_PLUGIN_FUSE_RULE"] = fuse, rule
                    rows, uids, runs = ffi.new("int32_t[]", 6 * n), ffi.new("uint64_t[]", n), ffi.new("int32_t[]", n)
                    steps = hook(graph, 0, 1, rows, uids, runs, n)
                    got = [tuple(rows[6 * i:6 * i + 6]) for i in range(steps)]
                    kinds = collections.Counter(KINDS[r[0]] for r in got)
                    print(f"{model_path.name}, {args.tokens} tokens, {n} nodes: {label}: {steps} steps, "
                          + ", ".join(f"{kinds[k]} {k}" for k in KINDS if kinds[k]))
                    if label == "fused plan":
                        for r in got[:args.show]:
                            print("   ", KINDS[r[0]], r[1:], ffi.string(lib.ggml_op_desc(lib.ggml_graph_node(graph, r[1]))).decode())
            finally:
                lib.ggml_free(gctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
