"""GEMM benchmarks: our kernels against llama.cpp's mul_mat on the same weights, threads and activations."""

from __future__ import annotations

import platform
import statistics
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import native, quants
from .errors import InvalidArgumentError
from .model import ModelFile


@dataclass(frozen=True)
class Shape:
    ggml_type: int
    rows: int
    k: int
    data: np.ndarray | None = field(default=None, compare=False, repr=False)  # real bytes, else synthetic

    @property
    def label(self) -> str:
        return f"{quants.type_name(self.ggml_type)}:{self.rows}:{self.k}"


def parse_shape(text: str) -> Shape:
    """'Q4_K:ROWS:K' -> Shape."""
    parts = text.split(":")
    names = {v: k for k, v in quants.TYPE_NAMES.items()}
    if len(parts) != 3 or parts[0].upper() not in names or not parts[1].isdigit() or not parts[2].isdigit():
        raise InvalidArgumentError(f"bad --shape {text!r} (expected TYPE:ROWS:K, e.g. Q4_K:4096:4096)")
    shape = Shape(names[parts[0].upper()], int(parts[1]), int(parts[2]))
    if shape.ggml_type not in quants.KEEP_QUANT_TYPES:
        raise InvalidArgumentError(f"--shape {text}: keep-quant kernels take Q4_K or Q6_K")
    quants.row_bytes(shape.ggml_type, shape.k)
    return shape


def model_shapes(model: ModelFile) -> list[Shape]:
    """The distinct keep-quant weight shapes of a model, each with the bytes of its first tensor."""
    seen: dict[tuple, Shape] = {}
    for t in model.weights():
        key = (t.ggml_type, t.rows, t.k)
        if key not in seen:
            seen[key] = Shape(t.ggml_type, t.rows, t.k, t.raw())
    return list(seen.values())


def synthetic_weight(shape: Shape, seed: int = 0) -> np.ndarray:
    """Random weight bytes of the shape, quantized with our simple quantizer."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((shape.rows, shape.k)).astype(np.float32) * 0.02
    return quants.quantize_q4_K(w) if shape.ggml_type == quants.Q4_K else quants.quantize_q6_K(w)


@dataclass
class CpuRow:
    type: str
    rows: int
    k: int
    tokens: int
    ciq_us: float
    llamacpp_us: float
    ratio: float  # ours / llama.cpp (lower is better)


def _median_us(fn, warmup: int, repeat: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_cpu(shapes: list[Shape], tokens_list: list[int], threads: int, repeat: int = 5, warmup: int = 1,
              progress=None) -> list[CpuRow]:
    """Our CPU GEMM (activation quantization included) vs llama.cpp CPU mul_mat, same threads."""
    from .llamacpp import LlamaCpp, MulMatGraph

    llama = LlamaCpp.load()
    native.set_num_threads(threads)
    n = native.load()
    rows_out = []
    for shape in shapes:
        data = shape.data if shape.data is not None else synthetic_weight(shape)
        problem = native.GemmProblem.upload(shape.ggml_type, data, shape.rows, shape.k, "cpu")
        for tokens in tokens_list:
            x = np.random.default_rng(tokens).standard_normal((tokens, shape.k)).astype(np.float32)
            out = np.empty((tokens, shape.rows), np.float32)
            xp, op = n.ffi.from_buffer("float[]", x), n.ffi.from_buffer(out)

            def ours():
                n.check(n.lib.ciq_gemm(-1, native.variant_id("cpu"), 0, shape.ggml_type, problem.weight.ptr,
                                       problem.weight.nbytes, shape.rows, shape.k, xp, tokens, op, 0))

            with MulMatGraph(llama, "CPU", shape.ggml_type, shape.rows, shape.k, tokens, threads=threads) as graph:
                graph.set_weights(data)
                graph.set_input(x)
                llama_us = _median_us(graph.compute, warmup, repeat)
            ours_us = _median_us(ours, warmup, repeat)
            rows_out.append(CpuRow(quants.type_name(shape.ggml_type), shape.rows, shape.k, tokens, ours_us,
                                   llama_us, ours_us / llama_us))
            if progress:
                progress()
        problem.close()
    return rows_out


def git_commit(path: Path | None = None) -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path or Path(__file__).parent,
                              capture_output=True, text=True, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_environment(threads: int) -> dict:
    from .llamacpp import LlamaCpp

    llama = LlamaCpp.load()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"device": f"CPU: {cpu}", "threads": threads, "ggml_ciq_commit": git_commit(),
            "ggml_ciq": native.build_info(), "llamacpp_version": llama.version, "llamacpp_commit": llama.commit,
            "llamacpp_lib": str(llama.lib_dir)}


def rows_to_json(rows) -> list[dict]:
    return [asdict(r) for r in rows]
