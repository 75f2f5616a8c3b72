"""libggml_ciq through cffi (ABI mode). The cdef is read from the C header's CDEF region, never retyped."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import cffi
import numpy as np

from . import quants
from .errors import (BackendError, InvalidArgumentError, LibraryNotFoundError, OutOfMemoryError, ShapeError,
                     UnsupportedTypeError)
from .resources import Closeable

_PACKAGE_DIR = Path(__file__).resolve().parent
_SOURCE_HEADER = _PACKAGE_DIR.parent / "native" / "include" / "ggml_ciq.h"
_LIBRARY_NAMES = ("libggml_ciq.so", "libggml_ciq.dylib", "ggml_ciq.dll")
API_VERSION = 31  # GGML_CIQ_API_VERSION of the header this package's code is written against

def _header_path() -> Path:
    for candidate in (_PACKAGE_DIR / "include" / "ggml_ciq.h", _SOURCE_HEADER):
        if candidate.exists():
            return candidate
    raise LibraryNotFoundError("ggml_ciq.h not found next to the package or in native/include")


def _cdef_source(header: Path) -> str:
    text = header.read_text()
    try:
        body = text.split("/* CDEF-BEGIN */", 1)[1].split("/* CDEF-END */", 1)[0]
    except IndexError:
        raise LibraryNotFoundError(f"{header} has no CDEF region") from None
    return body


def _library_path() -> Path:
    env = os.environ.get("GGML_CIQ_LIB")
    if env:
        path = Path(env)
        if not path.is_file():
            raise LibraryNotFoundError(f"GGML_CIQ_LIB={env} is not a file")
        return path
    for name in _LIBRARY_NAMES:
        if (_PACKAGE_DIR / name).is_file():
            return _PACKAGE_DIR / name
    # Running from a checkout: the library pip's CMake build left under build/.
    for name in _LIBRARY_NAMES:
        builds = sorted(_PACKAGE_DIR.parent.glob(f"build/*/{name}"), key=lambda p: p.stat().st_mtime)
        if builds:
            return builds[-1]
    raise LibraryNotFoundError("libggml_ciq not found in the package (pip install . builds it) and GGML_CIQ_LIB is unset")


class Native:
    """The loaded library: ``ffi``, ``lib`` and a ``check`` that turns a status into an exception."""

    def __init__(self, path: Path):
        self.path = path
        self.ffi = cffi.FFI()
        self.ffi.cdef(_cdef_source(_header_path()))
        try:
            self.lib = self.ffi.dlopen(str(path))
        except OSError as exc:
            raise LibraryNotFoundError(f"cannot load {path}: {exc}") from None
        version = self.ffi.new("int *")
        if self.lib.ciq_api_version(version) != self.lib.CIQ_OK or version[0] != API_VERSION:
            raise LibraryNotFoundError(f"{path} has API version {version[0]}, this package expects {API_VERSION}")

    def check(self, status: int) -> None:
        if status == self.lib.CIQ_OK:
            return
        message = self.ffi.string(self.lib.ciq_last_error()).decode(errors="replace")
        if status == self.lib.CIQ_ERR_INVALID_ARGUMENT:
            raise InvalidArgumentError(message)
        if status == self.lib.CIQ_ERR_OUT_OF_MEMORY:
            raise OutOfMemoryError(f"out of memory: {message}")
        raise BackendError(message)


@lru_cache(maxsize=None)
def load() -> Native:
    return Native(_library_path())


def build_info() -> dict:
    n = load()
    text = n.ffi.new("const char **")
    n.check(n.lib.ciq_build_info(text))
    return json.loads(n.ffi.string(text[0]).decode())


# ---------------------------------------------------------------------------------------------------------------
# Names and facts from the header and the library's registry (native/src/registry.cpp); none is retyped here.

@lru_cache(maxsize=None)
def _header_ffi() -> cffi.FFI:
    ffi = cffi.FFI()
    ffi.cdef(_cdef_source(_header_path()))
    return ffi


@lru_cache(maxsize=None)
def enum_names(ctype: str, prefix: str) -> tuple[str, ...]:
    """The header's names of an enum, lower-cased without the prefix, indexed by value (COUNT left out):
    enum_names("ciq_semantics", "CIQ_SEMANTICS_") == ("cpu", "mmq", "f16", "any")."""
    elements = _header_ffi().typeof(ctype).elements  # value -> name
    values = {v: name[len(prefix):].lower() for v, name in elements.items() if not name.endswith("_COUNT")}
    if sorted(values) != list(range(len(values))):
        raise LibraryNotFoundError(f"{ctype} values are not 0..n-1 in ggml_ciq.h")
    return tuple(values[v] for v in range(len(values)))


@dataclass(frozen=True)
class VariantInfo:
    """ciq_variant_describe's facts about one GEMM kernel variant."""

    id: int
    name: str
    semantics: str                    # what "any" resolves to
    host_semantics: tuple[str, ...]   # semantics it implements on the host (empty: not a host kernel)
    gpu_semantics: tuple[str, ...]    # ... on a GPU
    weight_types: tuple[int, ...]     # ggml type ids it multiplies
    min_tokens: int
    max_tokens: int
    k_multiple: int                   # K must be a multiple of this too (beyond the weight type's block)
    description: str


