"""llama.cpp's steps in child processes (isolation.py) and its loads without CPU extra buffer types (issue 35: on CPUs
with AMX, llama.cpp 0c1e570's AMX mul_mat segfaults on Q4_K weights): a crash is reported as llama.cpp's, exit 1, with
what finished kept; every load records which llama.cpp CPU path ran."""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

from ggml_ciq.errors import BackendError, InvalidArgumentError, LlamaCppCrash
from ggml_ciq.isolation import CRASH_ENV, run_isolated
from ggml_ciq.llama_model import EXTRA_BUFFER_TYPES


def _emits_then(emit, then: str, seed: int):
    """A child step: two values emitted, a progress line, then `then` (return, raise, exit 3, or die by SIGSEGV)."""
    emit("array", np.random.default_rng(seed).standard_normal((3, 5)).astype(np.float32))
    emit("meta", {"seed": seed, "words": ["a", "b"]})
    emit.progress("half way")
    if then == "raise":
        raise InvalidArgumentError("a bad argument, raised in the child")
    if then == "exit":
        os._exit(3)
    if then == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    emit("last", 7)


def test_values_come_back_in_order_with_progress():
    seen = []
    got = run_isolated("a test step", _emits_then, "return", 5, progress=seen.append)
    assert list(got) == ["array", "meta", "last"] and seen == ["half way"]
    np.testing.assert_array_equal(got["array"], np.random.default_rng(5).standard_normal((3, 5)).astype(np.float32))
    assert got["meta"] == {"seed": 5, "words": ["a", "b"]} and got["last"] == 7


def test_a_signal_is_a_crash_with_what_finished():
    with pytest.raises(LlamaCppCrash) as info:
        run_isolated("its CPU arm", _emits_then, "segv", 6)
    crash = info.value
    assert crash.signal_name == "SIGSEGV" and crash.step == "its CPU arm"
    assert str(crash).startswith("llama.cpp crashed (SIGSEGV) in its CPU arm: ")
    assert sorted(crash.finished) == ["array", "meta"] and crash.finished["meta"]["seed"] == 6
    assert crash.to_json()["signal"] == "SIGSEGV"


def test_the_child_s_exception_and_exit_status_reach_the_parent():
    with pytest.raises(InvalidArgumentError, match="raised in the child"):
        run_isolated("a test step", _emits_then, "raise", 7)
    with pytest.raises(BackendError, match="exited with status 3 before it finished"):
        run_isolated("a test step", _emits_then, "exit", 8)


def _cli(*args, crash: str | None = None, timeout: int = 600):
    env = dict(os.environ)
    env.pop(CRASH_ENV, None)
    if crash:
        env[CRASH_ENV] = crash
    return subprocess.run([sys.executable, "-m", "ggml_ciq.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.parametrize("crash,step,finished", [
    ("llama.cpp spread", "its spread arm", ["llama.cpp", "ours llamacpp", "ours exact", "reference"]),
    ("llama.cpp", "its CPU arm", ["ours llamacpp", "ours exact", "reference"]),
])
def test_compare_reports_a_llamacpp_crash_and_keeps_the_arms_that_finished(llama, default_model, tmp_path, crash,
                                                                          step, finished):
    """A real fault inside libllama (isolation.crash_point) in one of llama.cpp's arms: exit 1, one line naming the
    signal and the arm, every finished arm printed and in --json with the crash, the verdict not met."""
    out = tmp_path / "c.json"
    proc = _cli("compare", str(default_model.path), "--tokens", "19", "--repeat", "1", "--json", str(out),
                crash=crash)
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"ggml-ciq: llama.cpp crashed (SIGSEGV) in {step}: "), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    data = json.loads(out.read_text())
    assert [a["name"] for a in data["arms"]] == finished
    assert [e["step"] for e in data["errors"]] == [step] and data["errors"][0]["signal"] == "SIGSEGV"
    assert data["verdict"]["met"] is False
    for name in finished:
        assert name in proc.stdout
    assert data["llamacpp"]["extra_buffers"] is False


