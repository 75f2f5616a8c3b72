"""End-to-end comparison on one GGUF: llama.cpp (libllama, llama_model.py), our engine in each semantics and the
float64 reference (reference_ops) on the same tokens of a real text, with three kinds of distance over every
position's logits: each arm against the reference (the model the GGUF defines), our arms against llama.cpp, and
llama.cpp against a second llama.cpp run (its own spread: the yardstick of the verdict). Plus prefill tokens/s and
memory of the timed arms."""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from . import quants
from .errors import InvalidArgumentError, OutOfMemoryError, UnsupportedTypeError
from .llama_model import EXTRA_BUFFERS_WARNING
from .resources import free_host_bytes

# A short English passage (Jane Austen, Pride and Prejudice, chapter 1; public domain): prompt_tokens' text, for tests
# and tools that want a fixed prompt; `compare` reads a long real text (evaluation_text).
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


# The default text: the GCC Runtime Library Exception 3.1 and the GNU GPL v3, as numpy's manylinux wheels ship them in
# their LICENSE.txt (bundled for libgfortran): ~8.6k Gemma tokens of real, non-repeating English in a package every
# install of ggml-ciq has. Cut from the first marker to the second (the LGPL notice of libquadmath that follows).
TEXT_START, TEXT_END = "GCC RUNTIME LIBRARY EXCEPTION", "\nName: libquadmath"


@dataclass
class TextInfo:
    """Where the prompt came from and whether it had to repeat: `source` (package, version and file, or "--prompt"),
    `text_tokens` (the text once, BOS included), `repeated` (True when --tokens needed more than that)."""
    source: str
    text_tokens: int
    repeated: bool


def evaluation_text() -> tuple[str, str]:
    """(text, source): numpy's bundled licence texts (TEXT_START up to TEXT_END; the whole LICENSE.txt where a numpy
    build lacks the GCC section)."""
    from importlib import metadata

    try:
        files = metadata.files("numpy") or []
        version = metadata.version("numpy")
    except metadata.PackageNotFoundError:
        raise InvalidArgumentError("the default text comes from numpy's LICENSE.txt, but numpy's metadata is missing; "
                                   "give --prompt") from None
    licences = [f for f in files if f.name == "LICENSE.txt" and f.parts[0].endswith(".dist-info")]
    if not licences:
        raise InvalidArgumentError(f"numpy {version} has no LICENSE.txt in its metadata; give --prompt")
    text = licences[0].locate().read_text(encoding="utf-8")
    first = text.find(TEXT_START)
    if first < 0:
        return text, f"numpy {version}: {licences[0]} (whole file)"
    last = text.find(TEXT_END, first)
    return text[first:last if last > 0 else len(text)], f"numpy {version}: {licences[0]} (from {TEXT_START!r})"


def _repeat_to(llama, text: str, n_tokens: int | None) -> tuple[list[int], int, bool]:
    """llama.cpp's tokens (BOS as by default) of text, repeated (" " + text, no BOS) to n_tokens and cut there:
    (tokens, tokens of the text once, whether it repeated)."""
    tokens = llama.tokenize(text)
    once = len(tokens)
    if n_tokens is None:
        return tokens, once, False
    if n_tokens < 1:
        raise InvalidArgumentError(f"--tokens must be >= 1, got {n_tokens}")
    more = llama.tokenize(" " + text, add_special=False) if once < n_tokens else tokens
    if not more:
        raise InvalidArgumentError("the prompt has no tokens to repeat")
    while len(tokens) < n_tokens:
        tokens += more
    return tokens[:n_tokens], once, once < n_tokens


def prompt_tokens(llama, n_tokens: int | None, prompt: str | None) -> list[int]:
    """Tokens of `prompt` or of the short TEXT, repeated to n_tokens (tools/sensitivity.py, tests)."""
    return _repeat_to(llama, TEXT if prompt is None else prompt, n_tokens)[0]


