"""Write the Q4_K/Q6_K tensors of Gemma 3 270M (bytes unchanged) and its architecture keys to a small GGUF.

Usage: python3 tools/gemma_kquants.py OUT.gguf   (the GPU machine gets this instead of the 253 MB file)
"""

import sys

from ggml_ciq import catalog
from ggml_ciq.gguf_writer import add_blocks, gguf_file
from ggml_ciq.model import ModelFile


def main(out: str) -> None:
    model = ModelFile(catalog.gemma3_270m_path())
    with gguf_file(out, model.config.architecture) as writer:
        writer.add_name(f"{model.config.name} (Q4_K/Q6_K tensors only)")
        for t in model.weights():
            add_blocks(writer, t.name, t.ggml_type, t.data)


if __name__ == "__main__":
    main(sys.argv[1])
