"""GEMM benchmarks: our kernels against llama.cpp's mul_mat on the same weights, threads and activations."""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import native, quants
from .environment import ciq_commit, cpu_model, gpus
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


# every weight type a kernel of ours multiplies: the K-quant kernels' (Q5_K: host cpu, GPU mma) and the q32 kernel's
BENCH_TYPES = quants.HOST_KEEP_QUANT_TYPES + quants.Q32_TYPES + quants.Q32_1_TYPES


def parse_shape(text: str) -> Shape:
    """'Q4_K:ROWS:K' -> Shape."""
    parts = text.split(":")
    names = {v: k for k, v in quants.TYPE_NAMES.items()}
    if len(parts) != 3 or parts[0].upper() not in names or not parts[1].isdigit() or not parts[2].isdigit():
        raise InvalidArgumentError(f"bad --shape {text!r} (expected TYPE:ROWS:K, e.g. Q4_K:4096:4096)")
    shape = Shape(names[parts[0].upper()], int(parts[1]), int(parts[2]))
    if shape.rows < 1 or shape.k < 1:
        raise InvalidArgumentError(f"--shape {text}: ROWS and K must be >= 1")
    if shape.ggml_type not in BENCH_TYPES:
        raise InvalidArgumentError(f"--shape {text}: our GEMM kernels take {', '.join(map(quants.type_name, BENCH_TYPES))}")
    quants.row_bytes(shape.ggml_type, shape.k)
    return shape


def model_shapes(model: ModelFile) -> list[Shape]:
    """The distinct weight shapes of a model that our kernels multiply (K-quants, 32-block types), each with the
    bytes of its first tensor."""
    seen: dict[tuple, Shape] = {}
    for t in model.weights(BENCH_TYPES):
        key = (t.ggml_type, t.rows, t.k)
        if key not in seen:
            seen[key] = Shape(t.ggml_type, t.rows, t.k, t.raw())
    return list(seen.values())


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


def _interleaved_median_us(a, b, warmup: int, repeat: int) -> tuple[float, float]:
    """Medians of a and b timed alternately (a b a b ...), so drift in machine load hits both alike."""
    for _ in range(warmup):
        a()
        b()
    times_a, times_b = [], []
    for _ in range(repeat):
        for fn, times in ((a, times_a), (b, times_b)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times_a) * 1e6, statistics.median(times_b) * 1e6


def bench_cpu(shapes: list[Shape], tokens_list: list[int], threads: int, repeat: int = 5, warmup: int = 1,
              progress=None) -> list[CpuRow]:
    """Our CPU GEMM (activation quantization included) vs llama.cpp CPU mul_mat, same threads."""
    from .llamacpp import LlamaCpp, MulMatGraph

    llama = LlamaCpp.load()
    native.set_num_threads(threads)
    n = native.load()
    rows_out = []
    for shape in shapes:
        data = shape.data if shape.data is not None else random_blocks(shape)
        problem = native.GemmProblem.upload(shape.ggml_type, data, shape.rows, shape.k, "cpu")
        for tokens in tokens_list:
            x = np.random.default_rng(tokens).standard_normal((tokens, shape.k)).astype(np.float32)
            out = np.empty((tokens, shape.rows), np.float32)
            xp, op = n.ffi.from_buffer("float[]", x), n.ffi.from_buffer(out)

            def ours():  # the registry's host kernel for the type in llama.cpp CPU's semantics (cpu or q32)
                n.check(n.lib.ciq_gemm(n.lib.CIQ_DEVICE_CPU, n.lib.CIQ_VARIANT_AUTO, n.lib.CIQ_SEMANTICS_CPU,
                                       shape.ggml_type, problem.weight.ptr, problem.weight.nbytes, shape.rows, shape.k,
                                       xp, tokens, op, n.lib.CIQ_OUT_F32))

            with MulMatGraph(llama, "CPU", shape.ggml_type, shape.rows, shape.k, tokens, threads=threads) as graph:
                graph.set_weights(data)
                graph.set_input(x)
                llama_us, ours_us = _interleaved_median_us(graph.compute, ours, warmup, repeat)
            rows_out.append(CpuRow(quants.type_name(shape.ggml_type), shape.rows, shape.k, tokens, ours_us,
                                   llama_us, ours_us / llama_us))
            if progress:
                progress()
        problem.close()
    return rows_out


