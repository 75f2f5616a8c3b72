"""llama.cpp's whole model (libllama, cffi ABI mode): load a GGUF, tokenize with its vocab, prefill, logits,
memory footprint, and an eval callback that captures tensors during llama.cpp's own forward pass.

libllama sits next to the ggml libraries `llamacpp.find_library_dir` finds (llama-cpp-python's `llama_cpp/lib`, or
$GGML_CIQ_LLAMACPP_LIB). The cdef below is written from the vendored llama.h / ggml.h of llama-cpp-python 0.3.36
(llama.cpp 0c1e570); struct layouts were checked against that header with a C compiler: sizeof(llama_model_params)
80, sizeof(llama_context_params) 160 (cb_eval at 88, flash_attn_type at 52), sizeof(ggml_tensor) 336 (op at 80,
src at 152, data at 248, name at 256). Enums are C ints.

Memory (`LlamaModel.memory`): the buffers llama.cpp allocates and logs while loading ("model", "KV", "compute",
"output" buffer sizes per backend buffer, parsed from its log at MiB/100 resolution), llama_model_size (weight
bytes) and llama_state_get_size (KV cache contents + logits of a saved state); on CUDA also the device's used-memory
growth from cudaMemGetInfo around load + context creation (counts CUDA's own context and workspace too).
"""

from __future__ import annotations

import collections
import itertools
import os
import re
from pathlib import Path

import cffi
import numpy as np

from .errors import BackendError, GGUFFileError, InvalidArgumentError, LibraryNotFoundError, ShapeError
from .resources import Closeable
from .llamacpp import LlamaCpp, _lib_file

_CDEF = """
struct llama_model; struct llama_context; struct llama_vocab; struct llama_memory_i;
struct ggml_backend_buffer;
typedef int32_t llama_token;

struct llama_model_params {
    void ** devices;
    const void * tensor_buft_overrides;
    int32_t n_gpu_layers;
    int split_mode;                 /* enum llama_split_mode */
    int load_mode;                  /* enum llama_load_mode */
    int lazy_mode;                  /* enum llama_lazy_mode */
    int32_t main_gpu;
    const float * tensor_split;
    void * progress_callback;
    void * progress_callback_user_data;
    const void * kv_overrides;
    bool vocab_only, check_tensors, use_extra_bufts, no_host, no_alloc, load_mtp;
};

struct ggml_tensor;
typedef bool (*ggml_backend_sched_eval_callback)(struct ggml_tensor * t, bool ask, void * user_data);

struct llama_context_params {
    uint32_t n_ctx, n_batch, n_ubatch, n_seq_max, n_rs_seq, n_outputs_max, n_outputs_max_per_seq;
    int32_t n_threads, n_threads_batch;
    int ctx_type, rope_scaling_type, pooling_type, attention_type, flash_attn_type;
    float rope_freq_base, rope_freq_scale, yarn_ext_factor, yarn_attn_factor, yarn_beta_fast, yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    float defrag_thold;
    ggml_backend_sched_eval_callback cb_eval;
    void * cb_eval_user_data;
    int type_k, type_v;
    void * abort_callback;
    void * abort_callback_data;
    bool embeddings, offload_kqv, no_perf, op_offload, swa_full, kv_unified;
    void * samplers;
    size_t n_samplers;
    struct llama_context * ctx_other;
};

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token * token;
    float * embd;
    int32_t * pos;
    int32_t * n_seq_id;
    int32_t ** seq_id;
    int8_t * logits;
} llama_batch;

struct ggml_tensor {
    int type;
    struct ggml_backend_buffer * buffer;
    int64_t ne[4];
    size_t nb[4];
    int op;
    int32_t op_params[16];
    int32_t flags;
    struct ggml_tensor * src[10];
    struct ggml_tensor * view_src;
    size_t view_offs;
    void * data;
    char name[64];
    void * extra;
    char padding[8];
};

typedef void (*ggml_log_callback)(int level, const char * text, void * user_data);

void llama_backend_init(void);
void llama_log_set(ggml_log_callback log_callback, void * user_data);
struct llama_model_params llama_model_default_params(void);
size_t llama_max_devices(void);
struct llama_context_params llama_context_default_params(void);
struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
void llama_model_free(struct llama_model * model);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);
uint32_t llama_n_ctx(const struct llama_context * ctx);
uint32_t llama_n_ubatch(const struct llama_context * ctx);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
int32_t llama_model_n_layer(const struct llama_model * model);
int32_t llama_model_n_embd(const struct llama_model * model);
uint64_t llama_model_size(const struct llama_model * model);
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len, llama_token * tokens,
                       int32_t n_tokens_max, bool add_special, bool parse_special);
struct llama_memory_i * llama_get_memory(const struct llama_context * ctx);
void llama_memory_clear(struct llama_memory_i * mem, bool data);
size_t llama_state_get_size(struct llama_context * ctx);
struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(struct llama_batch batch);
int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
void llama_synchronize(struct llama_context * ctx);
float * llama_get_logits(struct llama_context * ctx);

const char * ggml_op_name(int op);
void * ggml_backend_dev_by_name(const char * name);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
"""