def evaluation_tokens(llama, n_tokens: int | None, prompt: str | None) -> tuple[list[int], TextInfo]:
    """`compare`'s tokens: of `prompt`, else of evaluation_text(); repeated to n_tokens only when the text is
    shorter (TextInfo says so)."""
    text, source = (prompt, "--prompt") if prompt is not None else evaluation_text()
    tokens, once, repeated = _repeat_to(llama, text, n_tokens)
    return tokens, TextInfo(source, once, repeated)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def logits_agreement(ours: np.ndarray, theirs: np.ndarray, chunk: int | None = None) -> dict:
    """Over all positions, `theirs` as P: top-1 agreement, KL(P || ours) per position (mean, max, all), NMSE of the
    logits."""
    return logits_agreements({"p": theirs, "q": ours}, [("p", "q")], chunk)[0]


def logits_agreements(logits: dict, pairs: list[tuple[str, str]], chunk: int | None = None,
                      workers: int | None = None) -> list[dict]:
    """logits_agreement for each (p, q) pair of arms' logits (p as P), in one pass over the positions: each arm's
    log-softmax is computed once a chunk of positions, not once a pair, and chunks run on `workers` threads (numpy
    releases the GIL; default: the cores, at most 8). Every position's KL is the same float64 arithmetic as one pair
    alone, so the numbers do not depend on chunk or workers. Comparing 4096 positions of a 262,144-token vocabulary
    (8 pairs over 6 arms) is what made `compare --tokens 4096` slow. chunk: positions at a time (default: about
    256 MiB of float64 work arrays a thread)."""
    from concurrent.futures import ThreadPoolExecutor

    arrays = {name: np.asarray(a, np.float32) for name, a in logits.items()}
    names = sorted({name for pair in pairs for name in pair})
    for p, q in pairs:
        if arrays[p].shape != arrays[q].shape:
            raise InvalidArgumentError(f"logits shapes differ: {arrays[q].shape} against {arrays[p].shape}")
    if len({arrays[name].shape for name in names}) > 1:
        raise InvalidArgumentError("logits shapes differ: " + ", ".join(f"{n} {arrays[n].shape}" for n in names))
    positions = len(arrays[pairs[0][0]]) if pairs else 0
    kld = {pair: np.empty(positions) for pair in pairs}
    if chunk is None:
        vocab = arrays[names[0]].shape[-1] if pairs else 1
        chunk = max(1, (256 << 20) // (8 * vocab * (len(names) + len({p for p, _ in pairs}) + 2)))

    def chunk_kld(s: int) -> None:
        logs = {name: _log_softmax(arrays[name][s:s + chunk]) for name in names}
        probs = {p: np.exp(logs[p]) for p in {p for p, _ in pairs}}
        for p, q in pairs:
            kld[p, q][s:s + chunk] = (probs[p] * (logs[p] - logs[q])).sum(-1)

    workers = workers or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(chunk_kld, range(0, positions, chunk)))
    top = {name: arrays[name].argmax(-1) for name in names}
    out = []
    for p, q in pairs:
        top1 = top[q] == top[p]
        out.append({"positions": positions, "top1": float(top1.mean()),
                    "top1_mismatches": np.flatnonzero(~top1).tolist(), "kld_mean": float(kld[p, q].mean()),
                    "kld_max": float(kld[p, q].max()), "nmse": quants.nmse(arrays[q], arrays[p]),
                    "kld_per_position": kld[p, q].tolist()})
    return out


@dataclass
class Arm:
    """One run over the tokens. kind: "llamacpp", "ours" or "reference"; settings: what distinguishes it (device,
    flash_attn, n_ubatch, threads, semantics); seconds of each timed prefill (empty for an untimed arm: one
    all-logits prefill only), tokens/s of their median, memory in bytes."""
    name: str
    kind: str
    settings: dict
    seconds: list[float] = field(default_factory=list)
    tokens_per_second: float | None = None
    memory: dict = field(default_factory=dict)


@dataclass
class Pair:
    """Two arms' logits: KL(p || q) per position, top-1 agreement, NMSE (logits_agreement with p as P). role:
    "vs reference", "vs llama.cpp" or "llama.cpp spread"."""
    p: str
    q: str
    role: str
    agreement: dict


