"""End-to-end comparison with llama.cpp on one GGUF: the same tokens through libllama (llama_model.py) and through
our engine; prefill tokens/s of each, logits agreement over all positions, memory of each."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import quants
from .errors import InvalidArgumentError, OutOfMemoryError, UnsupportedTypeError

# Real English for --tokens N without a prompt (Jane Austen, Pride and Prejudice, chapter 1; public domain),
# repeated to length.
TEXT = ("It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want "
        "of a wife. However little known the feelings or views of such a man may be on his first entering a "
        "neighbourhood, this truth is so well fixed in the minds of the surrounding families, that he is considered "
        "the rightful property of some one or other of their daughters. \"My dear Mr. Bennet,\" said his lady to him "
        "one day, \"have you heard that Netherfield Park is let at last?\" Mr. Bennet replied that he had not. "
        "\"But it is,\" returned she; \"for Mrs. Long has just been here, and she told me all about it.\" Mr. Bennet "
        "made no answer. \"Do you not want to know who has taken it?\" cried his wife impatiently. \"You want to tell "
        "me, and I have no objection to hearing it.\" This was invitation enough. \"Why, my dear, you must know, Mrs. "
        "Long says that Netherfield is taken by a young man of large fortune from the north of England; that he came "
        "down on Monday in a chaise and four to see the place, and was so much delighted with it, that he agreed "
        "with Mr. Morris immediately; that he is to take possession before Michaelmas, and some of his servants are "
        "to be in the house by the end of next week.\"")

TOP1_BAR, KLD_BAR = 0.99, 1e-3  # the agreement bars (top-1 over all positions, mean KL divergence)


def prompt_tokens(llama, n_tokens: int | None, prompt: str | None) -> list[int]:
    """llama.cpp's tokens (BOS as by default) of `prompt` or of TEXT; with n_tokens, the text is repeated until
    there are n_tokens and cut there."""
    text = TEXT if prompt is None else prompt
    tokens = llama.tokenize(text)
    if n_tokens is None:
        return tokens
    if n_tokens < 1:
        raise InvalidArgumentError(f"--tokens must be >= 1, got {n_tokens}")
    more = llama.tokenize(" " + text, add_special=False)
    if not more:
        raise InvalidArgumentError("the prompt has no tokens to repeat")
    while len(tokens) < n_tokens:
        tokens += more
    return tokens[:n_tokens]


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def logits_agreement(ours: np.ndarray, theirs: np.ndarray, chunk: int = 64) -> dict:
    """Over all positions, llama.cpp as the reference P: top-1 agreement, KL(P || ours) per position (mean, max,
    all), NMSE of the logits."""
    ours, theirs = np.asarray(ours, np.float32), np.asarray(theirs, np.float32)
    if ours.shape != theirs.shape:
        raise InvalidArgumentError(f"logits shapes differ: ours {ours.shape}, llama.cpp {theirs.shape}")
    kld = np.empty(len(theirs))
    for s in range(0, len(theirs), chunk):
        logp, logq = _log_softmax(theirs[s:s + chunk]), _log_softmax(ours[s:s + chunk])
        kld[s:s + chunk] = (np.exp(logp) * (logp - logq)).sum(-1)
    top1 = ours.argmax(-1) == theirs.argmax(-1)
    return {"positions": len(theirs), "top1": float(top1.mean()), "top1_mismatches": np.flatnonzero(~top1).tolist(),
            "kld_mean": float(kld.mean()), "kld_max": float(kld.max()), "nmse": quants.nmse(ours, theirs),
            "kld_per_position": kld.tolist()}


@dataclass
class Side:
    """One implementation's run: seconds per timed prefill, tokens/s (median), memory in bytes."""
    name: str
    seconds: list[float]
    tokens_per_second: float
    memory: dict = field(default_factory=dict)


@dataclass
class CompareResult:
    model: str
    device: str
    tokens: int
    repeat: int
    flash_attn: bool
    llamacpp: Side
    ours: Side
    speedup: float                      # ours / llama.cpp tokens/s
    memory_ratio: float | None          # ours ops.memory_bytes() / llama.cpp's buffers on the device
    agreement: dict
    bars: dict
    environment: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"schema": "docs/COMPARE_JSON.md", **asdict(self)}


def _median_tps(n_tokens: int, seconds: list[float]) -> float:
    return n_tokens / float(np.median(seconds))


def engine_memory(engine, cuda_used_growth: int | None) -> dict:
    """Our engine's footprint: ops.memory_bytes() (weights, caches, activations by the ops contract) and its KV
    cache's bytes where the engine exposes them; on CUDA the device memory growth over load + one prefill."""
    ops = getattr(engine, "ops", None)
    return {"ops_memory_bytes": int(ops.memory_bytes()) if ops is not None else None,
            "kv_cache_bytes": _nbytes(getattr(engine, "kv_cache", None)), "cuda_used_growth": cuda_used_growth}


def _nbytes(obj) -> int | None:
    if obj is None:
        return None
    if hasattr(obj, "nbytes"):
        return int(obj.nbytes)
    values = obj.values() if isinstance(obj, dict) else obj
    return sum(_nbytes(v) or 0 for v in values)


def _timed(prefill, repeat: int, progress, side: str) -> list[float]:
    """perf_counter seconds of `repeat` prefills (after the caller's warm-up, which progress counts too)."""
    if progress:
        progress(side)
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        prefill()
        seconds.append(time.perf_counter() - start)
        if progress:
            progress(side)
    return seconds


