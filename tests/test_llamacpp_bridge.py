"""Tests of the llama.cpp bridge (ggml_ciq.llamacpp); skipped when llama.cpp's libraries are absent."""

import os

import numpy as np
import pytest

pytest.importorskip("cffi")

from ggml_ciq.errors import BackendError, LibraryNotFoundError, ShapeError, UnsupportedTypeError  # noqa: E402
from ggml_ciq import llamacpp  # noqa: E402
from ggml_ciq.llamacpp import F32, Q4_K, Q6_K, Q8_K, LlamaCpp, MulMatGraph  # noqa: E402

try:
    BRIDGE = LlamaCpp.load()
except LibraryNotFoundError as e:
    if os.environ.get("GGML_CIQ_REQUIRE_LLAMACPP"):
        raise
    pytest.skip(f"llama.cpp not available: {e}", allow_module_level=True)


def nmse(got, ref):
    ref = np.asarray(ref, dtype=np.float64)
    return float(np.sum((np.asarray(got, dtype=np.float64) - ref) ** 2) / np.sum(ref ** 2))


def test_library_info():
    assert BRIDGE.lib_dir == llamacpp.find_library_dir()
    assert "CPU" in BRIDGE.devices()
    assert BRIDGE.version is None or isinstance(BRIDGE.version, str)
    assert LlamaCpp.load() is BRIDGE
    assert (BRIDGE.type_size(Q4_K), BRIDGE.block_size(Q4_K), BRIDGE.type_name(Q4_K)) == (144, 256, "q4_K")
    assert (BRIDGE.type_size(Q6_K), BRIDGE.type_size(Q8_K), BRIDGE.type_size(F32)) == (210, 292, 4)


def test_ggml_libraries_opened_by_their_soname_file(tmp_path):
    """llama-cpp-python's wheel holds libggml.so, libggml.so.0 and libggml.so.0.25.3 as copies, not links; libllama
    links libggml.so.0 by soname. ggml's libraries are opened as that file (one ggml in the process, whichever of
    `import llama_cpp` and ours comes first: the plugin's devices in the registry libllama reads); libllama itself as
    libllama.so, the file llama-cpp-python opens; a plain libggml.so where there is no soname file."""
    for name in ("libggml.so", "libggml.so.0", "libggml.so.0.25.3", "libggml-base.so", "libggml-base.so.0",
                 "libllama.so", "libllama.so.0"):
        (tmp_path / name).write_bytes(b"")
    assert llamacpp._lib_file(tmp_path, "ggml").name == "libggml.so.0"
    assert llamacpp._lib_file(tmp_path, "ggml-base").name == "libggml-base.so.0"
    assert llamacpp._lib_file(tmp_path, "llama").name == "libllama.so"
    (tmp_path / "libggml.so.0").unlink()
    assert llamacpp._lib_file(tmp_path, "ggml").name == "libggml.so"
    assert llamacpp._lib_file(tmp_path, "ggml-cpu") is None


def test_find_library_dir_errors(tmp_path, monkeypatch):
    with pytest.raises(LibraryNotFoundError, match="GGML_CIQ_LLAMACPP_LIB"):
        llamacpp.find_library_dir(tmp_path)
    monkeypatch.setenv(llamacpp.ENV_VAR, str(tmp_path))
    with pytest.raises(LibraryNotFoundError, match="not found"):
        llamacpp.find_library_dir()
    assert llamacpp.find_library_dir(BRIDGE.lib_dir) == BRIDGE.lib_dir


@pytest.mark.parametrize("tokens", [1, 7])
@pytest.mark.parametrize("k", [37, 256])
def test_mul_mat_f32_matches_numpy(rng, tokens, k):
    rows = 3
    w = rng.standard_normal((rows, k), dtype=np.float32)
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    out = BRIDGE.mul_mat(F32, w.view(np.uint8), rows, k, x, threads=2)
    assert out.shape == (tokens, rows) and out.dtype == np.float32
    assert nmse(out, x.astype(np.float64) @ w.T.astype(np.float64)) < 1e-12


@pytest.mark.parametrize("ggml_type, block_bytes, bar", [(Q4_K, 144, 1e-2), (Q6_K, 210, 1e-3)])
def test_quantize_dequantize_round_trip(rng, ggml_type, block_bytes, bar):
    rows, k = 3, 512
    x = rng.standard_normal((rows, k), dtype=np.float32)
    q = BRIDGE.quantize_chunk(ggml_type, x)
    assert q.dtype == np.uint8 and q.size == rows * k // 256 * block_bytes
    y = BRIDGE.dequantize(ggml_type, q, rows * k)
    assert y.dtype == np.float32 and y.shape == (rows * k,)
    assert nmse(y, x.reshape(-1)) < bar


def test_quantized_mul_mat_close_to_dequantized_reference(rng):
    rows, k, tokens = 5, 512, 3
    q = BRIDGE.quantize_chunk(Q4_K, rng.standard_normal((rows, k), dtype=np.float32))
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    ref = x.astype(np.float64) @ BRIDGE.dequantize(Q4_K, q, rows * k).reshape(rows, k).T.astype(np.float64)
    assert nmse(BRIDGE.mul_mat(Q4_K, q, rows, k, x), ref) < 1e-3  # only Q8_K activation error


