"""Bridge to llama.cpp's ggml libraries (cffi ABI mode): its mul_mat on any ggml device as a
reference, plus ggml's quantize / dequantize routines.

Only ggml API functions are called; no ggml struct layout is read or written here, except the
by-value `ggml_init_params`. Every size is checked in Python first, so bad input raises a
CiqError instead of reaching a GGML_ASSERT (which aborts the process).
"""

import contextlib
import importlib.util
import os
import pathlib
import re
import sys

import cffi
import numpy as np

from .errors import BackendError, LibraryNotFoundError, ShapeError, UnsupportedTypeError
from .resources import Closeable

ENV_VAR = "GGML_CIQ_LLAMACPP_LIB"
_HINT = "(pip install 'ggml-ciq[llamacpp]' or set GGML_CIQ_LLAMACPP_LIB)"

# enum ggml_type values (ggml.h; fixed by the GGUF format).
F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
BF16 = 30
_TYPE_COUNT = 43  # GGML_TYPE_COUNT of ggml 0.25.x; ggml does not bounds-check type indices
_MAX_THREADS = 512  # GGML_MAX_N_THREADS

# Types in ggml_quantize_chunk's switch (ggml.c); others abort. IQ* types: 16..23, 29.
_QUANTIZABLE = frozenset({F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
                          16, 17, 18, 19, 20, 21, 22, 23, 29, 34, 35, 39, 40, 41, 42})
# Weight types without a CPU vec_dot (Q8_1, Q8_K, I8, I16, I32, I64, F64): mul_mat would abort.
_NO_MUL_MAT = frozenset({Q8_1, Q8_K, 24, 25, 26, 27, 28})
_DEQUANTIZE = {
    Q4_0: "dequantize_row_q4_0", Q5_0: "dequantize_row_q5_0", Q8_0: "dequantize_row_q8_0",
    Q4_K: "dequantize_row_q4_K", Q5_K: "dequantize_row_q5_K", Q6_K: "dequantize_row_q6_K",
    F16: "ggml_fp16_to_fp32_row", BF16: "ggml_bf16_to_fp32_row",
    Q4_1: "dequantize_row_q4_1", Q5_1: "dequantize_row_q5_1",
}