def _check_logits_memory(n_tokens: int, n_vocab: int) -> None:
    """Both sides' logits of every position are held in host memory (float32): OutOfMemoryError, before either side
    runs, when they would not fit in the free memory with room for the models."""
    import os

    need = 2 * n_tokens * n_vocab * 4
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if need > 0.8 * free:
        raise OutOfMemoryError(f"the logits of {n_tokens} positions x {n_vocab} tokens, ours and llama.cpp's, need "
                               f"{need / 2**30:.1f} GiB of host memory; {free / 2**30:.1f} GiB is free")


def run_compare(path, n_tokens: int | None = 512, prompt: str | None = None, repeat: int = 3, device: str = "cpu",
                threads: int | None = None, flash_attn: bool | None = None, progress=None) -> CompareResult:
    """llama.cpp first (warm-up prefill with all logits, then `repeat` timed prefills with the last token's logits,
    as llama-bench), freed before our engine runs the same tokens the same way. flash_attn: llama.cpp's (None:
    on for CUDA, off on the CPU; see LlamaContext). progress(side) after each prefill."""
    from . import native
    from .engine import ARCHITECTURES, Transformer
    from .llama_model import CudaMemory, LlamaModel, memory_growth
    from .model import ModelFile

    if repeat < 1:
        raise InvalidArgumentError(f"--repeat must be >= 1, got {repeat}")
    threads = threads or native.build_info()["threads"]  # the same threads for both sides
    native.set_num_threads(threads)
    model = ModelFile(path)
    if model.config.architecture not in ARCHITECTURES:  # before llama.cpp spends its time
        raise UnsupportedTypeError(f"{path}: architecture {model.config.architecture} is not supported by the engine "
                                   f"(supported: {', '.join(ARCHITECTURES)})")
    with LlamaModel(path, device=device, threads=threads) as llama:
        tokens = prompt_tokens(llama, n_tokens, prompt)
        _check_logits_memory(len(tokens), llama.n_vocab)
        with llama.context_for(len(tokens), n_batch=512, flash_attn=flash_attn) as ctx:
            flash_attn, n_ctx = ctx.flash_attn, ctx.n_ctx
            theirs = ctx.prefill(tokens, all_logits=True)
            seconds = _timed(lambda: ctx.prefill(tokens, all_logits=False), repeat, progress, "llama.cpp")
            llama_side = Side("llama.cpp", seconds, _median_tps(len(tokens), seconds), ctx.memory())

    cuda = CudaMemory() if device == "cuda" else None
    used_before = cuda.used() if cuda else None
    engine = Transformer(model, device=device, n_ctx=n_ctx, n_ubatch=512)  # llama.cpp's context and micro-batch
    ours = engine.forward(tokens, all_logits=True)
    seconds = _timed(lambda: engine.forward(tokens, all_logits=False), repeat, progress, "ours")
    growth = memory_growth(used_before, cuda.used() if cuda else None)
    our_side = Side("ggml-ciq", seconds, _median_tps(len(tokens), seconds), engine_memory(engine, growth))

    agreement = logits_agreement(np.asarray(ours).reshape(theirs.shape), theirs)
    bars = {"top1_bar": TOP1_BAR, "kld_bar": KLD_BAR,
            "met": agreement["top1"] >= TOP1_BAR and agreement["kld_mean"] <= KLD_BAR}
    ours_bytes = our_side.memory["ops_memory_bytes"]
    memory_ratio = None if ours_bytes is None else ours_bytes / llama_side.memory["device_buffers_total"]
    return CompareResult(str(path), device, len(tokens), repeat, flash_attn, llama_side, our_side,
                         our_side.tokens_per_second / llama_side.tokens_per_second, memory_ratio, agreement, bars)


def load_compare_json(path) -> CompareResult:
    """A CompareResult back from `compare --json`'s file."""
    import json
    from pathlib import Path

    data = json.loads(Path(path).read_text())
    data.pop("schema", None)
    data["llamacpp"], data["ours"] = Side(**data["llamacpp"]), Side(**data["ours"])
    return CompareResult(**data)


def plot_compare(result: CompareResult, path: str) -> None:
    """Two panels: prefill tokens/s of each (median, with every timed run), KL divergence per position (log
    scale) with top-1 mismatches marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    sides = [result.llamacpp, result.ours]
    left.bar([s.name for s in sides], [s.tokens_per_second for s in sides], color=["gray", "tab:blue"])
    for i, s in enumerate(sides):
        left.scatter([i] * len(s.seconds), [result.tokens / t for t in s.seconds], color="black", s=10, zorder=3)
    left.set_ylabel("prefill tokens/s")
    left.set_title(f"{result.tokens} tokens, {result.device}: {result.speedup:.2f}x")
    a = result.agreement
    kld = np.maximum(np.asarray(a["kld_per_position"]), 1e-12)
    right.semilogy(kld, lw=0.8, label="KL(llama.cpp || ours)")
    if a["top1_mismatches"]:
        right.scatter(a["top1_mismatches"], kld[a["top1_mismatches"]], color="red", s=12, zorder=3,
                      label="top-1 differs")
    right.axhline(KLD_BAR, color="gray", ls="--", lw=0.8, label=f"mean bar {KLD_BAR:g}")
    right.set_xlabel("position")
    right.set_title(f"top-1 {a['top1']:.1%}, KLD mean {a['kld_mean']:.2e} max {a['kld_max']:.2e}, "
                    f"NMSE {a['nmse']:.2e}", fontsize=9)
    right.legend(fontsize=8)
    fig.suptitle(f"{result.model.rsplit('/', 1)[-1]}: ggml-ciq vs llama.cpp", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
