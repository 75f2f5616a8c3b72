"""libggml_ciq on the CPU: same-semantics agreement with the numpy references, quantizers, the C API's errors."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ggml_ciq import native
from ggml_ciq import quants as Q
from ggml_ciq.errors import BackendError, CiqError, InvalidArgumentError, ShapeError

ISAS = ("scalar", "avx2", "avxvnni")


@pytest.fixture
def isa(request, native_lib, monkeypatch):
    monkeypatch.setenv("GGML_CIQ_CPU_ISA", request.param)
    if native.build_info()["cpu_isa"] != request.param:
        pytest.skip(f"{request.param} not built or not supported by this CPU")
    return request.param


def run_checked(tensor, x, semantics, variant="cpu", device="cpu", out_type="f32"):
    """One GEMM with a poisoned output; asserts exactly one launch of the expected kernel."""
    native.dispatch_reset()
    out = native.gemm(tensor, x, variant=variant, device=device, semantics=semantics, out_type=out_type)
    counts = native.dispatch_counts()
    assert counts[(variant, tensor.type_name)] == 1 and sum(counts.values()) == 1, counts
    assert np.isfinite(out).all(), "unwritten (poisoned) outputs"
    return out


@pytest.mark.parametrize("isa", ISAS, indirect=True)
@pytest.mark.parametrize("semantics", ["cpu", "mmq"])
def test_cpu_gemm_matches_reference(isa, semantics, model, rng):
    for t in model.weights():
        for tokens in (1, 7, 32, 129):
            x = rng.standard_normal((tokens, t.k)).astype(np.float32)
            ref = Q.REFERENCE_GEMMS[semantics](t.ggml_type, t.raw(), t.rows, t.k, x)
            assert Q.nmse(run_checked(t, x, semantics), ref) <= 1e-12, (t.name, tokens)


def test_bf16_output(native_lib, default_model, rng):
    t = default_model.weights()[1]
    x = rng.standard_normal((5, t.k)).astype(np.float32)
    f32 = run_checked(t, x, "cpu")
    bf16 = run_checked(t, x, "cpu", out_type="bf16")
    assert 0 < Q.nmse(bf16, f32) < 1e-4


@pytest.mark.parametrize("weight_type", [Q.Q4_K, Q.Q6_K])
def test_quantizers_byte_identical(native_lib, weight_type, rng):
    tied = np.zeros((1, 256), np.float32)
    tied[0, 5], tied[0, 6] = 3.0, -3.0
    for x in (rng.standard_normal((3, 768)).astype(np.float32), np.zeros((2, 256), np.float32), tied,
              (rng.standard_normal((2, 256)) * 1e30).astype(np.float32),
              (rng.standard_normal((2, 256)) * 1e-30).astype(np.float32)):
        assert np.array_equal(native.quantize_activations(x, "cpu", weight_type),
                              Q.quantize_q8_K(x).view(np.uint8).reshape(-1))
        assert np.array_equal(native.quantize_activations(x, "mmq", weight_type),
                              Q.quantize_q8_1_mmq(x, weight_type).reshape(-1))


def test_build_info(native_lib):
    info = native.build_info()
    assert info["api_version"] == native.API_VERSION and "cpu" in info["backends"]
    assert info["cpu_isa"] in ISAS


def test_cuda_sources_compiled_where_expected(native_lib):
    """CI sets GGML_CIQ_EXPECT_CUDA when nvcc is present: the CUDA backend must then be in the build."""
    expected = os.environ.get("GGML_CIQ_EXPECT_CUDA")
    if not expected:
        pytest.skip("GGML_CIQ_EXPECT_CUDA not set")
    info = native.build_info()
    assert "cuda" in info["backends"] and info["cuda_archs"] == expected, info


# ----------------------------------------------------------------------------------------------
# The contract: header version, the registry's facts in Python, planning = dispatch.

# sha256 of ggml_ciq.h's CDEF region per GGML_CIQ_API_VERSION. A change to the region without a new version fails
# here; a new version needs its hash recorded (print(cdef_sha256()) gives it).
CDEF_SHA256 = {2: "4a2d9f159019c7458ae310183d425a220dd7d0e41cd353f738031334d4b9ad43",
               3: "f559ed9fd76b0c87472c77e1a087a27f0594ae5e7401c717094f78d6b526d693",  # 3: ciq_<object>_<verb> names
               4: "e558c50d8b8456a5a87d6221b46e9207a1e610f4aaae1d5eecab2a4359f99694",  # 4: plan.offload by weight size
               5: "be65c30c6795f2df5298de1c63ba3dd9910828e0f13c9be339a987fd5735c9e5",  # 5: ciq_op_order, rms_norm's add, mma_llamacpp
               6: "6ee20139fc68bd47f71e9b3017c51492c809be16b0b7fadebbf08b74fe711588",  # 6: mma_llamacpp is llama.cpp's flash attention bit for bit (stream-k)
               7: "311d8cfe8ceb2fda7f8d0c6db3afbc0c48cfd8cfc942089fffd349a75209a99d",  # 7: ciq_rms_norm_rope (llama.cpp CUDA's fused RMS_NORM + MUL + ROPE)
               8: "047ad557a4298d947da685667e9c88193cfd5d73ffa9a767e7534ac70d2cad67",  # 8: CUDA graphs (ciq_graph_capture_begin .. ciq_graph_free)
               9: "f609c6c4f2d31727cd6d23763b58fe7dbcf913d8fa16e7031038bd69cd79aa70",  # 9: wgmma on the 32-block types, ciq_variant_info.k_multiple
               10: "9ab6f24a4b9f06a660a9ce3204c58b1a5579041721cb357f8913137e6a3ab98b",  # 10: ciq_glu_activations (the GLU fused into the f16 activation conversion)
               11: "dba9f49f9bd5f85086cfbc74f086003750a9223e4c063b1309dedb3b91ad064f",  # 11: ciq_gemm_quantized_outputs (stacked weights' outputs apart, residual adds from the epilogue), ciq_rms_norm_activations, ciq_rope_kv_store
               12: "1700a6a76fb6e854081b5cf516d1682cd1456f8af6e6172c3897e3107ce2b171",  # 12: CIQ_ATTENTION_WGMMA (Hopper attention: wgmma, TMA, 128-query tiles)
               13: "ce5fc3624ec967ea0f143f6755a18346bd5fc2272663febf1a07b38bec8b1ff1",  # 13: ciq_wgmma_launch_count (wgmma's SS / RS / stream-K launches)
               14: "0d1865cc562a6c714abd6585d17cb05ff805b94176f9b6c5346e8d5bf75addae",  # 14: ciq_gemm_quantized_group (two weights, one launch), ciq_gemm_quantized_glu (the GLU from the epilogue)
               15: "4dc0f891fdce410527335b093c27358fdf7ad72fe06573b90efbbba4cdd89892",  # 15: CIQ_TYPE_Q4_1/Q5_1, CIQ_LAYOUT_Q8_1_CPU, CIQ_ORDER_LLAMACPP_CPU, ciq_registry_semantics
               16: "28067411ccc0085f2779565939253ad369f83240d2cddea4192468bab78d4010",  # 16: Q5_K on the host (cpu variant, cpu semantics only)
               17: "28067411ccc0085f2779565939253ad369f83240d2cddea4192468bab78d4010",  # 17: q8_1-mmq for any K % 32 (zero-padded), Q4_1/Q5_1 in MMQ semantics (q32, host and GPU), Q5_K in MMQ semantics on a GPU (mma)
               18: "9fabe8cd29708df5a978cca77780752a54df50fe67423e324aba07ca43c4e771",  # 18: Q4_1/Q5_1/Q5_K in mmvq (host and GPU) and f16 (wgmma)
               19: "da833a8ca6ab5654cdfb662e2d6a0ce99c720b68c6b4456a8254c36d4dda0998",  # 19: ciq_stream_wait_event / ciq_stream_record_event (the plugin's ordering against ggml-cuda's stream)
               20: "353349968338d372db75736e2cf575a3961631691e81dc5fd0fc270de77ffd49",  # 20: ciq_switch_on (the plugin reads GGML_CIQ_FUSE, GGML_CIQ_PLUGIN_GRAPHS)
               21: "70ec5a6fbc0d85060f360b1f3966303625bcefa476cbe9d289ff4bb2c3a1cc17",  # 21: ciq_switch_on's default per switch (GGML_CIQ_PLUGIN_GRAPHS off), GGML_CIQ_PLUGIN_FUSE_RULE
               22: "9d6004422bb567a69b0dff3a79b028101227a3793e7fe507b92dc0b2f8a6abbd",  # 22: GGML_CIQ_PLUGIN_STATS (the plugin's host-time line)
               23: "917e37eb39441f8ad61ddfd23a27f9dd7beada723f7bc2798fa9a12037a784ed",  # 23: GGML_CIQ_PLUGIN_RUN_GRAPHS (1eb1c26; withdrawn in 24)
               24: "9d6004422bb567a69b0dff3a79b028101227a3793e7fe507b92dc0b2f8a6abbd",  # 24: v22's header again: GGML_CIQ_PLUGIN_RUN_GRAPHS withdrawn (no measured gain, NOTES.md)
               25: "91fad4f2c9ad3b3fd9478c3145cc1e78c81f4f0c13429246d0a15c28967e4e9e",  # 25: ciq_attention_masked, ciq_rows_set_f16, GGML_CIQ_PLUGIN_ATTENTION (the plugin's attention steps)
               26: "2cc4322c930cc1e0750a0ea9187cdca9a5c7a8a73fe8fe2b776ca90e4f433559",  # 26: ciq_attention_masked runs wgmma (AUTO's order), its tiles marked none / all-zero / mixed
               27: "cf55d66b3d9cd0e4882b5fcdc828ceec3d4376c5f17a7f17f0e9037fb67a0395",  # 27: GGML_CIQ_PLUGIN_ATTENTION off by default (measured slower on the 8B, no faster on Gemma)
               28: "0feb9d5d78d8fe11c4241f71525c8d30b38929e04b705fc4d4d780fb9859f2ff",  # 28: ciq_gemm_quantized_group of 1..3 weights of one type or Q4_K then Q6_K, ciq_gemm_quantized_glu_pair, GGML_CIQ_PLUGIN_GROUP
               29: "4acb1c1133a7ed2de862d03ba3a4fcd4a1771a94493401594cc02d4bd391cdd9",  # 29: GGML_CIQ_PLUGIN_GROUP on by default (the 8B's pp512 +10% through llama-bench, H100)
               30: "fe249d049598b38975bfd3dc0cb9c7b6d8c69bf2a8266914d61fd0e6825972dd",  # 30: GGML_CIQ_PLUGIN_TIMELINE (the plugin's GPU timeline line)
               31: "4d0b1238d77f614f1ab99307bc6dacf548d39e578e5c19191534a3825189698d"}  # 31: ciq_rope_rows_set_f16, GGML_CIQ_PLUGIN_ROPE_KV (the plugin's ROPE_KV step)


def cdef_sha256() -> str:
    import hashlib

    return hashlib.sha256(native._cdef_source(native._header_path()).encode()).hexdigest()


def test_header_changes_raise_the_api_version(native_lib):
    import re

    text = native._header_path().read_text()
    version = int(re.search(r"#define GGML_CIQ_API_VERSION (\d+)", text).group(1))
    assert version == native.API_VERSION == native.build_info()["api_version"]
    assert CDEF_SHA256.get(version) == cdef_sha256(), (
        f"ggml_ciq.h's CDEF region changed (sha256 {cdef_sha256()}) while GGML_CIQ_API_VERSION is {version}: raise "
        "the version (header, native.API_VERSION) and record the new hash in CDEF_SHA256")


def test_python_variants_are_the_registry(native_lib):
    """Python's variant list, names and semantics come from ciq_variant_describe, and its names are the header
    enum's: no second copy."""
    n = native_lib
    info = n.ffi.new("ciq_variant_info *")
    from_c = []
    for v in range(n.lib.CIQ_VARIANT_COUNT):
        n.check(n.lib.ciq_variant_describe(v, info))
        from_c.append((n.ffi.string(info.name).decode(), native.SEMANTICS[info.semantics]))
    assert [(v.name, v.semantics) for v in native.variants()] == from_c
    assert native.VARIANTS == tuple(name for name, _ in from_c)
    assert native.VARIANTS == tuple(e.replace("_", "-") for e in native.enum_names("ciq_variant", "CIQ_VARIANT_"))
    assert native.variant_info("auto").semantics == "any" and native.variant_info("q32").gpu_semantics == ("mmq",)
    assert native.SEMANTICS == ("cpu", "mmq", "f16", "mmvq", "any")
    for v in native.variants()[1:]:
        assert v.semantics in v.host_semantics + v.gpu_semantics and v.weight_types and v.description


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_plan_resolves_auto_as_gemm_dispatches(native_lib, rng, device):
    """ciq_gemm_plan's variant for AUTO is the one ciq_gemm launches (dispatch counters), for every weight type,
    semantics and a spread of token counts; its layout and bytes are those ciq_activations_* give."""
    if device == "cuda" and native.device_count() == 0:
        pytest.skip("no CUDA device (or libggml_ciq built without CUDA)")
    rows, k = 40, 512
    for ggml_type in (Q.Q4_K, Q.Q6_K, Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1, Q.Q5_K):
        raw = rng.integers(0, 256, rows * Q.row_bytes(ggml_type, k), dtype=np.uint8)
        raw.reshape(rows * k // Q.BLOCK_LAYOUT[ggml_type][0], -1)[:, -2:] = 0  # Q4_K/Q6_K: finite d; 32-block: see below
        if ggml_type in Q.Q32_TYPES + Q.Q32_1_TYPES:
            raw.reshape(rows * k // 32, -1)[:, :2] = np.full((1,), 0.01, np.float16).view(np.uint8)
        for semantics in ("any", "cpu", "mmq", "mmvq"):
            for tokens in (1, 8, 9, 129):
                x = rng.standard_normal((tokens, k)).astype(np.float32)
                try:
                    plan = native.plan("auto", device, semantics, ggml_type, rows, k, tokens)
                except CiqError:
                    with pytest.raises(CiqError):
                        native.gemm(raw, x, device=device, semantics=semantics, ggml_type=ggml_type, rows=rows, k=k)
                    continue
                assert plan.variant != "auto" and plan.semantics != "any"
                assert plan.layout == native.activations_layout(plan.semantics, ggml_type)
                assert plan.activation_bytes == native.activation_bytes(plan.layout, tokens, k)
                native.dispatch_reset()
                native.gemm(raw, x, device=device, semantics=semantics, ggml_type=ggml_type, rows=rows, k=k)
                ran = {key: c for key, c in native.dispatch_counts().items() if c}
                assert ran == {(plan.variant, Q.type_name(ggml_type)): 1}, (semantics, tokens, plan, ran)


@pytest.mark.parametrize("ggml_type", [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=Q.type_name)
def test_mmvq_variant_through_the_registry(native_lib, rng, ggml_type):
    """The mmvq row: ciq_gemm with variant mmvq (and AUTO with mmvq semantics) on the host is llama.cpp CUDA's
    mul_mat_vec_q in its float order (quants.gemm_mmvq_semantics) at 1..8 tokens, counted once; 9 tokens are refused."""
    from test_ops import random_table

    rows, k = 37, 512
    raw = random_table(rng, ggml_type, rows, k)
    for tokens in (1, 3, 8):
        x = rng.standard_normal((tokens, k)).astype(np.float32)
        for variant in ("mmvq", "auto"):
            native.dispatch_reset()
            out = native.gemm(raw, x, variant=variant, semantics="mmvq", ggml_type=ggml_type, rows=rows, k=k)
            assert {key: n for key, n in native.dispatch_counts().items() if n} == {("mmvq", Q.type_name(ggml_type)): 1}
            assert Q.nmse(out, Q.gemm_mmvq_semantics(ggml_type, raw, rows, k, x)) <= 1e-10, (tokens, variant)
    with pytest.raises(BackendError, match="1..8 tokens"):
        native.gemm(raw, np.zeros((9, k), np.float32), variant="mmvq", ggml_type=ggml_type, rows=rows, k=k)


def test_offload_decision(native_lib, monkeypatch):
    """The host kernels are slower than llama.cpp CPU: never offloaded unless GGML_CIQ_OFFLOAD=all."""
    assert not native.plan("auto", "cpu", "any", Q.Q4_K, 64, 256, 512).offload
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "all")
    assert native.plan("auto", "cpu", "any", Q.Q4_K, 64, 256, 512).offload
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "none")
    assert not native.plan("auto", "cpu", "any", Q.Q4_K, 64, 256, 512).offload
    monkeypatch.setenv("GGML_CIQ_OFFLOAD", "some")
    with pytest.raises(InvalidArgumentError, match="GGML_CIQ_OFFLOAD=some"):
        native.plan("auto", "cpu", "any", Q.Q4_K, 64, 256, 512)


def test_gemm_quantized_runs_the_plan(native_lib, default_model, rng):
    """ciq_gemm_plan + ciq_activations_quantize + ciq_gemm_quantized give ciq_gemm's bits and count one launch."""
    n = native_lib
    t = default_model.weights()[0]
    x = rng.standard_normal((7, t.k)).astype(np.float32)
    raw = np.ascontiguousarray(t.raw())
    for semantics in ("cpu", "mmq"):
        plan = native.plan("auto", "cpu", semantics, t.ggml_type, t.rows, t.k, 7)
        xq = native.quantize_activations(x, plan.semantics, t.ggml_type)
        assert xq.nbytes == plan.activation_bytes
        out = np.full((7, t.rows), np.nan, np.float32)
        native.dispatch_reset()
        n.check(n.lib.ciq_gemm_quantized(n.lib.CIQ_DEVICE_CPU, plan.c, t.ggml_type, n.ffi.from_buffer(raw), raw.nbytes, t.rows, t.k,
                                         n.ffi.from_buffer(xq), 7, n.ffi.from_buffer(out), n.lib.CIQ_OUT_F32))
        assert native.dispatch_counts()[(plan.variant, t.type_name)] == 1
        assert np.array_equal(out, native.gemm(t, x, semantics=semantics))


def test_attention_dispatch_counter(native_lib, rng):
    from ggml_ciq import numpy_ops

    q = rng.standard_normal((3, 2, 64)).astype(np.float32)
    cache = rng.standard_normal((5, 1, 64)).astype(np.float16)
    native.dispatch_reset()
    numpy_ops.attention(q, cache, cache, 2, 0.125, 0)
    assert native.attention_dispatch_counts() == {"auto": 0, "cpu": 0, "simt": 0, "mma": 0, "ggml": 1, "mma_llamacpp": 0,
                                                  "wgmma": 0}
    native.dispatch_reset()
    assert sum(native.attention_dispatch_counts().values()) == 0


# ----------------------------------------------------------------------------------------------
# The C API's error paths, called directly through cffi.

def call(lib_fn, *args):
    n = native.load()
    status = lib_fn(*args)
    return status, n.ffi.string(n.lib.ciq_last_error()).decode()


def test_c_api_rejects_bad_calls(native_lib):
    n = native_lib
    lib, NULL = n.lib, n.ffi.NULL
    w = np.zeros(144, np.uint8)
    x = np.zeros(256, np.float32)
    out = np.zeros(4, np.float32)
    wp, xp, op = n.ffi.from_buffer(w), n.ffi.from_buffer("float[]", x), n.ffi.from_buffer(out)
    cases = {
        "NULL pointer": (NULL, 144, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU),
        "multiple of 256": (wp, 144, 1, 300, xp, 1, op, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU),
        "unknown kernel variant": (wp, 144, 1, 256, xp, 1, op, 99, lib.CIQ_SEMANTICS_CPU),
        "needs 144 weight bytes": (wp, 100, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU),
        "tokens must be": (wp, 144, 1, 256, xp, 0, op, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU),
        "unknown semantics": (wp, 144, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, 7),
    }
    for message, (wptr, nbytes, rows, k, xptr, tokens, optr, variant, semantics) in cases.items():
        status, error = call(lib.ciq_gemm, -1, variant, semantics, lib.CIQ_TYPE_Q4_K, wptr, nbytes, rows, k, xptr,
                             tokens, optr, lib.CIQ_OUT_F32)
        assert status == lib.CIQ_ERR_INVALID_ARGUMENT and message in error, (message, error)
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU, 10, wp, 144, 1, 256, xp, 1, op,
                         lib.CIQ_OUT_F32)  # Q2_K: no kernel of ours
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "not Q4_K, Q5_K" in error
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU, lib.CIQ_TYPE_Q5_K, wp, 144, 1,
                         256, xp, 1, op, lib.CIQ_OUT_F32)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "Q5_K [1 x 256] needs 176 weight bytes" in error
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_MMA, lib.CIQ_SEMANTICS_MMQ, lib.CIQ_TYPE_Q4_K, wp, 144, 1,
                         256, xp, 1, op, lib.CIQ_OUT_F32)
    assert status == lib.CIQ_ERR_UNSUPPORTED and "not available on the CPU" in error
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU, lib.CIQ_TYPE_Q4_0, wp, 144, 1,
                         256, xp, 1, op, lib.CIQ_OUT_F32)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "does not multiply Q4_0" in error
    status, error = call(lib.ciq_activations_quantize, -1, lib.CIQ_LAYOUT_Q8_K, NULL, NULL, 1, 256)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT
    status, error = call(lib.ciq_activations_size, lib.CIQ_LAYOUT_Q8_1_MMQ_D4, 1, 80, n.ffi.new("size_t *"))
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "multiple of 32" in error
    size = n.ffi.new("size_t *")
    assert lib.ciq_activations_size(lib.CIQ_LAYOUT_Q8_1_MMQ_D4, 3, 96, size) == lib.CIQ_OK and size[0] == 3 * 144
    status, error = call(lib.ciq_gemm_quantized, -1, NULL, lib.CIQ_TYPE_Q4_K, wp, 144, 1, 256, xp, 1, op,
                         lib.CIQ_OUT_F32)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "NULL" in error
    status, error = call(lib.ciq_variant_describe, lib.CIQ_VARIANT_COUNT, n.ffi.new("ciq_variant_info *"))
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "unknown kernel variant" in error
    if native.device_count() == 0:
        status, error = call(lib.ciq_memory_alloc, 0, 16, n.ffi.new("void **"))
        assert status != lib.CIQ_OK and ("without CUDA" in error or "device(s) found" in error)