_CDEF = """
struct ggml_context; struct ggml_tensor; struct ggml_cgraph;
struct ggml_backend; struct ggml_backend_device; struct ggml_backend_reg; struct ggml_backend_buffer;
struct ggml_init_params { size_t mem_size; void * mem_buffer; bool no_alloc; };
struct ggml_backend_feature { const char * name; const char * value; };
typedef struct ggml_backend_feature * (*ggml_backend_get_features_t)(struct ggml_backend_reg * reg);

const char * ggml_version(void);
const char * ggml_commit(void);
const char * ggml_type_name(int type);
int64_t ggml_blck_size(int type);
size_t ggml_type_size(int type);
size_t ggml_row_size(int type, int64_t ne);

struct ggml_context * ggml_init(struct ggml_init_params params);
void ggml_free(struct ggml_context * ctx);
size_t ggml_tensor_overhead(void);
size_t ggml_graph_overhead_custom(size_t size, bool grads);
struct ggml_tensor * ggml_new_tensor_2d(struct ggml_context * ctx, int type, int64_t ne0, int64_t ne1);
struct ggml_tensor * ggml_mul_mat(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_new_tensor_1d(struct ggml_context * ctx, int type, int64_t ne0);
struct ggml_tensor * ggml_new_tensor_3d(struct ggml_context * ctx, int type, int64_t ne0, int64_t ne1, int64_t ne2);
struct ggml_tensor * ggml_rms_norm(struct ggml_context * ctx, struct ggml_tensor * a, float eps);
struct ggml_tensor * ggml_mul(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_add(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_scale(struct ggml_context * ctx, struct ggml_tensor * a, float s);
struct ggml_tensor * ggml_geglu_split(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_swiglu_split(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b);
struct ggml_tensor * ggml_rope_ext(struct ggml_context * ctx, struct ggml_tensor * a, struct ggml_tensor * b,
                                   struct ggml_tensor * c, int n_dims, int mode, int n_ctx_orig, float freq_base,
                                   float freq_scale, float ext_factor, float attn_factor, float beta_fast,
                                   float beta_slow);
struct ggml_tensor * ggml_permute(struct ggml_context * ctx, struct ggml_tensor * a, int axis0, int axis1, int axis2,
                                  int axis3);
struct ggml_tensor * ggml_flash_attn_ext(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                         struct ggml_tensor * v, struct ggml_tensor * mask, float scale,
                                         float max_bias, float logit_softcap);
size_t ggml_nbytes(const struct ggml_tensor * tensor);
struct ggml_cgraph * ggml_new_graph_custom(struct ggml_context * ctx, size_t size, bool grads);
void ggml_build_forward_expand(struct ggml_cgraph * cgraph, struct ggml_tensor * tensor);

size_t ggml_backend_dev_count(void);
struct ggml_backend_device * ggml_backend_dev_get(size_t index);
struct ggml_backend_device * ggml_backend_dev_by_name(const char * name);
const char * ggml_backend_dev_name(struct ggml_backend_device * device);
struct ggml_backend * ggml_backend_dev_init(struct ggml_backend_device * device, const char * params);
struct ggml_backend_reg * ggml_backend_dev_backend_reg(struct ggml_backend_device * device);
void * ggml_backend_reg_get_proc_address(struct ggml_backend_reg * reg, const char * name);
void ggml_backend_load_all_from_path(const char * dir_path);
void ggml_backend_free(struct ggml_backend * backend);
bool ggml_backend_supports_op(struct ggml_backend * backend, const struct ggml_tensor * op);
struct ggml_backend_buffer * ggml_backend_alloc_ctx_tensors(struct ggml_context * ctx,
                                                            struct ggml_backend * backend);
void ggml_backend_buffer_free(struct ggml_backend_buffer * buffer);
const char * ggml_backend_buffer_name(struct ggml_backend_buffer * buffer);
void ggml_backend_tensor_set(struct ggml_tensor * tensor, const void * data, size_t offset, size_t size);
void ggml_backend_tensor_get(const struct ggml_tensor * tensor, void * data, size_t offset, size_t size);
int ggml_backend_graph_compute(struct ggml_backend * backend, struct ggml_cgraph * cgraph);

void ggml_quantize_init(int type);
bool ggml_quantize_requires_imatrix(int type);
size_t ggml_quantize_chunk(int type, const float * src, void * dst, int64_t start, int64_t nrows,
                           int64_t n_per_row, const float * imatrix);
void quantize_row_q8_K_ref(const float * x, void * y, int64_t k);
void quantize_row_q8_1(const float * x, void * y, int64_t k);
void dequantize_row_q4_0(const void * x, float * y, int64_t k);
void dequantize_row_q5_0(const void * x, float * y, int64_t k);
void dequantize_row_q8_0(const void * x, float * y, int64_t k);
void dequantize_row_q4_K(const void * x, float * y, int64_t k);
void dequantize_row_q5_K(const void * x, float * y, int64_t k);
void dequantize_row_q6_K(const void * x, float * y, int64_t k);
void dequantize_row_q4_1(const void * x, float * y, int64_t k);
void dequantize_row_q5_1(const void * x, float * y, int64_t k);
void ggml_fp16_to_fp32_row(const void * x, float * y, int64_t n);
void ggml_bf16_to_fp32_row(const void * x, float * y, int64_t n);
"""
_REQUIRED = ("ggml_init", "ggml_mul_mat", "ggml_backend_dev_count", "ggml_backend_dev_init",
             "ggml_backend_alloc_ctx_tensors", "ggml_backend_graph_compute", "ggml_quantize_chunk",
             "quantize_row_q8_K_ref")

ffi = cffi.FFI()
ffi.cdef(_CDEF)


def _lib_file(directory, stem):
    """The shared library `stem` (e.g. "ggml-base") in `directory`, or None. Of ggml's own libraries the file named as
    its soname (libggml.so.0) where there is one: libllama links them by soname, and llama-cpp-python's wheel holds
    libggml.so, libggml.so.0 and libggml.so.0.25.3 as three copies, not links, so opening libggml.so after
    `import llama_cpp` loaded libllama would map a second ggml, whose backend registry (the plugin's devices)
    libllama never sees."""
    directory = pathlib.Path(directory)
    if stem.startswith("ggml"):
        soname = re.compile(rf"lib{re.escape(stem)}\.so\.\d+")
        sonames = sorted(f for f in directory.glob(f"lib{stem}.so.*") if soname.fullmatch(f.name))
        if sonames:
            return sonames[0]
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll"):
        if (directory / name).is_file():
            return directory / name
    return None


