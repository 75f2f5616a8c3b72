"""Attention benchmarks: our attention kernels against llama.cpp's FLASH_ATTN_EXT in one process, on the same q and
f16 K/V caches, with the NMSE between the two outputs (`ggml-ciq bench attention`, docs/BENCH_JSON.md).

A case is one ciq_attention call as a prefill micro-batch makes it: `tokens` queries at positions n_past.., `heads`
query heads over `heads_kv` K/V heads of `head_dim`, causal, optionally a sliding window. GPU times: CUDA events
around `copies` back-to-back calls (ours) and a ggml graph of `copies` FLASH_ATTN_EXT nodes on the same inputs
(llama.cpp's, wall clock with its synchronize), per call, median of `repeat`; CPU: wall clock, one call at a time.
TFLOP/s counts the visible (query, key) pairs only: 4 * head_dim * heads flops each (q.k and p.v).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from . import native, quants
from .bench import _median_us, _time_gpu_us
from .errors import CiqError, InvalidArgumentError, UnsupportedTypeError

GPU_COPIES = 10  # calls per timed batch on a GPU (launch overhead amortized on both sides)


@dataclass(frozen=True)
class AttentionCase:
    tokens: int
    n_past: int
    heads: int
    heads_kv: int
    head_dim: int
    window: int = 0

    @property
    def label(self) -> str:
        return f"{self.tokens}:{self.n_past}:{self.heads}:{self.heads_kv}:{self.head_dim}:{self.window}"

    @property
    def visible_pairs(self) -> int:
        """(query, key) pairs a head attends: query t sees n_past + t + 1 keys, at most `window`."""
        seen = self.n_past + np.arange(1, self.tokens + 1, dtype=np.int64)
        return int(np.minimum(seen, self.window).sum() if self.window else seen.sum())

    @property
    def flops(self) -> float:
        return 4.0 * self.head_dim * self.heads * self.visible_pairs


def parse_case(text: str) -> AttentionCase:
    """'TOKENS:N_PAST:HEADS:HEADS_KV:HEAD_DIM[:WINDOW]' -> AttentionCase."""
    parts = text.split(":")
    if len(parts) not in (5, 6) or not all(p.isdigit() for p in parts):
        raise InvalidArgumentError(f"bad --case {text!r} (expected TOKENS:N_PAST:HEADS:HEADS_KV:HEAD_DIM[:WINDOW], "
                                   f"e.g. 512:0:32:8:128)")
    case = AttentionCase(*map(int, parts))
    if min(case.tokens, case.heads, case.heads_kv, case.head_dim) < 1:
        raise InvalidArgumentError(f"--case {text}: TOKENS, HEADS, HEADS_KV and HEAD_DIM must be >= 1")
    if case.heads % case.heads_kv:
        raise InvalidArgumentError(f"--case {text}: {case.heads} heads cannot share {case.heads_kv} K/V heads")
    return case


# The micro-batches of a 4096- and 8192-token prefill at n_ubatch 512: the first, and the last (most cached keys).
CASE_SETS = {
    "gemma3-270m": ["512:0:4:1:256:512", "512:3584:4:1:256:512", "512:0:4:1:256", "512:3584:4:1:256"],
    "llama3-8b": ["512:0:32:8:128", "512:1536:32:8:128", "512:7680:32:8:128"],
}


def case_set(name: str) -> list[AttentionCase]:
    if name not in CASE_SETS:
        raise InvalidArgumentError(f"unknown case set {name!r} (choose from {', '.join(CASE_SETS)})")
    return [parse_case(c) for c in CASE_SETS[name]]


@dataclass
class AttentionRow:
    tokens: int
    n_past: int
    heads: int
    heads_kv: int
    head_dim: int
    window: int
    kernel: str
    us: float
    tflops: float
    llamacpp_us: float | None
    speedup: float | None       # llama.cpp's time / ours
    nmse_vs_llamacpp: float | None


def default_kernels(device: str) -> list[str]:
    return ["simt", "mma", "mma_llamacpp", "wgmma"] if device == "cuda" else ["cpu", "ggml"]


def bench_attention(cases: list[AttentionCase], device: str, kernels: list[str], repeat: int = 5,
                    llamacpp: bool = True, threads: int | None = None, progress=None,
                    skipped: list | None = None) -> list[AttentionRow]:
    """Every kernel and llama.cpp's FLASH_ATTN_EXT on every case. A kernel that does not run a case (its head_dim on
    this device) has no row there, and llama.cpp's columns stay empty where its device refuses the case: each such
    (case, who, why) is appended to `skipped`."""
    skipped = [] if skipped is None else skipped
    from .ops import NativeOps

    llama = None
    if llamacpp:
        from .llamacpp import LlamaCpp

        llama = LlamaCpp.load()
        ggml_device = "CUDA0" if device == "cuda" else "CPU"
        if ggml_device not in llama.devices():
            raise InvalidArgumentError(f"llama.cpp at {llama.lib_dir} has no {ggml_device} device (point "
                                       f"GGML_CIQ_LLAMACPP_LIB at a CUDA build, or pass --no-llamacpp)")
    if device == "cpu" and threads:
        native.set_num_threads(threads)
    rows = []
    rng = np.random.default_rng(0)
    for case in cases:
        scale = 1.0 / np.sqrt(case.head_dim)
        n_kv = case.n_past + case.tokens
        q = rng.standard_normal((case.tokens, case.heads, case.head_dim)).astype(np.float32)
        k = rng.standard_normal((n_kv, case.heads_kv, case.head_dim)).astype(np.float16)
        v = rng.standard_normal((n_kv, case.heads_kv, case.head_dim)).astype(np.float16)
        llama_us = reference = None
        if llama is not None:
            from .llamacpp import AttentionGraph

            copies = GPU_COPIES if device == "cuda" else 1
            try:
                with AttentionGraph(llama, ggml_device, case.tokens, case.heads, case.heads_kv, case.head_dim,
                                    case.n_past, scale, case.window, copies=copies, threads=threads) as g:
                    g.set_inputs(q, k, v)
                    llama_us = _median_us(g.compute, 2, repeat) / copies
                    reference = g.output()
            except UnsupportedTypeError as exc:
                skipped.append((case.label, "llama.cpp", str(exc)))
        for kernel in kernels:
            ops = NativeOps(device, attention_kernel=kernel)
            try:
                ops.attention_kernel_name(case.head_dim)
                us, out = _time_ours(ops, case, q, k, v, scale, repeat)
            except CiqError as exc:  # this kernel does not run this case here: printed and saved, not silent
                skipped.append((case.label, kernel, str(exc)))
                if progress:
                    progress()
                continue
            rows.append(AttentionRow(case.tokens, case.n_past, case.heads, case.heads_kv, case.head_dim, case.window,
                                     kernel, us, case.flops / us * 1e-6, llama_us,
                                     None if llama_us is None else llama_us / us,
                                     None if reference is None else quants.nmse(out, reference)))
            if progress:
                progress()
    return rows


def _time_ours(ops, case: AttentionCase, q, k, v, scale: float, repeat: int) -> tuple[float, np.ndarray]:
    """Median microseconds of one ciq_attention call, and its output."""
    n = ops.native
    qd, kd, vd = ops.asarray(q), ops.asarray(k, np.float16), ops.asarray(v, np.float16)
    out = ops.empty((case.tokens, case.heads * case.head_dim))
    args = (ops.device, ops._attention_kernel_id, ops._fp(qd), ops._u16(kd), ops._u16(vd), case.tokens, case.heads, case.heads_kv,
            case.head_dim, k.shape[0], case.n_past, float(scale), case.window, ops._fp(out))

    def call(_=None):
        n.check(n.lib.ciq_attention(*args))

    if ops.device >= 0:
        us = statistics.median(_time_gpu_us(call, GPU_COPIES, ops.device, 2, repeat))
    else:
        us = _median_us(call, 1, repeat)
    return us, out.numpy()
