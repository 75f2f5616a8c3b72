"""Malformed GGUF files, systematically: every one must end in a GGUFFileError of one line that names the field,
tensor or byte at fault (or open as a valid file), never a traceback, hang or outsized allocation.

Three base files: the default model (a 512-entry vocabulary, Q4_K/Q6_K/F32 tensors), the Q4_K/Q6_K tensors of Gemma
3 270M (tools/gemma_kquants.py) and a small synthetic file with every GGUF value type, arrays of each, a
general.alignment of 64 and 1-D to 4-D tensors of several ggml types. gguf-py's reader maps each base's structure
(the byte range of every count, length, type, dimension and offset), independently of the parser under test. Cases:
truncation at every structural boundary and at random offsets, random byte flips in the header, key/value section
and tensor infos, each structural field set to 0, -1, 2^31, 2^63, past the end of the file and to unknown types,
tensor offsets that overlap another tensor or break the alignment. Cases that must fail say so, with the words the
error must contain. Everything is seeded; parsing runs on in-memory copies (ModelFile.from_buffer), and a sample
goes through files on disk and the CLI (exit 2, one line).
"""

from __future__ import annotations

import random
import re
import signal
import struct
import subprocess
import sys
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from ggml_ciq import catalog, cli
from ggml_ciq.errors import CiqError, GGUFFileError
from ggml_ciq.model import ModelFile

ROOT = Path(__file__).resolve().parent.parent
CASES_PER_BASE = {"default": 6000, "gemma-kquants": 5000, "synthetic": 4000}  # all structural cases + random ones
HANG_SECONDS = 5
INTERNAL = re.compile(r"Traceback|[A-Za-z]+(Error|Exception)\b|struct\.|numpy|ndarray|dtype|index \d+ is out")
NAMES_SOMETHING = re.compile(r"bytes? \d+|tensors? |key |not a GGUF file|big-endian|general\.alignment")


@dataclass(frozen=True)
class Slot:
    """One structural field of a base file: where it is, how wide, what it means."""

    kind: str       # magic version count length type item_type n_dims dim ggml_type offset value
    offset: int
    size: int       # 4 or 8 (bytes of the little-endian integer)
    value: int
    label: str


@dataclass(frozen=True)
class Base:
    name: str
    data: bytes
    slots: list
    boundaries: list  # byte offsets where one field ends and the next begins
    header_end: int   # start of the data section
    data_end: int     # end of the last tensor's data: any truncation before it must fail
    tensor_offsets: list  # (slot, relative data offset) per tensor
    alignment: int