def test_quantize_row_q8_K_ref(rng):
    x = rng.standard_normal(2 * 256, dtype=np.float32)
    q = BRIDGE.quantize_row_q8_K_ref(x)
    assert q.dtype == np.uint8 and q.size == 2 * 292
    for b in range(2):
        block = x[256 * b:256 * (b + 1)]
        vmax = block[np.argmax(np.abs(block))]
        expected = np.float32(1) / (np.float32(-127) / vmax)
        assert q[292 * b:292 * b + 4].view(np.float32)[0] == expected
    assert not BRIDGE.quantize_row_q8_K_ref(np.zeros(256, dtype=np.float32)).any()


def test_mul_mat_graph_copies_match_mul_mat(rng):
    rows, k, tokens, copies = 4, 256, 7, 3
    weights = [BRIDGE.quantize_chunk(Q4_K, rng.standard_normal((rows, k), dtype=np.float32))
               for _ in range(copies)]
    x = rng.standard_normal((tokens, k), dtype=np.float32)
    with MulMatGraph(BRIDGE, "CPU", Q4_K, rows, k, tokens, copies=copies, threads=2) as graph:
        # the CPU backend's plain buffer: none of its extra buffer types (the AMX mul_mat that crashes on Q4_K, the
        # repacked layouts), whatever the CPU has (issue 35)
        assert graph.buffer_name == "CPU"
        graph.set_weights(weights)
        graph.set_input(x)
        graph.compute()
        outputs = [graph.output(i) for i in range(copies)]
        graph.compute()  # recomputing is stable
        np.testing.assert_array_equal(graph.output(2), outputs[2])
    for w, out in zip(weights, outputs):
        np.testing.assert_array_equal(out, BRIDGE.mul_mat(Q4_K, w, rows, k, x, threads=2))
    assert not np.array_equal(outputs[0], outputs[1])
    with pytest.raises(BackendError, match="closed"):
        graph.compute()


def test_mul_mat_graph_one_weight_for_all_copies(rng):
    w = rng.standard_normal((3, 8), dtype=np.float32)
    with MulMatGraph(BRIDGE, "cpu", F32, 3, 8, 2, copies=2) as graph:
        with pytest.raises(BackendError, match="before compute"):
            graph.compute()
        graph.set_weights(w.tobytes())
        graph.set_input(np.ones((2, 8), dtype=np.float32))
        graph.compute()
        np.testing.assert_array_equal(graph.output(0), graph.output(1))
        with pytest.raises(ShapeError):
            graph.output(2)
        with pytest.raises(ShapeError, match="expected 2 weight buffers"):
            graph.set_weights([w, w, w])
        with pytest.raises(ShapeError, match="expected"):
            graph.set_input(np.ones((3, 8), dtype=np.float32))


def test_bad_inputs_raise(rng):
    x = rng.standard_normal((2, 256), dtype=np.float32)
    q = BRIDGE.quantize_chunk(Q4_K, rng.standard_normal((3, 256), dtype=np.float32))
    with pytest.raises(ShapeError, match="432"):
        BRIDGE.mul_mat(Q4_K, q[:-1], 3, 256, x)
    with pytest.raises(BackendError, match='unknown device "CUDA7".*CPU'):
        BRIDGE.mul_mat(Q4_K, q, 3, 256, x, device="CUDA7")
    with pytest.raises(ShapeError, match="multiple of"):
        BRIDGE.mul_mat(Q4_K, np.zeros(144, dtype=np.uint8), 1, 100, x[:, :100])
    with pytest.raises(ShapeError, match="multiple of"):
        BRIDGE.quantize_chunk(Q4_K, x[:, :100])
    with pytest.raises(ShapeError):
        BRIDGE.mul_mat(Q4_K, q, 3, 256, x[:, :128])
    with pytest.raises(ShapeError):
        BRIDGE.mul_mat(Q4_K, q, 3, 256, x[0])
    with pytest.raises(ShapeError):
        BRIDGE.mul_mat(Q4_K, q, 0, 256, x)
    with pytest.raises(ShapeError, match="bytes"):
        BRIDGE.dequantize(Q4_K, q[:100], 768)
    with pytest.raises(ShapeError, match="block size 256"):
        BRIDGE.quantize_row_q8_K_ref(np.ones(100, dtype=np.float32))
    with pytest.raises(UnsupportedTypeError):
        BRIDGE.mul_mat(Q8_K, np.zeros(292 * 3, dtype=np.uint8), 3, 256, x)
    with pytest.raises(UnsupportedTypeError):
        BRIDGE.type_name(1000)
    with pytest.raises(UnsupportedTypeError):
        BRIDGE.block_size(4)  # removed Q4_2
    with pytest.raises(UnsupportedTypeError):
        BRIDGE.dequantize(Q8_K, np.zeros(292, dtype=np.uint8), 256)
    with pytest.raises(BackendError, match="threads"):
        BRIDGE.mul_mat(Q4_K, q, 3, 256, x, threads=0)


def test_captured_log_keeps_its_newest_lines():
    """libllama's captured log is bounded (a context logs ~120 lines; an unbounded list grew 15 KB a context), and
    `log[start:]` with start from an earlier len(log) still gives the lines logged since, as far as they are kept."""
    from ggml_ciq.llama_model import _Log

    log = _Log(max_lines=5)
    for i in range(3):
        log.append(f"a{i}")
    start = len(log)
    for i in range(4):
        log.append(f"b{i}")
    assert len(log) == 7 and log[start:] == ["b0", "b1", "b2", "b3"]
    assert log[0:] == ["a2", "b0", "b1", "b2", "b3"]  # a0, a1 dropped
    assert log[len(log):] == []
    with pytest.raises(TypeError):
        log[2]
