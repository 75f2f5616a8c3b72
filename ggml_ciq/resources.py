"""Objects that own native resources (device buffers, llama.cpp models and contexts)."""


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