def _structure(name: str, path: Path) -> Base:
    """The base file's fields, mapped by gguf-py's reader (each part is a view of the file, so its address says
    where it lies)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    origin = reader.data.ctypes.data
    data = path.read_bytes()
    slots: list[Slot] = [Slot("magic", 0, 4, int.from_bytes(data[:4], "little"), "magic")]
    boundaries = {0, 4}

    def at(part) -> int:
        return part.ctypes.data - origin

    def add(kind, part, label):
        off = at(part)
        slots.append(Slot(kind, off, part.nbytes, int(part[0]) % 2**(8 * part.nbytes), label))
        boundaries.update((off, off + part.nbytes))

    for field in reader.fields.values():
        parts = field.parts
        if field.name == "GGUF.version":
            add("version", parts[0], "version")
            continue
        if field.name in ("GGUF.tensor_count", "GGUF.kv_count"):
            add("count", parts[0], field.name)
            continue
        add("length", parts[0], f"{field.name} key length")
        boundaries.add(at(parts[1]))
        add("type", parts[2], f"{field.name} value type")
        kind = gguf.GGUFValueType(int(parts[2][0]))
        if kind == gguf.GGUFValueType.STRING:
            add("length", parts[3], f"{field.name} string length")
            boundaries.add(at(parts[4]) + parts[4].nbytes)
        elif kind == gguf.GGUFValueType.ARRAY:
            add("item_type", parts[3], f"{field.name} item type")
            add("count", parts[4], f"{field.name} array length")
            sub = gguf.GGUFValueType(int(parts[3][0]))
            for i, idx in enumerate(field.data[:64]):  # the first 64 items (a vocabulary has hundreds)
                if sub == gguf.GGUFValueType.STRING:
                    add("length", parts[idx - 1], f"{field.name}[{i}] string length")
                else:
                    boundaries.add(at(parts[idx]))
            if field.data:
                last = parts[field.data[-1]]
                boundaries.add(at(last) + last.nbytes)
        elif parts[3].dtype.kind in "ui" and parts[3].nbytes in (4, 8):
            add("value", parts[3], f"{field.name} value")
        else:
            boundaries.update((at(parts[3]), at(parts[3]) + parts[3].nbytes))
    tensor_offsets = []
    for t in reader.tensors:
        _, name_data, n_dims, dims, raw_dtype, offset = t.field.parts
        add("length", t.field.parts[0], f"tensor {t.name} name length")
        add("n_dims", n_dims, f"tensor {t.name} n_dims")
        for i in range(len(dims)):
            slots.append(Slot("dim", at(dims) + 8 * i, 8, int(dims[i]), f"tensor {t.name} dim {i}"))
            boundaries.add(at(dims) + 8 * i)
        add("ggml_type", raw_dtype, f"tensor {t.name} type")
        add("offset", offset, f"tensor {t.name} offset")
        tensor_offsets.append((slots[-1], int(offset[0])))
    header_end = min((t.data_offset for t in reader.tensors), default=len(data))
    data_end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=header_end)
    boundaries.update(t.data_offset for t in reader.tensors)
    boundaries.update(t.data_offset + t.n_bytes for t in reader.tensors)
    return Base(name, data, slots, sorted(b for b in boundaries if b <= len(data)), header_end, data_end,
                tensor_offsets, int(reader.alignment))


def _write_synthetic(path: Path) -> Path:
    """Every value type and array kind, general.alignment 64, tensors of 1 to 4 dimensions and several types."""
    import gguf

    from ggml_ciq.gguf_writer import gguf_file

    with gguf_file(path, "llama") as w:
        rng = np.random.default_rng(7)
        V = gguf.GGUFValueType
        w.add_custom_alignment(64)
        w.add_block_count(1)
        w.add_embedding_length(256)
        w.add_head_count(2)
        for i, (kind, value) in enumerate([(V.UINT8, 7), (V.INT8, -7), (V.UINT16, 700), (V.INT16, -700), (V.UINT32, 7),
                                           (V.INT32, -7), (V.FLOAT32, 0.5), (V.BOOL, True), (V.UINT64, 2**40),
                                           (V.INT64, -2**40), (V.FLOAT64, 0.25), (V.STRING, "héllo")]):
            w.add_key_value(f"fuzz.scalar.{i}", value, kind)
            sample = ["a", "bc", ""] if kind == V.STRING else [value] * 3
            w.add_key_value(f"fuzz.array.{i}", sample, V.ARRAY, sub_type=kind)
        w.add_token_list(["<unk>", "<s>", "</s>", "a", "b"])
        w.add_tensor("one.weight", rng.standard_normal(96).astype(np.float32))
        w.add_tensor("two.weight", rng.standard_normal((3, 32)).astype(np.float16))
        w.add_tensor("three.weight", rng.integers(-5, 5, (2, 3, 8)).astype(np.int8))
        w.add_tensor("four.weight", rng.standard_normal((2, 1, 2, 16)).astype(np.float32))
        q4k = np.frombuffer(rng.bytes(2 * 144), np.uint8).reshape(2, 144)
        w.add_tensor("q4k.weight", q4k, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        q80 = np.frombuffer(rng.bytes(3 * 34 * 2), np.uint8).reshape(3, 68)
        w.add_tensor("q80.weight", q80, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    return path


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import gemma_kquants
    finally:
        sys.path.pop(0)
    kquants = tmp / "gemma-kquants.gguf"
    gemma_kquants.main(str(kquants))
    files = {"default": catalog.default_model_path(), "gemma-kquants": kquants,
             "synthetic": _write_synthetic(tmp / "synthetic.gguf")}
    return {name: _structure(name, path) for name, path in files.items()}


# ----------------------------------------------------------------------------------------------
# Mutations.

@dataclass(frozen=True)
class Case:
    description: str
    truncate: int | None = None   # keep this many bytes
    edits: tuple = ()             # (offset, bytes) written over the base
    xor: bool = False             # the edits' bytes are xor masks
    must: str | None = None       # None: may open; else it must fail, with a message matching this regex

    def apply(self, buf: np.ndarray) -> tuple[np.ndarray, list]:
        """The mutated view of buf (edited in place) and the undo list."""
        if self.truncate is not None:
            return buf[:self.truncate], []
        undo = []
        for offset, value in self.edits:
            if self.xor:
                value = bytes([buf[offset] ^ value[0]])
            undo.append((offset, bytes(buf[offset:offset + len(value)])))
            buf[offset:offset + len(value)] = np.frombuffer(value, np.uint8)
        return buf, undo

    def file_bytes(self, base: bytes) -> bytes:
        buf = np.frombuffer(bytearray(base), np.uint8)
        view, _ = self.apply(buf)
        return bytes(view)


def _truncation(base: "Base", n: int, how: str = "") -> Case:
    return Case(f"truncated at byte {n}{how}", truncate=n, must="" if n < base.data_end else None)


def _set(slot: "Slot", value: int, must: str | None = None, how: str = "") -> Case:
    return Case(f"{slot.label} = {value}{how}", edits=((slot.offset, value.to_bytes(slot.size, "little")),), must=must)

U32_EXTREMES = (0, 2**32 - 1, 2**31, 2**31 - 1)
U64_EXTREMES = (0, 2**64 - 1, 2**31, 2**63, 2**63 - 1, 2**32)


def _slot_cases(base: Base, slot: Slot, rng: random.Random):
    size = len(base.data)
    extremes = U32_EXTREMES if slot.size == 4 else U64_EXTREMES
    must = {  # values no valid file has in this field, and what the error must say
        "version": [(v, "version") for v in (0, 1, 4, 2**31, 2**32 - 1)] + [(3 << 24, "big-endian")],
        "count": [(v, "truncated or corrupt") for v in (2**64 - 1, 2**63, 2**32, size + 1)],
        "length": [(v, "truncated or corrupt") for v in (2**64 - 1, 2**63, size + 1, size - slot.offset - 7)],
        "type": [(v, "unknown value type") for v in (13, 255, 2**31, 2**32 - 1)],
        "item_type": [(9, "array of arrays")] + [(v, "unknown value type") for v in (13, 2**31, 2**32 - 1)],
        "n_dims": [(v, "dimensions") for v in (0, 5, 2**31, 2**32 - 1)],
        "dim": [(v, "") for v in (0, 2**64 - 1, 2**63, 2**32, size + 1)],
        "ggml_type": [(v, "unknown ggml type") for v in (4, 5, 36, 42, 2**31, 2**32 - 1)],
        "offset": [(v, "") for v in (2**64 - 1, 2**63, size, slot.value + 1, slot.value + base.alignment // 2)],
    }.get(slot.kind, [])
    cases = [_set(slot, v, words) for v, words in must]
    maybe = list(extremes) + [max(slot.value - 1, 0), slot.value + 1, slot.value * 2 % 2**(8 * slot.size),
                              rng.randrange(2**(8 * slot.size))]
    if slot.kind in ("type", "item_type"):
        maybe += list(range(13))  # every known value type in place of the real one
    if slot.kind == "ggml_type":
        maybe += [0, 1, 2, 8, 12, 14, 30]
    if slot.kind == "magic":
        maybe = [int.from_bytes(b"GGUG", "little"), int.from_bytes(b"FUGG", "little"), 0]
        cases += [_set(slot, v, "not a GGUF file") for v in maybe]
        maybe = []
    cases += [_set(slot, v) for v in maybe if v != slot.value]
    if slot.kind == "dim":  # a row length that is not a whole number of blocks: a shape error naming the tensor
        cases.append(_set(slot, 300))
    return cases


def _overlap_cases(base: Base):
    """Each tensor's offset set to another tensor's (the same bytes twice) or to the middle of the next one."""
    cases = []
    offsets = base.tensor_offsets
    for (slot, value), (_, other) in zip(offsets, offsets[1:] + offsets[:1]):
        if other != value:
            cases.append(_set(slot, other, "overlap|truncated|past the end", " (another tensor's)"))
        inside = other + base.alignment
        if inside != value:
            cases.append(_set(slot, inside, None, " (inside another tensor)"))
    return cases


def mutations(base: Base, count: int, seed: int):
    """Every structural case (each boundary, each field), then seeded random ones up to `count` cases."""
    rng = random.Random(seed)
    structural = []
    for b in base.boundaries:
        structural += [_truncation(base, n) for n in (b - 1, b, b + 1) if 0 <= n < len(base.data)]
    for slot in base.slots:
        structural += _slot_cases(base, slot, rng)
    structural += _overlap_cases(base)
    cases = list(structural)
    while len(cases) < count:
        r = rng.random()
        if r < 0.2:
            cases.append(_truncation(base, rng.randrange(len(base.data)), " (random)"))
        elif r < 0.6:
            edits = tuple((rng.randrange(base.header_end), bytes([rng.randrange(1, 256)]))
                          for _ in range(rng.choice((1, 2, 4))))
            cases.append(Case(f"bytes xor {[(o, e[0]) for o, e in edits]}", edits=edits, xor=True))
        else:
            slot = rng.choice(base.slots)
            v = rng.choice((0, 2**(8 * slot.size) - 1, 2**(8 * slot.size - 1), rng.randrange(2**(8 * slot.size))))
            cases.append(_set(slot, v, how=" (random)"))
    return cases


# ----------------------------------------------------------------------------------------------

class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def _use(model: ModelFile) -> None:
    """What the CLI and engine do with an opened file: config, every value, tensor views, the vocabulary."""
    for kv in model.fields.values():
        kv.value
    for t in model.tensors.values():
        assert t.raw().size >= 1 and t.rows * t.k >= 1
    model.token_strings()


def _run(base: Base, case: Case, buf: np.ndarray, memory: bool) -> str:
    """Apply the case to `buf` (the base's bytes, restored after) and open it: '' when it opened, else the error."""
    view, undo = case.apply(buf)
    try:
        if memory:
            tracemalloc.start()
        try:
            _use(ModelFile.from_buffer(view, "fuzz.gguf"))
            message = ""
        except GGUFFileError as exc:
            message = str(exc) or "(empty message)"
        if memory:
            _, peak = tracemalloc.get_traced_memory()
            justified = 2**20 + 4 * len(base.data)  # a string value may be the whole file, as text 4 bytes a character
            if peak > justified:
                raise AssertionError(f"{case.description}: opening allocated {peak} bytes for {len(base.data)}")
    finally:
        if memory:
            tracemalloc.stop()
        for offset, value in reversed(undo):
            buf[offset:offset + len(value)] = np.frombuffer(value, np.uint8)
    return message


def _check(case: Case, message: str) -> str | None:
    """What is wrong with this outcome, or None."""
    if message:
        if "\n" in message or not message.startswith("fuzz.gguf: ") or INTERNAL.search(message):
            return f"{case.description}: bad message {message!r}"
        if not NAMES_SOMETHING.search(message):
            return f"{case.description}: the message names no field, tensor or byte: {message!r}"
        if case.must and not re.search(case.must, message):
            return f"{case.description}: expected an error about {case.must!r}, got {message!r}"
    elif case.must is not None:
        return f"{case.description}: opened without error"
    return None


def test_fuzz(bases):
    """15,000 mutated files (bar: >= 5,000 in under 3 minutes on 2 cores; measured on the shared 2-core machine:
    11 s, tracemalloc on every 20th case; 19,000 cases with tracemalloc on every case: 2.2 min, 0 problems). Each
    must open or end in one GGUFFileError line naming the fault."""
    old = signal.signal(signal.SIGALRM, _alarm)
    problems, counts, started = [], {}, time.perf_counter()
    try:
        for seed, (name, base) in enumerate(bases.items()):
            buf = np.frombuffer(bytearray(base.data), np.uint8)
            cases = mutations(base, CASES_PER_BASE[name], seed)
            opened = failed = 0
            for i, case in enumerate(cases):
                signal.setitimer(signal.ITIMER_REAL, HANG_SECONDS)
                try:
                    message = _run(base, case, buf, memory=i % 20 == 0)
                except Hang:
                    problems.append(f"{name}: {case.description}: no answer within {HANG_SECONDS} s")
                    continue
                except Exception as exc:  # anything but a GGUFFileError is a defect: record it, keep going
                    problems.append(f"{name}: {case.description}: {type(exc).__name__}: {exc}")
                    continue
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                opened += not message
                failed += bool(message)
                problem = _check(case, message)
                if problem:
                    problems.append(f"{name}: {problem}")
            counts[name] = (len(cases), failed, opened)
            assert bytes(buf) == base.data  # every case was undone
    finally:
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - started
    total = sum(c[0] for c in counts.values())
    print(f"{total} mutated files in {seconds:.1f} s: " +
          "; ".join(f"{n}: {c} cases, {f} errors, {o} opened" for n, (c, f, o) in counts.items()))
    assert not problems, f"{len(problems)} problems, the first: " + "\n".join(problems[:15])
    assert total >= 5000


def test_fuzzed_files_through_the_cli(bases, tmp_path, capsys):
    """A sample of the failing cases as files on disk: `ggml-ciq diff FILE` exits 2 with one line (in-process for
    40 files, then as a real process for 3, so no traceback can hide)."""
    base = bases["default"]
    failing = []
    buf = np.frombuffer(bytearray(base.data), np.uint8)
    for case in mutations(base, 400, seed=99):
        if _run(base, case, buf, memory=False):
            failing.append(case)
    rng = random.Random(5)
    sample = rng.sample(failing, 40)
    for i, case in enumerate(sample):
        path = tmp_path / f"case{i}.gguf"
        path.write_bytes(case.file_bytes(base.data))
        assert cli.main(["diff", str(path), "--tokens", "1"]) == 2, case.description
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"ggml-ciq: error: {path}: ") and not INTERNAL.search(err[0]), err
        if i < 3:
            proc = subprocess.run([sys.executable, "-m", "ggml_ciq.cli", "diff", str(path), "--tokens", "1"],
                                  capture_output=True, text=True, timeout=120)
            assert proc.returncode == 2 and proc.stderr.strip() == err[0], proc.stderr