def find_library_dir(path=None):
    """Directory holding llama.cpp's libggml-base and libggml: `path`, else $GGML_CIQ_LLAMACPP_LIB,
    else the installed llama_cpp package's lib/ (found without importing llama_cpp)."""
    if path is None:
        path = os.environ.get(ENV_VAR) or None
    if path is None:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            raise LibraryNotFoundError(f"llama.cpp libraries not found: no llama_cpp package and "
                                       f"{ENV_VAR} unset {_HINT}")
        path = pathlib.Path(spec.submodule_search_locations[0]) / "lib"
    directory = pathlib.Path(path).expanduser().resolve()
    missing = [stem for stem in ("ggml-base", "ggml") if _lib_file(directory, stem) is None]
    if missing:
        raise LibraryNotFoundError(f"llama.cpp libraries not found: no lib{missing[0]} in "
                                   f"{directory} {_HINT}")
    return directory


def _raw_bytes(data):
    """A contiguous flat uint8 view (or copy) of a bytes-like object or numpy array."""
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    return np.frombuffer(data, dtype=np.uint8)


def _live(handle):
    return handle is not None and handle != ffi.NULL


def _positive(**sizes):
    for name, value in sizes.items():
        if int(value) != value or value < 1:
            raise ShapeError(f"{name} must be a positive integer, got {value!r}")


