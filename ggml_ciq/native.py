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

VARIANTS = ("auto", "cpu", "wmma", "wmma-wide", "wmma-shared", "wmma-bigtile", "mma", "wgmma")
GPU_VARIANTS = VARIANTS[2:]
SEMANTICS = ("cpu", "mmq", "f16", "any")  # "any": whatever AUTO picks (ciq_gemm only)
VARIANT_SEMANTICS = {"mma": "mmq", "wgmma": "f16"}  # the rest (cpu: also mmq) implement cpu semantics


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
        if self.lib.ciq_api_version() != 1:
            raise LibraryNotFoundError(f"{path} has API version {self.lib.ciq_api_version()}, this package expects 1")

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
    return json.loads(n.ffi.string(n.lib.ciq_build_info()).decode())


def device_count() -> int:
    n = load()
    count = n.ffi.new("int *")
    n.check(n.lib.ciq_device_count(count))
    return count[0]


def parse_device(device) -> int:
    """'cpu' -> -1, 'cuda' / 'cuda:N' / N -> N."""
    if isinstance(device, int):
        return device
    text = str(device).lower()
    if text == "cpu":
        return -1
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
    if variant not in VARIANTS:
        raise InvalidArgumentError(f"unknown kernel variant {variant!r} (choose from {', '.join(VARIANTS)})")
    return VARIANTS.index(variant)


def variant_available(device, variant: str) -> bool:
    n = load()
    out = n.ffi.new("int *")
    n.check(n.lib.ciq_variant_available(parse_device(device), variant_id(variant), out))
    return bool(out[0])


def default_semantics(variant: str, device) -> str:
    """The semantics a variant implements; AUTO: the fastest kernel's ("any"; on the CPU, llama.cpp CPU's)."""
    if variant in VARIANT_SEMANTICS:
        return VARIANT_SEMANTICS[variant]
    if variant in GPU_VARIANTS or variant == "cpu":
        return "cpu"
    return "cpu" if parse_device(device) < 0 else "any"


def resolve_variant(variant: str, device, semantics: str, ggml_type: int, rows: int, k: int, tokens: int) -> str:
    n = load()
    out = n.ffi.new("ciq_variant *")
    n.check(n.lib.ciq_resolve_variant(parse_device(device), variant_id(variant), SEMANTICS.index(semantics),
                                      ggml_type, rows, k, tokens, out))
    return VARIANTS[out[0]]


def dispatch_counts() -> dict[tuple[str, str], int]:
    """{(variant, 'Q4_K'|'Q6_K'): launches} for every variant, since the last reset."""
    n = load()
    out = n.ffi.new("uint64_t *")
    counts = {}
    for v, name in enumerate(VARIANTS):
        for t in quants.KEEP_QUANT_TYPES:
            n.check(n.lib.ciq_dispatch_count(v, t, out))
            counts[(name, quants.type_name(t))] = int(out[0])
    return counts


def q32_dispatch_counts() -> dict[tuple[str, str], int]:
    """{("cpu" | "cuda", 'Q4_0'|'Q5_0'|'Q8_0'): ciq_gemm_q32 calls} since the last reset."""
    n = load()
    out = n.ffi.new("uint64_t *")
    counts = {}
    for device, name in ((-1, "cpu"), (0, "cuda")):
        for t in quants.Q32_TYPES:
            n.check(n.lib.ciq_q32_dispatch_count(device, t, out))
            counts[(name, quants.type_name(t))] = int(out[0])
    return counts


def dispatch_reset() -> None:
    load().lib.ciq_dispatch_reset()


def set_num_threads(threads: int) -> None:
    n = load()
    n.check(n.lib.ciq_set_num_threads(int(threads)))