def test_python_errors_are_ciq_errors(native_lib, default_model):
    t = default_model.weights()[0]
    with pytest.raises(ShapeError, match="activations must be"):
        native.gemm(t, np.zeros((2, 100), np.float32), variant="cpu")
    with pytest.raises(InvalidArgumentError, match="unknown kernel variant"):
        native.gemm(t, np.zeros((2, t.k), np.float32), variant="turbo")
    with pytest.raises(ShapeError, match="needs"):
        native.gemm(t.raw()[:-1], np.zeros((2, t.k), np.float32), variant="cpu", ggml_type=t.ggml_type,
                    rows=t.rows, k=t.k)
    if native.device_count() == 0:
        with pytest.raises(CiqError, match="without CUDA|device"):
            native.gemm(t, np.zeros((2, t.k), np.float32), device="cuda")
    with pytest.raises(BackendError, match="not available on the CPU"):
        native.gemm(t, np.zeros((2, t.k), np.float32), variant="mma", device="cpu")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(1, 40), k=st.integers(1, 4).map(lambda b: 256 * b), tokens=st.integers(1, 20),
       weight_type=st.sampled_from([Q.Q4_K, Q.Q6_K]), semantics=st.sampled_from(["cpu", "mmq"]),
       seed=st.integers(0, 2**31), k_off=st.sampled_from([0, 0, 0, 1, 128]))