def host_cpu_flags() -> list[str]:
    """The host CPU's flags that decide llama.cpp CPU's kernels (AMX, AVX-512, AVX2, VNNI), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in set(flags) if f.startswith(("amx", "avx512", "avx2", "avx_vnni")))


class LlamaCpp:
    """llama.cpp's ggml, loaded from one library directory. Use `LlamaCpp.load()`."""

    _instances = {}

    @classmethod
    def load(cls, path=None):
        """The (cached) bridge for `find_library_dir(path)`. One directory per process: a second
        copy of ggml would bind to the first one's symbols."""
        directory = find_library_dir(path)
        if directory not in cls._instances:
            if cls._instances:
                other = next(iter(cls._instances))
                raise BackendError(f"llama.cpp is already loaded from {other}; cannot also load "
                                   f"{directory} in the same process")
            cls._instances[directory] = cls(directory)
        return cls._instances[directory]

    def __init__(self, lib_dir):
        self.lib_dir = pathlib.Path(lib_dir)
        try:
            # RTLD_GLOBAL so that backend modules can resolve ggml-base's symbols. Symbols are looked
            # up through libggml's handle, which also searches its dependencies (base, cpu, ...).
            flags = ffi.RTLD_NOW | ffi.RTLD_GLOBAL
            # The C++ runtime first in the global scope: a CUDA build's libggml-cuda exports its own copies of
            # std::ostream code, and libllama, loaded after it, bound to them and crashed in llama_model::print_info.
            if sys.platform.startswith("linux"):
                with contextlib.suppress(OSError):
                    ffi.dlopen("libstdc++.so.6", flags)
            self._base = ffi.dlopen(str(_lib_file(self.lib_dir, "ggml-base")), flags)
            self._lib = ffi.dlopen(str(_lib_file(self.lib_dir, "ggml")), flags)
        except (OSError, TypeError) as e:
            raise LibraryNotFoundError(f"cannot load llama.cpp libraries from {self.lib_dir}: {e}")
        for name in _REQUIRED:
            if not self._has(name):
                raise LibraryNotFoundError(f"{name} not exported by the llama.cpp libraries in "
                                           f"{self.lib_dir}")
        if self._lib.ggml_backend_dev_count() == 0:  # backends built as loadable modules
            self._lib.ggml_backend_load_all_from_path(str(self.lib_dir).encode())
        if self._lib.ggml_backend_dev_count() == 0:
            raise LibraryNotFoundError(f"no ggml backend devices found in {self.lib_dir}")
        self.version = self._string("ggml_version")
        self.commit = self._string("ggml_commit")
        if self.commit == "unknown":  # built from a source tree without git (an sdist): the builder may name it
            self.commit = os.environ.get("GGML_CIQ_LLAMACPP_COMMIT", "unknown")

    def __repr__(self):
        return f"LlamaCpp({str(self.lib_dir)!r}, version={self.version!r}, devices={self.devices()})"

    def _has(self, name):
        try:
            getattr(self._lib, name)
            return True
        except (AttributeError, ffi.error):
            return False

    def _string(self, name):
        return ffi.string(getattr(self._lib, name)()).decode() if self._has(name) else None

    def devices(self):
        """Names of the ggml devices, e.g. ["CUDA0", "CPU"]."""
        lib = self._lib
        return [ffi.string(lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i))).decode()
                for i in range(lib.ggml_backend_dev_count())]

    def cpu_features(self) -> dict[str, str]:
        """What llama.cpp's CPU backend was built for and found (its ggml_backend_get_features: AVX2, AVX512,
        AMX_INT8, REPACK, ...)."""
        lib = self._lib
        reg = lib.ggml_backend_dev_backend_reg(self._device("CPU"))
        address = lib.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
        if address == ffi.NULL:
            return {}
        features, out = ffi.cast("ggml_backend_get_features_t", address)(reg), {}
        i = 0
        while features[i].name != ffi.NULL:
            out[ffi.string(features[i].name).decode()] = ffi.string(features[i].value).decode()
            i += 1
        return out

    def cpu_provenance(self) -> dict:
        """llama.cpp CPU's arithmetic as far as its build decides it: the backend's features, the x86 path its
        K-quant kernels take (our CPU semantics follow the AVX2 one, docs/SEMANTICS.md) and the host's AMX and
        AVX-512 flags (/proc/cpuinfo)."""
        features = self.cpu_features()
        path = ("avx512-vnni" if "AVX512_VNNI" in features else "avx2" if "AVX2" in features else
                "other") if features else "unknown"
        return {"llamacpp_cpu_features": features, "llamacpp_cpu_path": path, "host_cpu_flags": host_cpu_flags()}

    def _device(self, name):
        dev = self._lib.ggml_backend_dev_by_name(str(name).encode())
        if dev == ffi.NULL:
            raise BackendError(f'unknown device "{name}" (available: {", ".join(self.devices())})')
        return dev

    def _check_type(self, ggml_type):
        if not isinstance(ggml_type, (int, np.integer)) or not 0 <= ggml_type < _TYPE_COUNT:
            raise UnsupportedTypeError(f"invalid ggml type {ggml_type!r}")
        if self._lib.ggml_blck_size(ggml_type) <= 0:
            raise UnsupportedTypeError(f"ggml type {ggml_type} has been removed from ggml")
        return int(ggml_type)

    def _check_row(self, ggml_type, n, what="K"):
        """Validate type and row length; returns the row's byte size."""
        ggml_type = self._check_type(ggml_type)
        blck = self._lib.ggml_blck_size(ggml_type)
        if n % blck:
            raise ShapeError(f"{what}={n} is not a multiple of {self.type_name(ggml_type)}'s block "
                             f"size {blck}")
        return self._lib.ggml_row_size(ggml_type, n)

    def type_name(self, ggml_type):
        """ggml's name of a type, e.g. "q4_K"."""
        return ffi.string(self._lib.ggml_type_name(self._check_type(ggml_type))).decode()

    def type_size(self, ggml_type):
        """Bytes per block (ggml_type_size)."""
        return self._lib.ggml_type_size(self._check_type(ggml_type))

    def block_size(self, ggml_type):
        """Values per block (ggml_blck_size)."""
        return self._lib.ggml_blck_size(self._check_type(ggml_type))

    def mul_mat(self, ggml_type, weight, rows, k, x, device="CPU", threads=None):
        """llama.cpp's out[tokens, rows] = x[tokens, k] @ W[rows, k].T, with W in raw GGUF blocks."""
        x = np.asarray(x)
        if x.ndim != 2:
            raise ShapeError(f"activations must be [tokens, K], got shape {x.shape}")
        with MulMatGraph(self, device, ggml_type, rows, k, x.shape[0], threads=threads) as graph:
            graph.set_weights(weight)
            graph.set_input(x)
            graph.compute()
            return graph.output()

    def quantize_chunk(self, ggml_type, x):
        """ggml_quantize_chunk of float32 x[rows, k] (no imatrix) -> raw blocks, uint8."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2:
            raise ShapeError(f"quantize_chunk needs [rows, K], got shape {x.shape}")
        rows, k = x.shape
        _positive(rows=rows, K=k)
        row_size = self._check_row(ggml_type, k)
        if ggml_type not in _QUANTIZABLE or self._lib.ggml_quantize_requires_imatrix(ggml_type):
            raise UnsupportedTypeError(f"ggml cannot quantize to {self.type_name(ggml_type)} "
                                       f"without an importance matrix")
        out = np.empty(rows * row_size, dtype=np.uint8)
        self._lib.ggml_quantize_init(ggml_type)
        written = self._lib.ggml_quantize_chunk(ggml_type, ffi.from_buffer("float[]", x),
                                                ffi.from_buffer(out), 0, rows, k, ffi.NULL)
        if written != out.size:
            raise BackendError(f"ggml_quantize_chunk wrote {written} bytes, expected {out.size}")
        return out

    def dequantize(self, ggml_type, data, n):
        """ggml's dequantize_row_* of `n` values in raw blocks -> float32[n]."""
        _positive(n=n)
        nbytes = self._check_row(ggml_type, n, what="n")
        name = _DEQUANTIZE.get(ggml_type)
        if name is None or not self._has(name):
            raise UnsupportedTypeError(f"no ggml dequantize function for {self.type_name(ggml_type)}")
        raw = _raw_bytes(data)
        if raw.size != nbytes:
            raise ShapeError(f"{n} {self.type_name(ggml_type)} values take {nbytes} bytes, got {raw.size}")
        out = np.empty(n, dtype=np.float32)
        getattr(self._lib, name)(ffi.from_buffer(raw), ffi.from_buffer("float[]", out), n)
        return out

    def quantize_row_q8_K_ref(self, x):
        """ggml's quantize_row_q8_K_ref of float32 values (a multiple of 256; e.g. [tokens, K])
        -> Q8_K blocks (292 B per 256 values), uint8."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        _positive(n=x.size)
        # Zeroed: for an all-zero block ggml writes d and qs but leaves bsums untouched.
        out = np.zeros(self._check_row(Q8_K, x.size, what="n"), dtype=np.uint8)
        self._lib.quantize_row_q8_K_ref(ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.size)
        return out

    def quantize_row_q8_1(self, x):
        """The CPU backend's quantize_row_q8_1 (its SIMD build: what mul_mat makes of Q4_1/Q5_1 activations) of
        float32 values (a multiple of 32; e.g. [tokens, K]) -> block_q8_1 (36 B per 32 values), uint8."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        _positive(n=x.size)
        if not self._has("quantize_row_q8_1"):
            raise UnsupportedTypeError(f"quantize_row_q8_1 not exported by the llama.cpp libraries in {self.lib_dir}")
        out = np.zeros(self._check_row(Q8_1, x.size, what="n"), dtype=np.uint8)
        self._lib.quantize_row_q8_1(ffi.from_buffer("float[]", x), ffi.from_buffer(out), x.size)
        return out


