"""llama.cpp's whole-model steps in a child process, so that a crash inside llama.cpp ends that step, not ours.

llama.cpp can die by a signal in code we do not own (0c1e570's AMX mul_mat segfaults on Q4_K weights, upstream issue
ggml-org/llama.cpp#20824; an assert aborts). `run_isolated(step, func, ...)` runs `func(emit, ...)` in a fresh
interpreter (multiprocessing "spawn": no CUDA context or lock is inherited). The child hands back what it finished as
it goes: `emit(key, value)` stores each value at once under a temporary directory (numpy arrays as .npy, read back
memory-mapped; anything else pickled), and `emit.progress(text)` reaches the parent's progress callback. The parent
gets every emitted value; when the child died by a signal it raises LlamaCppCrash carrying the values emitted before
the crash and llama.cpp's last log line, so a command can still report what did finish. An exception the child
raises (a CiqError: a bad file, an unknown device) is raised again in the parent as it was.

A test makes llama.cpp crash for real at a named point with GGML_CIQ_TEST_CRASH=<point> (`crash_point`): the child
then calls into libllama with a null model, which faults inside llama.cpp.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import signal
import tempfile
import traceback
from pathlib import Path

import numpy as np

from .errors import BackendError, LlamaCppCrash
from .llamacpp import host_cpu_flags

CRASH_ENV = "GGML_CIQ_TEST_CRASH"
_INDEX, _LOG = "index", "llama.log"


class _Emitter:
    """The child's side: each value stored under `directory` at once, the keys in order in its index file."""

    def __init__(self, directory: Path, connection):
        self.directory, self.connection, self.count = directory, connection, 0

    def __call__(self, key: str, value) -> None:
        stem = f"{self.count:03d}"
        if isinstance(value, np.ndarray):
            np.save(self.directory / f"{stem}.npy", value, allow_pickle=False)
        else:
            with open(self.directory / f"{stem}.pkl", "wb") as f:
                pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        with open(self.directory / _INDEX, "a") as f:  # after the value: a listed key is complete
            f.write(f"{stem}\t{key}\n")
        self.count += 1

    def progress(self, text: str) -> None:
        self.connection.send(("progress", text))


def _child(directory: str, connection, func, args, kwargs) -> None:
    from .llama_model import _Library

    _Library.log_path = Path(directory) / _LOG  # llama.cpp's log lines reach the disk as they come
    emit = _Emitter(Path(directory), connection)
    try:
        func(emit, *args, **kwargs)
        connection.send(("done", None))
    except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
        try:
            pickle.dumps(exc)
            connection.send(("error", exc))
        except Exception:  # an exception that does not pickle: its text
            connection.send(("error", BackendError(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")))


def _read(directory: Path) -> dict:
    index = directory / _INDEX
    out = {}
    if not index.exists():
        return out
    for line in index.read_text().splitlines():
        stem, key = line.split("\t", 1)
        npy = directory / f"{stem}.npy"
        if npy.exists():
            out[key] = np.load(npy, mmap_mode="r")  # the mapping outlives the file's removal
        else:
            with open(directory / f"{stem}.pkl", "rb") as f:
                out[key] = pickle.load(f)
    return out


def _last_line(path: Path) -> str | None:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


def _signal_name(exitcode: int) -> str:
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


def run_isolated(step: str, func, *args, progress=None, **kwargs) -> dict:
    """func(emit, *args, **kwargs) in a child process; every value it emitted, by key. `step` names what runs in
    the crash message ("its CPU arm"). progress(text) for each emit.progress(text) of the child."""
    directory = Path(tempfile.mkdtemp(prefix="ggml-ciq-llamacpp-"))
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(str(directory), sender, func, args, kwargs), daemon=True)
    outcome = None
    try:
        process.start()
        sender.close()
        while True:
            try:
                kind, value = receiver.recv()
            except EOFError:  # the child is gone
                break
            if kind == "progress":
                if progress:
                    progress(value)
            else:
                outcome = (kind, value)
        process.join()
        finished = _read(directory)
        last_log = _last_line(directory / _LOG)
    finally:
        if process.is_alive():  # interrupted: take the child with us
            process.kill()
            process.join()
        receiver.close()
        shutil.rmtree(directory, ignore_errors=True)
    if outcome is not None and outcome[0] == "error":
        raise outcome[1]
    if outcome is None or process.exitcode != 0:
        code = process.exitcode
        if code is not None and code < 0:
            detail = f"llama.cpp's last log line: {last_log!r}" if last_log else "no log line from llama.cpp"
            if any(flag.startswith("amx") for flag in host_cpu_flags()):
                detail += ("; this CPU has AMX, whose llama.cpp 0c1e570 mul_mat is known to crash on Q4_K weights "
                           "loaded with the CPU extra buffer types (upstream issue ggml-org/llama.cpp#20824)")
            raise LlamaCppCrash(step, _signal_name(code), detail, finished)
        raise BackendError(f"llama.cpp's process for {step} exited with status {code} before it finished")
    return finished


def crash_point(name: str) -> None:
    """Tests: with GGML_CIQ_TEST_CRASH=name, fault inside libllama here (llama_model_n_layer of a null model)."""
    if os.environ.get(CRASH_ENV) == name:
        from .llama_model import _Library, ffi

        _Library.load().lib.llama_model_n_layer(ffi.NULL)