ffi = cffi.FFI()
ffi.cdef(_CDEF)

LLAMA_FLASH_ATTN_TYPE_DISABLED, LLAMA_FLASH_ATTN_TYPE_ENABLED = 0, 1
LLAMA_SPLIT_MODE_NONE, LLAMA_SPLIT_MODE_LAYER = 0, 1
_GGML_F32, _GGML_F16 = 0, 1
# llama.cpp CPU's extra buffer types (repacked weight layouts), in its load log's buffer names.
EXTRA_BUFFER_TYPES = ("CPU_REPACK", "AMX", "KLEIDIAI", "CPU_KLEIDIAI")
EXTRA_BUFFERS_WARNING = ("llama.cpp's CPU extra buffer types are on: on CPUs with AMX, llama.cpp 0c1e570 segfaults in "
                         "ggml_backend_amx_mul_mat on Q4_K weights (upstream issue ggml-org/llama.cpp#20824), and the "
                         "repacked layouts run another float order than the one our CPU engine follows")
_BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|compute|output) buffer size =\s*([0-9.]+) MiB")


class _Log:
    """llama.cpp's log lines, the newest MAX_LINES kept (a context logs about 120 lines: an unbounded list grew 15 KB
    a context). len() counts every line ever logged, so `log[len(log):]` later gives the lines logged since, as many
    of them as are still kept."""

    MAX_LINES = 5000  # a whole model load (Gemma 3 270M: 763 pieces), at most ~1 MB

    def __init__(self, max_lines: int = MAX_LINES):
        self.lines: collections.deque[str] = collections.deque(maxlen=max_lines)
        self.total = 0

    def append(self, line: str) -> None:
        self.lines.append(line)
        self.total += 1

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: slice) -> list[str]:
        if not isinstance(index, slice) or index.stop is not None or index.step is not None:
            raise TypeError("the log is read as log[start:], start from an earlier len(log)")
        start = index.start or 0
        kept_from = self.total - len(self.lines)
        return list(itertools.islice(self.lines, max(0, start - kept_from), None))


class _Library:
    """libllama loaded once per process, after llama.cpp's ggml (same directory, RTLD_GLOBAL). log_path: a file
    every log line is appended to as well (isolation.py's child sets it, so a crash leaves llama.cpp's last words)."""

    _loaded = None
    log_path = None

    @classmethod
    def load(cls) -> "_Library":
        if cls._loaded is None:
            cls._loaded = cls(LlamaCpp.load())
        return cls._loaded

    def __init__(self, ggml: LlamaCpp):
        path = _lib_file(ggml.lib_dir, "llama")
        if path is None:
            raise LibraryNotFoundError(f"libllama not found in {ggml.lib_dir} (llama-cpp-python's lib/ or "
                                       f"GGML_CIQ_LLAMACPP_LIB)")
        try:
            self.lib = ffi.dlopen(str(path), ffi.RTLD_NOW | ffi.RTLD_GLOBAL)
        except OSError as exc:
            raise LibraryNotFoundError(f"cannot load {path}: {exc}") from None
        self.ggml, self.path, self.log = ggml, path, _Log()
        self._log_callback = ffi.callback("ggml_log_callback", self._on_log)  # llama.cpp's log, kept for memory
        self.lib.llama_log_set(self._log_callback, ffi.NULL)
        self.lib.llama_backend_init()
        self.mul_mat_op = next(op for op in range(256) if ffi.string(self.lib.ggml_op_name(op)) == b"MUL_MAT")
        self.flash_attn_op = next(op for op in range(256)
                                  if ffi.string(self.lib.ggml_op_name(op)) == b"FLASH_ATTN_EXT")

    def _on_log(self, level, text, user_data):
        line = ffi.string(text).decode(errors="replace")
        self.log.append(line)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(line)

    def last_message(self, start: int) -> str:
        """llama.cpp's reason for a failure: the last log line since index `start` that mentions an error, else the
        last line."""
        lines = [line.strip() for line in "".join(self.log[start:]).splitlines() if line.strip()]
        errors = [line for line in lines if "error" in line.lower()]
        return (errors or lines or ["no message"])[-1]


