"""llama-cpp-python's high-level `Llama` in the tests' child processes, loaded as our own libllama loads are: with
llama.cpp's CPU extra buffer types off (use_extra_bufts = false; ggml_ciq.llama_model.EXTRA_BUFFERS_WARNING), so that
the AMX mul_mat of llama.cpp 0c1e570, which segfaults on Q4_K weights, is never reached and llama.cpp CPU runs the
plain-buffer arithmetic our CPU engine follows. `Llama` takes no such argument: its model parameters come from
llama_model_default_params, which the prelude wraps. The prelude also hides the GPUs from a CUDA build of llama.cpp
(the GPU machine's): these children are llama.cpp CPU, as LlamaModel(device="cpu") lists no GPU device, and a CUDA
build would otherwise keep the weights in pinned host buffers and offload large ops to the GPU."""

import textwrap

PRELUDE = textwrap.dedent("""
    import os
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import llama_cpp.llama_cpp as _bindings
    _default_params = _bindings.llama_model_default_params
    def _plain_buffer_params():
        params = _default_params()
        params.use_extra_bufts = False
        return params
    _bindings.llama_model_default_params = _plain_buffer_params
""")


def script(body: str) -> str:
    """A child's Python source: the prelude, then `body` (dedented)."""
    return PRELUDE + textwrap.dedent(body)