@lru_cache(maxsize=None)
def variants() -> tuple[VariantInfo, ...]:
    """Every variant of the library's registry, AUTO first, indexed by ciq_variant."""
    n = load()
    info = n.ffi.new("ciq_variant_info *")
    names = enum_names("ciq_semantics", "CIQ_SEMANTICS_")
    out = []
    for v in range(n.lib.CIQ_VARIANT_COUNT):
        n.check(n.lib.ciq_variant_describe(v, info))
        out.append(VariantInfo(
            v, n.ffi.string(info.name).decode(), names[info.semantics],
            tuple(s for i, s in enumerate(names) if info.host_semantics >> i & 1),
            tuple(s for i, s in enumerate(names) if info.gpu_semantics >> i & 1),
            tuple(int(info.weight_types[i]) for i in range(info.weight_type_count)),
            int(info.min_tokens), int(info.max_tokens), int(info.k_multiple),
            n.ffi.string(info.description).decode()))
    return tuple(out)


def weight_types(device) -> tuple[int, ...]:
    """The ggml weight types some kernel of ours multiplies on this device's kind (host or GPU), from the registry."""
    host = parse_device(device) < 0
    return tuple(sorted({t for v in variants()[1:] if (v.host_semantics if host else v.gpu_semantics)
                         for t in v.weight_types}))


def __getattr__(name: str):
    """VARIANTS (names, AUTO first), GPU_VARIANTS (the GPU kernels of the K-quant types for every token count: what
    bench and the sanitizer run), SEMANTICS, LAYOUTS and OUT_TYPES, read from the header and the registry on first
    use."""
    if name == "VARIANTS":
        return tuple(v.name for v in variants())
    if name == "GPU_VARIANTS":
        return tuple(v.name for v in variants()[1:]
                     if v.gpu_semantics and quants.Q4_K in v.weight_types and v.min_tokens == 1 and v.max_tokens >= 2**62)
    if name == "SEMANTICS":
        return enum_names("ciq_semantics", "CIQ_SEMANTICS_")
    if name == "LAYOUTS":
        return enum_names("ciq_layout", "CIQ_LAYOUT_")
    if name == "OUT_TYPES":
        return enum_names("ciq_out_type", "CIQ_OUT_")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_count() -> int:
    n = load()
    count = n.ffi.new("int *")
    n.check(n.lib.ciq_device_count(count))
    return count[0]


def parse_device(device) -> int:
    """'cpu' -> CIQ_DEVICE_CPU, 'cuda' / 'cuda:N' / N -> N."""
    if isinstance(device, int):
        return device
    text = str(device).lower()
    if text == "cpu":
        return _header_ffi().typeof("ciq_device_index").relements["CIQ_DEVICE_CPU"]
    if text in ("cuda", "gpu"):
        return 0
    for prefix in ("cuda:", "gpu:"):
        if text.startswith(prefix) and text[len(prefix):].isdigit():
            return int(text[len(prefix):])
    raise InvalidArgumentError(f"unknown device {device!r} (use cpu, cuda or cuda:N)")


def device_name(device) -> str:
    n = load()
    buf = n.ffi.new("char[256]")
    n.check(n.lib.ciq_device_name(parse_device(device), buf, 256))
    return n.ffi.string(buf).decode()


def variant_id(variant: str) -> int:
    names = tuple(v.name for v in variants())
    if variant not in names:
        raise InvalidArgumentError(f"unknown kernel variant {variant!r} (choose from {', '.join(names)})")
    return names.index(variant)


def variant_info(variant: str) -> VariantInfo:
    return variants()[variant_id(variant)]


def semantics_id(semantics: str) -> int:
    names = enum_names("ciq_semantics", "CIQ_SEMANTICS_")
    if semantics not in names:
        raise InvalidArgumentError(f"unknown semantics {semantics!r} (choose from {', '.join(names)})")
    return names.index(semantics)


