"""Objects that own native resources (device buffers, llama.cpp models and contexts), and the host memory left."""

import os


class Closeable:
    """Mixin for a class with an idempotent close(): a `with` block and the garbage collector call it."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # a half-built object, or the interpreter shutting down
            pass


def free_host_bytes() -> int:
    """Host memory free now (the kernel's available pages), which the memory checks before big allocations read."""
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
