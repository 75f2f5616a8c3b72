"""Q4_1 / Q5_1 weights in cpu semantics (the q32 variant on the host): llama.cpp x86 CPU's mul_mat for them, bit for
bit. llama.cpp takes neither llamafile_sgemm nor its tiled matmul for these types: every output is one
ggml_vec_dot_q{4,5}_1_q8_1 on activations from quantize_row_q8_1 (native/src/cpu/gemm_q32.cpp says the float order),
whatever the token count. The AVX2 build and a -march=native AVX-512 one run the same arithmetic for these types
(dpbusd's sums equal maddubs+madd's here: no pair saturates), so the same assertions hold against either."""

import numpy as np
import pytest

from ggml_ciq import native
from ggml_ciq import quants as Q
from ggml_ciq.errors import BackendError
from ggml_ciq.model import Tensor
from test_ops import random_table

TYPES = Q.Q32_1_TYPES
IDS = [Q.type_name(t) for t in TYPES]


def activations(rng, tokens: int, k: int) -> np.ndarray:
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[:, 7] *= 300.0  # an outlier channel, as real residual streams have
    if tokens > 1:
        x[1, 32:64] = 0.0  # an all-zero block: d = s = 0
    return x


def weights(llama, rng, ggml_type: int, rows: int, k: int, source: str) -> np.ndarray:
    """ggml's own quantization of Gaussian weights, or random blocks (every qh bit pattern, d and m of either sign)."""
    if source == "ggml":
        return llama.quantize_chunk(ggml_type, rng.standard_normal((rows, k)).astype(np.float32) * 0.02)
    return random_table(rng, ggml_type, rows, k)


@pytest.mark.parametrize("tokens", [1, 2, 31, 77])
@pytest.mark.parametrize("isa", ["best", "scalar"])
def test_q8_1_cpu_layout_is_llamacpp_quantize_row_q8_1(llama, native_lib, rng, monkeypatch, tokens, isa):
    """The q8_1-cpu layout's bytes are the CPU backend's quantize_row_q8_1 (s from the quants, d * sum(q)) and the
    numpy reference's; MMVQ's q8_1 (s from the floats, CUDA's quantize_q8_1) is another layout."""
    if isa == "scalar":
        monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
    k = 576
    x = activations(rng, tokens, k)
    x[0, 99] = -254.0  # block 3's amax: 127 / amax = 0.5 exactly, so 1.0, 3.0 and -1.0 are ties (half to even)
    x[0, 100:103] = [1.0, 3.0, -1.0]
    ours = native.quantize_activations(x, "cpu", Q.Q4_1, "cpu")
    assert native.activations_layout("cpu", Q.Q5_1) == "q8_1_cpu"
    assert ours.tobytes() == llama.quantize_row_q8_1(x).tobytes() == Q.quantize_q8_1_cpu(x).tobytes()
    assert ours.tobytes() != Q.quantize_q8_1(x).tobytes()


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_dequantize_matches_ggml(llama, native_lib, rng, ggml_type):
    """quants.dequantize and the library's get_rows (ciq_rows_get) are ggml's dequantize_row_q{4,5}_1 (q*d + m)."""
    rows, k = 9, 1536
    raw = random_table(rng, ggml_type, rows, k)
    theirs = llama.dequantize(ggml_type, raw, rows * k).reshape(rows, k)
    assert np.array_equal(Q.dequantize(ggml_type, raw, rows, k), theirs)
    from ggml_ciq.ops import NativeOps

    ids = np.array([8, 0, 3, 3], np.int32)
    out = NativeOps("cpu").get_rows(Tensor("token_embd.weight", ggml_type, (rows, k), raw), ids).numpy()
    assert np.array_equal(out, theirs[ids])


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("k", [576, 1536, 32 * 23])
@pytest.mark.parametrize("tokens", [1, 2, 7, 8, 9, 31, 77])
def test_gemm_matches_llamacpp_cpu(llama, native_lib, rng, ggml_type, k, tokens):
    """ciq_gemm (q32, cpu semantics; the output poisoned first) against llama.cpp CPU's mul_mat on a plain CPU buffer,
    bit for bit, for ggml-quantized and random weights at odd row counts (tails of the 32-row chunk); one dispatch of
    q32 counted; close to float64 (the activations' int8 rounding is the error), exact on its own q8_1 activations."""
    x = activations(rng, tokens, k)
    for rows, source in ((333, "ggml"), (37, "random")):
        raw = weights(llama, rng, ggml_type, rows, k, source)
        native.dispatch_reset()
        ours = native.gemm_q32(raw, x, ggml_type, rows, k, "cpu", semantics="cpu")
        ran = {key: c for key, c in native.dispatch_counts().items() if c}
        assert ran == {("q32", Q.type_name(ggml_type)): 1}, ran
        theirs = llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2)
        assert np.isfinite(ours).all()
        assert np.array_equal(ours, theirs), (f"{source} {rows}x{k}x{tokens}: NMSE {Q.nmse(ours, theirs):.2e}, "
                                              f"identical {np.mean(ours == theirs):.4f}")
        exact = Q.gemm_q32_1_cpu_quantized(ggml_type, raw, rows, k, Q.quantize_q8_1_cpu(x), tokens)
        float64 = x.astype(np.float64) @ Q.dequantize(ggml_type, raw, rows, k).T.astype(np.float64)
        err, float_err = Q.nmse(ours, exact), Q.nmse(ours, float64)
        print(f"{Q.type_name(ggml_type)} {source} {rows}x{k}x{tokens}: NMSE {err:.2e} to its q8_1 activations, "
              f"{float_err:.2e} to float64")
        assert err <= 1e-10 and float_err <= 1e-3 and float_err > 1e3 * max(err, 1e-18)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 9, 77])