class _Graph(Closeable):
    """A ggml context, backend and device buffer owned together (self._lib, ._ctx, ._backend, ._buffer)."""

    def close(self):
        """Free the device buffer, backend and context (idempotent)."""
        if _live(self._buffer):
            self._lib.ggml_backend_buffer_free(self._buffer)
        if _live(self._backend):
            self._lib.ggml_backend_free(self._backend)
        if _live(self._ctx):
            self._lib.ggml_free(self._ctx)
        self._ctx = self._backend = self._buffer = None

    def _open(self):
        if self._ctx is None:
            raise BackendError(f"{type(self).__name__} is closed")

    def _compute(self):
        """Run the graph; returns when the results are ready."""
        status = self._lib.ggml_backend_graph_compute(self._backend, self._graph)
        if status != 0:
            raise BackendError(f"ggml_backend_graph_compute on {self.device} failed (status {status})")

    def _set_tensors(self, arrays: dict, what: str) -> None:
        """Each input tensor from its array (its bytes checked against the tensor's)."""
        for name, tensor in self._inputs.items():
            a = arrays[name]
            if a.nbytes != self._lib.ggml_nbytes(tensor):
                raise ShapeError(f"{what}: {name} has {a.nbytes} bytes, the graph's tensor "
                                 f"{self._lib.ggml_nbytes(tensor)}")
            self._lib.ggml_backend_tensor_set(tensor, ffi.from_buffer(a), 0, a.nbytes)

    def _finish(self, outputs, graph_size, dev, device, unsupported: str | None, allocation: str) -> None:
        """The graph over `outputs` in self._ctx, a backend on `dev` that runs the first output's op (else
        UnsupportedTypeError(unsupported); None: not asked), the context's tensors in its default buffer type (plain
        layout: none of the CPU's extra buffer types, so neither repacking nor the AMX mul_mat that crashes on Q4_K;
        buffer_name says which; BackendError naming `allocation` when that fails)."""
        lib = self._lib
        self._graph = lib.ggml_new_graph_custom(self._ctx, graph_size, False)
        for out in outputs:
            lib.ggml_build_forward_expand(self._graph, out)
        self._backend = lib.ggml_backend_dev_init(dev, ffi.NULL)
        if self._backend == ffi.NULL:
            raise BackendError(f"cannot initialize a ggml backend on {device}")
        if unsupported is not None and not lib.ggml_backend_supports_op(self._backend, outputs[0]):
            raise UnsupportedTypeError(unsupported)
        self._buffer = lib.ggml_backend_alloc_ctx_tensors(self._ctx, self._backend)
        if self._buffer == ffi.NULL:
            raise BackendError(f"cannot allocate {allocation} on {device}")
        self.buffer_name = ffi.string(lib.ggml_backend_buffer_name(self._buffer)).decode()


