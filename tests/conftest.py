"""Shared fixtures. llama.cpp and the native library are skipped when absent, unless CI requires them
(GGML_CIQ_REQUIRE_LLAMACPP=1 / GGML_CIQ_REQUIRE_NATIVE=1 make a missing one a failure, not a skip)."""

import os
import zlib

import numpy as np
import pytest
from hypothesis import settings

from ggml_ciq import catalog
from ggml_ciq.errors import LibraryNotFoundError
from ggml_ciq.model import ModelFile


# Hypothesis draws its examples from a fixed seed (derandomize): the same examples on every run, so no test passes or
# fails by chance; a new example set comes only with a code change.
settings.register_profile("ciq", derandomize=True, database=None)
settings.load_profile("ciq")


def _load_or_skip(load, env: str, what: str):
    try:
        return load()
    except LibraryNotFoundError as exc:
        if os.environ.get(env):
            pytest.fail(f"{what} not available: {exc} ({env} is set)")
        pytest.skip(f"{what} not available: {exc}")


@pytest.fixture(scope="session")
def llama():
    from ggml_ciq.llamacpp import LlamaCpp

    return _load_or_skip(LlamaCpp.load, "GGML_CIQ_REQUIRE_LLAMACPP", "llama.cpp")


@pytest.fixture(scope="session")
def llamacpp_avx2(llama):
    """Whether llama.cpp's CPU backend is an AVX2 build, whose arithmetic our CPU engine follows end to end, bit for
    bit (CI builds it so: CMAKE_ARGS=-DGGML_NATIVE=OFF). A -march=native build on an AVX-512 CPU (AMX ones too) runs
    the same weight GEMMs bit for bit but its other ops in 16-wide vectors: rounding-level apart, which Gemma 3
    amplifies; tests then hold ours to llama.cpp's own spread instead (docs/SEMANTICS.md)."""
    return llama.cpu_provenance()["llamacpp_cpu_path"] == "avx2"


@pytest.fixture(scope="session")
def native_lib():
    from ggml_ciq import native

    return _load_or_skip(native.load, "GGML_CIQ_REQUIRE_NATIVE", "libggml_ciq")


@pytest.fixture(scope="session")
def default_model():
    return ModelFile(catalog.default_model_path())


@pytest.fixture(scope="session")
def gemma_model():
    return ModelFile(catalog.gemma3_270m_path())


@pytest.fixture(scope="session")
def gemma_full(gemma_model):
    """The whole Gemma 3 270M file: skips on the K-quant-only extract the GPU machine uses until the whole file is
    staged there (tools/gpu.py stage)."""
    if "token_embd.weight" not in gemma_model.tensors:
        pytest.skip(f"{gemma_model.path} holds only Gemma's K-quant tensors, not the whole model")
    return gemma_model


@pytest.fixture(scope="session", params=["default", "gemma3-270m"])
def model(request, default_model, gemma_model):
    return default_model if request.param == "default" else gemma_model


@pytest.fixture
def rng(request):
    """A generator seeded from the test's own id: fresh inputs per test, the same inputs on every run (a failure
    reproduces; nothing passes or fails by chance)."""
    seed = zlib.crc32(request.node.nodeid.encode())
    print(f"seed={seed}")  # pytest shows it when a test fails
    return np.random.default_rng(seed)

