"""C API misuse: every status-returning ciq_* function of the header, called with one argument made wrong at a time
(NULL pointers, negative sizes and offsets, unknown enum values, devices out of range), returns a status and a
one-line message, and never crashes. The functions and their parameter names come from the header's CDEF region, so
a new function is covered without editing this file; a parameter name without a valid default fails the test
(add it to VALID). CI also runs this file against an AddressSanitizer + UBSan build of the CPU library
(.ci/run, GGML_CIQ_LIB), where an out-of-bounds access or undefined behaviour aborts the run.
"""

import re

import pytest

from ggml_ciq import native
from ggml_ciq.errors import LibraryNotFoundError

SCRATCH_BYTES = 1 << 20  # every pointer argument gets its own zeroed MiB: the valid calls below stay far inside it

# A valid value per parameter name (small CPU problems: one token, one 256-value super-block, one head...).
VALID = {
    "device": -1, "tokens": 1, "k": 256, "rows": 1, "n": 1, "d": 1, "heads": 1, "heads_kv": 1, "head_dim": 2,
    "cache_rows": 4, "table_rows": 1, "b_n": 1, "n_past": 0, "window": 0, "start": 0, "row_values": 1,
    "ggml_type": 12, "type": 12, "layout_for": 12, "semantics": 0, "variant": 1, "kernel": 1, "mode": 0, "kind": 0,
    "out_type": 0, "layout": 0, "form": 0, "base": 10000.0, "eps": 1e-6, "scale": 1.0, "s": 1.0, "value": 0, "threads": 1,
    "buffer_size": 64, "nbytes": 64, "weight_nbytes": 144, "order": 0, "n_outputs": 1, "n_weights": 1,
    "mask_row": 1, "n_kv": 1, "row_stride": 256, "v_k": 1, "k_table_rows": 1, "v_table_rows": 1,
    "k_row_stride": 256, "v_row_stride": 256,
}
# Per-function valid values where the shared ones do not fit.
VALID_FOR = {"ciq_activations_size": {"layout": 0},
             "ciq_gemm_quantized_glu": {"rows": 128, "weight_nbytes": 128 * 144}}  # one interleaved gate/up block
# Pointer parameters that are handles the library made: a valid call needs a real one.
HANDLES = {("ciq_memory_free", "ptr"): "malloc", ("ciq_timer_mark", "timer"): "timer", ("ciq_timer_stop", "timer"): "timer",
           ("ciq_gemm_quantized", "plan"): "plan", ("ciq_gemm_quantized_outputs", "plan"): "plan",
           ("ciq_gemm_quantized_outputs", "outputs"): "outputs", ("ciq_gemm_quantized_glu", "plan"): "plan",
           ("ciq_gemm_quantized_glu_pair", "plan"): "plan",
           ("ciq_gemm_quantized_group", "weights"): "weights", ("ciq_switch_on", "name"): "switch"}
# Pointer parameters that may legitimately be NULL.
MAY_BE_NULL = {("ciq_rms_norm", "weight"), ("ciq_rms_norm", "add"), ("ciq_rms_norm_activations", "weight"),
               ("ciq_rope_kv_store", "v"), ("ciq_rope_rows_set_f16", "q"), ("ciq_rope_rows_set_f16", "v"),
               ("ciq_rope_rows_set_f16", "v_ids"),
               ("ciq_memory_free", "ptr"), ("ciq_graph_free", "graph")}
# Functions whose valid call needs what the CPU does not have (a GPU) or that take no misusable argument.
NOT_ON_CPU = {"ciq_gemm_dense_bf16", "ciq_graph_capture_begin", "ciq_graph_capture_end", "ciq_graph_launch",
              "ciq_graph_free", "ciq_stream_wait_event", "ciq_stream_record_event"}
# Parameters any value of which is valid (a thread count <= 0 means all cores; a memset byte).
ANY_VALUE = {("ciq_threads_set", "threads"), ("ciq_memory_fill", "value")}
# Parameters that are not a size or a count: a negative value is an offset the callee cannot check.
NOT_A_COUNT = {"base", "eps", "scale", "s"}


