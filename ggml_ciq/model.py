"""GGUF model files: typed hyperparameters and zero-copy tensors, read by our own GGUF parser.

Shape convention, used everywhere in ggml_ciq: a weight is ``[rows = output features, cols = input
features]`` (GGUF's ne1, ne0); ``Tensor.k`` is cols. Tensor data is a read-only memmap view of the file.

The parser reads the header, the key/value section and the tensor infos with ``struct`` from a memmap, checking
every count, length, type, shape and offset against the file before it is used, so a bad file ends in one
GGUFFileError naming the field, tensor and byte offset at fault. Arrays stay in the file until asked for: opening
Gemma 3 270M (a 262,144-entry vocabulary) skips over the token strings instead of decoding them. gguf-py serves
for the ggml type table (block sizes) and the value type numbers.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import quants
from .errors import GGUFFileError, UnsupportedTypeError

GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (2, 3)
GGML_MAX_DIMS = 4
GGML_MAX_NAME = 64          # tensor names are shorter than this (ggml.h), as llama.cpp's gguf reader checks
GGUF_MAX_KEY = 65535        # the GGUF specification's longest key
DEFAULT_ALIGNMENT = 32

# GGUF value types (gguf-py's GGUFValueType): struct format, numpy dtype, the name errors use.
STRING, ARRAY = 8, 9
_SCALAR_TYPES = {0: ("<B", "<u1", "uint8"), 1: ("<b", "<i1", "int8"), 2: ("<H", "<u2", "uint16"),
                 3: ("<h", "<i2", "int16"), 4: ("<I", "<u4", "uint32"), 5: ("<i", "<i4", "int32"),
                 6: ("<f", "<f4", "float32"), 7: ("<?", "<u1", "bool"), 10: ("<Q", "<u8", "uint64"),
                 11: ("<q", "<i8", "int64"), 12: ("<d", "<f8", "float64")}
_TYPE_NAMES = {**{t: name for t, (_, _, name) in _SCALAR_TYPES.items()}, STRING: "string", ARRAY: "array"}
_MIN_KV_BYTES = 8 + 4 + 1             # empty key, type, one-byte value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dimension, type, offset
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# ggml types gguf-py reads as typed elements; every other type is raw bytes [..., row bytes].
_ELEMENT_DTYPES = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
                   28: np.float64}


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
        """float32 [rows, cols]; a type ggml-ciq does not decode is an error naming the tensor."""
        if self.ggml_type not in quants.BLOCK_LAYOUT:
            raise quants.unsupported_type(self.ggml_type, self.name)
        return quants.dequantize(self.ggml_type, self.raw(), self.rows, self.k)


class KeyValue:
    """One metadata entry: key, GGUF value type (and item type for arrays), value decoded on first use.

    Scalars and strings are read when the file is opened; an array is only located (``count`` items from byte
    ``offset``) until ``value`` asks for it as a list.
    """

    __slots__ = ("key", "value_type", "item_type", "count", "offset", "_value", "_file")

    def __init__(self, key: str, value_type: int, value=None, item_type: int | None = None, count: int = 1,
                 offset: int = 0, file: "_Parser | None" = None):
        self.key, self.value_type, self.item_type, self.count, self.offset = key, value_type, item_type, count, offset
        self._value, self._file = value, file

    @property
    def type_name(self) -> str:
        if self.value_type == ARRAY:
            return f"array of {self.count} {_TYPE_NAMES[self.item_type]}"
        return _TYPE_NAMES[self.value_type]

    @property
    def value(self):
        if self._file is not None:  # an array not decoded yet
            self._value, self._file = self._file.array_values(self), None
        return self._value

    def __repr__(self) -> str:
        return f"KeyValue({self.key!r}, {self.type_name})"


@dataclass(frozen=True)
class _TensorInfo:
    name: str
    ggml_type: int
    dims: tuple[int, ...]   # GGUF order: ne0 (values per row) first
    start: int              # absolute byte offsets in the file
    end: int


def _shown(name: str) -> str:
    """A key or tensor name as an error message can show it: control characters escaped, at most 80 characters."""
    if name.isprintable() and 0 < len(name) <= 80:
        return name
    if not name:
        return "''"
    shown = repr(name[:80])[1:-1]
    return shown + ("..." if len(name) > 80 else "")


class _Parser:
    """Walks a GGUF buffer once, bounds-checking every read; fail() names the path, the field and the byte."""

    def __init__(self, buf: np.ndarray, path: str):
        self.buf, self.path, self.size = buf, path, int(buf.size)
        self.view = memoryview(buf)

    def fail(self, message: str):
        raise GGUFFileError(f"{self.path}: {message}")

    def need(self, offset: int, n: int, what: str) -> None:
        if offset + n > self.size:
            self.fail(f"truncated or corrupt GGUF: {what} (byte {offset}) needs {n} bytes, the file ends at byte "
                      f"{self.size}")

    def u32(self, offset: int, what: str) -> int:
        self.need(offset, 4, what)
        return _U32.unpack_from(self.view, offset)[0]

    def u64(self, offset: int, what: str) -> int:
        self.need(offset, 8, what)
        return _U64.unpack_from(self.view, offset)[0]

    def string_end(self, offset: int, what: str, limit: int | None = None) -> int:
        """The offset after the length-prefixed string at `offset`, which must fit the file and `limit` bytes."""
        n = self.u64(offset, f"{what}'s length")
        if n > self.size - offset - 8:
            self.fail(f"truncated or corrupt GGUF: {what} (byte {offset}) claims {n} bytes, past the end of the file "
                      f"({self.size} bytes)")
        if limit is not None and n > limit:
            self.fail(f"{what} (byte {offset}) is {n} bytes long; GGUF allows at most {limit}")
        return offset + 8 + n

    def string(self, offset: int, what: str, limit: int | None = None) -> tuple[str, int]:
        """The length-prefixed UTF-8 string at `offset` and the offset after it."""
        end = self.string_end(offset, what, limit)
        return str(self.view[offset + 8:end], "utf-8", "replace"), end

    # -- key/value section ------------------------------------------------------------------------------------

    def key_value(self, offset: int, index: int) -> tuple[KeyValue, int]:
        key, offset = self.string(offset, f"key {index}'s name", GGUF_MAX_KEY)
        label = f"key {_shown(key)}"
        value_type = self.u32(offset, f"{label}'s value type")
        offset += 4
        if value_type == ARRAY:
            item_type = self.u32(offset, f"{label}'s array item type")
            count = self.u64(offset + 4, f"{label}'s array length")
            offset += 12
            if item_type == ARRAY:
                self.fail(f"{label} (byte {offset - 12}) is an array of arrays, which GGUF readers do not support")
            if item_type == STRING:
                if count > (self.size - offset) // 8:
                    self.fail(f"truncated or corrupt GGUF: {label} (byte {offset}) claims {count} strings, more "
                              f"than the {self.size - offset} bytes left in the file can hold")
                end = self.skip_strings(offset, count, label)
            elif item_type in _SCALAR_TYPES:
                item_size = struct.calcsize(_SCALAR_TYPES[item_type][0])
                if count > (self.size - offset) // item_size:
                    self.fail(f"truncated or corrupt GGUF: {label} (byte {offset}) claims {count} "
                              f"{_TYPE_NAMES[item_type]} values, past the end of the file ({self.size} bytes)")
                end = offset + count * item_size
            else:
                self.fail(f"{label} (byte {offset - 12}) has arrays of unknown value type {item_type}")
            return KeyValue(key, ARRAY, item_type=item_type, count=count, offset=offset, file=self), end
        if value_type == STRING:
            value, end = self.string(offset, f"{label}'s value")
            return KeyValue(key, STRING, value), end
        if value_type not in _SCALAR_TYPES:
            self.fail(f"{label} (byte {offset - 4}) has unknown value type {value_type}")
        fmt = _SCALAR_TYPES[value_type][0]
        self.need(offset, struct.calcsize(fmt), f"{label}'s value")
        value = struct.unpack_from(fmt, self.view, offset)[0]
        return KeyValue(key, value_type, value), offset + struct.calcsize(fmt)

    def skip_strings(self, offset: int, count: int, what: str) -> int:
        """Byte after `count` length-prefixed strings from `offset`, without decoding them. A run of zero bytes is
        that many empty strings, skipped at once: a corrupt count over zeroed tensor data would otherwise walk the
        file 8 bytes at a time (31 million steps, 6 s, on a 253 MB file). A string past the end of the file is named
        (string_end's error) where the walk meets it."""
        end, view, unpack, left, size, done = offset, self.view, _U64.unpack_from, count, self.size, 0
        try:
            while left:
                for done in range(left):
                    n = unpack(view, end)[0]
                    if not n:
                        break
                    if end + 8 + n > size:
                        raise IndexError
                    end += 8 + n
                else:
                    return end
                left -= done
                empty = max(1, self.zero_run(end, 8 * left) // 8)  # unpack read 8 zero bytes: at least one
                end += 8 * empty
                left -= empty
                done = 0
            return end
        except (struct.error, IndexError):
            self.string_end(end, f"{what}: string {count - left + done}")  # raises, naming the string and its byte
            self.fail(f"truncated or corrupt GGUF: {what}: string {count - left + done} (byte {end}) runs past the end "
                      f"of the file")

    def zero_run(self, start: int, limit: int) -> int:
        """How many zero bytes follow `start` (at most `limit`, within the file)."""
        stop, pos, step = min(self.size, start + limit), start, 4096
        while pos < stop:
            chunk = self.buf[pos:min(stop, pos + step)]
            if chunk.any():
                return pos + int((chunk != 0).argmax()) - start
            pos += len(chunk)
            step = min(step * 4, 1 << 24)
        return stop - start

    def array_values(self, kv: KeyValue) -> list:
        if kv.item_type == STRING:
            values, offset = [], kv.offset
            view, unpack = self.view, _U64.unpack_from
            for _ in range(kv.count):
                n = unpack(view, offset)[0]
                values.append(str(view[offset + 8:offset + 8 + n], "utf-8", "replace"))
                offset += 8 + n
            return values
        fmt, dtype, _ = _SCALAR_TYPES[kv.item_type]
        array = np.frombuffer(self.buf, dtype=dtype, count=kv.count, offset=kv.offset)
        return (array != 0).tolist() if kv.item_type == 7 else array.tolist()

    # -- tensor infos -------------------------------------------------------------------------------------------

    def tensor_info(self, offset: int, index: int) -> tuple[tuple, int]:
        name, offset = self.string(offset, f"tensor {index}'s name", GGML_MAX_NAME - 1)
        label = f"tensor {_shown(name)}"
        n_dims = self.u32(offset, f"{label}'s dimension count")
        if not 1 <= n_dims <= GGML_MAX_DIMS:
            self.fail(f"{label} (byte {offset}) has {n_dims} dimensions; ggml tensors have 1 to {GGML_MAX_DIMS}")
        offset += 4
        self.need(offset, 8 * n_dims + 12, f"{label}'s dimensions, type and offset")
        dims = struct.unpack_from(f"<{n_dims}Q", self.view, offset)
        ggml_type, data_offset = struct.unpack_from("<IQ", self.view, offset + 8 * n_dims)
        return (name, n_dims, dims, ggml_type, data_offset, offset), offset + 8 * n_dims + 12


def _parse(buf: np.ndarray, path: str) -> tuple[dict[str, KeyValue], list[_TensorInfo]]:
    """The key/value entries and tensor infos of a GGUF file in `buf` (uint8), every field checked."""
    import gguf

    p = _Parser(buf, path)
    if p.size < 4 or bytes(buf[:4]) != GGUF_MAGIC:
        p.fail(f"not a GGUF file (magic {bytes(buf[:4])!r})")
    version = p.u32(4, "the GGUF version")
    if version not in GGUF_VERSIONS:
        if version & 0xFFFF == 0 and int.from_bytes(version.to_bytes(4, "little"), "big") in GGUF_VERSIONS:
            p.fail("a big-endian GGUF file; only little-endian files are supported")
        p.fail(f"GGUF version {version} (byte 4) is not supported (versions {', '.join(map(str, GGUF_VERSIONS))})")
    n_tensors = p.u64(8, "the tensor count")
    n_kv = p.u64(16, "the key/value count")
    offset = 24
    if n_kv > (p.size - offset) // _MIN_KV_BYTES:
        p.fail(f"truncated or corrupt GGUF: the header claims {n_kv} keys (byte 16), more than the file's {p.size} bytes can hold")
    if n_tensors > (p.size - offset) // _MIN_TENSOR_INFO_BYTES:
        p.fail(f"truncated or corrupt GGUF: the header claims {n_tensors} tensors (byte 8), more than the file's {p.size} bytes can "
               f"hold")

    fields: dict[str, KeyValue] = {}
    for i in range(n_kv):
        start = offset
        kv, offset = p.key_value(offset, i)
        if kv.key in fields:
            p.fail(f"key {_shown(kv.key)} appears twice (the second at byte {start})")
        fields[kv.key] = kv
    if n_tensors > (p.size - offset) // _MIN_TENSOR_INFO_BYTES:
        p.fail(f"truncated or corrupt GGUF: the header claims {n_tensors} tensors (byte 8), more than the {p.size - offset} bytes "
               f"after the key/value section can hold")

    alignment = DEFAULT_ALIGNMENT
    if "general.alignment" in fields:
        kv = fields["general.alignment"]
        if kv.value_type != 4 or not kv.value or kv.value & (kv.value - 1):
            p.fail(f"general.alignment must be a power of two as uint32, got {kv.value!r} ({kv.type_name})")
        alignment = kv.value

    raw_infos = []
    for i in range(n_tensors):
        info, offset = p.tensor_info(offset, i)
        raw_infos.append(info)
    data_start = offset + (-offset % alignment)

    infos, names = [], set()
    for name, n_dims, dims, ggml_type, data_offset, at in raw_infos:
        label = f"tensor {_shown(name)}"
        if name in names:
            p.fail(f"two tensors are named {_shown(name)}")
        names.add(name)
        if ggml_type not in gguf.GGML_QUANT_SIZES:
            p.fail(f"{label} (byte {at + 8 * n_dims}) has unknown ggml type {ggml_type}")
        type_name = quants.type_name(ggml_type)
        shape = " x ".join(map(str, reversed(dims)))
        if any(d == 0 or d >= 2**63 for d in dims):
            p.fail(f"{label} ({type_name}) has an invalid shape {shape}: every dimension must be 1 to 2^63-1")
        block, type_size = gguf.GGML_QUANT_SIZES[ggml_type]
        if dims[0] % block:
            p.fail(f"{label} ({type_name}) has an invalid shape {shape}: a row of {dims[0]} values is not a whole "
                   f"number of {type_name} blocks ({block} values)")
        if data_offset % alignment:
            p.fail(f"{label}: its data offset {data_offset} (byte {at + 8 * n_dims + 4}) is not a multiple of the "
                   f"alignment {alignment}")
        n_bytes = int(np.prod(dims, dtype=object)) // block * type_size
        start = data_start + data_offset
        if start >= p.size:
            p.fail(f"{label} ({type_name}, {shape}): its data offset {data_offset} (byte {at + 8 * n_dims + 4}) puts it "
                   f"at byte {start}, past the end of the file ({p.size} bytes)")
        if start + n_bytes > p.size:
            p.fail(f"truncated: {label} ({type_name}, {shape}) needs bytes {start}..{start + n_bytes} but the file has "
                   f"{p.size}")
        infos.append(_TensorInfo(name, ggml_type, tuple(dims), start, start + n_bytes))

    by_start = sorted(infos, key=lambda t: t.start)
    for before, after in zip(by_start, by_start[1:]):
        if after.start < before.end:
            p.fail(f"tensors {before.name} (bytes {before.start}..{before.end}) and {after.name} (bytes "
                   f"{after.start}..{after.end}) overlap")
    return fields, infos


def _tensor(buf: np.ndarray, info: _TensorInfo) -> Tensor:
    """A zero-copy view, typed as gguf-py's reader types it: float/int types by element, others as row bytes."""
    import gguf

    shape = tuple(reversed(info.dims))
    data = buf[info.start:info.end]
    if info.ggml_type in _ELEMENT_DTYPES:
        data = data.view(_ELEMENT_DTYPES[info.ggml_type]).reshape(shape)
    else:
        block, type_size = gguf.GGML_QUANT_SIZES[info.ggml_type]
        data = data.reshape(*shape[:-1], shape[-1] // block * type_size)
    return Tensor(info.name, info.ggml_type, shape, data)


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
    metadata: Mapping = field(repr=False, default_factory=dict)


class _Metadata(Mapping):
    """Every key's value by name, each decoded when first asked for (nothing is read up front)."""

    def __init__(self, fields: dict[str, KeyValue]):
        self._fields = fields

    def __getitem__(self, key: str):
        return self._fields[key].value

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


_INTEGER_TYPES = (0, 1, 2, 3, 4, 5, 10, 11)
_NUMBER_TYPES = _INTEGER_TYPES + (6, 12)


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: the printable character that stands for each byte in a byte-level BPE
    vocabulary -> the byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


_GPT2_BYTES = _gpt2_byte_decoder()


class ModelFile:
    """An open GGUF file. ``ModelFile(path)`` validates it; errors are GGUFFileError with one-line messages.

    ``fields`` holds every metadata entry (KeyValue, arrays decoded on first use), ``tensors`` every tensor.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        if not self.path.exists():
            raise GGUFFileError(f"model file not found: {self.path}")
        if not self.path.is_file():
            raise GGUFFileError(f"not a file: {self.path}")
        size = self.path.stat().st_size
        if size < 4:
            raise GGUFFileError(f"{self.path} is not a GGUF file ({size} bytes)")
        try:
            buf = np.memmap(self.path, dtype=np.uint8, mode="r")
        except OSError as exc:
            raise GGUFFileError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        self._open(buf)

    @classmethod
    def from_buffer(cls, data, name: str = "<buffer>") -> "ModelFile":
        """A GGUF file already in memory (bytes or a uint8 array; not copied); `name` stands for its path."""
        self = cls.__new__(cls)
        self.path = Path(name)
        self._open(np.frombuffer(data, dtype=np.uint8) if not isinstance(data, np.ndarray) else data.view(np.uint8))
        return self

    def _open(self, buf: np.ndarray) -> None:
        self.fields, infos = _parse(buf, str(self.path))
        self.tensors: dict[str, Tensor] = {info.name: _tensor(buf, info) for info in infos}
        self.config = self._read_config()

    def _value(self, key: str, types: tuple[int, ...], expected: str, default=None):
        """The value of `key`, which must have one of the value `types` (a per-layer array: its first item)."""
        kv = self.fields.get(key)
        if kv is None:
            return default
        if kv.value_type == ARRAY and kv.item_type in types:
            if kv.count == 0:
                return default
            return kv.value[0]
        if kv.value_type not in types:
            raise GGUFFileError(f"{self.path}: key {_shown(key)} is {kv.type_name}, expected {expected}")
        return kv.value

    def _read_config(self) -> ModelConfig:
        arch = self._value("general.architecture", (STRING,), "a string", "unknown")

        def integer(key, default=0):
            value = self._value(f"{arch}.{key}", _INTEGER_TYPES, "an integer", default)
            if value < 0:
                raise GGUFFileError(f"{self.path}: key {_shown(arch)}.{key} is {value}, expected a count >= 0")
            return int(value)

        def number(key, default):
            return float(self._value(f"{arch}.{key}", _NUMBER_TYPES, "a number", default))

        tokens = self.fields.get("tokenizer.ggml.tokens")
        vocab = tokens.count if tokens is not None and tokens.value_type == ARRAY else 0
        if not vocab and "token_embd.weight" in self.tensors:
            vocab = self.tensors["token_embd.weight"].rows
        metadata = _Metadata(self.fields)
        head_count = integer("attention.head_count")
        return ModelConfig(
            architecture=arch,
            name=self._value("general.name", (STRING,), "a string", self.path.stem),
            block_count=integer("block_count"),
            embedding_length=integer("embedding_length"),
            feed_forward_length=integer("feed_forward_length"),
            head_count=head_count,
            head_count_kv=integer("attention.head_count_kv", head_count),
            context_length=integer("context_length"),
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", 1e-6),
            rope_freq_base=number("rope.freq_base", 10000.0),
            vocab_size=vocab,
            metadata=metadata,
        )

    def token_strings(self) -> list[str]:
        """The vocabulary (tokenizer.ggml.tokens), or [] when the file has none."""
        kv = self.fields.get("tokenizer.ggml.tokens")
        if kv is None:
            return []
        if kv.value_type != ARRAY or kv.item_type != STRING:
            raise GGUFFileError(f"{self.path}: key tokenizer.ggml.tokens is {kv.type_name}, expected an array of "
                                f"strings")
        return kv.value

    def token_text(self, token: int) -> str:
        """A token's text as the tokenizer decodes it: GPT-2 byte-level BPE ("gpt2": its printable stand-ins mapped back
        to bytes), SentencePiece ("llama": U+2581 a space, <0xNN> a byte); the raw piece for other tokenizers."""
        vocab = self.token_strings()
        if not 0 <= token < len(vocab):
            return ""
        piece = vocab[token]
        field = self.fields.get("tokenizer.ggml.model")
        kind = field.value if field is not None else ""
        if kind == "gpt2":
            data = bytes(_GPT2_BYTES.get(ch, ord(ch) & 0xFF) for ch in piece)
            return data.decode("utf-8", errors="replace")
        if kind == "llama":
            if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                return bytes([int(piece[3:5], 16)]).decode("utf-8", errors="replace")
            return piece.replace("\u2581", " ")
        return piece

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