def variant_available(device, variant: str) -> bool:
    n = load()
    out = n.ffi.new("int *")
    n.check(n.lib.ciq_variant_available(parse_device(device), variant_id(variant), out))
    return bool(out[0])


@dataclass(frozen=True)
class Plan:
    """ciq_gemm_plan's answer: the resolved variant and semantics, the activation layout and its bytes, and whether
    the registry's measurements say to offload this GEMM from llama.cpp. ``c`` is the C struct for
    ciq_gemm_quantized."""

    variant: str
    semantics: str
    layout: str
    activation_bytes: int
    offload: bool
    c: object


def plan(variant: str, device, semantics: str, ggml_type: int, rows: int, k: int, tokens: int) -> Plan:
    n = load()
    out = n.ffi.new("ciq_plan *")
    n.check(n.lib.ciq_gemm_plan(parse_device(device), variant_id(variant), semantics_id(semantics), ggml_type, rows,
                                k, tokens, out))
    return Plan(variants()[out.variant].name, enum_names("ciq_semantics", "CIQ_SEMANTICS_")[out.semantics],
                enum_names("ciq_layout", "CIQ_LAYOUT_")[out.activation_layout], int(out.activation_bytes),
                bool(out.offload), out)


def resolve_variant(variant: str, device, semantics: str, ggml_type: int, rows: int, k: int, tokens: int) -> str:
    """The variant ciq_gemm would run (ciq_gemm_plan)."""
    return plan(variant, device, semantics, ggml_type, rows, k, tokens).variant


def dispatch_counts() -> dict[tuple[str, str], int]:
    """{(variant, weight type name): launches} for every variant and the types it multiplies, since the last reset."""
    n = load()
    out = n.ffi.new("uint64_t *")
    counts = {}
    for v in variants():
        for t in v.weight_types:
            n.check(n.lib.ciq_dispatch_count(v.id, t, out))
            counts[(v.name, quants.type_name(t))] = int(out[0])
    return counts


WGMMA_FORMS = ("ss", "rs", "stream_k", "grouped", "glu")


def wgmma_launch_counts() -> dict[str, int]:
    """{wgmma kernel form: launches} since the last reset: "ss" (A tiles through shared memory), "rs" (A from
    registers), "stream_k" (launches of either form that stream K), "grouped" (RS launches over two weights:
    ciq_gemm_quantized_group), "glu" (launches whose epilogue applied a GLU: ciq_gemm_quantized_glu)."""
    n = load()
    out = n.ffi.new("uint64_t *")
    counts = {}
    for i, form in enumerate(WGMMA_FORMS):
        n.check(n.lib.ciq_wgmma_launch_count(i, out))
        counts[form] = int(out[0])
    return counts


def attention_dispatch_counts() -> dict[str, int]:
    """{attention kernel: ciq_attention launches} since the last reset (AUTO never counts: launches are resolved)."""
    n = load()
    out = n.ffi.new("uint64_t *")
    counts = {}
    for kernel, name in enumerate(enum_names("ciq_attention_kernel", "CIQ_ATTENTION_")):
        n.check(n.lib.ciq_attention_dispatch_count(kernel, out))
        counts[name] = int(out[0])
    return counts


def dispatch_reset() -> None:
    n = load()
    n.check(n.lib.ciq_dispatch_reset())


def set_num_threads(threads: int) -> None:
    n = load()
    n.check(n.lib.ciq_threads_set(int(threads)))