@dataclass
class CompareResult:
    model: str
    device: str
    tokens: int
    repeat: int
    text: dict                          # TextInfo
    arms: list[Arm]
    pairs: list[Pair]
    spread: str                         # what the second llama.cpp run changes
    verdict: dict
    environment: dict = field(default_factory=dict)
    llamacpp: dict = field(default_factory=dict)   # which llama.cpp CPU path ran (LlamaModel.provenance)
    errors: list = field(default_factory=list)     # llama.cpp's crashes (LlamaCppCrash.to_json), the arms lost

    def arm(self, name: str) -> Arm | None:
        return next((a for a in self.arms if a.name == name), None)

    def pair(self, p: str, q: str) -> Pair | None:
        return next((x for x in self.pairs if x.p == p and x.q == q), None)

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


def _timed(prefill, repeat: int, progress, arm: str) -> list[float]:
    """perf_counter seconds of `repeat` prefills, after one untimed prefill of the same kind (the caller's all-logits
    warm-up is another graph: llama.cpp CUDA's first last-token-only prefills in a fresh process measured 27, 17, 9
    ms against 8 ms steady); progress counts the timed ones."""
    prefill()
    seconds = []
    for _ in range(repeat):
        start = time.perf_counter()
        prefill()
        seconds.append(time.perf_counter() - start)
        if progress:
            progress(arm)
    return seconds


class LogitsStore(dict):
    """Every arm's logits of every position (float32), by arm name. In host memory when they fit (0.8 of the free
    memory); else each arm's array is moved, as it arrives, into a file under the temporary directory (np.memmap,
    removed by close()), so that a 4096-token Gemma compare (six arms: 26 GB) runs on a 23 GB machine; else
    OutOfMemoryError before any arm runs."""

    def __init__(self, n_arrays: int, n_tokens: int, n_vocab: int):
        import shutil
        import tempfile

        super().__init__()
        need = n_arrays * n_tokens * n_vocab * 4
        free = free_host_bytes()
        self.directory = None
        if need > 0.8 * free:
            disk = shutil.disk_usage(tempfile.gettempdir()).free
            if need > 0.8 * disk:
                raise OutOfMemoryError(f"the logits of {n_tokens} positions x {n_vocab} tokens for {n_arrays} runs "
                                       f"need {need / 2**30:.1f} GiB; {free / 2**30:.1f} GiB of host memory and "
                                       f"{disk / 2**30:.1f} GiB of disk in {tempfile.gettempdir()} are free")
            self.directory = tempfile.mkdtemp(prefix="ggml-ciq-logits-")

    def __setitem__(self, name: str, array) -> None:
        array = np.asarray(array, np.float32)
        if self.directory is not None:
            path = os.path.join(self.directory, f"{len(self)}.f32")
            stored = np.lib.format.open_memmap(path, "w+", np.float32, array.shape)
            stored[...] = array
            stored.flush()
            array = stored
        super().__setitem__(name, array)

    def close(self) -> None:
        import shutil

        self.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


# The second llama.cpp run per device, and what it changes. Measured on llama.cpp CPU 0c1e570 (Gemma 3 270M, 128
# tokens, flash attention off): 1, 2 or 3 threads and n_ubatch 64 or 512 give the same logits bit for bit; below 8
# tokens per micro-batch other kernels run (n_ubatch 7: top-1 97.7%, KLD 5.8e-3; n_ubatch 1: 94.5%, 6.9e-3), and
# flash attention on: 93.0%, 9.6e-3. On the CPU the spread is therefore token-by-token decoding (n_ubatch 1), the
# way llama.cpp generates; on CUDA flash attention on against off.
SPREAD = {"cpu": "n_ubatch 1 (token by token)", "cuda": "flash attention toggled"}
SEMANTICS_ARMS = {"llamacpp": "ours llamacpp", "exact": "ours exact", "fast": "ours fast"}
LLAMACPP, SPREAD_ARM, PLUGIN, REFERENCE = "llama.cpp", "llama.cpp spread", "llama.cpp + plugin", "reference"