class CudaMemory:
    """cudaMemGetInfo through libcudart (already in the process when llama.cpp's CUDA backend is)."""

    def __init__(self):
        self.ffi = cffi.FFI()
        self.ffi.cdef("int cudaMemGetInfo(size_t * free, size_t * total); int cudaSetDevice(int device);")
        self.lib = None
        for name in ("libcudart.so", "libcudart.so.13", "libcudart.so.12"):
            try:
                self.lib = self.ffi.dlopen(name)
                break
            except OSError:
                continue

    def used(self, device: int = 0) -> int | None:
        if self.lib is None:
            return None
        free, total = self.ffi.new("size_t *"), self.ffi.new("size_t *")
        if self.lib.cudaSetDevice(device) != 0 or self.lib.cudaMemGetInfo(free, total) != 0:
            return None
        return int(total[0] - free[0])


def memory_growth(before: int | None, after: int | None) -> int | None:
    """after - before, or None where either reading is missing."""
    return None if before is None or after is None else after - before


class Capture:
    """What an eval callback saw during one prefill: the float32 input and output of every MUL_MAT whose src0 is a
    model weight (keyed by the weight's GGUF name), and llama.cpp's per-layer hidden states ("l_out-N"). Rows are
    tokens; several micro-batches are concatenated in order."""

    def __init__(self, attention: bool = False, weights: bool = True):
        self.weights = weights  # False: the hidden states only (no weight mul_mat kept)
        self.mul_mat: dict[str, tuple[list, list]] = {}
        self.hidden: dict[int, list] = {}
        # attention=True: every FLASH_ATTN_EXT node in graph order (flash attention on), see AttentionCall
        self.attention: list[AttentionCall] | None = [] if attention else None
        self.error: Exception | None = None  # raised after decode: exceptions must not cross the C callback

    @staticmethod
    def is_weight(name: str) -> bool:
        return name.endswith(".weight") and (name.startswith("blk.") or name in ("output.weight", "token_embd.weight"))

    def inputs(self, name: str) -> np.ndarray:
        return np.concatenate(self.mul_mat[name][0])

    def outputs(self, name: str) -> np.ndarray:
        return np.concatenate(self.mul_mat[name][1])

    def hidden_state(self, layer: int) -> np.ndarray:
        return np.concatenate(self.hidden[layer])


class AttentionCall:
    """One FLASH_ATTN_EXT node of llama.cpp's graph as ciq_attention takes it: q float32 [tokens, heads, D], the K and
    V views of its f16 cache [n_kv, heads_kv, D] (n_kv: llama.cpp's padded length), its output float32
    [tokens, heads * D], the scale, and the query positions and window read off its KQ mask (the last query's visible
    keys: a window when they do not start at key 0)."""

    def __init__(self, name: str, q, k, v, out, mask, scale: float):
        self.name, self.q, self.k, self.v, self.out, self.scale = name, q, k, v, out, scale
        tokens = q.shape[0]
        seen = np.flatnonzero(np.isfinite(mask[tokens - 1]))
        if len(seen) == 0 or seen[-1] - seen[0] + 1 != len(seen):
            raise BackendError(f"{name}: the KQ mask of the last query is not one run of visible keys")
        self.n_past = int(seen[-1]) - (tokens - 1)
        self.window = int(len(seen)) if seen[0] > 0 else 0


def _tensor_array(lib, t, dtype=np.float32) -> np.ndarray:
    """A ggml tensor (any strides, any buffer) of ggml type F32 or F16 as a numpy array of shape ne[::-1]."""
    want = {np.dtype(np.float32): _GGML_F32, np.dtype(np.float16): _GGML_F16}[np.dtype(dtype)]
    if t.type != want:
        raise BackendError(f"captured tensor {ffi.string(t.name).decode()} has ggml type {t.type}, not {want}")
    size = np.dtype(dtype).itemsize
    ne, nb = [int(t.ne[i]) for i in range(4)], [int(t.nb[i]) for i in range(4)]
    span = sum((n - 1) * s for n, s in zip(ne, nb)) + size
    raw = np.empty(span, np.uint8)
    lib.ggml_backend_tensor_get(t, ffi.from_buffer(raw), 0, span)
    view = np.lib.stride_tricks.as_strided(raw.view(dtype), shape=ne[::-1], strides=nb[::-1])
    return np.ascontiguousarray(view)