def _declarations():
    n = native.load()
    source = native._cdef_source(native._header_path())
    source = re.sub(r"/\*.*?\*/", " ", source, flags=re.S)
    found = {}
    for name, params in re.findall(r"\b(ciq_\w+)\s*\(([^()]*)\)\s*;", source):
        ctype = n.ffi.typeof(getattr(n.lib, name))
        if ctype.result.cname != "ciq_status":
            continue
        names = [] if params.strip() in ("", "void") else [p.strip().split()[-1].lstrip("*") for p in params.split(",")]
        found[name] = list(zip(names, ctype.args))
    return found


try:
    DECLARATIONS = _declarations()
except LibraryNotFoundError:  # the native_lib fixture then skips, or fails where CI requires the library
    DECLARATIONS = {"ciq_api_version": []}


_KEEP = []  # buffers a handle points into


def _handle(n, kind):
    if kind == "plan":  # the valid plan for VALID's problem: the host K-quant kernel, cpu semantics, Q4_K
        plan = n.ffi.new("ciq_plan *")
        assert n.lib.ciq_gemm_plan(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_VARIANT_CPU, n.lib.CIQ_SEMANTICS_CPU,
                                   n.lib.CIQ_TYPE_Q4_K, 1, 256, 1, plan) == n.lib.CIQ_OK
        return plan
    if kind == "outputs":  # one output of VALID's one row, no addend: a 64-byte buffer kept with the array
        outputs = n.ffi.new("ciq_gemm_output[1]")
        buf = n.ffi.new("char[]", 64)
        outputs[0].rows, outputs[0].out = 1, buf
        _KEEP.append(buf)
        return outputs
    if kind == "weights":  # one weight of VALID's problem (one Q4_K row of K 256), its plan and one output
        weights = n.ffi.new("ciq_gemm_weight[1]")
        blocks = n.ffi.new("char[]", 144)
        w, plan, outputs = weights[0], _handle(n, "plan"), _handle(n, "outputs")
        w.plan, w.type, w.weight, w.weight_nbytes, w.rows = plan, n.lib.CIQ_TYPE_Q4_K, blocks, 144, 1
        w.outputs, w.n_outputs = outputs, 1
        _KEEP.extend([blocks, plan, outputs])  # the owners: the struct's pointers do not keep them alive
        return weights
    if kind == "switch":  # an on/off switch's name
        name = n.ffi.new("char[]", b"GGML_CIQ_FUSE")
        _KEEP.append(name)
        return name
    out = n.ffi.new("void **")
    status = n.lib.ciq_memory_alloc(-1, 64, out) if kind == "malloc" else n.lib.ciq_timer_start(-1, out)
    assert status == n.lib.CIQ_OK
    return out[0]


def _valid_args(n, name, params, keep):
    args = []
    for pname, ctype in params:
        if (name, pname) in HANDLES:
            args.append(_handle(n, HANDLES[(name, pname)]))
        elif ctype.kind == "pointer":
            buf = n.ffi.new("char[]", SCRATCH_BYTES)
            keep.append(buf)
            args.append(n.ffi.cast(ctype, buf))
        else:
            valid = {**VALID, **VALID_FOR.get(name, {})}
            if pname not in valid:
                pytest.fail(f"{name}: no valid default for parameter {pname!r}: add it to VALID")
            args.append(valid[pname])
    return args


def _call(n, name, args):
    status = getattr(n.lib, name)(*args)
    message = n.ffi.string(n.lib.ciq_last_error()).decode(errors="replace")
    return status, message


def _mutations(name, params):
    """(description, index, value) for each argument made wrong in turn."""
    for i, (pname, ctype) in enumerate(params):
        if (name, pname) in ANY_VALUE:
            continue
        if ctype.kind == "pointer":
            if (name, pname) not in MAY_BE_NULL:
                yield f"{pname}=NULL", i, None
        elif ctype.kind == "enum":
            yield f"{pname}=999", i, 999
        elif pname == "device":
            yield "device=99", i, 99
            yield "device=-2", i, -2
        elif ctype.cname == "int64_t" and pname not in NOT_A_COUNT:
            yield f"{pname}=-1", i, -1
            if pname not in ("n_past", "window", "start"):
                yield f"{pname}=0", i, 0
        elif ctype.cname == "int" and pname in ("ggml_type", "type"):
            yield f"{pname}=999", i, 999