def _set_threads(lib, dev, backend, threads) -> None:
    """A CPU backend's thread count (threads, else every core); other backends have no such function."""
    set_threads = lib.ggml_backend_reg_get_proc_address(lib.ggml_backend_dev_backend_reg(dev),
                                                        b"ggml_backend_set_n_threads")
    if set_threads != ffi.NULL:
        ffi.cast("void (*)(struct ggml_backend *, int)", set_threads)(backend, threads or os.cpu_count() or 1)


class MulMatGraph(_Graph):
    """A ggml graph of `copies` mul_mats W_i[rows, k] x x[tokens, k] on one device: each with its
    own weight tensor, all sharing one activation tensor. Allocated once, computed many times."""

    def __init__(self, bridge, device, ggml_type, rows, k, tokens, copies=1, threads=None):
        self._lib = lib = bridge._lib
        self._ctx = self._backend = self._buffer = None
        _positive(rows=rows, K=k, tokens=tokens, copies=copies)
        self.weight_nbytes = rows * bridge._check_row(ggml_type, k)
        if ggml_type in _NO_MUL_MAT:
            raise UnsupportedTypeError(f"ggml has no mul_mat for {bridge.type_name(ggml_type)} weights")
        if threads is not None and not 1 <= threads <= _MAX_THREADS:
            raise BackendError(f"threads must be in 1..{_MAX_THREADS}, got {threads}")
        self.device, self.rows, self.k, self.tokens, self.copies = device, rows, k, tokens, copies
        self._weights_set, self._input_set = set(), False
        dev = bridge._device(device)
        try:
            graph_size = 2 * copies + 8
            mem = ((2 * copies + 1) * lib.ggml_tensor_overhead()
                   + lib.ggml_graph_overhead_custom(graph_size, False))
            self._ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [mem, ffi.NULL, True])[0])
            if self._ctx == ffi.NULL:
                raise BackendError("ggml_init failed")
            self._w = [lib.ggml_new_tensor_2d(self._ctx, ggml_type, k, rows) for _ in range(copies)]
            self._x = lib.ggml_new_tensor_2d(self._ctx, F32, k, tokens)
            self._out = [lib.ggml_mul_mat(self._ctx, w, self._x) for w in self._w]
            self._finish(self._out, graph_size, dev, device,
                         f"{device} does not support mul_mat with {bridge.type_name(ggml_type)} weights",
                         f"{copies} x {self.weight_nbytes} weight bytes + activations")
            _set_threads(lib, dev, self._backend, threads)
        except BaseException:
            self.close()
            raise

    def set_weights(self, weights):
        """Raw weight blocks: one bytes-like for all copies, or a list of `copies` of them."""
        self._open()
        if not isinstance(weights, (list, tuple)):
            weights = [weights] * self.copies
        if len(weights) != self.copies:
            raise ShapeError(f"expected {self.copies} weight buffers, got {len(weights)}")
        raws = [_raw_bytes(w) for w in weights]
        for raw in raws:
            if raw.size != self.weight_nbytes:
                raise ShapeError(f"weight has {raw.size} bytes, expected {self.weight_nbytes} "
                                 f"({self.rows} rows x K={self.k})")
        for i, raw in enumerate(raws):
            self._lib.ggml_backend_tensor_set(self._w[i], ffi.from_buffer(raw), 0, raw.size)
            self._weights_set.add(i)

    def set_input(self, x):
        """Activations, float32 [tokens, K]."""
        self._open()
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.shape != (self.tokens, self.k):
            raise ShapeError(f"activations have shape {x.shape}, expected ({self.tokens}, {self.k})")
        self._lib.ggml_backend_tensor_set(self._x, ffi.from_buffer(x), 0, x.nbytes)
        self._input_set = True

    def compute(self):
        """Run the graph; returns when the results are ready."""
        self._open()
        if len(self._weights_set) != self.copies or not self._input_set:
            raise BackendError("set_weights() and set_input() must be called before compute()")
        self._compute()

    def output(self, i=0):
        """Result of mul_mat `i`, float32 [tokens, rows]."""
        self._open()
        if not 0 <= i < self.copies:
            raise ShapeError(f"output index {i} out of range (copies={self.copies})")
        out = np.empty((self.tokens, self.rows), dtype=np.float32)
        self._lib.ggml_backend_tensor_get(self._out[i], ffi.from_buffer(out), 0, out.nbytes)
        return out



