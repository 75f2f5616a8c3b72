"""GGUF access: config, tensor views, and one-line errors for bad files."""

import pytest

from ggml_ciq import catalog
from ggml_ciq.errors import GGUFFileError
from ggml_ciq.model import ModelFile


def test_default_model_is_deterministic(tmp_path, default_model):
    again = catalog.write_default_model(tmp_path / "again.gguf")
    assert again.read_bytes() == default_model.path.read_bytes()


def test_configs(default_model, gemma_model):
    c = default_model.config
    assert (c.architecture, c.block_count, c.embedding_length, c.head_count_kv, c.vocab_size) == ("llama", 2, 512, 2, 512)
    g = gemma_model.config
    assert (g.architecture, g.block_count, g.embedding_length, g.feed_forward_length) == ("gemma3", 18, 640, 2048)


def test_tensor_convention(gemma_model):
    t = gemma_model.tensor("blk.0.ffn_down.weight")
    assert (t.type_name, t.rows, t.k) == ("Q6_K", 640, 2048)  # rows = output features, k = input features
    assert t.raw().size == 640 * 8 * 210 and not t.raw().flags.writeable


def test_bad_files(tmp_path, default_model):
    with pytest.raises(GGUFFileError, match="not found"):
        ModelFile(tmp_path / "missing.gguf")
    (tmp_path / "text.gguf").write_text("hello world")
    with pytest.raises(GGUFFileError, match="not a GGUF file"):
        ModelFile(tmp_path / "text.gguf")
    data = default_model.path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 1000])
    with pytest.raises(GGUFFileError, match="truncated: tensor output.weight"):
        ModelFile(tmp_path / "cut.gguf")
    (tmp_path / "header.gguf").write_bytes(data[:200])
    with pytest.raises(GGUFFileError, match="truncated or corrupt"):
        ModelFile(tmp_path / "header.gguf")
    with pytest.raises(GGUFFileError, match="no tensor named"):
        default_model.tensor("nope")


def test_opening_gemma_leaves_the_vocabulary_in_the_file(gemma_model):
    """Opening Gemma 3 270M walks past its 262,144 token strings without decoding them (gguf-py's reader built them
    all: 27 s on the 2-core CI machine; ModelFile: ~35 ms). Under tracemalloc, which counts numpy's buffers too,
    opening allocates < 1 MiB; the tokens come when asked for, the same as llama.cpp's vocabulary."""
    import tracemalloc

    tracemalloc.start()
    try:
        m = ModelFile(gemma_model.path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak
    tokens = m.fields["tokenizer.ggml.tokens"]
    assert (tokens.type_name, m.config.vocab_size) == ("array of 262144 string", 262144)
    assert tokens._file is not None  # located, not decoded
    vocab = m.token_strings()
    assert len(vocab) == 262144 and vocab[:3] == ["<pad>", "<eos>", "<bos>"] and vocab[-1] == "<unused6241>"
    assert m.config.metadata["tokenizer.ggml.scores"][:2] == [-1000.0, -1000.0]  # <pad>, <eos>


def _string_array_file(path, strings, zero_bytes, after_key):
    """A GGUF with one string array (`strings`, then `zero_bytes` zero bytes: as many empty strings) and one u32 KV
    after it, no tensors."""
    import struct

    def s(b):
        return struct.pack("<Q", len(b)) + b

    count = len(strings) + zero_bytes // 8
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, count)
    body += b"".join(s(x) for x in strings) + bytes(zero_bytes) + s(after_key) + struct.pack("<II", 4, 7)
    path.write_bytes(body + bytes(-len(body) % 32))
    return count


@pytest.mark.parametrize("layout", ["zeros-first", "mixed"])
def test_string_array_over_zero_bytes_is_skipped_at_once(tmp_path, monkeypatch, layout):
    """A string count over a long run of zero bytes (a corrupt count over zeroed data, or 2*10^7 empty strings) is
    walked in one step per zero run, not 8 bytes a step (3 s on 240 MB): the string lengths read are counted, the KV
    after the array is found, and a small file of the same layout decodes to the same strings."""
    import struct

    from ggml_ciq import model as model_module

    reads = []

    class CountingU64:
        def unpack_from(self, buffer, offset=0):
            reads.append(offset)
            return struct.unpack_from("<Q", buffer, offset)

    strings = [] if layout == "zeros-first" else [b"ab", b"", b"c" * 13, b"", b"", b"\x00" * 9, b"x"]
    count = _string_array_file(tmp_path / "s.gguf", strings, 160 << 20, b"general.after")
    monkeypatch.setattr(model_module, "_U64", CountingU64())
    m = ModelFile(tmp_path / "s.gguf")
    assert len(reads) < 100  # one per non-empty string and per zero run (the 8-byte walk: 20 million)
    assert m.fields["tokenizer.ggml.tokens"].count == count
    assert m.fields["general.after"].value == 7
    monkeypatch.undo()
    small = tmp_path / "small.gguf"  # the same layout with 5 empty strings, decoded: the skip lands where a walk does
    _string_array_file(small, strings, 40, b"general.after")
    assert ModelFile(small).token_strings() == [x.decode() for x in strings] + [""] * 5


@pytest.mark.parametrize("tail", [b"\xff" * 64, b"\x05" + b"\x00" * 7 + b"abc"])
def test_string_array_running_past_the_end_is_named_quickly(tmp_path, tail):
    """A corrupt count over 40 MB of zeros that then meets bytes whose length runs past the end (or a string cut
    short): one line naming the array, the string's index and its byte, found by the same one-step-per-run walk."""
    import struct
    import time

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 21) + b"tokenizer.ggml.tokens"
    body += struct.pack("<IIQ", 9, 8, (40 << 20) // 8 + 1) + bytes(40 << 20) + tail
    (tmp_path / "bad.gguf").write_bytes(body)
    started = time.perf_counter()
    with pytest.raises(GGUFFileError, match=r"tokenizer.ggml.tokens: string 5242880\b.*\(byte \d+\)") as error:
        ModelFile(tmp_path / "bad.gguf")
    assert time.perf_counter() - started < 5 and "\n" not in str(error.value)
