"""ggml_ciq: keep-quant GEMM kernels over GGUF Q4_K/Q6_K blocks, diffed and benchmarked against llama.cpp."""

from .errors import (BackendError, CiqError, GGUFFileError, InvalidArgumentError, LibraryNotFoundError, ShapeError,
                     UnsupportedTypeError)
from .model import ModelFile, Tensor
from .native import GemmProblem, build_info, gemm

__version__ = "0.1.0"
__all__ = ["BackendError", "CiqError", "GGUFFileError", "InvalidArgumentError", "LibraryNotFoundError", "ShapeError",
           "UnsupportedTypeError", "ModelFile", "Tensor", "GemmProblem", "build_info", "gemm", "__version__"]