def cpu_environment(threads: int) -> dict:
    from .llamacpp import LlamaCpp

    llama = LlamaCpp.load()
    return {"device": f"CPU: {cpu_model()}", "threads": threads, "ggml_ciq_commit": ciq_commit(),
            "ggml_ciq": native.build_info(), "llamacpp_version": llama.version, "llamacpp_commit": llama.commit,
            "llamacpp_lib": str(llama.lib_dir)}


def rows_to_json(rows) -> list[dict]:
    return [asdict(r) for r in rows]


# ----------------------------------------------------------------------------------------------
# GPU: our variants and llama.cpp's CUDA mul_mat in one process, weights rotated through more than the L2.

SHAPE_SETS = {
    "seed6": ([(3072, 2048), (12288, 2048), (2048, 6144)], [128]),
    "llama3-8b": ([(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096)], [512]),
}
ROTATION_BYTES = 192 << 20  # > 3x the H200's 60 MB L2


def shape_set(name: str) -> tuple[list[Shape], list[int]]:
    if name not in SHAPE_SETS:
        raise InvalidArgumentError(f"unknown shape set {name!r} (choose from {', '.join(SHAPE_SETS)})")
    dims, tokens = SHAPE_SETS[name]
    return [Shape(t, r, k) for t in quants.KEEP_QUANT_TYPES for r, k in dims], tokens