def run_compare(path, n_tokens: int | None = 512, prompt: str | None = None, repeat: int = 3, device: str = "cpu",
                threads: int | None = None, flash_attn: bool | None = None, semantics=("llamacpp", "exact"),
                reference: bool = True, plugin: bool = False, progress=None, cuda_graph: bool = False,
                extra_buffers: bool = False) -> CompareResult:
    """llama.cpp first (a warm-up prefill with all logits, then `repeat` timed prefills with the last token's
    logits, as llama-bench), then its spread run (SPREAD: one all-logits prefill), with plugin=True llama.cpp with
    the ggml-ciq backend plugin loaded (timed as llama.cpp; docs/PLUGIN.md), then our engine in each of `semantics`
    the same way, then (reference=True) the float64 reference once (its seconds recorded). flash_attn: llama.cpp's
    (None: on for CUDA, off on the CPU; see LlamaContext). progress(arm) after each prefill. cuda_graph: our arms'
    timed prefills run as CUDA graphs (Transformer.forward(graph=True); one more untimed prefill captures them).
    extra_buffers: load llama.cpp's model with its CPU extra buffer types (llama_model.EXTRA_BUFFERS_WARNING).

    llama.cpp's arms run in child processes (isolation.py): a crash there is kept in `errors` with the arms that
    finished, and the rest of the comparison runs on those; without its tokens nothing can, and LlamaCppCrash is
    raised."""
    from . import native
    from .engine import ARCHITECTURES, SEMANTICS, Transformer
    from .errors import LlamaCppCrash
    from .isolation import run_isolated
    from .llama_model import CudaMemory, memory_growth
    from .model import ModelFile

    if repeat < 1:
        raise InvalidArgumentError(f"--repeat must be >= 1, got {repeat}")
    if cuda_graph and device != "cuda":
        raise InvalidArgumentError(f"--cuda-graph times our prefills as CUDA graphs: it needs --device cuda, not {device}")
    for s in semantics:
        if s not in SEMANTICS:
            raise InvalidArgumentError(f"unknown semantics {s!r} (choose {' or '.join(SEMANTICS)})")
    threads = threads or native.build_info()["threads"]  # the same threads for every arm
    native.set_num_threads(threads)
    model = ModelFile(path)
    if model.config.architecture not in ARCHITECTURES:  # before llama.cpp spends its time
        raise UnsupportedTypeError(f"{path}: architecture {model.config.architecture} is not supported by the engine "
                                   f"(supported: {', '.join(ARCHITECTURES)})")
    if reference:
        from .reference_ops import check_host_memory

        check_host_memory(model)
    flash_attn = device == "cuda" if flash_attn is None else flash_attn
    errors: list[LlamaCppCrash] = []

    def isolated(step: str, func, *args):
        try:
            return run_isolated(step, func, *args, progress=progress)
        except LlamaCppCrash as crash:
            errors.append(crash)
            return crash.finished

    got = isolated(f"its {device.upper()} arm", _llamacpp_arms, str(path), device, threads, n_tokens, prompt,
                   flash_attn, repeat, extra_buffers)
    if "tokens" not in got:
        raise errors[-1]
    tokens, text, n_vocab, n_ctx, llamacpp = got["tokens"]
    llamacpp["extra_buffers_warning"] = EXTRA_BUFFERS_WARNING if extra_buffers else None
    logits, arms = None, []
    try:
        logits = LogitsStore(2 + plugin + len(semantics) + reference, len(tokens), n_vocab)
        for name in (LLAMACPP, SPREAD_ARM):
            if f"arm:{name}" in got:
                arms.append(got[f"arm:{name}"])
                logits[name] = got.pop(f"logits:{name}")
        if errors and len(arms) < 2:
            errors[-1] = errors[-1].renamed(f"its {'spread' if arms else device.upper()} arm")
        if plugin:
            got = isolated(f"its {device.upper()} arm with the plugin", _plugin_arm, str(path), device, threads,
                           tokens, flash_attn, repeat)
            if f"arm:{PLUGIN}" in got:
                arms.append(got[f"arm:{PLUGIN}"])
                logits[PLUGIN] = got.pop(f"logits:{PLUGIN}")

        cuda = CudaMemory() if device == "cuda" else None
        for s in semantics:
            name = SEMANTICS_ARMS[s]
            used_before = cuda.used() if cuda else None
            # n_ubatch: llama.cpp's micro-batch
            engine = Transformer(model, device=device, n_ctx=n_ctx, n_ubatch=512, semantics=s)
            logits[name] = np.asarray(engine.forward(tokens, all_logits=True))
            if progress:
                progress(name)
            if cuda_graph:
                engine.forward(tokens, all_logits=False, graph=True)  # eager + capture, untimed
            seconds = _timed(lambda: engine.forward(tokens, all_logits=False, graph=cuda_graph), repeat, progress, name)
            growth = memory_growth(used_before, cuda.used() if cuda else None)
            arms.append(Arm(name, "ours", {"device": device, "semantics": s, "n_ubatch": 512, "threads": threads,
                                           "cuda_graph": cuda_graph},
                            seconds, _median_tps(len(tokens), seconds), engine_memory(engine, growth)))
            del engine
        if reference:
            start = time.perf_counter()
            engine = Transformer(model, device="reference", n_ctx=n_ctx, n_ubatch=512)
            loaded = time.perf_counter()
            logits[REFERENCE] = engine.forward(tokens, all_logits=True)
            arms.append(Arm(REFERENCE, "reference", {"device": "cpu (float64)", "n_ubatch": 512, "threads": threads,
                                                     "load_seconds": loaded - start},
                            [time.perf_counter() - loaded], None, engine_memory(engine, None)))
            del engine
            if progress:
                progress(REFERENCE)

        wanted = []  # (p, q, role), p as P
        if reference:
            wanted += [(REFERENCE, a.name, "vs reference") for a in arms if a.name != REFERENCE]
        wanted += [(LLAMACPP, SEMANTICS_ARMS[s], "vs llama.cpp") for s in semantics]
        wanted.append((LLAMACPP, SPREAD_ARM, "llama.cpp spread"))
        if "llamacpp" in semantics:  # which of llama.cpp's two settings ours llamacpp follows
            wanted.append((SPREAD_ARM, SEMANTICS_ARMS["llamacpp"], "vs llama.cpp"))
        if plugin:
            wanted.append((LLAMACPP, PLUGIN, "vs llama.cpp"))
        wanted = [(p, q, role) for p, q, role in wanted if p in logits and q in logits]  # arms that finished
        agreements = logits_agreements(logits, [(p, q) for p, q, _ in wanted])
        pairs = [Pair(p, q, role, agreement) for (p, q, role), agreement in zip(wanted, agreements)]
    finally:
        if logits is not None:
            logits.close()
    result = CompareResult(str(path), device, len(tokens), repeat, asdict(text), arms, pairs, SPREAD[device], {},
                           llamacpp=llamacpp, errors=[e.to_json() for e in errors])
    result.verdict = verdict(result)
    return result


