"""Per-tensor GEMM diff: our path vs llama.cpp's mul_mat vs the float64 truth, on every weight of a GGUF."""

from __future__ import annotations

import re
import zlib
from dataclasses import asdict, dataclass, field

import numpy as np

from . import native, quants
from .errors import CiqError, InvalidArgumentError, LlamaCppCrash, UnsupportedTypeError
from .model import ModelFile, Tensor

BACKENDS = ("auto", "reference", "ciq-cpu", "ciq-cuda")
REFERENCES = ("auto", "llamacpp-cpu", "llamacpp-cuda")
# The semantics each llama.cpp path implements, so "ours" is compared with like: CUDA above 8 tokens (MMQ);
# reference_semantics gives the one for a weight type and token count.
REFERENCE_SEMANTICS = {"llamacpp-cpu": "cpu", "llamacpp-cuda": "mmq"}
REFERENCE_DEVICE = {"llamacpp-cpu": "CPU", "llamacpp-cuda": "CUDA0"}


def cuda_compute_capability() -> tuple[int, int]:
    """The first GPU's compute capability from its name ("... (sm_90, 132 SMs)"); Hopper's where there is none."""
    match = re.search(r"\(sm_(\d)(\d+)", native.device_name("cuda")) if native.device_count() > 0 else None
    return (int(match.group(1)), int(match.group(2))) if match else (9, 0)


def reference_semantics(reference: str, ggml_type: int, tokens: int, compute_capability=(9, 0)) -> str:
    """The arithmetic llama.cpp itself runs for this weight type and token count: its CPU path "cpu"; CUDA
    mul_mat_vec_q ("mmvq") where ggml_cuda_should_use_mmvq takes it (1..8 tokens on Ampere and Hopper), else MMQ."""
    if reference == "llamacpp-cuda" and quants.llamacpp_cuda_uses_mmvq(ggml_type, tokens, compute_capability):
        return "mmvq"
    return REFERENCE_SEMANTICS[reference]


