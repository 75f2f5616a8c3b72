"""Write the Q4_K/Q6_K tensors of Gemma 3 270M (bytes unchanged) and its architecture keys to a small GGUF.

Usage: python3 tools/gemma_kquants.py OUT.gguf   (the GPU machine gets this instead of the 253 MB file)
"""

import sys

import gguf

from ggml_ciq import catalog
from ggml_ciq.model import ModelFile


def main(out: str) -> None:
    model = ModelFile(catalog.gemma3_270m_path())
    writer = gguf.GGUFWriter(out, model.config.architecture)
    writer.add_name(f"{model.config.name} (Q4_K/Q6_K tensors only)")
    for t in model.weights():
        writer.add_tensor(t.name, t.data, raw_dtype=gguf.GGMLQuantizationType(t.ggml_type))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


if __name__ == "__main__":
    main(sys.argv[1])