def _llamacpp_arms(emit, path: str, device: str, threads: int, n_tokens: int | None, prompt: str | None,
                   flash_attn: bool, repeat: int, extra_buffers: bool) -> None:
    """llama.cpp's arm and its spread arm, in isolation.py's child: emits "tokens" (tokens, TextInfo, vocabulary
    size, n_ctx, llama.cpp's provenance), then per arm its logits and its Arm."""
    from .isolation import crash_point
    from .llama_model import LlamaModel

    with LlamaModel(path, device=device, threads=threads, extra_buffers=extra_buffers) as llama:
        tokens, text = evaluation_tokens(llama, n_tokens, prompt)
        with llama.context_for(len(tokens), n_batch=512, flash_attn=flash_attn) as ctx:
            emit("tokens", (tokens, text, llama.n_vocab, ctx.n_ctx, llama.provenance()))
            crash_point(LLAMACPP)
            logits = ctx.prefill(tokens, all_logits=True)
            emit.progress(LLAMACPP)
            seconds = _timed(lambda: ctx.prefill(tokens, all_logits=False), repeat, emit.progress, LLAMACPP)
            n_batch = ctx.n_batch
            emit(f"logits:{LLAMACPP}", logits)
            emit(f"arm:{LLAMACPP}", Arm(LLAMACPP, "llamacpp", {"device": device, "flash_attn": flash_attn,
                                                               "n_ubatch": n_batch, "threads": threads},
                                        seconds, _median_tps(len(tokens), seconds), ctx.memory()))
        del logits
        spread = {"flash_attn": not flash_attn, "n_batch": n_batch} if device == "cuda" else \
            {"flash_attn": flash_attn, "n_batch": 1}
        with llama.context_for(len(tokens), **spread) as ctx:
            crash_point(SPREAD_ARM)
            emit(f"logits:{SPREAD_ARM}", ctx.prefill(tokens, all_logits=True))
            emit(f"arm:{SPREAD_ARM}", Arm(SPREAD_ARM, "llamacpp", {"device": device, "flash_attn": ctx.flash_attn,
                                                                   "n_ubatch": ctx.n_batch, "threads": threads}))
        emit.progress(SPREAD_ARM)


