"""Host memory stays flat when the library is called thousands of times, as the engine and the ggml plugin call it:
2,000 GEMM calls and 200 engine prefills on the CPU, the resident set size (RSS) measured after a warm-up and at the
end. Each loop also checks that the same inputs give the same bits every time and takes error paths (a refused
variant, a wrong activation shape), whose messages must not pile up either.

One OpenMP thread (this thread's setting, restored after): on a loaded 2-core machine a two-thread team spins on
its barrier and a 128-row GEMM takes 30 ms instead of 0.3 ms; the allocations under test are the same.
tools/gpu_memory_repeat.py does the same for device memory on a GPU.
"""

import gc

import numpy as np
import pytest

from ggml_ciq import catalog, native
from ggml_ciq.engine import Transformer
from ggml_ciq.errors import CiqError, ShapeError

FLAT_BYTES = 4 * 2**20  # "within a few MiB" after warm-up; 1,800 library buffers of 4 KiB left unfreed: +7.9 MiB


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    pytest.skip("no /proc/self/status")


@pytest.fixture
def one_thread(native_lib):
    threads = native.build_info()["threads"]
    native.set_num_threads(1)
    yield
    native.set_num_threads(threads)


def _flat(label: str, before: int, after: int, calls: int) -> None:
    print(f"{label}: RSS {before / 2**20:.1f} MiB after warm-up, {after / 2**20:.1f} MiB after {calls} more calls "
          f"({(after - before) / 2**10:+.0f} KiB)")
    assert after - before < FLAT_BYTES, f"{label}: RSS grew {(after - before) / 2**20:.1f} MiB"


def test_gemm_2000_calls(one_thread, default_model, rng):
    """Alternately a one-shot gemm() (weight uploaded to a library buffer and freed) and a GemmProblem reused, on a
    Q4_K and a Q6_K weight, 1..9 tokens; every 50th call is refused (by the library: a GPU variant on the CPU; or by
    Python: a wrong activation shape)."""
    q4, q6 = default_model.tensor("blk.0.attn_k.weight"), default_model.tensor("blk.0.attn_v.weight")
    assert (q4.type_name, q6.type_name) == ("Q4_K", "Q6_K")
    inputs = [rng.standard_normal((tokens, q4.k)).astype(np.float32) for tokens in range(1, 10)]
    problem = native.GemmProblem.upload(q6.ggml_type, q6.raw(), q6.rows, q6.k)
    first = {}
    warm_up, calls, before = 200, 2000, None
    try:
        for i in range(calls):
            if i == warm_up:
                gc.collect()
                before = rss_bytes()
            x = inputs[i % len(inputs)]
            if i % 50 == 49:
                with pytest.raises(CiqError if i % 100 == 49 else ShapeError):
                    if i % 100 == 49:
                        native.gemm(q4, x, variant="wgmma")  # a GPU variant on the CPU
                    else:
                        problem.run(x[:, :-1], variant="cpu")
                continue
            out = native.gemm(q4, x, variant="cpu") if i % 2 else problem.run(x, variant="cpu")
            key = (i % 2, len(x))
            if key not in first:
                assert not np.isnan(out).any()
                first[key] = out
            elif i % 10 == 0:
                assert np.array_equal(out, first[key])
    finally:
        problem.close()
    gc.collect()
    _flat("2,000 GEMM calls", before, rss_bytes(), calls - warm_up)


def test_engine_200_prefills(one_thread, default_model):
    """200 prefills of 3..7 tokens through one engine (the K/V cache grows to 7 positions in the warm-up, then is
    reused); every prompt length gives the same logits each time."""
    engine = Transformer(default_model, device="cpu")
    prompts = [[1, 17, 300, 42, 7, 99, 260][:n] for n in range(3, 8)]
    first = {}
    warm_up, calls, before = 20, 200, None
    for i in range(calls):
        if i == warm_up:
            gc.collect()
            before = rss_bytes()
        tokens = prompts[i % len(prompts)]
        logits = engine.forward(tokens)
        if len(tokens) not in first:
            first[len(tokens)] = logits
        else:
            assert np.array_equal(logits, first[len(tokens)])
    gc.collect()
    _flat("200 engine prefills", before, rss_bytes(), calls - warm_up)


def test_small_model_prefills_after_a_reload(one_thread, tmp_path):
    """A second architecture (qwen3) through engines built and dropped 20 times: weights, ops and caches freed."""
    path = catalog.write_small_model(tmp_path / "qwen3.gguf", "qwen3")
    from ggml_ciq.model import ModelFile

    before = None
    for i in range(25):
        if i == 5:
            gc.collect()
            before = rss_bytes()
        engine = Transformer(ModelFile(path), device="cpu")
        engine.forward([1, 2, 3, 4])
        del engine
    gc.collect()
    _flat("20 qwen3 engines built, run and dropped", before, rss_bytes(), 20)