def _tensor_f32(lib, t) -> np.ndarray:
    """A float32 ggml tensor (any strides, any buffer) as a [rows, ne0] numpy array, rows = ne1*ne2*ne3."""
    return _tensor_array(lib, t).reshape(-1, int(t.ne[0]))


def _attention_call(lib, t) -> AttentionCall:
    """A FLASH_ATTN_EXT node (src: q, k, v, mask) after its computation."""
    q = _tensor_array(lib, t.src[0])[0].transpose(1, 0, 2)         # [heads, tokens, D] -> [tokens, heads, D]
    k = _tensor_array(lib, t.src[1], np.float16)[0].transpose(1, 0, 2)  # [heads_kv, n_kv, D] -> [n_kv, heads_kv, D]
    v = _tensor_array(lib, t.src[2], np.float16)[0].transpose(1, 0, 2)
    mask = _tensor_array(lib, t.src[3], np.float16)[0, 0]             # [tokens (padded), n_kv]
    out = _tensor_f32(lib, t).reshape(q.shape[0], -1)                 # [tokens][heads][D]
    scale = float(np.frombuffer(ffi.buffer(t.op_params, 4), np.float32)[0])
    return AttentionCall(ffi.string(t.name).decode(errors="replace"), np.ascontiguousarray(q),
                         np.ascontiguousarray(k), np.ascontiguousarray(v), out, mask, scale)