class Buffer(Closeable):
    """Memory on a device (or the host, device -1) owned by libggml_ciq; freed on close()."""

    def __init__(self, device, nbytes: int):
        self.native = load()
        self.device = parse_device(device)
        self.nbytes = int(nbytes)
        ptr = self.native.ffi.new("void **")
        self.native.check(self.native.lib.ciq_memory_alloc(self.device, self.nbytes, ptr))
        self.ptr = ptr[0]

    @classmethod
    def from_array(cls, device, array: np.ndarray) -> "Buffer":
        array = np.ascontiguousarray(array)
        buf = cls(device, array.nbytes)
        buf.upload(array)
        return buf

    def upload(self, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes > self.nbytes:
            raise ShapeError(f"upload of {array.nbytes} bytes into a {self.nbytes}-byte buffer")
        n = self.native
        n.check(n.lib.ciq_memory_upload(self.device, self.ptr, n.ffi.from_buffer(array), array.nbytes))

    def download(self, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype)
        if out.nbytes > self.nbytes:
            raise ShapeError(f"download of {out.nbytes} bytes from a {self.nbytes}-byte buffer")
        n = self.native
        n.check(n.lib.ciq_memory_download(self.device, n.ffi.from_buffer(out), self.ptr, out.nbytes))
        return out

    def fill(self, byte: int) -> None:
        self.native.check(self.native.lib.ciq_memory_fill(self.device, self.ptr, byte, self.nbytes))

    def close(self) -> None:
        if self.ptr is not None:
            self.native.check(self.native.lib.ciq_memory_free(self.device, self.ptr))
            self.ptr = None


def glu_into(device: int, order_id: int, kind_id: int, gate_ptr, up_ptr, out_ptr, size: int, row: int) -> None:
    """ciq_glu of `size` float32 values in rows of `row`: one call, or one a row where llama.cpp CPU's SIMD order
    (whose 8-value blocks run from each row's start: ggml_ciq.h) meets rows that are not whole blocks."""
    n = load()
    if order_id != n.lib.CIQ_ORDER_LLAMACPP_CPU or row % 8 == 0 or size <= row:
        n.check(n.lib.ciq_glu(device, order_id, kind_id, gate_ptr, up_ptr, size, out_ptr))
        return
    for start in range(0, size, row):
        n.check(n.lib.ciq_glu(device, order_id, kind_id, gate_ptr + start, up_ptr + start, row, out_ptr + start))


def activations_layout(semantics: str, weight_type: int) -> str:
    """The layout a semantics quantizes activations into for a weight type (ciq_activations_layout)."""
    n = load()
    out = n.ffi.new("ciq_layout *")
    n.check(n.lib.ciq_activations_layout(semantics_id(semantics), weight_type, out))
    return enum_names("ciq_layout", "CIQ_LAYOUT_")[out[0]]


def _layout_id(layout: str) -> int:
    names = enum_names("ciq_layout", "CIQ_LAYOUT_")
    if layout not in names:
        raise InvalidArgumentError(f"unknown activation layout {layout!r} (choose from {', '.join(names)})")
    return names.index(layout)


def activation_bytes(layout: str, tokens: int, k: int) -> int:
    n = load()
    out = n.ffi.new("size_t *")
    n.check(n.lib.ciq_activations_size(_layout_id(layout), tokens, k, out))
    return int(out[0])


def quantize_into(device: int, layout: str, x_ptr, out_ptr, tokens: int, k: int) -> None:
    """Device-to-device: float activations at x_ptr into a layout at out_ptr (ciq_activations_quantize)."""
    n = load()
    n.check(n.lib.ciq_activations_quantize(device, _layout_id(layout), n.ffi.cast("float *", x_ptr), out_ptr, tokens,
                                           k))


def quantize_activations(x: np.ndarray, semantics: str, weight_type: int, device="cpu") -> np.ndarray:
    """Activations in the layout a semantics uses for a weight type (Q8_K, q8_1-mmq DS4/D4, f16, q8_0), made on a
    device by libggml_ciq and returned to the host as bytes."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ShapeError(f"activations must be [tokens, K], got shape {x.shape}")
    tokens, k = x.shape
    layout = activations_layout(semantics, weight_type)
    dev = parse_device(device)
    size = activation_bytes(layout, tokens, k)
    with Buffer.from_array(dev, x) as xb, Buffer(dev, max(size, 1)) as qb:
        quantize_into(dev, layout, xb.ptr, qb.ptr, tokens, k)
        return qb.download(np.uint8, (size,))


def _out_type_id(out_type: str) -> int:
    names = enum_names("ciq_out_type", "CIQ_OUT_")
    if out_type not in names:
        raise InvalidArgumentError(f"unknown output type {out_type!r} (choose from {', '.join(names)})")
    return names.index(out_type)


@dataclass
class GemmProblem:
    """A weight uploaded once to a device, for repeated GEMMs (benchmarks reuse its buffers)."""

    ggml_type: int
    rows: int
    k: int
    device: int
    weight: Buffer

    @classmethod
    def upload(cls, ggml_type: int, data, rows: int, k: int, device="cpu") -> "GemmProblem":
        raw = np.ascontiguousarray(np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8).reshape(-1))
        types = variants()[0].weight_types  # AUTO covers every type some variant multiplies
        if ggml_type not in types:
            raise UnsupportedTypeError(f"the GEMM takes {', '.join(quants.type_name(t) for t in types)} weights, "
                                       f"not {quants.type_name(ggml_type)}")
        expected = rows * quants.row_bytes(ggml_type, k)
        if raw.size != expected:
            raise ShapeError(f"{quants.type_name(ggml_type)} [{rows} x {k}] needs {expected} bytes, got {raw.size}")
        dev = parse_device(device)
        return cls(ggml_type, rows, k, dev, Buffer.from_array(dev, raw))

    def plan(self, tokens: int, variant: str = "auto", semantics: str = "any") -> Plan:
        return plan(variant, self.device, semantics, self.ggml_type, self.rows, self.k, tokens)

    def run(self, x: np.ndarray, variant: str = "auto", semantics: str | None = None, out_type: str = "f32",
            poison: bool = True) -> np.ndarray:
        """out[tokens, rows] = x @ W^T (ciq_gemm). semantics None: the variant's own ("any"). The output buffer is
        poisoned (NaN bytes) first unless poison=False."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ShapeError(f"activations must be [tokens, {self.k}], got shape {x.shape}")
        sem, v, ot = semantics_id(semantics or "any"), variant_id(variant), _out_type_id(out_type)
        tokens = x.shape[0]
        n = load()
        dtype = np.float32 if ot == n.lib.CIQ_OUT_F32 else np.uint16

        def call(x_ptr, out_ptr):
            n.check(n.lib.ciq_gemm(self.device, v, sem, self.ggml_type, self.weight.ptr, self.weight.nbytes, self.rows,
                                   self.k, n.ffi.cast("float *", x_ptr), tokens, out_ptr, ot))

        if self.device < 0:  # the host reads and writes numpy's memory directly
            out = np.empty((tokens, self.rows), dtype)
            if poison:
                out.view(np.uint8).fill(0xFF)  # NaN in both f32 and bf16
            call(n.ffi.from_buffer(x), n.ffi.from_buffer(out))
        else:
            nbytes = tokens * self.rows * np.dtype(dtype).itemsize
            with Buffer.from_array(self.device, x) as xb, Buffer(self.device, nbytes) as ob:
                if poison:
                    ob.fill(0xFF)
                call(xb.ptr, ob.ptr)
                n.check(n.lib.ciq_device_synchronize(self.device))
                out = ob.download(dtype, (tokens, self.rows))
        return out if dtype is np.float32 else (out.astype(np.uint32) << 16).view(np.float32)

    def close(self) -> None:
        self.weight.close()


def gemm(weight, x: np.ndarray, variant: str = "auto", device="cpu", semantics: str | None = None,
         out_type: str = "f32", ggml_type: int | None = None, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """out[tokens, rows] = x @ W^T through libggml_ciq (ciq_gemm).

    ``weight`` is a model.Tensor, or raw block bytes with ``ggml_type``, ``rows`` and ``k``. ``semantics`` defaults
    to the resolved variant's own (variant_info(...).semantics; AUTO: the first variant of the registry's AUTO order).
    """
    if hasattr(weight, "ggml_type"):
        ggml_type, rows, k, data = weight.ggml_type, weight.rows, weight.k, weight.raw()
    else:
        if ggml_type is None or rows is None or k is None:
            raise InvalidArgumentError("raw weight bytes need ggml_type, rows and k")
        data = weight
    problem = GemmProblem.upload(ggml_type, data, rows, k, device)
    try:
        return problem.run(x, variant=variant, semantics=semantics, out_type=out_type)
    finally:
        problem.close()


def gemm_q32(data, x: np.ndarray, ggml_type: int, rows: int, k: int, device="cpu",
             semantics: str = "mmq") -> np.ndarray:
    """out[tokens, rows] = x @ W^T for 32-block bytes (Q4_0/Q5_0/Q8_0/Q4_1/Q5_1, K any multiple of 32): ciq_gemm
    with the q32 variant, semantics "mmq" (llama.cpp CUDA MMQ's, host or GPU) or "cpu" (llama.cpp x86 CPU's, host
    only)."""
    q32 = variant_info("q32")
    if ggml_type not in q32.weight_types:
        raise UnsupportedTypeError(f"gemm_q32: {quants.type_name(ggml_type)} is not "
                                   f"{' or '.join(quants.type_name(t) for t in q32.weight_types)}")
    implemented = sorted(set(q32.host_semantics) | set(q32.gpu_semantics))
    if semantics not in implemented:
        raise InvalidArgumentError(f"gemm_q32: unknown semantics {semantics!r} (choose {' or '.join(implemented)})")
    return gemm(data, x, variant="q32", device=device, semantics=semantics, ggml_type=ggml_type, rows=rows, k=k)