def _plugin_arm(emit, path: str, device: str, threads: int, tokens, flash_attn: bool, repeat: int) -> None:
    """llama.cpp with the plugin loaded (CPU: its CIQ_CPU device beside llama.cpp CPU; CUDA: device CIQ0), timed as llama.cpp,
    in isolation.py's child; its settings name the plugin's devices and count the GEMMs our library ran. Emits its
    logits and its Arm."""
    from . import native
    from .isolation import crash_point
    from .llama_model import LlamaModel
    from .plugin import Plugin

    with Plugin() as loaded:
        devices = loaded.devices
        options = {} if device == "cpu" else {"devices": ["CIQ0"]}  # CUDA0 with our GEMMs: the whole graph
        native.dispatch_reset()
        with LlamaModel(path, device=device, threads=threads, **options) as model, \
                model.context_for(len(tokens), n_batch=512, flash_attn=flash_attn) as ctx:
            crash_point(PLUGIN)
            logits = ctx.prefill(tokens, all_logits=True)
            counts = native.dispatch_counts()
            emit.progress(PLUGIN)
            seconds = _timed(lambda: ctx.prefill(tokens, all_logits=False), repeat, emit.progress, PLUGIN)
            memory, n_batch = ctx.memory(), ctx.n_batch
    emit(f"logits:{PLUGIN}", logits)
    emit(f"arm:{PLUGIN}", Arm(PLUGIN, "plugin", {"device": device, "flash_attn": flash_attn, "n_ubatch": n_batch,
                                                 "threads": threads, "plugin_devices": devices,
                                                 "offload": os.environ.get("GGML_CIQ_OFFLOAD") or "table",
                                                 "warm_up_gemms": sum(counts.values()),
                                                 "warm_up_gemms_by_kernel": {f"{v}/{t}": n for (v, t), n in
                                                                             sorted(counts.items()) if n}},
                              seconds, _median_tps(len(tokens), seconds), memory))


def verdict(result: CompareResult) -> dict:
    """The calibrated bars (issue 18). `llamacpp`: ours against llama.cpp no further than llama.cpp's own spread, in
    mean KLD and in top-1 disagreement. `exact`: ours' mean KLD against the reference at most half of llama.cpp's.
    Each {"value", "bar", "met"}; a bar whose arms did not run (or crashed) is absent; `met` over those judged, and
    False when an arm crashed. The `llamacpp` bars are not judged (met None, with a note) against a llama.cpp CPU
    build whose arithmetic ours does not follow (not the AVX2 one: docs/SEMANTICS.md)."""
    out = {}
    spread, ours = result.pair(LLAMACPP, SPREAD_ARM), result.pair(LLAMACPP, SEMANTICS_ARMS["llamacpp"])
    if ours is not None and spread is not None:
        a, spread = ours.agreement, spread.agreement
        out["llamacpp_kld_vs_llamacpp"] = {"value": a["kld_mean"], "bar": spread["kld_mean"],
                                           "met": a["kld_mean"] <= spread["kld_mean"]}
        out["llamacpp_top1_disagreement_vs_llamacpp"] = {"value": 1 - a["top1"], "bar": 1 - spread["top1"],
                                                         "met": a["top1"] >= spread["top1"]}
        path = result.llamacpp.get("llamacpp_cpu_path")
        if result.device == "cpu" and (path != "avx2" or result.llamacpp.get("extra_buffers")):
            for key in ("llamacpp_kld_vs_llamacpp", "llamacpp_top1_disagreement_vs_llamacpp"):
                out[key].update(met=None, note=f"not judged: llama.cpp's CPU path here ({path}"
                                               f"{', extra buffer types' if result.llamacpp.get('extra_buffers') else ''}"
                                               f") is not the AVX2 plain-buffer arithmetic ours follows")
    exact, llama = result.pair(REFERENCE, SEMANTICS_ARMS["exact"]), result.pair(REFERENCE, LLAMACPP)
    if exact is not None and llama is not None:
        bar = 0.5 * llama.agreement["kld_mean"]
        out["exact_kld_vs_reference"] = {"value": exact.agreement["kld_mean"], "bar": bar,
                                         "met": exact.agreement["kld_mean"] <= bar}
    out["met"] = all(v["met"] for v in out.values() if v["met"] is not None) and not result.errors
    return out