class LlamaModel(Closeable):
    """One GGUF loaded by libllama: every layer on the GPU when device="cuda" (llama.cpp's CUDA0), else CPU only.
    Tokenizes with the GGUF's vocab; `context(...)` creates the context that runs prefills."""

    def __init__(self, path, device: str = "cpu", threads: int | None = None, extra_buffers: bool = False,
                 devices: list[str] | None = None):
        """extra_buffers=False (the default) loads every weight as raw GGUF blocks in plain buffers
        (llama_model_params.use_extra_bufts off): no CPU_REPACK or AMX layouts, so llama.cpp CPU runs its portable
        arithmetic, the one our CPU engine follows (docs/SEMANTICS.md), llama.cpp 0c1e570's AMX mul_mat, which
        segfaults on Q4_K (EXTRA_BUFFERS_WARNING), is never reached, and the plugin's CIQ_CPU device can read the
        weights. extra_buffers=True is llama.cpp's own default, for measuring it. devices names the ggml devices of
        a "cuda" model, the last one holding every layer (["CIQ0"]: the plugin's GPU device, CUDA0 with our GEMMs,
        runs the whole graph; docs/PLUGIN.md)."""
        self._model = None
        path = Path(path)
        if not path.is_file():
            raise GGUFFileError(f"{path}: no such file")
        if device not in ("cpu", "cuda"):
            raise InvalidArgumentError(f"unknown device {device!r} (cpu or cuda)")
        self.library = _Library.load()
        lib = self.library.lib
        if device == "cuda" and "CUDA0" not in self.library.ggml.devices():
            raise BackendError(f"llama.cpp at {self.library.ggml.lib_dir} has no CUDA0 device (point "
                               f"GGML_CIQ_LLAMACPP_LIB at a CUDA build)")
        self.path, self.device = path, device
        self.threads = threads or os.cpu_count() or 1
        self.cuda = CudaMemory() if device == "cuda" else None
        used_before = self.cuda.used() if self.cuda else None
        log_start = len(self.library.log)
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 999 if device == "cuda" else 0
        mparams.split_mode = LLAMA_SPLIT_MODE_NONE
        mparams.main_gpu = 0
        mparams.use_extra_bufts = extra_buffers
        self.extra_buffers = extra_buffers
        if device == "cpu" and not devices:
            # No GPU device in the model's list: with one (a CUDA build's default), llama.cpp keeps CPU weights in
            # the GPU's pinned host buffer type, which comes before the CPU's buffer types in make_cpu_buft_list, so
            # a CUDA build computed a CPU model in another buffer than a CPU build. ACCEL devices (the plugin's
            # CIQ_CPU, BLAS) are not in this list; the model adds them.
            self._devices = ffi.new("void *[]", [ffi.NULL])
            mparams.devices = self._devices
        elif devices:
            handles = [lib.ggml_backend_dev_by_name(name.encode()) for name in devices]
            if ffi.NULL in handles:
                raise BackendError(f"no ggml device {devices[handles.index(ffi.NULL)]!r} (have: "
                                   f"{', '.join(self.library.ggml.devices())})")
            self._devices = ffi.new("void *[]", handles + [ffi.NULL])
            mparams.devices = self._devices
            mparams.main_gpu = len(devices) - 1
            if len(devices) > 1:
                # As llama-bench's `-dev A/B -ts 0/1`: split by layer with every layer on the last device, so
                # the others stay in the context's scheduler (in front, taking the ops they support) and hold no
                # weights. Split mode NONE would keep the main device alone and drop the rest.
                mparams.split_mode = LLAMA_SPLIT_MODE_LAYER
                split = [0.0] * max(int(lib.llama_max_devices()), len(devices))
                split[len(devices) - 1] = 1.0
                self._tensor_split = ffi.new("float[]", split)
                mparams.tensor_split = self._tensor_split
        self._model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if self._model == ffi.NULL:
            self._model = None
            raise GGUFFileError(f"llama.cpp could not load {path}: {self.library.last_message(log_start)}")
        self.load_log = "".join(self.library.log[log_start:])
        self.cuda_used = memory_growth(used_before, self.cuda.used() if self.cuda else None)
        self.n_ctx_train = lib.llama_model_n_ctx_train(self._model)
        self.n_layer = lib.llama_model_n_layer(self._model)
        self.n_embd = lib.llama_model_n_embd(self._model)
        self._vocab = lib.llama_model_get_vocab(self._model)
        self.n_vocab = lib.llama_vocab_n_tokens(self._vocab)
        self.size = int(lib.llama_model_size(self._model))
        self.weight_buffers = sorted({buffer for buffer, kind, _ in _BUFFER_LINE.findall(self.load_log)
                                      if kind == "model"})
        if device == "cpu" and not extra_buffers and set(self.weight_buffers) & set(EXTRA_BUFFER_TYPES):
            self.close()
            raise BackendError(f"llama.cpp put weights of {path.name} into {', '.join(self.weight_buffers)} with its "
                               f"extra buffer types off")

    def provenance(self) -> dict:
        """Which llama.cpp CPU path ran: its extra buffer types on or off, the buffers the weights went into (from its
        load log: CPU_Mapped / CPU plain, CPU_REPACK / AMX repacked, CUDA0 ...), the CPU features its CPU backend was
        built for, and the host CPU's relevant flags."""
        return {"extra_buffers": self.extra_buffers, "weight_buffers": self.weight_buffers,
                **self.library.ggml.cpu_provenance()}

    def context(self, n_ctx: int, n_batch: int = 512, flash_attn: bool | None = None,
                eval_callback: bool = False) -> "LlamaContext":
        if self._model is None:
            raise BackendError("LlamaModel is closed")
        return LlamaContext(self, n_ctx, n_batch, flash_attn, eval_callback)

    def context_for(self, n_tokens: int, **kwargs) -> "LlamaContext":
        """A context for a prompt of n_tokens: n_ctx rounded up to 256 (llama.cpp pads to that), capped at the
        training context, which a longer prompt exceeds (ShapeError naming both)."""
        if n_tokens > self.n_ctx_train:
            raise ShapeError(f"the prompt has {n_tokens} tokens, longer than {self.path.name}'s context of "
                             f"{self.n_ctx_train}")
        return self.context(min(-(-n_tokens // 256) * 256, self.n_ctx_train), **kwargs)

    # -- tokens ---------------------------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        """llama.cpp's tokenizer with the GGUF's vocab; BOS added when the vocab asks for it (llama.cpp's
        default); special-token text is not parsed (llama-cpp-python's default)."""
        data = text.encode()
        lib = self.library.lib
        capacity = len(data) + 8
        out = ffi.new("llama_token[]", capacity)
        n = lib.llama_tokenize(self._vocab, data, len(data), out, capacity, add_special, False)
        if n < 0:
            capacity = -n
            out = ffi.new("llama_token[]", capacity)
            n = lib.llama_tokenize(self._vocab, data, len(data), out, capacity, add_special, False)
        if n < 0:
            raise BackendError(f"llama_tokenize failed ({n})")
        return list(out[0:n])

    def close(self):
        if self._model is not None:
            self.library.lib.llama_model_free(self._model)
            self._model = None


class LlamaContext(Closeable):
    """A llama.cpp context on a LlamaModel: n_ctx tokens, n_batch = n_ubatch micro-batches, f16 K/V cache.
    flash_attn None (auto): on for CUDA (llama-bench's setting for the speed comparison), off on the CPU, where
    llama.cpp's flash attention rounds Q to f16 and depends on the micro-batch size: on Gemma 3 270M, 128 tokens,
    FA on vs off gives top-1 93.0%, mean KLD 9.6e-3, and FA on with n_ubatch 32 vs 512 top-1 95.3%, mean KLD
    1.2e-2, while FA off is bit-identical across n_ubatch (41d23b3:bench/results/cpu/llamacpp-self-consistency-*.txt).
    eval_callback=True installs the callback `capture` needs (the scheduler then asks Python about every node, so
    timed runs go without it)."""

    def __init__(self, model: LlamaModel, n_ctx: int, n_batch: int, flash_attn: bool | None, eval_callback: bool):
        self._ctx = None
        self._capture = None
        if n_ctx < 1 or n_batch < 1:
            raise InvalidArgumentError(f"n_ctx and n_batch must be >= 1 (got {n_ctx}, {n_batch})")
        if n_ctx > model.n_ctx_train:
            raise ShapeError(f"a context of {n_ctx} tokens is longer than {model.path.name}'s training context "
                             f"({model.n_ctx_train})")
        self.model, self.library = model, model.library
        self.flash_attn = model.device == "cuda" if flash_attn is None else flash_attn
        self.n_batch, self.eval_callback = n_batch, eval_callback
        self.n_vocab = model.n_vocab
        lib = self.library.lib
        used_before = model.cuda.used() if model.cuda else None
        log_start = len(self.library.log)
        self._eval_callback = ffi.callback("ggml_backend_sched_eval_callback", self._on_eval)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = cparams.n_threads_batch = model.threads
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn else LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.offload_kqv = cparams.op_offload = model.device == "cuda"
        cparams.no_perf = True
        if eval_callback:
            cparams.cb_eval = self._eval_callback
        self._ctx = lib.llama_init_from_model(model._model, cparams)
        if self._ctx == ffi.NULL:
            self._ctx = None
            raise BackendError(f"llama.cpp could not create a {n_ctx}-token context for {model.path}: "
                               f"{self.library.last_message(log_start)}")
        self.n_ctx = lib.llama_n_ctx(self._ctx)
        self.n_batch = lib.llama_n_ubatch(self._ctx)  # llama.cpp caps the micro-batch at n_ctx
        self.load_log = "".join(self.library.log[log_start:])
        self.cuda_used = memory_growth(used_before, model.cuda.used() if model.cuda else None)

    def _alive(self):
        if self._ctx is None:
            raise BackendError("LlamaContext is closed")

    def _check_tokens(self, tokens) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
        if tokens.size == 0:
            raise ShapeError("no tokens to decode")
        if tokens.size > self.n_ctx:
            raise ShapeError(f"{tokens.size} tokens do not fit llama.cpp's context of {self.n_ctx}")
        if tokens.min() < 0 or tokens.max() >= self.n_vocab:
            raise ShapeError(f"token ids must be in [0, {self.n_vocab}), got {tokens.min()}..{tokens.max()}")
        return tokens

    # -- prefill --------------------------------------------------------------------------------------------------

    def prefill(self, tokens, all_logits: bool = True) -> np.ndarray:
        """Decode `tokens` from an empty KV cache in batches of n_batch; logits [tokens, vocab] (all positions) or,
        with all_logits=False, only the last position's logits are computed and [1, vocab] returned."""
        self._alive()
        tokens = self._check_tokens(tokens)
        lib = self.library.lib
        lib.llama_memory_clear(lib.llama_get_memory(self._ctx), True)
        batch = lib.llama_batch_init(self.n_batch, 0, 1)
        out = np.empty((tokens.size if all_logits else 1, self.n_vocab), np.float32)
        try:
            for start in range(0, tokens.size, self.n_batch):
                chunk = tokens[start:start + self.n_batch]
                batch.n_tokens = chunk.size
                for i, token in enumerate(chunk.tolist()):
                    batch.token[i] = token
                    batch.pos[i] = start + i
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = 0
                    batch.logits[i] = all_logits or start + i == tokens.size - 1
                status = lib.llama_decode(self._ctx, batch)
                if status != 0:
                    raise BackendError(f"llama_decode failed with status {status} at token {start}")
                n_out = chunk.size if all_logits else int(start + chunk.size == tokens.size)
                if n_out:
                    logits = lib.llama_get_logits(self._ctx)
                    rows = slice(start, start + n_out) if all_logits else slice(0, 1)
                    out[rows] = np.frombuffer(ffi.buffer(logits, 4 * n_out * self.n_vocab), np.float32).reshape(
                        n_out, self.n_vocab)
            lib.llama_synchronize(self._ctx)
        finally:
            lib.llama_batch_free(batch)
        return out

    # -- capture --------------------------------------------------------------------------------------------------

    def _on_eval(self, t, ask, user_data):
        capture = self._capture
        if capture is None:
            return not ask  # asked: no node wanted; observing: continue
        name = ffi.string(t.name).decode(errors="replace")
        is_mul_mat = capture.weights and t.op == self.library.mul_mat_op and t.src[0] != ffi.NULL and \
            Capture.is_weight(ffi.string(t.src[0].name).decode(errors="replace"))
        is_attention = capture.attention is not None and t.op == self.library.flash_attn_op
        if ask:
            return is_mul_mat or is_attention or name.startswith("l_out-")
        lib = self.library.lib
        try:
            if is_attention:
                capture.attention.append(_attention_call(lib, t))
            elif is_mul_mat:
                weight = ffi.string(t.src[0].name).decode()
                x, y = capture.mul_mat.setdefault(weight, ([], []))
                x.append(_tensor_f32(lib, t.src[1]))
                y.append(_tensor_f32(lib, t))
            elif name.startswith("l_out-"):
                capture.hidden.setdefault(int(name.split("-", 1)[1]), []).append(_tensor_f32(lib, t))
        except Exception as exc:
            capture.error = exc
            return False
        return True

    def capture(self, tokens, attention: bool = False, weights: bool = True) -> tuple[np.ndarray, Capture]:
        """Prefill with the eval callback on: (all-position logits, Capture); attention=True also keeps every flash
        attention node's inputs and output (Capture.attention); weights=False keeps only the hidden states."""
        if not self.eval_callback:
            raise InvalidArgumentError("LlamaModel(eval_callback=True) is needed to capture tensors")
        self._capture = capture = Capture(attention, weights)
        try:
            logits = self.prefill(tokens, all_logits=True)
        except BackendError:
            if capture.error is not None:
                raise BackendError(f"capturing llama.cpp's tensors failed: {capture.error}") from None
            raise
        finally:
            self._capture = None
        if capture.error is not None:
            raise BackendError(f"capturing llama.cpp's tensors failed: {capture.error}")
        return logits, capture

    # -- memory ---------------------------------------------------------------------------------------------------

    def memory(self) -> dict:
        """llama.cpp's footprint in bytes: buffers by kind ("model", "KV", "compute", "output") and backend
        buffer, their total, the total of those on the compute device (CUDA: "CUDAn" buffers, not host-pinned or
        mapped ones; CPU: all), llama_model_size, llama_state_get_size, and on CUDA the device memory growth from
        loading the model and creating this context."""
        self._alive()
        buffers: dict[str, dict[str, int]] = {}
        for buffer, kind, mib in _BUFFER_LINE.findall(self.model.load_log + self.load_log):
            kind_buffers = buffers.setdefault(kind, {})
            kind_buffers[buffer] = kind_buffers.get(buffer, 0) + round(float(mib) * 2**20)
        growth = None if self.model.cuda_used is None or self.cuda_used is None else self.model.cuda_used + \
            self.cuda_used
        on_device = (lambda name: re.fullmatch(r"CUDA\d+", name) is not None) if self.model.device == "cuda" else \
            (lambda name: True)
        return {"buffers": buffers, "buffers_total": sum(sum(b.values()) for b in buffers.values()),
                "device_buffers_total": sum(n for b in buffers.values() for name, n in b.items() if on_device(name)),
                "model_size": self.model.size, "state_size": int(self.library.lib.llama_state_get_size(self._ctx)),
                "cuda_used_growth": growth}

    def close(self):
        if self._ctx is not None:
            self.library.lib.llama_free(self._ctx)
            self._ctx = None