def test_scalar_path_matches_llamacpp_cpu(llama, native_lib, rng, monkeypatch, ggml_type, tokens):
    """GGML_CIQ_CPU_ISA=scalar: the scalar loops keep the AVX2 path's float order (quantization and GEMM)."""
    monkeypatch.setenv("GGML_CIQ_CPU_ISA", "scalar")
    rows, k = 101, 1536
    raw = weights(llama, rng, ggml_type, rows, k, "ggml")
    x = activations(rng, tokens, k)
    ours = native.gemm_q32(raw, x, ggml_type, rows, k, "cpu", semantics="cpu")
    assert np.array_equal(ours, llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2))


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_numpy_ops_weight_runs_q32(llama, native_lib, rng, ggml_type):
    """The CPU engine's NumpyWeight keeps Q4_1/Q5_1 in their blocks (kind q32) and multiplies them as llama.cpp."""
    from ggml_ciq.numpy_ops import NumpyWeight

    rows, k = 75, 576
    raw = weights(llama, rng, ggml_type, rows, k, "ggml")
    weight = NumpyWeight(Tensor("blk.0.ffn_up.weight", ggml_type, (rows, k), raw))
    assert weight.kind == "q32"
    x = activations(rng, 9, k)
    assert np.array_equal(weight(x), llama.mul_mat(ggml_type, raw, rows, k, x, device="CPU", threads=2))


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_other_semantics_refused_cleanly(native_lib, rng, ggml_type):
    """The q32 row lists Q4_1/Q5_1 for all its semantics; planning refuses them outside cpu semantics on the host with
    CIQ_ERR_UNSUPPORTED naming the type (never a wrong kernel), AUTO included; a forged MMQ plan does not run."""
    n = native_lib
    lib, name = n.lib, Q.type_name(ggml_type)
    plan = n.ffi.new("ciq_plan *")
    for variant in (lib.CIQ_VARIANT_Q32, lib.CIQ_VARIANT_AUTO):
        status = lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, variant, lib.CIQ_SEMANTICS_MMQ, ggml_type, 64, 576, 9, plan)
        error = n.ffi.string(lib.ciq_last_error()).decode()
        assert status == lib.CIQ_ERR_UNSUPPORTED and name in error and "mmq" in error, (variant, error)
    for variant, semantics in ((lib.CIQ_VARIANT_MMVQ, lib.CIQ_SEMANTICS_MMVQ), (lib.CIQ_VARIANT_CPU, lib.CIQ_SEMANTICS_CPU),
                               (lib.CIQ_VARIANT_WGMMA, lib.CIQ_SEMANTICS_F16)):
        assert lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, variant, semantics, ggml_type, 64, 576, 2, plan) != lib.CIQ_OK
    for semantics in ("any", "cpu"):
        p = native.plan("auto", "cpu", semantics, ggml_type, 64, 576, 9)
        assert (p.variant, p.semantics, p.layout) == ("q32", "cpu", "q8_1_cpu")
        assert p.activation_bytes == 9 * 576 // 32 * 36
    # A plan forged for MMQ semantics: ciq_gemm_quantized refuses it too.
    assert lib.ciq_gemm_plan(lib.CIQ_DEVICE_CPU, lib.CIQ_VARIANT_Q32, lib.CIQ_SEMANTICS_MMQ, Q.Q4_0, 64, 512, 9,
                             plan) == lib.CIQ_OK
    raw = random_table(rng, ggml_type, 64, 512)
    xq = np.zeros(plan.activation_bytes, np.uint8)
    out = np.zeros((9, 64), np.float32)
    status = lib.ciq_gemm_quantized(lib.CIQ_DEVICE_CPU, plan, ggml_type, n.ffi.from_buffer(raw), raw.size, 64, 512,
                                    n.ffi.from_buffer(xq), 9, n.ffi.from_buffer(out), lib.CIQ_OUT_F32)
    error = n.ffi.string(lib.ciq_last_error()).decode()
    assert status == lib.CIQ_ERR_UNSUPPORTED and name in error, error
    with pytest.raises(BackendError, match=name):
        native.gemm_q32(raw, np.zeros((9, 512), np.float32), ggml_type, 64, 512, "cpu", semantics="mmq")


def test_python_type_ids_are_the_headers(native_lib):
    """quants' type constants are ggml_ciq.h's ciq_type values, name for name (Q4_1 = 3, Q5_1 = 7 included)."""
    names = native._header_ffi().typeof("ciq_type").elements  # value -> CIQ_TYPE_<name>
    assert {getattr(Q, name[len("CIQ_TYPE_"):]): value for value, name in names.items()} == {v: v for v in names}
    assert (Q.Q4_1, Q.Q5_1) == (native_lib.lib.CIQ_TYPE_Q4_1, native_lib.lib.CIQ_TYPE_Q5_1) == (3, 7)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
def test_gpu_refuses_them_cleanly(native_lib, ggml_type):
    """On a GPU no kernel multiplies Q4_1/Q5_1 (NativeOps dequantizes them to bf16): AUTO and q32 both refuse in
    planning with CIQ_ERR_UNSUPPORTED naming the type."""
    if native.device_count() == 0:
        pytest.skip("no GPU (or libggml_ciq built without CUDA)")
    name = Q.type_name(ggml_type)
    for variant, semantics in (("auto", "any"), ("auto", "mmq"), ("q32", "mmq"), ("q32", "any")):
        with pytest.raises(BackendError, match=name):
            native.plan(variant, 0, semantics, ggml_type, 64, 512, 9)