def random_blocks(shape: Shape, seed: int = 0) -> np.ndarray:
    """Valid random blocks, fast at any size: random quants and scales, fp16 (super-)block scales near 1e-3 (Q4_K:
    d and dmin at bytes 0-3, Q5_K and Q4_1/Q5_1 (d, m) too; Q6_K: d at 208; Q4_0/Q5_0/Q8_0: d at bytes 0-1 of every
    32-value block)."""
    rng = np.random.default_rng(seed)
    values, block_bytes = quants.BLOCK_LAYOUT[shape.ggml_type]
    quants.row_bytes(shape.ggml_type, shape.k)  # ShapeError unless K is whole blocks
    blocks = rng.integers(0, 256, size=(shape.rows * shape.k // values, block_bytes), dtype=np.uint8)
    halves = (np.abs(rng.normal(1e-3, 3e-4, size=(blocks.shape[0], 2))) + 1e-5).astype(np.float16).view(np.uint8)
    if shape.ggml_type in (quants.Q4_K, quants.Q5_K) + quants.Q32_1_TYPES:
        blocks[:, 0:4] = halves.reshape(-1, 4)
    elif shape.ggml_type == quants.Q6_K:
        blocks[:, 208:210] = halves[:, 0:2]
    else:
        blocks[:, 0:2] = halves[:, 0:2]
    return blocks.reshape(-1)


@dataclass
class GpuRow:
    type: str
    rows: int
    k: int
    tokens: int
    variant: str
    us: float               # median per GEMM, activation quantization included
    best_us: float          # best batch
    gemm_only_us: float     # median per GEMM on pre-quantized activations
    tflops: float           # from the median
    llamacpp_us: float | None
    speedup: float | None   # llama.cpp time / ours
    bf16_us: float | None   # dense bf16 cuBLAS GEMM of the same shape (the ceiling)
    bf16_fraction: float | None  # bf16 time / ours = our fraction of the ceiling
    host_us: float | None = None  # median host time per call (activation quantization included): near `us`, host-bound


def _time_gpu_us(launch, n: int, device: int, warmup: int, repeat: int, host: list | None = None) -> list[float]:
    """Per-launch times of `repeat` timed batches of n launches, with device events; `host`, when given, gets each
    batch's host time per launch (the loop's wall time before its sync: where it reaches the device time, the calls
    are bound by the host, not the GPU)."""
    n_ = native.load()
    for i in range(warmup):
        launch(i)
    samples = []
    for _ in range(repeat):
        timer = n_.ffi.new("void **")
        n_.check(n_.lib.ciq_timer_start(device, timer))
        t0 = time.perf_counter()
        for i in range(n):
            launch(i)
        t1 = time.perf_counter()
        ms = n_.ffi.new("float *")
        n_.check(n_.lib.ciq_timer_stop(timer[0], ms))
        samples.append(ms[0] * 1e3 / n)
        if host is not None:
            host.append((t1 - t0) * 1e6 / n)
    return samples


class GpuProblem:
    """One shape on the GPU: `copies` weight buffers (rotated past the L2), activations, output, launchers."""

    def __init__(self, shape: Shape, tokens: int, device: int = 0):
        self.n = native.load()
        self.shape, self.tokens, self.device = shape, tokens, device
        self.data = shape.data if shape.data is not None else random_blocks(shape)
        self.copies = max(2, min(16, -(-ROTATION_BYTES // self.data.nbytes)))
        self.weights = [native.Buffer.from_array(device, self.data) for _ in range(self.copies)]
        self.x = np.random.default_rng(tokens).standard_normal((tokens, shape.k)).astype(np.float32)
        self.xb = native.Buffer.from_array(device, self.x)
        self.out = native.Buffer(device, tokens * shape.rows * 4)
        self.quantized: dict[int, native.Buffer] = {}  # by activation layout

    @property
    def flops(self) -> float:
        return 2.0 * self.shape.rows * self.shape.k * self.tokens

    def launcher(self, variant: str, gemm_only: bool = False):
        """A launch of the variant in its own semantics: ciq_gemm (activation quantization included), or with
        gemm_only ciq_gemm_quantized on activations quantized once per the plan's layout."""
        n, s = self.n, self.shape
        plan = n.ffi.new("ciq_plan *")
        n.check(n.lib.ciq_gemm_plan(self.device, native.variant_id(variant), n.lib.CIQ_SEMANTICS_ANY, s.ggml_type,
                                    s.rows, s.k, self.tokens, plan))
        xp = n.ffi.cast("float *", self.xb.ptr)
        # Each launch one C call on arguments made beforehand (a copy's): the harness's own Python per call kept to
        # the call itself, as llama.cpp's side pays one Python call for a graph of `copies` mul_mats.
        if not gemm_only:
            fn = n.lib.ciq_gemm
            argsets = [(self.device, plan.variant, plan.semantics, s.ggml_type, w.ptr, w.nbytes, s.rows, s.k, xp,
                        self.tokens, self.out.ptr, n.lib.CIQ_OUT_F32) for w in self.weights]
        else:
            if plan.activation_layout not in self.quantized:
                qb = native.Buffer(self.device, plan.activation_bytes)
                n.check(n.lib.ciq_activations_quantize(self.device, plan.activation_layout, xp, qb.ptr, self.tokens,
                                                       s.k))
                self.quantized[plan.activation_layout] = qb
            qb = self.quantized[plan.activation_layout]
            fn = n.lib.ciq_gemm_quantized
            argsets = [(self.device, plan, s.ggml_type, w.ptr, w.nbytes, s.rows, s.k, qb.ptr, self.tokens,
                        self.out.ptr, n.lib.CIQ_OUT_F32) for w in self.weights]
        copies, check = self.copies, n.check

        def launch(i):
            status = fn(*argsets[i % copies])
            if status:
                check(status)
        return launch

    def time(self, launch, repeat: int, host: list | None = None) -> list[float]:
        return _time_gpu_us(launch, 2 * self.copies, self.device, 2, repeat, host)

    def time_bf16(self, repeat: int) -> float:
        """Median time of cuBLAS bf16 out = X @ W^T on bf16 copies of the same shape (random values)."""
        n, s = self.n, self.shape
        copies = max(2, min(16, -(-ROTATION_BYTES // (s.rows * s.k * 2))))
        rng = np.random.default_rng(1)
        w = (rng.standard_normal((s.rows, s.k), dtype=np.float32) * 0.02).view(np.uint32) >> 16
        x = rng.standard_normal((self.tokens, s.k), dtype=np.float32).view(np.uint32) >> 16
        weights = [native.Buffer.from_array(self.device, w.astype(np.uint16)) for _ in range(copies)]
        with native.Buffer.from_array(self.device, x.astype(np.uint16)) as xb:
            def launch(i):
                n.check(n.lib.ciq_gemm_dense_bf16(self.device, weights[i % copies].ptr, s.rows, s.k, xb.ptr,
                                                  self.tokens, self.out.ptr, n.lib.CIQ_OUT_F32))
            times = _time_gpu_us(launch, 2 * copies, self.device, 2, repeat)
        for b in weights:
            b.close()
        return statistics.median(times)

    def time_llamacpp(self, llama, repeat: int) -> float:
        """llama.cpp's CUDA mul_mat: a graph of `copies` mul_mats on distinct weight copies, per mul_mat."""
        from .llamacpp import MulMatGraph

        s = self.shape
        with MulMatGraph(llama, "CUDA0", s.ggml_type, s.rows, s.k, self.tokens, copies=self.copies) as g:
            g.set_weights(self.data)
            g.set_input(self.x)
            return _median_us(g.compute, 2, repeat) / self.copies

    def close(self) -> None:
        for b in [*self.weights, self.xb, self.out, *self.quantized.values()]:
            b.close()


def _llamacpp_cuda():
    from .llamacpp import LlamaCpp

    llama = LlamaCpp.load()
    if "CUDA0" not in llama.devices():
        raise InvalidArgumentError(f"llama.cpp at {llama.lib_dir} has no CUDA0 device "
                                   f"(point GGML_CIQ_LLAMACPP_LIB at a CUDA build, or pass --no-llamacpp)")
    return llama


def runs(variant: str, shape: Shape, tokens: int) -> bool:
    """Whether a variant multiplies this shape's weight type at this token count and K (mmvq: 1..8 tokens; q32: the
    32-block types; wgmma: every type, the 32-block ones at K a multiple of 64; the others: the K-quants)."""
    info = native.variant_info(variant)
    return (info.min_tokens <= tokens <= info.max_tokens and shape.ggml_type in info.weight_types
            and shape.k % info.k_multiple == 0)


def bench_gpu(shapes: list[Shape], tokens_list: list[int], variants: list[str], repeat: int = 5,
              llamacpp: bool = True, ceiling: bool = True, device: int = 0, progress=None) -> list[GpuRow]:
    """Every variant, llama.cpp and the bf16 ceiling on every shape and token count."""
    llama = _llamacpp_cuda() if llamacpp else None
    rows_out = []
    for shape in shapes:
        for tokens in tokens_list:
            takers = [v for v in variants if runs(v, shape, tokens)]
            if progress:
                for _ in range(len(variants) - len(takers)):
                    progress()
            if not takers:  # no variant asked for multiplies this case: nothing to time, not even llama.cpp
                continue
            p = GpuProblem(shape, tokens, device)
            try:
                llama_us = p.time_llamacpp(llama, repeat) if llama is not None else None
                bf16_us = p.time_bf16(repeat) if ceiling else None
                for variant in takers:
                    host: list[float] = []
                    times = p.time(p.launcher(variant), repeat, host)
                    us = statistics.median(times)
                    gemm_us = statistics.median(p.time(p.launcher(variant, gemm_only=True), repeat))
                    rows_out.append(GpuRow(quants.type_name(shape.ggml_type), shape.rows, shape.k, tokens, variant,
                                           us, min(times), gemm_us, p.flops / us * 1e-6, llama_us,
                                           None if llama_us is None else llama_us / us, bf16_us,
                                           None if bf16_us is None else bf16_us / us, statistics.median(host)))
                    if progress:
                        progress()
            finally:
                p.close()
    return rows_out


@dataclass
class AbRow:
    type: str
    rows: int
    k: int
    tokens: int
    a_us: float
    b_us: float
    ratio: float  # a time / b time: > 1 means B is faster


def bench_ab(shapes: list[Shape], tokens_list: list[int], a: str, b: str, repeat: int = 7, device: int = 0,
             progress=None) -> list[AbRow]:
    """Two variants timed alternately (A B A B ...) on the same buffers, per-shape median ratio; the cases that not
    both multiply are skipped (InvalidArgumentError when that is every case)."""
    rows_out = []
    cases = [(shape, tokens) for shape in shapes for tokens in tokens_list
             if runs(a, shape, tokens) and runs(b, shape, tokens)]
    if not cases:
        raise InvalidArgumentError(f"--ab {a},{b}: no shape and token count that both variants multiply")
    if progress:
        for _ in range(len(shapes) * len(tokens_list) - len(cases)):
            progress()
    for shape, tokens in cases:
        p = GpuProblem(shape, tokens, device)
        try:
            la, lb = p.launcher(a), p.launcher(b)
            ta, tb = [], []
            for _ in range(repeat):
                ta += p.time(la, 1)
                tb += p.time(lb, 1)
            a_us, b_us = statistics.median(ta), statistics.median(tb)
            rows_out.append(AbRow(quants.type_name(shape.ggml_type), shape.rows, shape.k, tokens, a_us, b_us,
                                  a_us / b_us))
            if progress:
                progress()
        finally:
            p.close()
    return rows_out


def plot_gpu(rows: list[GpuRow], path: str, title: str) -> None:
    """Grouped bars of TFLOP/s per shape, one bar per variant; llama.cpp and the bf16 ceiling as markers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys((r.type, r.rows, r.k, r.tokens) for r in rows))
    variants = list(dict.fromkeys(r.variant for r in rows))
    by = {(r.type, r.rows, r.k, r.tokens, r.variant): r for r in rows}
    width = 0.8 / max(1, len(variants))
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(shapes)), 5))
    for i, v in enumerate(variants):
        xs = [j + (i - (len(variants) - 1) / 2) * width for j in range(len(shapes))]
        ax.bar(xs, [by[(*s, v)].tflops if (*s, v) in by else 0 for s in shapes], width, label=v)
    for j, s in enumerate(shapes):
        any_row = next(r for r in rows if (r.type, r.rows, r.k, r.tokens) == s)
        flops = 2.0 * s[1] * s[2] * s[3]
        if any_row.llamacpp_us:
            ax.hlines(flops / any_row.llamacpp_us * 1e-6, j - 0.45, j + 0.45, colors="black",
                      label="llama.cpp MMQ" if j == 0 else None)
        if any_row.bf16_us:
            ax.hlines(flops / any_row.bf16_us * 1e-6, j - 0.45, j + 0.45, colors="gray", linestyles="dashed",
                      label="bf16 cuBLAS" if j == 0 else None)
    ax.set_xticks(range(len(shapes)), [f"{t}\n{r}x{k}\nn={n}" for t, r, k, n in shapes], fontsize=8)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_json(json_path: str, png_path: str) -> None:
    """Plot a saved GPU bench file (fields missing from older files count as absent)."""
    import json

    data = json.loads(Path(json_path).read_text())
    fields = GpuRow.__dataclass_fields__
    rows = [GpuRow(**{name: r.get(name) for name in fields}) for r in data["rows"]]
    for r in rows:
        r.tflops = r.tflops or 2.0 * r.rows * r.k * r.tokens / r.us * 1e-6
    plot_gpu(rows, png_path, f"keep-quant GEMM on {data['environment']['device']} "
                             f"(ggml-ciq {data['environment'].get('ggml_ciq_commit')})")


def gpu_environment(device: int = 0, llamacpp: bool = True) -> dict:
    env = {"device": native.device_name(device), "ggml_ciq_commit": ciq_commit(), "ggml_ciq": native.build_info(),
           "rotation_bytes": ROTATION_BYTES}
    env["nvidia_smi"] = gpus()
    if llamacpp:
        from .llamacpp import LlamaCpp

        llama = LlamaCpp.load()
        env.update(llamacpp_version=llama.version, llamacpp_commit=llama.commit, llamacpp_lib=str(llama.lib_dir))
    return env


def geomean(values) -> float:
    values = list(values)
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


def geomeans(rows: list[GpuRow]) -> dict:
    """Geomean speedup over llama.cpp per (variant, type)."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.speedup:
            groups.setdefault(f"{r.variant}/{r.type}", []).append(r.speedup)
    return {k: geomean(v) for k, v in groups.items()}
