"""Calls from several Python threads at once (cffi releases the GIL during each library call): each thread's own
GEMMs and prefills give the same bits as the same calls made one after another, and the library's last-error
message is per thread (an error in one thread neither changes nor shows up in another)."""

import threading

import numpy as np
import pytest

from ggml_ciq import native
from ggml_ciq.engine import Transformer
from ggml_ciq.errors import CiqError

TENSORS = ("blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.1.attn_q.weight", "blk.1.ffn_down.weight")


def _last_error() -> str:
    """The calling thread's last library error message (the one raw call here; the C names are about to change)."""
    n = native.load()
    return n.ffi.string(n.lib.ciq_last_error()).decode(errors="replace")


def _run_threads(targets) -> None:
    """Start every target at once (a barrier), join them, re-raise the first failure."""
    start = threading.Barrier(len(targets), timeout=120)
    failures = []

    def wrap(target):
        def run():
            try:
                start.wait()
                target()
            except BaseException as exc:  # reported in the main thread
                failures.append(exc)
        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
        assert not t.is_alive(), "a thread did not finish in 300 s"
    if failures:
        raise failures[0]


def test_gemms_and_prefills_from_threads_match_serial(native_lib, default_model, rng):
    """Four threads, each with its own weight (Q4_K and Q6_K, 128 to 1536 rows) and token counts (1, 7, 16, 33),
    repeat their GEMMs while two more threads prefill through engines of their own; every result equals the
    serial one bit for bit."""
    jobs = []
    for name, tokens in zip(TENSORS, (1, 7, 16, 33)):
        w = default_model.tensor(name)
        jobs.append((w, rng.standard_normal((tokens, w.k)).astype(np.float32)))
    serial = [native.gemm(w, x, variant="cpu") for w, x in jobs]
    prompts = ([1, 5, 9, 200, 33], [2, 400, 3, 77, 8, 11, 12, 13, 14])
    engines = [Transformer(default_model, device="cpu") for _ in prompts]
    serial_logits = [engine.forward(p) for engine, p in zip(engines, prompts)]

    def gemm_thread(i):
        w, x = jobs[i]

        def run():
            problem = native.GemmProblem.upload(w.ggml_type, w.raw(), w.rows, w.k)
            try:
                for repeat in range(12):
                    out = problem.run(x, variant="cpu") if repeat % 2 else native.gemm(w, x, variant="cpu")
                    assert np.array_equal(out, serial[i]), f"{w.name}: thread result differs from the serial one"
            finally:
                problem.close()
        return run

    def engine_thread(i):
        def run():
            for _ in range(4):
                assert np.array_equal(engines[i].forward(prompts[i]), serial_logits[i])
        return run

    _run_threads([gemm_thread(i) for i in range(len(jobs))] + [engine_thread(i) for i in range(len(prompts))])


def test_error_messages_stay_in_their_thread(native_lib, default_model, rng):
    """Thread A's call fails (wgmma on the CPU), then thread B's (mma), then thread C succeeds, in that order (a
    barrier between steps): afterwards each thread still reads its own message, and a successful call in between
    changes neither."""
    w = default_model.tensor("blk.0.attn_k.weight")
    x = rng.standard_normal((3, w.k)).astype(np.float32)
    expected = native.gemm(w, x, variant="cpu")
    step = threading.Barrier(3, timeout=120)  # a failed thread breaks it for the others
    seen = {}

    def failing(variant):
        def run():
            if variant == "mma":
                step.wait()  # after A's failure
            with pytest.raises(CiqError, match=variant):
                native.gemm(w, x, variant=variant)
            if variant == "wgmma":
                step.wait()  # A failed; B goes next
            step.wait()  # B failed
            step.wait()  # C succeeded
            seen[variant] = _last_error()
        return run

    def succeeding():
        step.wait()
        step.wait()
        assert np.array_equal(native.gemm(w, x, variant="cpu"), expected)
        step.wait()
        seen["cpu"] = _last_error()

    _run_threads([failing("wgmma"), failing("mma"), succeeding])
    assert "wgmma" in seen["wgmma"] and "mma" in seen["mma"] and "wgmma" not in seen["mma"], seen
    assert "mma" not in seen["cpu"], seen  # C never failed: it sees neither A's nor B's message