def test_opened_files_through_the_engine(bases, native_lib):
    """150 of the mutated default models that open as GGUF files (a changed dimension, head count or value) go on
    into the engine: building it and a two-token prefill end in one-line CiqErrors (a tensor whose shape the
    hyperparameters do not allow, heads that cannot share K/V heads), or run; never a numpy error."""
    from ggml_ciq import native
    from ggml_ciq.engine import Transformer

    base = bases["default"]
    buf = np.frombuffer(bytearray(base.data), np.uint8)
    threads = native.build_info()["threads"]
    native.set_num_threads(1)
    opened = [case for case in mutations(base, CASES_PER_BASE["default"], 0) if not _run(base, case, buf, False)]
    outcomes, problems = {"error": 0, "ran": 0}, []
    try:
        for case in random.Random(3).sample(opened, min(len(opened), 150)):
            model = ModelFile.from_buffer(case.file_bytes(base.data), "fuzz.gguf")
            try:
                with np.errstate(all="ignore"):  # a mutated norm or scale may overflow: numbers, not errors
                    Transformer(model, device="cpu").forward([1, 2])
                outcomes["ran"] += 1
            except CiqError as exc:
                outcomes["error"] += 1
                if "\n" in str(exc) or INTERNAL.search(str(exc)):
                    problems.append(f"{case.description}: {exc}")
            except Exception as exc:
                problems.append(f"{case.description}: {type(exc).__name__}: {exc}")
    finally:
        native.set_num_threads(threads)
    print(f"opened mutated files through the engine: {outcomes}")
    assert not problems, f"{len(problems)} problems, the first: " + "\n".join(problems[:10])
    assert outcomes["error"] >= 20 and outcomes["ran"] >= 20  # both kinds were exercised


def test_messages_say_what_is_wrong(bases):
    """The two messages the issue quoted, now in the user's terms."""
    base = bases["default"]
    count_slot = next(s for s in base.slots if s.label == "GGUF.tensor_count")
    data = bytearray(base.data)
    data[count_slot.offset:count_slot.offset + 8] = struct.pack("<Q", 2**62)
    with pytest.raises(GGUFFileError, match=r"claims 4611686018427387904 tensors \(byte 8\), more than"):
        ModelFile.from_buffer(bytes(data), "x.gguf")
    dim = next(s for s in base.slots if s.label == "tensor blk.0.ffn_down.weight dim 0")
    data = bytearray(base.data)
    data[dim.offset:dim.offset + 8] = struct.pack("<Q", 300)
    with pytest.raises(GGUFFileError, match=r"tensor blk.0.ffn_down.weight \(Q6_K\) has an invalid shape 512 x 300: a "
                                            r"row of 300 values is not a whole number of Q6_K blocks \(256 values\)"):
        ModelFile.from_buffer(bytes(data), "x.gguf")