def test_diff_prompt_reports_a_llamacpp_crash(llama, default_model):
    proc = _cli("diff", str(default_model.path), "--prompt", "Hello world", crash="capture")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]  # its CPU capture; its CUDA capture where --reference auto takes CUDA
    assert re.match(r"ggml-ciq: llama\.cpp crashed \(SIGSEGV\) in its (CPU|CUDA) capture: ", last), last
    assert "Traceback" not in proc.stderr


def test_diff_prompt_keeps_the_diff_when_the_spread_prefill_crashes(llama, default_model, tmp_path):
    """A fault in llama.cpp's second (spread) prefill: the diff on the finished capture is printed and written, its
    layers held to the layer bar alone, the crash its last line and in --json; exit 1."""
    out = tmp_path / "d.json"
    proc = _cli("diff", str(default_model.path), "--prompt", "Hello world", "--reference", "llamacpp-cpu",
                "--spread", "on", "--json", str(out), crash="spread")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ggml-ciq: llama.cpp crashed (SIGSEGV) in its spread prefill: "), last
    assert "Traceback" not in proc.stderr and "PASS: 15 tensors judged" in proc.stdout
    data = json.loads(out.read_text())
    assert [e["step"] for e in data["errors"]] == ["its spread prefill"] and data["spread"] is None
    assert len(data["layers"]) == 2 and all(d["spread"] is None and d["bar"] == 1e-4 for d in data["layers"])


def test_libllama_loads_without_extra_buffer_types_and_says_so(llama, default_model):
    """The default load puts no weight into CPU_REPACK / AMX buffers; extra_buffers=True is llama.cpp's own default
    (its REPACK feature then moves the Q4_K weights there; only loaded here, never decoded: on AMX that is the crash).
    The provenance names the build's CPU path and the host's AMX / AVX-512 flags."""
    from ggml_ciq.llama_model import LlamaModel

    with LlamaModel(default_model.path, threads=1) as model:
        provenance = model.provenance()
    assert provenance["extra_buffers"] is False and provenance["weight_buffers"]
    assert not set(provenance["weight_buffers"]) & set(EXTRA_BUFFER_TYPES)
    assert provenance["llamacpp_cpu_path"] in ("avx2", "avx512-vnni", "other")
    assert isinstance(provenance["host_cpu_flags"], list)
    if "REPACK" in provenance["llamacpp_cpu_features"] and provenance["llamacpp_cpu_path"] != "other":
        try:  # in a child: on an AMX CPU even the load may die
            buffers = run_isolated("a load with extra buffer types", _weight_buffers, str(default_model.path))["buffers"]
        except LlamaCppCrash as crash:
            assert any(flag.startswith("amx") for flag in provenance["host_cpu_flags"]), str(crash)
        else:
            assert set(buffers) & set(EXTRA_BUFFER_TYPES), buffers


def _weight_buffers(emit, path: str):
    from ggml_ciq.llama_model import LlamaModel

    with LlamaModel(path, threads=1, extra_buffers=True) as model:
        emit("buffers", model.weight_buffers)


def test_extra_buffers_flag(llama, default_model):
    """--llamacpp-extra-buffers belongs to llama.cpp's model loads (compare, diff --prompt): elsewhere a one-line
    error; on, a warning that names the upstream issue, and on an AMX CPU the crash comes back as llama.cpp's."""
    proc = _cli("diff", str(default_model.path), "--llamacpp-extra-buffers")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--llamacpp-extra-buffers" in proc.stderr
    proc = _cli("compare", str(default_model.path), "--tokens", "9", "--repeat", "1", "--reference", "off",
                "--llamacpp-extra-buffers")
    assert "20824" in proc.stdout, proc.stdout[-2000:]
    assert proc.returncode == 0 or (proc.returncode == 1 and "llama.cpp crashed" in proc.stderr), proc.stderr[-2000:]
