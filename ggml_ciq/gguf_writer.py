"""Writing GGUF files: the one writer of the catalog's generated models, the recipes (models/*.py) and the tools.

``gguf_file(path, architecture)`` opens gguf-py's GGUFWriter; the block adds keys and tensors, and when it ends the
file is written in gguf-py's order (header, keys, tensor infos, tensor data) and closed. A file larger than memory
is streamed instead: the block adds the keys and every tensor's info (``add_tensor_info``), calls
``start_tensor_data`` and then writes each tensor's data in the infos' order (``writer.write_tensor_data``); the end
of the block only closes it.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from . import quants


@contextlib.contextmanager
def gguf_file(path: str | os.PathLike, architecture: str):
    """A gguf.GGUFWriter for path; what the block adds is written when it ends (unless the block streamed it:
    start_tensor_data), then the file is closed. Where the block raises, nothing more is written."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    yield writer
    if writer.state is gguf.WriterState.NO_FILE:  # not streamed: keys and tensors are in memory
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    writer.close()


def start_tensor_data(writer) -> None:
    """Streaming: after the keys and every tensor's info, write the header, keys and infos; the tensors' data follow
    by writer.write_tensor_data(array), one per info, in order."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()


def add_blocks(writer, name: str, ggml_type: int, blocks: np.ndarray) -> None:
    """A quantized tensor from its raw GGUF blocks (uint8, [rows, row bytes])."""
    import gguf

    writer.add_tensor(name, blocks, raw_dtype=gguf.GGMLQuantizationType(ggml_type))


def add_keep_quant(writer, name: str, ggml_type: int, w: np.ndarray) -> None:
    """Float weights [rows, K] quantized to Q4_K, Q5_K or Q6_K by our numpy quantizer (ggml_ciq.quants)."""
    quantize = {quants.Q4_K: quants.quantize_q4_K, quants.Q5_K: quants.quantize_q5_K}.get(ggml_type, quants.quantize_q6_K)
    data = quantize(w)
    add_blocks(writer, name, ggml_type, data.reshape(w.shape[0], -1))


def add_blocks_info(writer, name: str, ggml_type: int, rows: int, k: int) -> None:
    """Streaming: the info of a quantized tensor [rows, k] whose blocks are written later."""
    import gguf

    nbytes = rows * quants.row_bytes(ggml_type, k)
    writer.add_tensor_info(name, (rows, nbytes // rows), np.dtype(np.uint8), nbytes,
                           raw_dtype=gguf.GGMLQuantizationType(ggml_type))
