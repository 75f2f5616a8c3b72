"""Error hierarchy: every failure a user can cause is a CiqError; the CLI prints it as one line, exit 2. A crash inside
llama.cpp (LlamaCppCrash) is not the user's: the CLI reports it with what finished, exit 1."""


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


class LlamaCppCrash(BackendError):
    """llama.cpp's child process died by `signal_name` in `step`; `finished` holds what it emitted before."""

    def __init__(self, step: str, signal_name: str, detail: str, finished: dict):
        super().__init__(f"llama.cpp crashed ({signal_name}) in {step}: {detail}")
        self.step, self.signal_name, self.detail, self.finished = step, signal_name, detail, finished

    def renamed(self, step: str) -> "LlamaCppCrash":
        """The same crash, said to be in `step` (a caller that knows which of its steps had not finished)."""
        return LlamaCppCrash(step, self.signal_name, self.detail, self.finished)

    def to_json(self) -> dict:
        return {"step": self.step, "signal": self.signal_name, "detail": self.detail, "message": str(self)}