class Buffer(Closeable):
    """Memory on a device (or the host, device -1) owned by libggml_ciq; freed on close()."""

    def __init__(self, device, nbytes: int):
        self.native = load()
        self.device = parse_device(device)
        self.nbytes = int(nbytes)
        ptr = self.native.ffi.new("void **")
        self.native.check(self.native.lib.ciq_malloc(self.device, self.nbytes, ptr))
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
        n.check(n.lib.ciq_memcpy_to_device(self.device, self.ptr, n.ffi.from_buffer(array), array.nbytes))

    def download(self, dtype, shape) -> np.ndarray:
        out = np.empty(shape, dtype)
        if out.nbytes > self.nbytes:
            raise ShapeError(f"download of {out.nbytes} bytes from a {self.nbytes}-byte buffer")
        n = self.native
        n.check(n.lib.ciq_memcpy_to_host(self.device, n.ffi.from_buffer(out), self.ptr, out.nbytes))
        return out

    def fill(self, byte: int) -> None:
        self.native.check(self.native.lib.ciq_memset(self.device, self.ptr, byte, self.nbytes))

    def close(self) -> None:
        if self.ptr is not None:
            self.native.check(self.native.lib.ciq_free(self.device, self.ptr))
            self.ptr = None


def quantize_activations(x: np.ndarray, semantics: str, weight_type: int, device="cpu") -> np.ndarray:
    """Activations in a semantics' layout, made on a device by libggml_ciq and returned to the host as bytes:
    Q8_K (cpu), q8_1-mmq (mmq) or the f16 layout (f16)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ShapeError(f"activations must be [tokens, K], got shape {x.shape}")
    if semantics not in SEMANTICS[:3]:
        raise InvalidArgumentError(f"unknown semantics {semantics!r} (choose cpu, mmq or f16)")
    tokens, k = x.shape
    load()  # a missing library is a LibraryNotFoundError before any buffer is made
    dev = parse_device(device)
    size = activation_bytes(semantics, tokens, k)
    with Buffer.from_array(dev, x) as xb, Buffer(dev, max(size, 1)) as qb:
        quantize_into(dev, semantics, weight_type, xb.ptr, qb.ptr, tokens, k)
        return qb.download(np.uint8, (size,))


def activation_bytes(semantics: str, tokens: int, k: int) -> int:
    lib = load().lib
    return {"cpu": lib.ciq_q8_K_size, "mmq": lib.ciq_q8_1_mmq_size, "f16": lib.ciq_f16_size}[semantics](tokens, k)


def quantize_into(device: int, semantics: str, weight_type: int, x_ptr, out_ptr, tokens: int, k: int) -> None:
    """Device-to-device: float activations at x_ptr into the semantics' layout at out_ptr."""
    n = load()
    xp = n.ffi.cast("float *", x_ptr)
    if semantics == "cpu":
        n.check(n.lib.ciq_quantize_q8_K(device, xp, out_ptr, tokens, k))
    elif semantics == "mmq":
        n.check(n.lib.ciq_quantize_q8_1_mmq(device, weight_type, xp, out_ptr, tokens, k))
    else:
        n.check(n.lib.ciq_convert_f16(device, xp, out_ptr, tokens, k))


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
        if ggml_type not in quants.KEEP_QUANT_TYPES:
            raise InvalidArgumentError(f"keep-quant GEMM takes Q4_K or Q6_K weights, not {quants.type_name(ggml_type)}")
        expected = rows * quants.row_bytes(ggml_type, k)
        if raw.size != expected:
            raise ShapeError(f"{quants.type_name(ggml_type)} [{rows} x {k}] needs {expected} bytes, got {raw.size}")
        dev = parse_device(device)
        return cls(ggml_type, rows, k, dev, Buffer.from_array(dev, raw))

    def run(self, x: np.ndarray, variant: str = "auto", semantics: str | None = None, out_type: str = "f32",
            poison: bool = True) -> np.ndarray:
        """out[tokens, rows] = x @ W^T. The output buffer is poisoned (NaN bytes) first unless poison=False."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.k:
            raise ShapeError(f"activations must be [tokens, {self.k}], got shape {x.shape}")
        semantics = semantics or default_semantics(variant, self.device)
        if semantics not in SEMANTICS:
            raise InvalidArgumentError(f"unknown semantics {semantics!r} (choose from {', '.join(SEMANTICS)})")
        if out_type not in ("f32", "bf16"):
            raise InvalidArgumentError(f"unknown output type {out_type!r} (choose f32 or bf16)")
        tokens = x.shape[0]
        n = load()
        dtype = np.float32 if out_type == "f32" else np.uint16

        def call(x_ptr, out_ptr):
            n.check(n.lib.ciq_gemm(self.device, variant_id(variant), SEMANTICS.index(semantics), self.ggml_type,
                                   self.weight.ptr, self.weight.nbytes, self.rows, self.k, n.ffi.cast("float *", x_ptr),
                                   tokens, out_ptr, 0 if out_type == "f32" else 1))

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
                n.check(n.lib.ciq_synchronize(self.device))
                out = ob.download(dtype, (tokens, self.rows))
        return out if out_type == "f32" else (out.astype(np.uint32) << 16).view(np.float32)

    def close(self) -> None:
        self.weight.close()


def gemm(weight, x: np.ndarray, variant: str = "auto", device="cpu", semantics: str | None = None,
         out_type: str = "f32", ggml_type: int | None = None, rows: int | None = None, k: int | None = None) -> np.ndarray:
    """out[tokens, rows] = x @ W^T through libggml_ciq.

    ``weight`` is a model.Tensor, or raw block bytes with ``ggml_type``, ``rows`` and ``k``.
    ``semantics`` defaults to the variant's own ('mma' -> mmq, 'wgmma' -> f16, WMMA and cpu -> cpu; auto: GPU any,
    CPU cpu).
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
    """out[tokens, rows] = x @ W^T for Q4_0/Q5_0/Q8_0 bytes (ciq_gemm_q32): semantics "mmq" (llama.cpp CUDA MMQ's,
    host or GPU) or "cpu" (llama.cpp x86 CPU's, host only)."""
    if ggml_type not in quants.Q32_TYPES:
        raise UnsupportedTypeError(f"gemm_q32: {quants.type_name(ggml_type)} is not Q4_0, Q5_0 or Q8_0")
    if semantics not in ("cpu", "mmq"):
        raise InvalidArgumentError(f"gemm_q32: unknown semantics {semantics!r} (choose cpu or mmq)")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != k:
        raise ShapeError(f"activations must be [tokens, {k}], got shape {x.shape}")
    raw = np.ascontiguousarray(data.view(np.uint8) if isinstance(data, np.ndarray) else np.frombuffer(data, np.uint8))
    if raw.size != rows * quants.row_bytes(ggml_type, k):
        raise ShapeError(f"{quants.type_name(ggml_type)} [{rows} x {k}] needs {rows * quants.row_bytes(ggml_type, k)} "
                         f"bytes, got {raw.size}")
    n, dev = load(), parse_device(device)
    if dev < 0:  # the host reads and writes numpy's memory directly
        out = np.full((len(x), rows), np.nan, np.float32)  # NaN where the kernel writes nothing
        n.check(n.lib.ciq_gemm_q32(dev, SEMANTICS.index(semantics), ggml_type, n.ffi.from_buffer(raw), rows, k,
                                   n.ffi.from_buffer("float[]", x), len(x), n.ffi.from_buffer("float[]", out)))
        return out
    with Buffer.from_array(dev, raw) as wb, Buffer.from_array(dev, x) as xb, Buffer(dev, rows * len(x) * 4) as ob:
        n.check(n.lib.ciq_memset(dev, ob.ptr, 0xFF, rows * len(x) * 4))  # NaN where the kernel writes nothing
        n.check(n.lib.ciq_gemm_q32(dev, SEMANTICS.index(semantics), ggml_type, wb.ptr, rows, k,
                                   n.ffi.cast("float *", xb.ptr), len(x), n.ffi.cast("float *", ob.ptr)))
        return ob.download(np.float32, (len(x), rows))