@pytest.mark.parametrize("name", sorted(DECLARATIONS))
def test_every_function_rejects_each_wrong_argument(native_lib, name):
    n = native_lib
    params = DECLARATIONS[name]
    keep = []
    base = _valid_args(n, name, params, keep)
    status, message = _call(n, name, base)
    if name not in NOT_ON_CPU:
        assert status == n.lib.CIQ_OK, f"{name} with valid arguments: status {status}: {message}"
    checked = 0
    for description, index, value in _mutations(name, params):
        # a handle is used up by a call that succeeds: each call gets fresh ones
        args = [_handle(n, HANDLES[(name, p)]) if (name, p) in HANDLES else a for (p, _), a in zip(params, base)]
        args[index] = n.ffi.NULL if value is None else value
        n.lib.ciq_dispatch_reset()
        status, message = _call(n, name, args)
        assert status != n.lib.CIQ_OK, f"{name}({description}) was accepted"
        assert message and "\n" not in message and len(message) < 400, f"{name}({description}): message {message!r}"
        checked += 1
    if name in ("ciq_device_synchronize", "ciq_device_count", "ciq_dispatch_reset", "ciq_threads_set", "ciq_graph_free"):
        return
    assert checked or not params, f"{name}: no argument was mutated"


def test_error_message_names_the_problem(native_lib):
    """A wrong argument's message says which function and what: not a bare code."""
    n = native_lib
    weight = n.ffi.new("char[]", 144)
    x = n.ffi.new("float[]", 300)
    out = n.ffi.new("float[]", 4)
    status = n.lib.ciq_gemm(-1, 1, 0, 12, weight, 144, 1, 300, x, 1, out, 0)
    message = n.ffi.string(n.lib.ciq_last_error()).decode()
    assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT
    assert "ciq_gemm" in message and "256" in message and "300" in message, message


def _status_and_message(n, status):
    return status, n.ffi.string(n.lib.ciq_last_error()).decode()


def test_freed_handles_are_errors(native_lib):
    """A host block freed twice, a pointer ciq_memory_alloc never gave out, a timer stopped twice: each an error with a
    message (the library tracks its host handles), never a double free."""
    n = native_lib
    block = n.ffi.new("void **")
    assert n.lib.ciq_memory_alloc(n.lib.CIQ_DEVICE_CPU, 64, block) == n.lib.CIQ_OK
    assert n.lib.ciq_memory_free(n.lib.CIQ_DEVICE_CPU, block[0]) == n.lib.CIQ_OK
    status, message = _status_and_message(n, n.lib.ciq_memory_free(n.lib.CIQ_DEVICE_CPU, block[0]))
    assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and "ciq_memory_free" in message and "already freed" in message
    foreign = n.ffi.new("char[]", 64)
    assert n.lib.ciq_memory_free(n.lib.CIQ_DEVICE_CPU, foreign) == n.lib.CIQ_ERR_INVALID_ARGUMENT
    timer = n.ffi.new("void **")
    ms = n.ffi.new("float *")
    assert n.lib.ciq_timer_start(n.lib.CIQ_DEVICE_CPU, timer) == n.lib.CIQ_OK
    assert n.lib.ciq_timer_stop(timer[0], ms) == n.lib.CIQ_OK
    for call in (lambda: n.lib.ciq_timer_stop(timer[0], ms), lambda: n.lib.ciq_timer_mark(timer[0])):
        status, message = _status_and_message(n, call())
        assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and "not a running timer" in message, message


@pytest.mark.parametrize("field,value", [("variant", 999), ("variant", 0), ("semantics", 999), ("semantics", 4),
                                         ("semantics", 2), ("variant", 7)])
def test_forged_plan_is_refused(native_lib, field, value):
    """A plan not made by ciq_gemm_plan for this problem (an unknown or AUTO variant, a semantics the variant does not
    implement here, a GPU-only variant on the host) is refused before any kernel reads the activations."""
    n = native_lib
    plan = n.ffi.new("ciq_plan *")
    assert n.lib.ciq_gemm_plan(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_VARIANT_CPU, n.lib.CIQ_SEMANTICS_CPU,
                               n.lib.CIQ_TYPE_Q4_K, 1, 256, 1, plan) == n.lib.CIQ_OK
    setattr(plan, field, value)
    weight, xq, out = n.ffi.new("char[]", 144), n.ffi.new("char[]", 4096), n.ffi.new("float[]", 4)
    status, message = _status_and_message(
        n, n.lib.ciq_gemm_quantized(n.lib.CIQ_DEVICE_CPU, plan, n.lib.CIQ_TYPE_Q4_K, weight, 144, 1, 256, xq, 1, out,
                                    n.lib.CIQ_OUT_F32))
    assert status != n.lib.CIQ_OK, f"{field}={value} accepted"
    assert "plan" in message or "not available" in message, message
    assert out[0] == 0.0  # nothing was written


