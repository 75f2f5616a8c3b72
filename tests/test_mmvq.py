"""MMVQ semantics (llama.cpp CUDA's mul_mat_vec_q, 1..8 tokens; docs/SEMANTICS.md "mmvq"): the numpy reference in
quants against its own exact float64 formula (the index mapping), the host C twin native/src/cpu/gemm_mmvq.cpp and the
CUDA kernel native/src/cuda/gemm_mmvq.cu run on the CPU through tests/cuda_on_cpu, bit for bit.

Both native files are compiled here on their own (g++, a small driver), so these tests need no library build."""

import shutil
import subprocess
from pathlib import Path

import cffi
import numpy as np
import pytest

from ggml_ciq import quants as Q
from ggml_ciq.errors import ShapeError, UnsupportedTypeError
from test_cuda_emulation import call as emulated_call, poisoned, rewrite
from test_ops import random_table

ROOT = Path(__file__).resolve().parents[1]
EMULATION = Path(__file__).resolve().parent / "cuda_on_cpu"
TYPES = list(Q.MMVQ_TYPES)
IDS = [Q.type_name(t) for t in TYPES]
K_QUANTS = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
# K with a tail: the blocks per row are not a multiple of the blocks a CTA takes per step (2 threads per 32-block:
# 64 or 32 blocks a step; Q8_0 32 or 16; Q4_K/Q5_K 8 or 4; Q6_K 4 or 2), and several steps.
K_OF = {t: 256 * 11 if t in K_QUANTS else 32 * 150 for t in TYPES}

DRIVER = r"""
#include "cpu/cpu_backend.h"
#include "cuda/cuda_backend.h"
extern "C" {
const char *mmvq_last_error(void) { return ciq_last_error(); }
int mmvq_quantize(const float *x, void *out, int64_t tokens, int64_t k) { return QUANTIZE(x, out, tokens, k); }
int mmvq_gemm(int type, const void *w, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out) {
    return GEMM(type, w, rows, k, xq, tokens, out);
}
}
"""
CDEF = """
const char *mmvq_last_error(void);
int mmvq_quantize(const float *x, void *out, int64_t tokens, int64_t k);
int mmvq_gemm(int type, const void *w, int64_t rows, int64_t k, const void *xq, int64_t tokens, float *out);
"""