def activations(tensor: Tensor, tokens: int, seed: int) -> np.ndarray:
    """Seeded activations with a realistic spread: log-normal channel scales and a few outlier channels."""
    rng = np.random.default_rng([seed, zlib.crc32(tensor.name.encode())])
    scale = np.exp(rng.normal(0.0, 0.5, size=tensor.k)).astype(np.float32)
    scale[rng.choice(tensor.k, size=max(1, tensor.k // 128), replace=False)] *= 20.0
    return (rng.standard_normal((tokens, tensor.k)).astype(np.float32) * scale).astype(np.float32)


def max_abs(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def our_kernel_takes(tensor: Tensor, device: str, semantics: str, tokens: int, variant: str = "auto") -> bool:
    """Whether a kernel of ours multiplies this 2-D weight on the device in these semantics at this token count: the
    registry's planning (ciq_gemm_plan) says, so every weight type, K and token range it covers is diffed, and nothing
    else (no second list of types here)."""
    if len(tensor.shape) != 2:
        return False
    try:
        native.plan(variant, device, semantics, tensor.ggml_type, tensor.rows, tensor.k, tokens)
    except CiqError:
        return False
    return True


@dataclass
class TensorDiff:
    name: str
    type: str
    rows: int
    k: int
    variant: str | None = None          # kernel that ran for "ours" (None: no kernel of ours takes this weight)
    ours_vs_llamacpp: float | None = None
    ours_vs_llamacpp_maxabs: float | None = None
    llamacpp_vs_f64: float | None = None
    llamacpp_vs_f64_maxabs: float | None = None
    ours_vs_f64: float | None = None
    ours_vs_f64_maxabs: float | None = None
    ours_vs_own_reference: float | None = None  # other semantics than llama.cpp's: vs the numpy model of our own
    passed: bool = True


@dataclass
class DiffReport:
    model: str
    tokens: int
    seed: int
    backend: str
    reference: str
    semantics: str
    bar: float
    tensors: list[TensorDiff] = field(default_factory=list)
    environment: dict = field(default_factory=dict)
    not_diffed: list[dict] = field(default_factory=list)  # quantized weights no kernel of ours takes: name, type, why

    @property
    def failures(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.passed]

    def summary(self) -> dict:
        ours = [t.ours_vs_llamacpp for t in self.tensors if t.ours_vs_llamacpp is not None]
        return {"tensors": len(self.tensors), "compared": len(ours), "failed": len(self.failures),
                "worst_ours_vs_llamacpp": max(ours) if ours else None,
                "worst_llamacpp_vs_f64": max((t.llamacpp_vs_f64 for t in self.tensors
                                              if t.llamacpp_vs_f64 is not None), default=None)}

    def to_json(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary()
        return out


class Differ:
    """Runs one tensor through ours, llama.cpp and float64, holding the libraries and device state."""

    def __init__(self, backend: str, reference: str, variant: str = "auto", threads: int | None = None,
                 tokens: int | None = None):
        from .llamacpp import LlamaCpp

        if backend not in BACKENDS:
            raise InvalidArgumentError(f"unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
        if reference not in REFERENCES:
            raise InvalidArgumentError(f"unknown reference {reference!r} (choose from {', '.join(REFERENCES)})")
        self.llamacpp = LlamaCpp.load()
        if backend == "auto":  # our kernels on the GPU when there is one
            backend = "ciq-cuda" if native.device_count() > 0 else "ciq-cpu"
        if reference == "auto":  # llama.cpp's CUDA MMQ when its build has CUDA, else its CPU path
            cuda = backend == "ciq-cuda" and "CUDA0" in self.llamacpp.devices()
            reference = "llamacpp-cuda" if cuda else "llamacpp-cpu"
        self.backend, self.reference, self.variant, self.threads = backend, reference, variant, threads
        # Our kernel's semantics: the one llama.cpp runs for the type and token count (the bar is then ours vs
        # llama.cpp), unless the variant named implements others (wgmma: f16; mma: mmq at 1..8 tokens, where
        # llama.cpp runs MMVQ); then ours must be no further from f64 than llama.cpp is, and must match the numpy
        # model of its own semantics within the bar. semantics / same_semantics: for Q4_K at `tokens`.
        self.compute_capability = cuda_compute_capability() if reference == "llamacpp-cuda" else (9, 0)
        self.own_semantics = None
        if backend == "ciq-cuda" and variant not in ("auto", "cpu"):
            self.own_semantics = native.variant_info(variant).semantics
        self.semantics, self.same_semantics = self.semantics_for(quants.Q4_K, tokens or quants.MMVQ_MAX_TOKENS + 1)
        self.llamacpp_device = REFERENCE_DEVICE[reference]
        if self.llamacpp_device not in self.llamacpp.devices():
            raise InvalidArgumentError(f"reference {reference} needs llama.cpp device {self.llamacpp_device}, "
                                       f"found {', '.join(self.llamacpp.devices())} in {self.llamacpp.lib_dir}")
        self.device = "cuda" if backend == "ciq-cuda" else "cpu"
        if backend != "reference":
            if threads:
                native.set_num_threads(threads)
            if backend == "ciq-cpu":  # the host's AUTO order (registry.cpp): the K-quant kernel, then q32
                self.variant = "auto"

    def environment(self) -> dict:
        env = {"llamacpp": {"lib_dir": str(self.llamacpp.lib_dir), "version": self.llamacpp.version,
                            "commit": self.llamacpp.commit, "device": self.llamacpp_device}}
        if self.backend != "reference":
            env["ggml_ciq"] = native.build_info()
            env["device"] = native.device_name(self.device)
        return env

    def semantics_for(self, ggml_type: int, tokens: int) -> tuple[str, bool]:
        """(our semantics for this weight type and token count, whether it is llama.cpp's)."""
        theirs = reference_semantics(self.reference, ggml_type, tokens, self.compute_capability)
        ours = self.own_semantics or theirs
        return ours, ours == theirs

    def takes(self, tensor: Tensor, tokens: int) -> bool:
        """Whether "ours" runs this weight at this token count (the numpy reference backend: the K-quants)."""
        if self.backend == "reference":
            return tensor.is_keep_quant
        return our_kernel_takes(tensor, self.device, self.semantics_for(tensor.ggml_type, tokens)[0], tokens,
                                self.variant)

    def ours(self, tensor: Tensor, x: np.ndarray) -> tuple[np.ndarray, str]:
        semantics, _ = self.semantics_for(tensor.ggml_type, x.shape[0])
        if self.backend == "reference":
            return quants.REFERENCE_GEMMS[semantics](tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, x), \
                "numpy"
        native.dispatch_reset()  # ciq_gemm resolves the variant once; the counters say which one ran
        out = native.gemm(tensor, x, variant=self.variant, device=self.device, semantics=semantics)
        ran = [(variant, n) for (variant, type_name), n in native.dispatch_counts().items() if n]
        if len(ran) != 1 or ran[0][1] != 1:
            raise InvalidArgumentError(f"{tensor.name}: dispatch counters do not show exactly one launch ({ran})")
        return out, ran[0][0]

    def run(self, tensor: Tensor, x: np.ndarray, bar: float) -> TensorDiff:
        d = TensorDiff(tensor.name, tensor.type_name, tensor.rows, tensor.k)
        llama = self.llamacpp.mul_mat(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, x,
                                      device=self.llamacpp_device, threads=self.threads)
        truth = quants.gemm_f64(tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, x)
        d.llamacpp_vs_f64, d.llamacpp_vs_f64_maxabs = quants.nmse(llama, truth), max_abs(llama, truth)
        if self.takes(tensor, x.shape[0]):
            ours, d.variant = self.ours(tensor, x)
            d.ours_vs_llamacpp, d.ours_vs_llamacpp_maxabs = quants.nmse(ours, llama), max_abs(ours, llama)
            d.ours_vs_f64, d.ours_vs_f64_maxabs = quants.nmse(ours, truth), max_abs(ours, truth)
            semantics, same = self.semantics_for(tensor.ggml_type, x.shape[0])
            if same:
                d.passed = d.ours_vs_llamacpp <= bar
            else:
                own = quants.REFERENCE_GEMMS[semantics](tensor.ggml_type, tensor.raw(), tensor.rows, tensor.k, x)
                d.ours_vs_own_reference = quants.nmse(ours, own)
                d.passed = d.ours_vs_own_reference <= bar and d.ours_vs_f64 <= d.llamacpp_vs_f64
        return d


def not_diffed(model: ModelFile, tensors: list[Tensor]) -> list[dict]:
    """The quantized 2-D weights left out of a diff (no kernel of ours multiplies them here), each with why."""
    chosen = {t.name for t in tensors}
    return [{"name": t.name, "type": t.type_name,
             "why": "no kernel of ours here" if t.ggml_type in quants.BLOCK_LAYOUT else "llama.cpp only (not decoded)"}
            for t in model.quantized_weights() if t.name not in chosen]


def select_tensors(model: ModelFile, takes, all_quantized: bool, names: list[str] | None = None) -> list[Tensor]:
    """The weights a kernel of ours multiplies (`takes(tensor)`: Differ.takes at the diff's token count), or with
    all_quantized every quantized 2-D weight of a type ggml-ciq decodes (the others then with llama.cpp vs float64
    only); optionally only the named ones. A named tensor ours does not take (without all_quantized), or of a type we
    cannot decode, is an error naming it."""
    if names:
        tensors = [model.tensor(name) for name in names]
        for t in tensors:  # (a type we do not decode: the check below names it)
            if t.ggml_type in quants.BLOCK_LAYOUT and not all_quantized and not takes(t):
                raise UnsupportedTypeError(f"tensor {t.name} is {t.type_name} ({t.rows} x {t.k}), which no kernel of "
                                           f"ours multiplies here; --all-quantized lists it with llama.cpp vs float64")
    else:  # types ggml-ciq cannot decode stay out (not_diffed names them)
        tensors = [t for t in model.quantized_weights()
                   if (all_quantized and t.ggml_type in quants.BLOCK_LAYOUT) or takes(t)]
    for t in tensors:
        if t.ggml_type not in quants.BLOCK_LAYOUT:
            raise UnsupportedTypeError(f"{model.path}: tensor {t.name} has type {t.type_name}, which ggml-ciq "
                                       f"does not decode")
    return tensors


# ---------------------------------------------------------------------------------------------------------------
# Per-layer diff on real activations: the inputs llama.cpp's own prefill fed to every weight mul_mat.

LAYER_BAR = 1e-4  # hidden-state NMSE above which a layer is named as the first to diverge


@dataclass
class CapturedTensorDiff:
    """One weight's mul_mat on llama.cpp's captured input: our kernel of llama.cpp's semantics where the registry has
    one (our_kernel_takes; judged against the bar) or else the float64 product of the dequantized weight (listed
    only)."""
    name: str
    type: str
    layer: int | None
    rows: int
    k: int
    tokens: int
    kernel: str                         # our variant, "q8_0" / "q32" (32-value blocks), or "f64" (listed only)
    nmse: float                         # ours (or f64) vs llama.cpp's captured output
    max_abs: float
    judged: bool
    passed: bool


@dataclass
class LayerStateDiff:
    layer: int
    nmse: float
    max_abs: float
    spread: float | None = None         # llama.cpp's own: its flash-attention-toggled prefill vs its capture
    bar: float | None = None            # this layer's bar: the layer bar, or llama.cpp's spread where that is larger


@dataclass
class ActivationDiffReport:
    model: str
    prompt: str
    tokens: int
    reference: str                      # llamacpp-cpu | llamacpp-cuda
    semantics: str
    bar: float
    layer_bar: float
    spread: str | None = None           # what llama.cpp's spread run changed ("flash attention on"), None: not run
    tensors: list[CapturedTensorDiff] = field(default_factory=list)
    layers: list[LayerStateDiff] = field(default_factory=list)
    first_diverging_layer: int | None = None
    logits_nmse: float | None = None    # our engine's logits vs llama.cpp's, all positions
    environment: dict = field(default_factory=dict)
    llamacpp: dict = field(default_factory=dict)  # which llama.cpp CPU path ran (LlamaModel.provenance)
    errors: list = field(default_factory=list)  # llama.cpp's crash in its spread prefill (LlamaCppCrash.to_json)

    @property
    def failures(self) -> list[CapturedTensorDiff]:
        return [t for t in self.tensors if not t.passed]

    def summary(self) -> dict:
        judged = [t.nmse for t in self.tensors if t.judged]
        return {"tensors": len(self.tensors), "judged": len(judged), "failed": len(self.failures),
                "worst_judged_nmse": max(judged) if judged else None,
                "first_diverging_layer": self.first_diverging_layer}

    def to_json(self) -> dict:
        out = asdict(self)
        out["summary"] = self.summary()
        return out


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else None


def _f64_product(tensor: Tensor, x: np.ndarray, chunk_rows: int = 8192) -> np.ndarray:
    """gemm_f64 in row chunks, so a 262144-row output head never needs a full float64 copy."""
    row_bytes = quants.row_bytes(tensor.ggml_type, tensor.k)
    raw = tensor.raw().reshape(tensor.rows, row_bytes)
    out = np.empty((x.shape[0], tensor.rows), np.float64)
    for start in range(0, tensor.rows, chunk_rows):
        stop = min(start + chunk_rows, tensor.rows)
        out[:, start:stop] = quants.gemm_f64(tensor.ggml_type, raw[start:stop].reshape(-1), stop - start,
                                             tensor.k, x)
    return out


def captured_tensor_diffs(model: ModelFile, capture, reference: str, bar: float, progress=None) \
        -> list[CapturedTensorDiff]:
    """Every captured weight mul_mat, in llama.cpp's graph order, through our kernel of llama.cpp's semantics on
    exactly llama.cpp's input, against llama.cpp's output: per captured call (micro-batch), the registry's AUTO kernel
    for the semantics llama.cpp ran there (reference_semantics: cpu on the CPU; on CUDA mmvq for 1..8 tokens, else
    mmq), where the registry has one for the weight (our_kernel_takes; the q32 variant reported on the CPU by its
    activations, "q8_0" or "q8_1").
    These are judged against the bar; the other weights are listed with a float64 product."""
    device = "cpu" if reference == "llamacpp-cpu" else "cuda"
    capability = cuda_compute_capability() if device == "cuda" else (9, 0)
    diffs = []
    for name in capture.mul_mat:
        tensor = model.tensor(name)
        x, theirs = capture.inputs(name), capture.outputs(name)
        calls = capture.mul_mat[name][0]
        semantics = [reference_semantics(reference, tensor.ggml_type, len(part), capability) for part in calls]
        judged = True
        if all(our_kernel_takes(tensor, device, sem, len(part)) for part, sem in zip(calls, semantics)):
            pieces, kernels = [], []
            for part, sem in zip(calls, semantics):
                native.dispatch_reset()  # AUTO in llama.cpp's semantics: the registry picks, the counters say which
                pieces.append(native.gemm(tensor, part, device=device, semantics=sem))
                ran = [(variant, n) for (variant, type_name), n in native.dispatch_counts().items() if n]
                if len(ran) != 1 or ran[0][1] != 1:
                    raise InvalidArgumentError(f"{name}: dispatch counters do not show exactly one launch ({ran})")
                if ran[0][0] == "q32" and device == "cpu":  # named by its activations: q8_0 or q8_1 (Q4_1/Q5_1)
                    kernels.append("q8_1" if tensor.ggml_type in quants.Q32_1_TYPES else "q8_0")
                else:
                    kernels.append(ran[0][0])
            ours, kernel = np.concatenate(pieces), "+".join(dict.fromkeys(kernels))
        elif tensor.ggml_type in quants.BLOCK_LAYOUT:
            ours, kernel, judged = _f64_product(tensor, x), "f64", False
        else:
            raise UnsupportedTypeError(f"{model.path}: tensor {name} has type {tensor.type_name}, which ggml-ciq "
                                       f"does not decode")
        err = quants.nmse(ours, theirs)
        diffs.append(CapturedTensorDiff(name, tensor.type_name, _layer_of(name), tensor.rows, tensor.k, x.shape[0],
                                        kernel, err, max_abs(ours, theirs), judged, err <= bar if judged else True))
        if progress:
            progress(name)
    return diffs


def hidden_state_diffs(ours: list[np.ndarray], capture) -> list[LayerStateDiff]:
    """Our engine's hidden state after each layer against llama.cpp's "l_out-N"."""
    if len(ours) != len(capture.hidden):
        raise InvalidArgumentError(f"engine gave {len(ours)} hidden states, llama.cpp {len(capture.hidden)} layers")
    out = []
    for layer, state in enumerate(ours):
        theirs = capture.hidden_state(layer)
        state = np.asarray(state, np.float32).reshape(theirs.shape)
        out.append(LayerStateDiff(layer, quants.nmse(state, theirs), max_abs(state, theirs)))
    return out


def first_diverging_layer(layers: list[LayerStateDiff], bar: float = LAYER_BAR) -> int | None:
    """The first layer whose hidden-state NMSE is above `bar`, or above llama.cpp's own spread there where that
    was measured and is larger."""
    return next((d.layer for d in layers if not d.nmse <= max(bar, d.spread or 0.0)), None)


def follows_bit_for_bit(device: str, provenance: dict) -> bool:
    """Whether our engine follows this llama.cpp's arithmetic end to end, bit for bit: its CUDA build (MMQ/MMVQ
    semantics, its attention's order) and its CPU AVX2 build with plain weight buffers (docs/SEMANTICS.md). Against
    another CPU build (AVX-512, extra buffer types) the hidden states are rounding-level apart, and llama.cpp's own
    spread is the yardstick. (On CUDA that spread is far above ours: Gemma-shaped layers 2.5e-3 against 0.)"""
    if device == "cuda":
        return True
    return provenance.get("llamacpp_cpu_path") == "avx2" and not provenance.get("extra_buffers")


def resolve_reference(reference: str) -> str:
    """auto: llama.cpp CUDA when both its build and ours have a GPU, else llama.cpp CPU."""
    from .llamacpp import LlamaCpp

    if reference not in REFERENCES:
        raise InvalidArgumentError(f"unknown reference {reference!r} (choose from {', '.join(REFERENCES)})")
    if reference == "auto":
        cuda = native.device_count() > 0 and "CUDA0" in LlamaCpp.load().devices()
        reference = "llamacpp-cuda" if cuda else "llamacpp-cpu"
    return reference


SPREADS = ("auto", "on", "off")


def activation_diff(path, prompt: str, reference: str = "auto", bar: float = 1e-10, layer_bar: float = LAYER_BAR,
                    threads: int | None = None, flash_attn: bool | None = None,
                    progress=None, extra_buffers: bool = False, spread: str = "auto") -> ActivationDiffReport:
    """llama.cpp prefills `prompt` (its tokenizer, BOS as by default) with the eval callback on, in a child process
    (isolation.py: a crash there is LlamaCppCrash); every weight mul_mat's captured input goes through our kernel
    and is compared with llama.cpp's output; then our engine prefills the same tokens on the same device and its
    hidden state after each layer is compared with llama.cpp's "l_out-N". flash_attn: llama.cpp's flash attention
    (None: on for CUDA, off on the CPU; see LlamaContext). extra_buffers: llama.cpp's CPU extra buffer types
    (llama_model.EXTRA_BUFFERS_WARNING). spread: a second llama.cpp prefill with flash attention toggled, its
    hidden states against the first: llama.cpp's own spread per layer, which raises that layer's bar to it ("auto":
    where ours does not follow llama.cpp bit for bit, follows_bit_for_bit). `progress(text)` is called per step."""
    from .engine import Transformer
    from .isolation import run_isolated

    if spread not in SPREADS:
        raise InvalidArgumentError(f"unknown spread {spread!r} (choose from {', '.join(SPREADS)})")
    model = ModelFile(path)
    reference = resolve_reference(reference)
    device = "cuda" if reference == "llamacpp-cuda" else "cpu"
    if threads:
        native.set_num_threads(threads)
    spread_crash = None
    try:
        got = run_isolated(f"its {device.upper()} capture", _capture_prefill, str(path), device, threads, prompt,
                           flash_attn, extra_buffers, spread=spread)
    except LlamaCppCrash as crash:  # in the spread prefill: the capture finished, the diff goes on without it
        if "capture" not in crash.finished:
            raise
        got, spread_crash = crash.finished, crash.renamed("its spread prefill")
    tokens, theirs, capture, n_ctx, n_ubatch = (got[k] for k in ("tokens", "logits", "capture", "n_ctx", "n_ubatch"))
    report = ActivationDiffReport(str(path), prompt, len(tokens), reference, REFERENCE_SEMANTICS[reference], bar,
                                  layer_bar, got.get("spread_run"), llamacpp=got["provenance"])
    if spread_crash is not None:
        report.errors.append(spread_crash.to_json())
    report.tensors = captured_tensor_diffs(model, capture, reference, bar, progress)
    semantics = {"mmvq" if "mmvq" in t.kernel else REFERENCE_SEMANTICS[reference] for t in report.tensors if t.judged}
    report.semantics = "+".join(sorted(semantics)) or report.semantics  # CUDA: mmvq for calls of 1..8 tokens
    hidden: list[np.ndarray] = []
    ours = Transformer(model, device=device, n_ctx=n_ctx, n_ubatch=n_ubatch).forward(tokens, hidden_states=hidden,
                                                                                  all_logits=True)
    if progress:
        progress("engine")
    report.layers = hidden_state_diffs(hidden, capture)
    for d in report.layers:
        if "spread_hidden" in got:
            d.spread = quants.nmse(got["spread_hidden"][d.layer], capture.hidden_state(d.layer))
        d.bar = max(layer_bar, d.spread or 0.0)
    report.first_diverging_layer = first_diverging_layer(report.layers, layer_bar)
    report.logits_nmse = quants.nmse(np.asarray(ours, np.float32).reshape(theirs.shape), theirs)
    return report


def _capture_prefill(emit, path: str, device: str, threads: int | None, prompt: str, flash_attn: bool | None,
                     extra_buffers: bool, n_tokens: int | None = None, attention: bool = False,
                     spread: str = "off") -> None:
    """llama.cpp's prefill with the eval callback on, in isolation.py's child: emits the tokens (of `prompt`, or with
    n_tokens of compare's evaluation text, repeated if shorter), the provenance, the context's sizes, all logits and
    the Capture; with spread on (auto: where ours does not follow this llama.cpp bit for bit) a second prefill with
    flash attention toggled, its hidden states ("spread_hidden") and what it changed ("spread_run")."""
    from .compare import _repeat_to, evaluation_text
    from .isolation import crash_point
    from .llama_model import LlamaModel

    with LlamaModel(path, device=device, threads=threads, extra_buffers=extra_buffers) as llama:
        tokens = llama.tokenize(prompt) if n_tokens is None else \
            _repeat_to(llama, evaluation_text()[0], n_tokens)[0]
        emit("tokens", tokens)
        emit("provenance", llama.provenance())
        with llama.context_for(len(tokens), flash_attn=flash_attn, eval_callback=True) as ctx:
            emit("n_ctx", ctx.n_ctx)
            emit("n_ubatch", ctx.n_batch)
            crash_point("capture")
            logits, capture = ctx.capture(tokens, attention=attention)
            flash, n_batch = ctx.flash_attn, ctx.n_batch
        emit("logits", logits)
        emit("capture", capture)
        del logits, capture
        if spread == "on" or spread == "auto" and not follows_bit_for_bit(device, llama.provenance()):
            with llama.context_for(len(tokens), flash_attn=not flash, n_batch=n_batch, eval_callback=True) as ctx:
                crash_point("spread")
                other = ctx.capture(tokens, weights=False)[1]
                emit("spread_hidden", {layer: other.hidden_state(layer) for layer in other.hidden})
                emit("spread_run", f"flash attention {'on' if ctx.flash_attn else 'off'}")


@dataclass
class AttentionCallDiff:
    """One flash-attention node of llama.cpp CUDA's prefill against ciq_attention on exactly its inputs."""
    node: str
    tokens: int
    n_past: int
    n_kv: int
    window: int
    kernel: str
    differing: int     # output values whose bits differ
    max_abs: float
    nmse: float
    differing_by_head: list = field(default_factory=list)      # per q head
    differing_by_16_queries: list = field(default_factory=list)  # per 16 consecutive queries (llama.cpp's tiles)


def capture_attention(path, n_tokens: int = 512, device: str = "cuda") -> list:
    """llama.cpp (CUDA, or its CPU build) prefills n_tokens of compare's evaluation text (repeated if shorter) with
    flash attention on and the eval callback keeping every FLASH_ATTN_EXT node, in a child process (isolation.py):
    its AttentionCalls in graph order."""
    from .isolation import run_isolated

    got = run_isolated(f"its {device.upper()} capture", _capture_prefill, str(path), device, None, None, True, False,
                       n_tokens, True)
    return got["capture"].attention


def attention_call_diffs(calls: list, kernel: str = "mma_llamacpp", progress=None) -> list[AttentionCallDiff]:
    """Each captured flash-attention node through ciq_attention (`kernel`, on the GPU) with the positions and window
    its KQ mask shows, compared value for value with llama.cpp's output."""
    from .ops import NativeOps

    if native.device_count() < 1:
        raise InvalidArgumentError("the attention diff runs our kernel on a GPU, and there is none")
    ops = NativeOps("cuda", attention_kernel=kernel)
    diffs = []
    for call in calls:
        ours = ops.attention(call.q, call.k, call.v, call.n_past, call.scale, call.window).numpy()
        theirs = call.out
        t, h, d = call.q.shape
        differ = (ours.view(np.uint32) != theirs.view(np.uint32)).reshape(t, h, d)
        per_query = differ.sum(axis=(1, 2))
        diffs.append(AttentionCallDiff(call.name, t, call.n_past, call.k.shape[0], call.window,
                                       ops.attention_kernel_name(d), int(differ.sum()), max_abs(ours, theirs),
                                       quants.nmse(ours, theirs), differ.sum(axis=(0, 2)).tolist(),
                                       np.add.reduceat(per_query, np.arange(0, t, 16)).tolist()))
        if progress:
            progress(f"{call.name}: {diffs[-1].differing} values differ")
    return diffs