def test_fuzz_random_sizes_and_bytes(native_lib, rows, k, tokens, weight_type, semantics, seed, k_off):
    """Random bytes as weights (valid blocks by construction except for the fp16 scales): never a crash; either a
    clean error or the reference's numbers wherever the reference is finite."""
    rng = np.random.default_rng(seed)
    k += k_off
    nbytes = rows * (k // 256) * (144 if weight_type == Q.Q4_K else 210)
    w = rng.integers(0, 256, size=max(nbytes, 1), dtype=np.uint8)
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    try:
        out = native.gemm(w[:nbytes], x, variant="cpu", semantics=semantics, ggml_type=weight_type, rows=rows, k=k)
    except CiqError as exc:
        assert k % 256 != 0, exc
        return
    assert k % 256 == 0
    with np.errstate(all="ignore"):
        ref = Q.REFERENCE_GEMMS[semantics](weight_type, w[:nbytes], rows, k, x)
    finite = np.isfinite(ref)
    if finite.all() and np.abs(ref).max() < 1e30:
        assert Q.nmse(out, ref) <= 1e-12


def test_f16_layout_on_the_host_matches_numpy(native_lib, rng):
    for x in (rng.standard_normal((7, 512)).astype(np.float32), np.zeros((2, 256), np.float32),
              (rng.standard_normal((3, 256)) * 1e5).astype(np.float32),
              (rng.standard_normal((3, 256)) * 1e-30).astype(np.float32)):
        assert np.array_equal(native.quantize_activations(x, "f16", Q.Q4_K, "cpu"), Q.f16_layout(x))


def test_f16_layout_of_block32_weights(native_lib, rng):
    """The f16 layout (wgmma's activations) at K a multiple of 64, as Gemma's 640 for its Q5_0/Q8_0 weights: the host
    bytes equal numpy's; K = 96 fails with the multiple named."""
    for weight_type in (Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1):
        x = (rng.standard_normal((5, 640)) * rng.choice([1e-3, 1.0, 3e4], size=(5, 1))).astype(np.float32)
        assert np.array_equal(native.quantize_activations(x, "f16", weight_type, "cpu"), Q.f16_layout(x))
    with pytest.raises(InvalidArgumentError, match="K must be a positive multiple of 64, got 96"):
        native.quantize_activations(np.zeros((2, 96), np.float32), "f16", Q.Q8_0, "cpu")


def test_wgmma_registry_row(native_lib):
    """One table says what wgmma multiplies: every weight type, the 32-value block types at K a multiple of 64 (the
    only variant with a K multiple beyond its types' blocks); on the CPU it is not available, and AUTO never names it."""
    info = native.variant_info("wgmma")
    assert set(info.weight_types) == {Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_1, Q.Q5_1}
    assert info.k_multiple == 64 and set(native.variant_info("mmvq").weight_types) == set(info.weight_types)
    assert info.gpu_semantics == ("f16",) and not info.host_semantics
    assert all(v.k_multiple == 1 for v in native.variants() if v.name != "wgmma")
    assert not native.variant_available("cpu", "wgmma")
    assert native.resolve_variant("auto", "cpu", "any", Q.Q5_0, 2048, 640, 512) == "q32"


def test_f16_semantics_need_the_gpu_kernel(native_lib, rng):
    data = Q.quantize_q6_K((rng.standard_normal((64, 512)) * 0.02).astype(np.float32))
    x = rng.standard_normal((5, 512)).astype(np.float32)
    with pytest.raises(InvalidArgumentError, match="not f16"):
        native.gemm(data, x, device="cpu", semantics="f16", ggml_type=Q.Q6_K, rows=64, k=512)
    assert native.resolve_variant("auto", "cpu", "any", Q.Q6_K, 64, 512, 5) == "cpu"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_timer_mark_ends_the_interval(native_lib, device):
    """ciq_timer_stop reports start..mark, not start..stop; a second mark is an error; NULL timers are refused."""
    import time

    n = native_lib
    if device == "cuda" and native.device_count() == 0:
        pytest.skip("no CUDA device (or libggml_ciq built without CUDA)")
    dev = native.parse_device(device)
    handle, ms = n.ffi.new("void **"), n.ffi.new("float *")
    n.check(n.lib.ciq_timer_start(dev, handle))
    n.check(n.lib.ciq_timer_mark(handle[0]))
    assert n.lib.ciq_timer_mark(handle[0]) == 1  # CIQ_ERR_INVALID_ARGUMENT
    time.sleep(0.2)
    n.check(n.lib.ciq_timer_stop(handle[0], ms))
    assert 0 <= ms[0] < 100
    assert n.lib.ciq_timer_mark(n.ffi.NULL) == 1