# OpGraph kinds: the transformer ops llama.cpp's Gemma/Llama graphs run around the GEMMs, as those graphs chain them
# (so ggml-cuda fuses what it fuses there: RMS_NORM + MUL (+ ADD) into one kernel, and RMS_NORM + MUL + ROPE, the
# q/k norms of Gemma 3 and Qwen 3, into another).
OP_KINDS = ("rms_norm", "rms_norm_mul", "rms_norm_mul_add", "rope_neox", "rope_norm", "rms_norm_mul_rope_neox",
            "rms_norm_mul_rope_norm", "geglu", "swiglu", "scale")
_I32 = 26  # GGML_TYPE_I32


class OpGraph(_Graph):
    """One of OP_KINDS as a ggml graph on a device, computed once per call of run(). Shapes: x [rows, d] (the rope
    kinds: x [tokens, heads, d] and int32 positions[tokens]); weight [d]; add like x; gate/up [rows, d]. Parameters: eps (the
    norms), base (RoPE's freq_base; freq_scale 1, no YaRN, as llama.cpp's graphs pass them), s (scale)."""

    def __init__(self, bridge, device, kind, shape, eps=1e-6, base=10000.0, s=1.0):
        if kind not in OP_KINDS:
            raise BackendError(f"unknown op kind {kind!r} (choose from {', '.join(OP_KINDS)})")
        self._lib = lib = bridge._lib
        self._ctx = self._backend = self._buffer = None
        self.kind, self.shape, self.device = kind, tuple(shape), device
        rope = "rope" in kind
        if len(self.shape) != (3 if rope else 2) or min(self.shape) < 1:
            raise ShapeError(f"{kind}: shape {shape} (rope: [tokens, heads, d]; else [rows, d])")
        dev = bridge._device(device)
        try:
            mem = 8 * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead_custom(16, False)
            self._ctx = ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [mem, ffi.NULL, True])[0])
            if ctx == ffi.NULL:
                raise BackendError("ggml_init failed")
            d = self.shape[-1]
            if rope:
                t, h, _ = self.shape
                x = lib.ggml_new_tensor_3d(ctx, F32, d, h, t)
                pos = lib.ggml_new_tensor_1d(ctx, _I32, t)
                mode = 2 if kind.endswith("neox") else 0  # GGML_ROPE_TYPE_NEOX, NORM
                self._inputs = {"x": x, "positions": pos}
                out = x
                if kind.startswith("rms_norm"):  # the q/k norm: each head's row normed, times weight[d]
                    w = self._inputs["weight"] = lib.ggml_new_tensor_1d(ctx, F32, d)
                    out = lib.ggml_mul(ctx, lib.ggml_rms_norm(ctx, x, float(eps)), w)
                out = lib.ggml_rope_ext(ctx, out, pos, ffi.NULL, d, mode, 0, float(base), 1.0, 0.0, 1.0, 32.0, 1.0)
            else:
                rows = self.shape[0]
                x = lib.ggml_new_tensor_2d(ctx, F32, d, rows)
                self._inputs = {"x": x}
                if kind.startswith("rms_norm"):
                    out = lib.ggml_rms_norm(ctx, x, float(eps))
                    if kind != "rms_norm":
                        w = self._inputs["weight"] = lib.ggml_new_tensor_1d(ctx, F32, d)
                        out = lib.ggml_mul(ctx, out, w)
                    if kind == "rms_norm_mul_add":
                        a = self._inputs["add"] = lib.ggml_new_tensor_2d(ctx, F32, d, rows)
                        out = lib.ggml_add(ctx, out, a)
                elif kind in ("geglu", "swiglu"):
                    up = self._inputs["up"] = lib.ggml_new_tensor_2d(ctx, F32, d, rows)
                    out = (lib.ggml_geglu_split if kind == "geglu" else lib.ggml_swiglu_split)(ctx, x, up)
                else:
                    out = lib.ggml_scale(ctx, x, float(s))
            self._out = out
            self._finish([out], 16, dev, device, None, f"the {kind} graph's tensors")
        except BaseException:
            self.close()
            raise

    def run(self, **inputs) -> np.ndarray:
        """Set every input (float32; positions int32), compute, return the output in the input's shape."""
        self._open()
        if set(inputs) != set(self._inputs):
            raise ShapeError(f"{self.kind} takes {sorted(self._inputs)}, got {sorted(inputs)}")
        self._set_tensors({name: np.ascontiguousarray(a, np.int32 if name == "positions" else np.float32)
                           for name, a in inputs.items()}, self.kind)
        self._compute()
        out = np.empty(self.shape, np.float32)
        self._lib.ggml_backend_tensor_get(self._out, ffi.from_buffer(out), 0, out.nbytes)
        return out