def load_compare_json(path) -> CompareResult:
    """A CompareResult back from `compare --json`'s file."""
    import json
    from pathlib import Path

    data = json.loads(Path(path).read_text())
    data.pop("schema", None)
    if "arms" not in data:
        raise InvalidArgumentError(f"{path}: a compare file of the old schema (no arms); re-run compare")
    data["arms"] = [Arm(**a) for a in data["arms"]]
    data["pairs"] = [Pair(**p) for p in data["pairs"]]
    return CompareResult(**data)


def plot_compare(result: CompareResult, path: str, smooth: int = 16) -> None:
    """Prefill tokens/s of the timed arms (median, every timed run as a dot) and KL divergence per position of every
    pair (log scale; thin: each position, thick: mean over `smooth` positions), the pairs against the reference in
    one panel, those against llama.cpp (its spread dashed) in the other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 7))
    grid = fig.add_gridspec(2, 2, width_ratios=[1, 2.4])
    speed = fig.add_subplot(grid[:, 0])
    timed = [a for a in result.arms if a.tokens_per_second]
    speed.bar(range(len(timed)), [a.tokens_per_second for a in timed], color="lightgray", edgecolor="black")
    for i, a in enumerate(timed):
        speed.scatter([i] * len(a.seconds), [result.tokens / t for t in a.seconds], color="black", s=10, zorder=3)
    speed.set_xticks(range(len(timed)), [a.name for a in timed], rotation=20, fontsize=8)
    speed.set_ylabel("prefill tokens/s")
    speed.set_title(f"{result.tokens} tokens, {result.device}", fontsize=10)
    kernel = np.ones(smooth) / smooth
    panels = {"vs reference": fig.add_subplot(grid[0, 1])}
    panels["vs llama.cpp"] = panels["llama.cpp spread"] = fig.add_subplot(grid[1, 1], sharex=panels["vs reference"])
    for i, pair in enumerate(result.pairs):
        ax, a = panels[pair.role], pair.agreement
        kld = np.maximum(np.asarray(a["kld_per_position"]), 1e-12)
        style = "--" if pair.role == "llama.cpp spread" else "-"
        label = f"{pair.q} vs {pair.p}: mean {a['kld_mean']:.2e}, top-1 {a['top1']:.2%}"
        ax.semilogy(kld, lw=0.4, alpha=0.35, color=f"C{i}")
        smoothed = np.convolve(kld, kernel, "valid") if len(kld) >= smooth else kld
        ax.semilogy(np.arange(len(kld) - len(smoothed), len(kld)), smoothed, style, lw=1.6, color=f"C{i}",
                    label=label)
    repeated = " (the text repeated)" if result.text["repeated"] else ""
    panels["vs reference"].set_title(f"KL(reference || arm) per position{repeated}", fontsize=10)
    panels["vs llama.cpp"].set_title(f"KL(llama.cpp || arm); dashed: llama.cpp's spread ({result.spread})",
                                     fontsize=10)
    for ax in (panels["vs reference"], panels["vs llama.cpp"]):
        ax.set_ylabel("KLD")
        ax.legend(fontsize=7, loc="best")
    panels["vs llama.cpp"].set_xlabel("position")
    fig.suptitle(f"{result.model.rsplit('/', 1)[-1]}: llama.cpp, ggml-ciq and the float64 reference", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
