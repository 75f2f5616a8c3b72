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
    assert info["api_version"] == 1 and "cpu" in info["backends"]
    assert info["cpu_isa"] in ISAS


def test_cuda_sources_compiled_where_expected(native_lib):
    """CI sets GGML_CIQ_EXPECT_CUDA when nvcc is present: the CUDA backend must then be in the build."""
    expected = os.environ.get("GGML_CIQ_EXPECT_CUDA")
    if not expected:
        pytest.skip("GGML_CIQ_EXPECT_CUDA not set")
    info = native.build_info()
    assert "cuda" in info["backends"] and info["cuda_archs"] == expected, info


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
        "NULL pointer": (NULL, 144, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, 0),
        "multiple of 256": (wp, 144, 1, 300, xp, 1, op, lib.CIQ_VARIANT_CPU, 0),
        "unknown kernel variant": (wp, 144, 1, 256, xp, 1, op, 99, 0),
        "needs 144 weight bytes": (wp, 100, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, 0),
        "tokens must be": (wp, 144, 1, 256, xp, 0, op, lib.CIQ_VARIANT_CPU, 0),
        "unknown semantics": (wp, 144, 1, 256, xp, 1, op, lib.CIQ_VARIANT_CPU, 7),
    }
    for message, (wptr, nbytes, rows, k, xptr, tokens, optr, variant, semantics) in cases.items():
        status, error = call(lib.ciq_gemm, -1, variant, semantics, lib.CIQ_TYPE_Q4_K, wptr, nbytes, rows, k, xptr,
                             tokens, optr, lib.CIQ_OUT_F32)
        assert status == lib.CIQ_ERR_INVALID_ARGUMENT and message in error, (message, error)
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_CPU, 0, 13, wp, 144, 1, 256, xp, 1, op, 0)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT and "not Q4_K" in error
    status, error = call(lib.ciq_gemm, -1, lib.CIQ_VARIANT_MMA, 1, lib.CIQ_TYPE_Q4_K, wp, 144, 1, 256, xp, 1, op, 0)
    assert status == lib.CIQ_ERR_UNSUPPORTED and "not available on the CPU" in error
    status, error = call(lib.ciq_quantize_q8_K, -1, NULL, NULL, 1, 256)
    assert status == lib.CIQ_ERR_INVALID_ARGUMENT
    if native.device_count() == 0:
        status, error = call(lib.ciq_malloc, 0, 16, n.ffi.new("void **"))
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
