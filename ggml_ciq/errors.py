"""Error hierarchy: every failure a user can cause is a CiqError; the CLI prints it as one line, exit 2."""


class CiqError(Exception):
    """Base class of ggml_ciq errors."""


class GGUFFileError(CiqError):
    """A model file is missing, not GGUF, truncated or otherwise unreadable."""


class UnsupportedTypeError(CiqError):
    """A tensor type (or weight type for a kernel) this path cannot handle."""


class InvalidArgumentError(CiqError, ValueError):
    """An argument no path accepts: unknown variant, device or semantics, bad pointer or size."""


class ShapeError(InvalidArgumentError):
    """Mismatched or invalid sizes, e.g. K not a multiple of 256."""


class BackendError(CiqError):
    """A native library, llama.cpp or a device failed or is not available."""


class OutOfMemoryError(BackendError):
    """An allocation on the host or a device failed."""


class LibraryNotFoundError(BackendError):
    """A shared library (ours or llama.cpp's) could not be located or loaded."""