class AttentionGraph(_Graph):
    """llama.cpp's FLASH_ATTN_EXT as its graphs build it (llama-graph.cpp build_attn_mha): q [tokens, heads, d] float32
    permuted to [d, tokens, heads], K and V caches [n_kv, heads_kv, d] f16 (n_kv = n_past + tokens) permuted likewise,
    a float16 mask [tokens, n_kv] (0 where query t at position n_past + t sees key p: p <= n_past + t and, with a
    window, n_past + t - p < window; -inf elsewhere), max_bias 0, no softcap. `copies` FLASH_ATTN_EXT nodes on the
    same inputs in one graph (each its own output): compute() runs them all, for timing per node. Output: float32
    [tokens, heads * d], ours' layout."""

    def __init__(self, bridge, device, tokens, heads, heads_kv, d, n_past, scale, window=0, copies=1, threads=None):
        _positive(tokens=tokens, heads=heads, heads_kv=heads_kv, head_dim=d, copies=copies)
        if heads % heads_kv or n_past < 0 or window < 0:
            raise ShapeError(f"attention: {heads} heads over {heads_kv} kv heads, n_past {n_past}, window {window}")
        self._lib = lib = bridge._lib
        self._ctx = self._backend = self._buffer = None
        self.device, self.tokens, self.heads, self.heads_kv, self.d = device, tokens, heads, heads_kv, d
        self.n_past, self.window, self.copies = n_past, window, copies
        self._ready = False  # set_inputs() before compute()
        n_kv = n_past + tokens
        dev = bridge._device(device)
        try:
            mem = (8 + 2 * copies) * lib.ggml_tensor_overhead() + lib.ggml_graph_overhead_custom(copies + 8, False)
            self._ctx = ctx = lib.ggml_init(ffi.new("struct ggml_init_params *", [mem, ffi.NULL, True])[0])
            if ctx == ffi.NULL:
                raise BackendError("ggml_init failed")
            q = lib.ggml_new_tensor_3d(ctx, F32, d, heads, tokens)
            k = lib.ggml_new_tensor_3d(ctx, F16, d, heads_kv, n_kv)
            v = lib.ggml_new_tensor_3d(ctx, F16, d, heads_kv, n_kv)
            mask = lib.ggml_new_tensor_2d(ctx, F16, n_kv, tokens)
            self._inputs = {"q": q, "k": k, "v": v, "mask": mask}
            qp, kp, vp = (lib.ggml_permute(ctx, t, 0, 2, 1, 3) for t in (q, k, v))
            self._out = [lib.ggml_flash_attn_ext(ctx, qp, kp, vp, mask, float(scale), 0.0, 0.0) for _ in range(copies)]
            self._finish(self._out, copies + 8, dev, device, f"{device} does not support FLASH_ATTN_EXT at head_dim {d}",
                         "the attention graph's tensors")
            _set_threads(lib, dev, self._backend, threads)
        except BaseException:
            self.close()
            raise

    def mask(self) -> np.ndarray:
        """The float16 [tokens, n_kv] mask of this causal (windowed) attention."""
        pos = self.n_past + np.arange(self.tokens)[:, None]
        key = np.arange(self.n_past + self.tokens)[None, :]
        seen = (key <= pos) & ((pos - key < self.window) if self.window else True)
        return np.where(seen, 0.0, -np.inf).astype(np.float16)

    def set_inputs(self, q, k, v) -> None:
        """q float32 [tokens, heads, d]; k, v float16 [n_kv or more rows, heads_kv, d] (the first n_kv rows are used)."""
        self._open()
        n_kv = self.n_past + self.tokens
        arrays = {"q": np.ascontiguousarray(q, np.float32), "k": np.ascontiguousarray(np.asarray(k)[:n_kv], np.float16),
                  "v": np.ascontiguousarray(np.asarray(v)[:n_kv], np.float16), "mask": self.mask()}
        self._set_tensors(arrays, "attention")
        self._ready = True

    def compute(self) -> None:
        self._open()
        if not self._ready:
            raise BackendError("AttentionGraph: set_inputs() before compute()")
        self._compute()

    def output(self) -> np.ndarray:
        self._open()
        out = np.empty((self.tokens, self.heads * self.d), np.float32)
        self._lib.ggml_backend_tensor_get(self._out[0], ffi.from_buffer(out), 0, out.nbytes)
        return out