def _build(tmp: Path, sources: list, flags: list, prefix: str):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("no g++")
    driver = tmp / "driver.cpp"
    driver.write_text(DRIVER)
    library = tmp / "libmmvq.so"
    command = [compiler, "-O2", "-shared", "-fPIC", "-ffp-contract=off", f"-I{ROOT / 'native' / 'include'}",
               f"-DQUANTIZE={prefix}_quantize_q8_1", f"-DGEMM={prefix}_gemm_mmvq", *flags, *map(str, sources),
               str(ROOT / "native" / "src" / "status.cpp"), str(driver), "-o", str(library)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode and ("<barrier>" in result.stderr or "_Float16" in result.stderr):
        pytest.skip(f"{compiler} lacks C++20 <barrier> or _Float16")
    assert result.returncode == 0, result.stderr[-4000:]
    ffi = cffi.FFI()
    ffi.cdef(CDEF)
    return ffi, ffi.dlopen(str(library))


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """native/src/cpu/gemm_mmvq.cpp as the library builds it (-ffp-contract=off, OpenMP)."""
    tmp = tmp_path_factory.mktemp("mmvq_host")
    return _build(tmp, [ROOT / "native" / "src" / "cpu" / "gemm_mmvq.cpp"],
                  ["-std=c++17", "-fopenmp", f"-I{ROOT / 'native' / 'src'}"], "ciq_cpu")


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """native/src/cuda/gemm_mmvq.cu for the CPU: a thread per CUDA thread (tests/cuda_on_cpu)."""
    tmp = tmp_path_factory.mktemp("mmvq_emu")
    shutil.copytree(ROOT / "native" / "src", tmp / "src")
    text, counts = rewrite((tmp / "src" / "cuda" / "gemm_mmvq.cu").read_text())
    assert counts == {"launch": 2, "mma": 0, "ldmatrix": 0, "extern_shared": 0}, counts
    assert "<<<" not in text, "a launch was not rewritten"
    source = tmp / "src" / "cuda" / "gemm_mmvq.cpp"
    source.write_text(text)
    stream = tmp / "stream.cpp"  # runtime.cu's ciq_stream(), not built here: the emulation's one stream
    stream.write_text('#include "cuda/common.cuh"\ncudaStream_t ciq_stream() { return nullptr; }\n')
    return _build(tmp, [source, stream], ["-std=c++20", "-pthread", "-DGGML_CIQ_WITH_CUDA", "-DCIQ_CUDA_ON_CPU",
                                          f"-I{EMULATION}", f"-I{tmp / 'src'}"], "ciq_cuda")


def call(lib, name, *args):
    emulated_call(lib, name, *args, last_error="mmvq_last_error")


def activations(rng, tokens, k):
    """Gaussian activations with outlier channels (x30) and one all-zero 32-block (d = 0, q = 0)."""
    x = rng.standard_normal((tokens, k)).astype(np.float32)
    x[:, rng.choice(k, 5, replace=False)] *= 30
    x[0, 64:96] = 0
    return x


# ---------------------------------------------------------------------------------------------------------------
# The reference


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_reference_is_the_formula(rng, ggml_type, tokens):
    """The float32 reference in the kernel's order against the same formula with exact float steps (float64): only the
    order of additions differs, so a wrong index mapping (a value on the wrong scale or block) fails here."""
    rows, k = 37, K_OF[ggml_type]
    w = random_table(rng, ggml_type, rows, k)
    xq = Q.quantize_q8_1(activations(rng, tokens, k))
    out = Q.gemm_mmvq_semantics_quantized(ggml_type, w, rows, k, xq)
    assert out.dtype == np.float32 and out.shape == (tokens, rows)
    assert Q.nmse(out, Q.gemm_mmvq_exact(ggml_type, w, rows, k, xq)) <= 1e-12


def test_llamacpp_cuda_uses_mmvq():
    """ggml_cuda_should_use_mmvq at 0c1e570: <= 8 columns for every type on Hopper and Ampere, fewer for K-quants on
    RTX 50-class Blackwell and Orin."""
    for t in TYPES:
        assert [n for n in range(0, 12) if Q.llamacpp_cuda_uses_mmvq(t, n, (9, 0))] == list(range(1, 9))
        assert Q.llamacpp_cuda_uses_mmvq(t, 8, (8, 6)) and not Q.llamacpp_cuda_uses_mmvq(t, 9, (8, 0))
    assert [n for n in range(1, 9) if Q.llamacpp_cuda_uses_mmvq(Q.Q4_K, n, (12, 0))] == [1, 2, 3, 4, 5]
    assert [n for n in range(1, 9) if Q.llamacpp_cuda_uses_mmvq(Q.Q6_K, n, (8, 7))] == [1]
    assert Q.llamacpp_cuda_uses_mmvq(Q.Q8_0, 8, (12, 0))


def test_quantize_q8_1_fields(rng):
    """block_q8_1 as llama.cpp's quantize_q8_1 writes it: d = fp16(amax * float(1/127)), q = roundf(x/d), the sum of the
    float values in fp16, an all-zero block all zero."""
    x = activations(rng, 3, 256)
    xq = Q.quantize_q8_1(x)
    assert xq.dtype.itemsize == 36 and xq.shape == (3, 8)
    xb = x.reshape(3, 8, 32)
    d = np.abs(xb).max(-1) * np.float32(1 / 127)
    assert np.array_equal(xq["d"], d.astype(np.float16))
    assert np.abs(xq["qs"]).max() == 127
    assert np.allclose(xq["s"].astype(np.float64), xb.astype(np.float64).sum(-1), rtol=2e-3, atol=1e-3)
    assert np.abs(xq["qs"].astype(np.float32) * d[..., None] - xb).max() <= d.max() / 2 * (1 + 1e-6)
    assert (xq["qs"][0, 2] == 0).all() and xq["d"][0, 2] == 0 and xq["s"][0, 2] == 0


def test_reference_bad_input(rng):
    w = random_table(rng, Q.Q4_K, 4, 256)
    with pytest.raises(ShapeError, match="1..8 tokens"):
        Q.gemm_mmvq_semantics(Q.Q4_K, w, 4, 256, np.zeros((9, 256), np.float32))
    with pytest.raises(UnsupportedTypeError, match="Q2_K"):
        Q.gemm_mmvq_semantics(10, np.zeros(84 * 4, np.uint8), 4, 256, np.zeros((1, 256), np.float32))
    with pytest.raises(ShapeError):
        Q.quantize_q8_1(np.zeros((1, 100), np.float32))


# ---------------------------------------------------------------------------------------------------------------
# The host C twin and the CUDA kernel (emulated), bit for bit


def check_quantize(lib, rng, tokens, k):
    """The library's quantize_q8_1 (into a poisoned buffer) against quants.quantize_q8_1, byte for byte."""
    x = activations(rng, tokens, k)
    out = poisoned((tokens, k // 32), Q.Q8_1_DTYPE)
    call(lib, "mmvq_quantize", x, out, tokens, k)
    assert out.tobytes() == Q.quantize_q8_1(x).tobytes()


def check_gemm(lib, rng, ggml_type, rows, k, tokens):
    """The library's gemm_mmvq (into a poisoned buffer) against quants' MMVQ reference, bit for bit."""
    w = random_table(rng, ggml_type, rows, k)
    xq = Q.quantize_q8_1(activations(rng, tokens, k))
    out = poisoned((tokens, rows))
    call(lib, "mmvq_gemm", ggml_type, w, rows, k, xq, tokens, out)
    ref = Q.gemm_mmvq_semantics_quantized(ggml_type, w, rows, k, xq)
    assert np.array_equal(out, ref), f"{np.sum(out != ref)} of {out.size} differ"


def test_host_quantize_q8_1(host, rng):
    check_quantize(host, rng, 5, 2048)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_host_gemm_bit_exact(host, rng, ggml_type, tokens):
    check_gemm(host, rng, ggml_type, 37, K_OF[ggml_type], tokens)


def test_emulated_quantize_q8_1(emulated, rng):
    check_quantize(emulated, rng, 3, 512)


# The emulation runs a thread per CUDA thread: few rows (5: a tail of the 2-row CTA), K with a tail of the CTA's step.
@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_emulated_gemm_bit_exact(emulated, rng, ggml_type, tokens):
    check_gemm(emulated, rng, ggml_type, 5, {Q.Q4_K: 256 * 9, Q.Q5_K: 256 * 9, Q.Q6_K: 256 * 5}.get(ggml_type, 32 * 70),
               tokens)


def test_emulated_gemm_refuses_misaligned_weights(emulated, rng):
    """The CUDA kernel reads Q4_K/Q5_K blocks as 32-bit words (the others as 16-bit ones): a weight pointer off that
    alignment is an error naming it, the output untouched, never a misaligned load."""
    ffi, handle = emulated
    ptr = lambda a: ffi.cast("void *", ffi.from_buffer(a))  # noqa: E731
    xq = Q.quantize_q8_1(np.ones((1, 256), np.float32))
    for ggml_type, offset, ok in ((Q.Q4_K, 2, False), (Q.Q5_K, 2, False), (Q.Q6_K, 2, True), (Q.Q4_1, 1, False),
                                  (Q.Q4_1, 2, True)):
        w = random_table(rng, ggml_type, 2, 256)
        buf = np.zeros(w.size + 8, np.uint8)
        buf[offset:offset + w.size] = w
        out = poisoned((1, 2))
        status = handle.mmvq_gemm(ggml_type, ffi.cast("uint8_t *", ptr(buf)) + offset, 2, 256, ptr(xq), 1,
                                  ffi.cast("float *", ptr(out)))
        if ok:
            assert status == 0 and np.isfinite(out).all(), Q.type_name(ggml_type)
        else:
            assert status != 0 and "aligned" in ffi.string(handle.mmvq_last_error()).decode()
            assert np.isnan(out).all()


def test_emulated_gemm_rejects(emulated, rng):
    ffi, handle = emulated
    w = random_table(rng, Q.Q4_K, 2, 256)
    xq = Q.quantize_q8_1(np.ones((9, 256), np.float32))
    out = poisoned((9, 2))
    ptr = lambda a: ffi.cast("void *", ffi.from_buffer(a))  # noqa: E731
    assert handle.mmvq_gemm(Q.Q4_K, ptr(w), 2, 256, ptr(xq), 9, ffi.cast("float *", ptr(out))) != 0
    assert "1..8 tokens" in ffi.string(handle.mmvq_last_error()).decode()
    assert np.isnan(out).all()


# ---------------------------------------------------------------------------------------------------------------
# llama.cpp CPU at small batch: ggml-cpu has no separate small-batch kernel for these types. Our cpu semantics
# (the `cpu` host kernel, the `q32` variant with cpu semantics) is llama.cpp CPU's arithmetic at 1..8 tokens too.


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_cpu_semantics_small_batch_vs_llamacpp_cpu(llama, native_lib, rng, ggml_type, tokens):
    """Bit-exact with llama.cpp CPU's mul_mat (a plain CPU buffer, the one every model load of ours uses) for Q4_K,
    Q5_K and Q6_K (their vec_dot lanes under 8 tokens, the tiled matmul at 8) and the 32-block types (tinyBLAS;
    Q4_1/Q5_1 vec_dot_q{4,5}_1_q8_1), whatever the row count (gemm_kernels.cpp, gemm_q32.cpp)."""
    from ggml_ciq import native

    block32 = ggml_type in Q.Q32_TYPES + Q.Q32_1_TYPES
    k = 1024 if block32 else 2048
    x = activations(rng, tokens, k)
    for rows in (37, 64):
        w = random_table(rng, ggml_type, rows, k)
        ll = llama.mul_mat(ggml_type, w, rows, k, x, device="CPU", threads=2)
        if block32:
            ours = native.gemm_q32(w, x, ggml_type, rows, k, "cpu", semantics="cpu")
        else:
            ours = native.gemm(w, x, variant="cpu", device="cpu", semantics="cpu", ggml_type=ggml_type, rows=rows, k=k)
        assert np.array_equal(ours, ll), f"rows={rows}: NMSE {Q.nmse(ours, ll):.2e}"


# ---------------------------------------------------------------------------------------------------------------
# Through the public API: the mmvq variant (host here; the GPU tests skip without one)


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_api_host_mmvq_bit_exact(native_lib, rng, ggml_type, tokens):
    from ggml_ciq import native

    rows, k = 37, K_OF[ggml_type]
    w = random_table(rng, ggml_type, rows, k)
    x = activations(rng, tokens, k)
    assert native.quantize_activations(x, "mmvq", ggml_type, "cpu").tobytes() == Q.quantize_q8_1(x).tobytes()
    plan = native.plan("auto", "cpu", "mmvq", ggml_type, rows, k, tokens)
    assert (plan.variant, plan.semantics, plan.layout) == ("mmvq", "mmvq", "q8_1")
    native.dispatch_reset()
    out = native.gemm(w, x, variant="auto", device="cpu", semantics="mmvq", ggml_type=ggml_type, rows=rows, k=k)
    assert {key: n for key, n in native.dispatch_counts().items() if n} == {("mmvq", Q.type_name(ggml_type)): 1}
    assert np.array_equal(out, Q.gemm_mmvq_semantics(ggml_type, w, rows, k, x))


def test_api_mmvq_refuses(native_lib, rng):
    from ggml_ciq import native
    from ggml_ciq.errors import CiqError

    w = random_table(rng, Q.Q4_K, 4, 256)
    with pytest.raises(CiqError, match="1..8 tokens, not 9"):
        native.gemm(w, np.ones((9, 256), np.float32), variant="mmvq", device="cpu", ggml_type=Q.Q4_K, rows=4, k=256)
    with pytest.raises(CiqError, match="float32 output only"):
        native.gemm(w, np.ones((2, 256), np.float32), variant="mmvq", device="cpu", ggml_type=Q.Q4_K, rows=4, k=256,
                    out_type="bf16")
    with pytest.raises(CiqError, match="mmvq"):  # the host AUTO has no mmvq above 8 tokens
        native.plan("auto", "cpu", "mmvq", Q.Q4_K, 4, 256, 9)


def test_diff_reference_semantics():
    """`diff --reference llamacpp-cuda` compares with the arithmetic llama.cpp runs for the token count."""
    from ggml_ciq.diff import reference_semantics

    assert [reference_semantics("llamacpp-cuda", Q.Q4_K, n) for n in (1, 2, 5, 8, 9, 17)] == ["mmvq"] * 4 + ["mmq"] * 2
    assert reference_semantics("llamacpp-cuda", Q.Q6_K, 7, (12, 0)) == "mmvq"
    assert reference_semantics("llamacpp-cuda", Q.Q6_K, 8, (12, 0)) == "mmq"
    assert {reference_semantics("llamacpp-cpu", t, n) for t in TYPES for n in (1, 8, 9)} == {"cpu"}


@pytest.fixture(scope="module")
def gpu(native_lib):
    from ggml_ciq import native

    if native.device_count() == 0:
        pytest.skip("no CUDA device (or libggml_ciq built without CUDA)")


def test_gpu_auto_small_batch(gpu):
    """AUTO at 1..8 tokens is never less exact than llama.cpp: K-quants take MMVQ's own arithmetic, the 32-block types
    MMQ's formula (as exact as MMVQ for Q8_0, more for Q4_0/Q5_0); above 8 tokens wgmma (Hopper) or mma."""
    from ggml_ciq import native

    for t in TYPES:
        for tokens in (1, 5, 8):
            want = "mmvq" if t in K_QUANTS else "q32"
            assert native.resolve_variant("auto", "cuda", "any", t, 1024, 2048, tokens) == want
    assert native.resolve_variant("auto", "cuda", "any", Q.Q4_K, 1024, 2048, 9) in ("wgmma", "mma")


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_gpu_mmvq_bit_exact_on_gpu_bytes(gpu, rng, ggml_type, tokens):
    """The CUDA kernel on the GPU's own q8_1 bytes against the reference on the same bytes (the GPU flushes
    subnormals, none occur here), and its quantizer against the host's within the documented tie flips."""
    from ggml_ciq import native

    rows, k = 1013, K_OF[ggml_type]
    w = random_table(rng, ggml_type, rows, k)
    x = activations(rng, tokens, k)
    xq = native.quantize_activations(x, "mmvq", ggml_type, "cuda").view(Q.Q8_1_DTYPE).reshape(tokens, k // 32)
    host = Q.quantize_q8_1(x)
    assert np.array_equal(xq["d"], host["d"]) and np.array_equal(xq["s"], host["s"])
    assert np.abs(xq["qs"].astype(int) - host["qs"]).max() <= 1
    native.dispatch_reset()
    out = native.gemm(w, x, variant="mmvq", device="cuda", ggml_type=ggml_type, rows=rows, k=k)
    assert native.dispatch_counts()[("mmvq", Q.type_name(ggml_type))] == 1
    ref = Q.gemm_mmvq_semantics_quantized(ggml_type, w, rows, k, xq)
    assert np.array_equal(out, ref), f"{np.sum(out != ref)} of {out.size} differ, NMSE {Q.nmse(out, ref):.1e}"


@pytest.mark.parametrize("ggml_type", TYPES, ids=IDS)
@pytest.mark.parametrize("tokens", [1, 2, 5, 8])
def test_gpu_mmvq_matches_llamacpp_cuda(gpu, llama, rng, ggml_type, tokens):
    """Same semantics as llama.cpp CUDA at 1..8 tokens: <= 1e-10 (the same float order: expected bit-exact)."""
    from ggml_ciq import native

    if "CUDA0" not in llama.devices():
        pytest.skip(f"llama.cpp at {llama.lib_dir} has no CUDA device (GGML_CIQ_LLAMACPP_LIB: a CUDA build)")
    rows, k = 1013, K_OF[ggml_type]
    w = random_table(rng, ggml_type, rows, k)
    x = activations(rng, tokens, k)
    theirs = llama.mul_mat(ggml_type, w, rows, k, x, device="CUDA0")
    ours = native.gemm(w, x, variant="auto", device="cuda", semantics="mmvq", ggml_type=ggml_type, rows=rows, k=k)
    print(f"{Q.type_name(ggml_type)} tokens={tokens}: NMSE {Q.nmse(ours, theirs):.1e}, "
          f"bit-exact {np.array_equal(ours, theirs)}")
    assert Q.nmse(ours, theirs) <= 1e-10
