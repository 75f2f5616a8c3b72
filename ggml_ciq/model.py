"""GGUF model files: typed hyperparameters and zero-copy tensors on top of gguf-py's reader.

Shape convention, used everywhere in ggml_ciq: a weight is ``[rows = output features, cols = input
features]`` (GGUF's ne1, ne0); ``Tensor.k`` is cols. Tensor data is a read-only memmap view of the file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import quants
from .errors import GGUFFileError, UnsupportedTypeError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class Tensor:
    """One tensor of a GGUF file: name, ggml type, [rows, cols] and its raw bytes (memmap view)."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]  # (rows, cols) for matrices; GGUF order reversed
    data: np.ndarray = field(repr=False)

    @property
    def type_name(self) -> str:
        return quants.type_name(self.ggml_type)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def k(self) -> int:
        return self.shape[-1]

    @property
    def is_keep_quant(self) -> bool:
        return self.ggml_type in quants.KEEP_QUANT_TYPES and len(self.shape) == 2

    def raw(self) -> np.ndarray:
        """The tensor's bytes as a flat uint8 array (no copy)."""
        return self.data.reshape(-1).view(np.uint8)

    def dequantize(self) -> np.ndarray:
        """float32 [rows, cols]."""
        return quants.dequantize(self.ggml_type, self.raw(), self.rows, self.k)


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters every architecture we run shares; the rest stays in ``metadata``."""

    architecture: str
    name: str
    block_count: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    context_length: int
    rms_norm_eps: float
    rope_freq_base: float
    vocab_size: int
    metadata: dict = field(repr=False, default_factory=dict)


class _CheckedReader:
    """gguf.GGUFReader that names the tensor a truncated or corrupt file breaks on."""

    @staticmethod
    def open(path: Path):
        import gguf

        class Reader(gguf.GGUFReader):
            def _build_tensors(self, start_offs, fields):
                size = len(self.data)
                for f in fields:
                    _, name_data, _, dims, raw_dtype, offset = f.parts
                    name = bytes(name_data).decode("utf-8", "replace")
                    try:
                        ggml_type = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                    except ValueError:
                        raise GGUFFileError(f"{path}: tensor {name} has unknown ggml type {int(raw_dtype[0])}") from None
                    block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
                    n_bytes = int(np.prod(dims)) * type_size // block
                    start = int(start_offs + offset[0])
                    if start + n_bytes > size:
                        raise GGUFFileError(f"{path}: truncated: tensor {name} needs bytes {start}..{start + n_bytes} "
                                            f"but the file has {size}")
                super()._build_tensors(start_offs, fields)

        return Reader(path)


def _field_value(reader, key: str):
    f = reader.get_field(key)
    if f is None:
        return None
    value = f.contents()
    return value


class ModelFile:
    """An open GGUF file. ``ModelFile(path)`` validates it; errors are GGUFFileError with one-line messages."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFFileError(f"model file not found: {self.path}")
        if not self.path.is_file():
            raise GGUFFileError(f"not a file: {self.path}")
        with open(self.path, "rb") as fh:
            magic = fh.read(4)
        if magic != GGUF_MAGIC:
            raise GGUFFileError(f"{self.path} is not a GGUF file (magic {magic!r})")
        try:
            reader = _CheckedReader.open(self.path)
        except GGUFFileError:
            raise
        except Exception as exc:  # gguf-py raises assorted errors on corrupt headers
            raise GGUFFileError(f"{self.path}: truncated or corrupt GGUF header ({type(exc).__name__}: {exc})") from None
        self._reader = reader
        self.tensors: dict[str, Tensor] = {}
        for t in reader.tensors:
            shape = tuple(int(d) for d in reversed(t.shape.tolist()))
            self.tensors[t.name] = Tensor(t.name, int(t.tensor_type), shape, t.data)
        self.config = self._read_config()

    def _read_config(self) -> ModelConfig:
        r = self._reader
        arch = _field_value(r, "general.architecture") or "unknown"

        def get(key, default=0):
            v = _field_value(r, f"{arch}.{key}")
            if isinstance(v, list):  # per-layer arrays (e.g. head_count_kv): the first layer's value
                v = v[0] if v else default
            return default if v is None else v

        tokens = r.get_field("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else 0
        if not vocab and "token_embd.weight" in self.tensors:
            vocab = self.tensors["token_embd.weight"].rows
        metadata = {}
        for key, f in r.fields.items():
            if key.startswith("tokenizer.ggml.") and key not in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
                continue
            try:
                metadata[key] = f.contents()
            except Exception:  # pragma: no cover - exotic field types
                continue
        head_count = int(get("attention.head_count"))
        return ModelConfig(
            architecture=str(arch),
            name=str(_field_value(r, "general.name") or self.path.stem),
            block_count=int(get("block_count")),
            embedding_length=int(get("embedding_length")),
            feed_forward_length=int(get("feed_forward_length")),
            head_count=head_count,
            head_count_kv=int(get("attention.head_count_kv", head_count)),
            context_length=int(get("context_length")),
            rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_freq_base=float(get("rope.freq_base", 10000.0)),
            vocab_size=vocab,
            metadata=metadata,
        )

    def token_strings(self) -> list[str]:
        """The vocabulary (tokenizer.ggml.tokens), or [] when the file has none."""
        field = self._reader.get_field("tokenizer.ggml.tokens")
        return list(field.contents()) if field is not None else []

    def tensor(self, name: str) -> Tensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise GGUFFileError(f"{self.path}: no tensor named {name}") from None

    def weights(self, types=quants.KEEP_QUANT_TYPES) -> list[Tensor]:
        """2-D tensors of the given ggml types, in file order."""
        return [t for t in self.tensors.values() if t.ggml_type in types and len(t.shape) == 2]

    def quantized_weights(self) -> list[Tensor]:
        """Every 2-D quantized (non-float) weight."""
        floats = (quants.F32, quants.F16, quants.BF16)
        return [t for t in self.tensors.values() if t.ggml_type not in floats and len(t.shape) == 2]


def require_keep_quant(tensor: Tensor) -> None:
    """UnsupportedTypeError/ShapeError unless the tensor can go through a keep-quant GEMM."""
    if tensor.ggml_type not in quants.KEEP_QUANT_TYPES:
        raise UnsupportedTypeError(f"tensor {tensor.name} is {tensor.type_name}; keep-quant kernels take Q4_K or Q6_K")
    quants.row_bytes(tensor.ggml_type, tensor.k)