def test_graph_calls_on_the_cpu_and_foreign_handles(native_lib):
    """CUDA graphs and stream events on the CPU device: unsupported, said in one line; a pointer that is not a captured
    graph: an error for launch and free (the library tracks its graphs); freeing NULL: nothing to do."""
    n = native_lib
    status, message = _status_and_message(n, n.lib.ciq_graph_capture_begin(n.lib.CIQ_DEVICE_CPU))
    assert status == n.lib.CIQ_ERR_UNSUPPORTED and "need a GPU" in message, message
    graph = n.ffi.new("void **")
    status, message = _status_and_message(n, n.lib.ciq_graph_capture_end(n.lib.CIQ_DEVICE_CPU, graph))
    assert status == n.lib.CIQ_ERR_UNSUPPORTED and graph[0] == n.ffi.NULL, message
    foreign = n.ffi.new("char[]", 64)
    for call in (n.lib.ciq_graph_launch, n.lib.ciq_graph_free):
        status, message = _status_and_message(n, call(foreign))
        assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and "not a captured graph" in message, message
    assert n.lib.ciq_graph_free(n.ffi.NULL) == n.lib.CIQ_OK
    for call in (n.lib.ciq_stream_wait_event, n.lib.ciq_stream_record_event):  # the plugin's stream ordering
        status, message = _status_and_message(n, call(n.lib.CIQ_DEVICE_CPU, foreign))
        assert status == n.lib.CIQ_ERR_UNSUPPORTED and "the host has no streams" in message, message


def test_switch_on_reads_the_words_and_names_bad_ones(monkeypatch):
    """ciq_switch_on: the on/off words in any case, unset or empty the switch's default (on; GGML_CIQ_PLUGIN_GRAPHS,
    GGML_CIQ_PLUGIN_STATS, GGML_CIQ_PLUGIN_ATTENTION and GGML_CIQ_PLUGIN_TIMELINE off); a value it does not take and a name that is
    not an on/off switch each an error naming them (the plugin then offers no device: test_plugin)."""
    n = native.load()
    on = n.ffi.new("int *")
    for value, want in (("", 1), ("0", 0), ("Off", 0), ("no", 0), ("1", 1), ("TRUE", 1), (" yes ", 1)):
        monkeypatch.setenv("GGML_CIQ_FUSE", value)
        assert n.lib.ciq_switch_on(b"GGML_CIQ_FUSE", on) == n.lib.CIQ_OK and on[0] == want, value
    for name, default in ((b"GGML_CIQ_PLUGIN_GRAPHS", 0), (b"GGML_CIQ_PLUGIN_FUSE_RULE", 1),
                          (b"GGML_CIQ_PLUGIN_STATS", 0), (b"GGML_CIQ_PLUGIN_ATTENTION", 0),
                          (b"GGML_CIQ_PLUGIN_GROUP", 1), (b"GGML_CIQ_PLUGIN_TIMELINE", 0),
                          (b"GGML_CIQ_PLUGIN_ROPE_KV", 1)):  # the table's defaults
        monkeypatch.delenv(name.decode(), raising=False)
        assert n.lib.ciq_switch_on(name, on) == n.lib.CIQ_OK and on[0] == default, name
        monkeypatch.setenv(name.decode(), "on" if default == 0 else "off")
        assert n.lib.ciq_switch_on(name, on) == n.lib.CIQ_OK and on[0] == 1 - default, name
    monkeypatch.setenv("GGML_CIQ_FUSE", "sometimes")
    status, message = _status_and_message(n, n.lib.ciq_switch_on(b"GGML_CIQ_FUSE", on))
    assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and "GGML_CIQ_FUSE='sometimes'" in message, message
    status, message = _status_and_message(n, n.lib.ciq_switch_on(b"GGML_CIQ_OFFLOAD", on))
    assert status == n.lib.CIQ_ERR_INVALID_ARGUMENT and "'GGML_CIQ_OFFLOAD' is not an on/off switch" in message
