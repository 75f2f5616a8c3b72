"""The ggml backend plugin (native/plugin, docs/PLUGIN.md): llama.cpp's own tools and libllama run their MUL_MATs
through libggml_ciq.

- `llamacpp_source()` finds the headers the plugin is compiled against: ggml's internal `ggml-backend-impl.h` is in
  no installed package, only in the llama-cpp-python sdist this project pins. $GGML_CIQ_LLAMACPP_SRC names a local
  copy (the sdist's .tar.gz, its directory, or a llama.cpp tree: offline machines); otherwise the sdist is fetched
  once with `pip download` into the cache and the headers are extracted from it.
- `find_plugin()` / `build()` locate or build libggml-ciq.so; `Plugin.load()` loads it into the libggml that
  `llamacpp.LlamaCpp` drives (ggml_backend_load), `Plugin.unload()` takes it out again.

This file also runs as a script with the standard library only (CMake calls it while `pip install .` builds:
`python ggml_ciq/plugin.py headers`), so the package is imported lazily, inside functions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PINNED = "0.3.36"  # the `llamacpp` extra's llama-cpp-python
COMMITS = {"0.3.36": "0c1e570"}  # the llama.cpp commit each llama-cpp-python version vendors (the sdist has no .git)
SOURCE_ENV = "GGML_CIQ_LLAMACPP_SRC"
PLUGIN_ENV = "GGML_CIQ_PLUGIN"
PLUGIN_NAMES = ("libggml-ciq.so", "libggml-ciq.dylib", "ggml-ciq.dll")
_PACKAGE_DIR = Path(__file__).resolve().parent
# The plugin's source: the installed package's copy, else the checkout's native/plugin.
_PLUGIN_SOURCE = next((d for d in (_PACKAGE_DIR / "plugin_src", _PACKAGE_DIR.parent / "native" / "plugin")
                       if (d / "CMakeLists.txt").is_file()), _PACKAGE_DIR.parent / "native" / "plugin")
_LLAMACPP_IN_SDIST = "vendor/llama.cpp"


class SourceError(Exception):
    """The headers cannot be had (a plain exception: the script half runs without the package)."""


# -- headers ----------------------------------------------------------------------------------------------------------

def _cache_dir() -> Path:
    # catalog.cache_dir's rule, repeated here because this half must run without numpy (inside pip's build).
    return Path(os.environ.get("GGML_CIQ_CACHE", Path.home() / ".cache" / "ggml_ciq"))


def _wanted(name: str) -> bool:
    """The sdist members the plugin build reads: ggml's public and internal headers, its CMakeLists (the version),
    llama.h, and the package's __init__ (its version)."""
    parts = name.split("/", 1)
    if len(parts) < 2:
        return False
    rel = parts[1]
    ggml = f"{_LLAMACPP_IN_SDIST}/ggml/"
    return (rel.startswith(ggml + "include/") or rel == ggml + "CMakeLists.txt"
            or (rel.startswith(ggml + "src/") and rel.count("/") == 4 and rel.endswith(".h"))
            or rel in (f"{_LLAMACPP_IN_SDIST}/include/llama.h", "llama_cpp/__init__.py", "PKG-INFO"))


def _extract_headers(archive: Path, dest: Path) -> Path:
    """The wanted members of an sdist .tar.gz, into dest (atomically: a half-written cache is never used)."""
    tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    try:
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and _wanted(m.name)]
            if not members:
                raise SourceError(f"{archive} holds no llama.cpp ggml headers")
            for m in members:
                m.name = m.name.split("/", 1)[1]
            tar.extractall(tmp, members=members, filter="data")
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _llamacpp_root(path: Path) -> Path | None:
    """The llama.cpp tree at or inside path (an sdist directory holds it at vendor/llama.cpp)."""
    for root in (path, path / _LLAMACPP_IN_SDIST):
        if (root / "ggml" / "src" / "ggml-backend-impl.h").is_file():
            return root
    return None


def _sdist_version(root: Path) -> str | None:
    """llama-cpp-python's version for a llama.cpp tree inside its sdist, else None."""
    init = root.parent.parent / "llama_cpp" / "__init__.py"
    if root.parent.name == "vendor" and init.is_file():
        for line in init.read_text().splitlines():
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("\"'")
    return None


def _pip_download(version: str, dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "-q", "-d", str(dest), f"llama-cpp-python=={version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SourceError(f"pip download llama-cpp-python=={version} failed: {exc}") from None
    archives = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if done.returncode != 0 or not archives:
        reason = (done.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise SourceError(f"pip download llama-cpp-python=={version} failed: {reason} "
                          f"(offline: set {SOURCE_ENV} to the sdist or a llama.cpp tree)")
    return archives[0]


def llamacpp_source(fetch: bool = True) -> dict:
    """Where the plugin's headers are: {"root": llama.cpp tree, "llama_cpp_python": version or None, "commit",
    "ggml_version"}. $GGML_CIQ_LLAMACPP_SRC first, then the cache, then (fetch=True) `pip download` of the pinned
    sdist into the cache."""
    env = os.environ.get(SOURCE_ENV)
    if env:
        path = Path(env).expanduser().resolve()
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            root = _llamacpp_root(_extract_headers(path, _cache_dir() / f"headers-{path.name.split('.tar')[0]}"))
        elif path.is_dir():
            root = _llamacpp_root(path)
        else:
            raise SourceError(f"{SOURCE_ENV}={env} is neither an sdist .tar.gz nor a directory")
        if root is None:
            raise SourceError(f"{SOURCE_ENV}={env} holds no ggml/src/ggml-backend-impl.h")
    else:
        cached = _cache_dir() / f"llama-cpp-python-{PINNED}"
        root = _llamacpp_root(cached)
        if root is None:
            if not fetch:
                raise SourceError(f"no llama-cpp-python {PINNED} headers in {cached} (fetch them, or set {SOURCE_ENV})")
            cached.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix="sdist-", dir=cached.parent) as tmp:
                root = _llamacpp_root(_extract_headers(_pip_download(PINNED, Path(tmp)), cached))
    version = _sdist_version(root)
    return {"root": str(root), "llama_cpp_python": version, "commit": COMMITS.get(version, "unknown"),
            "ggml_version": ggml_version_of(root)}


def ggml_version_of(root: Path | str) -> str:
    """GGML_VERSION_MAJOR.MINOR.PATCH from a llama.cpp tree's ggml/CMakeLists.txt (what ggml_version() returns)."""
    values = {}
    for line in (Path(root) / "ggml" / "CMakeLists.txt").read_text().splitlines():
        for part in ("MAJOR", "MINOR", "PATCH"):
            prefix = f"set(GGML_VERSION_{part} "
            if line.strip().startswith(prefix):
                values[part] = line.strip()[len(prefix):].rstrip(")").strip()
    if len(values) != 3:
        raise SourceError(f"no GGML_VERSION_MAJOR/MINOR/PATCH in {root}/ggml/CMakeLists.txt")
    return f"{values['MAJOR']}.{values['MINOR']}.{values['PATCH']}"


# -- the plugin library -----------------------------------------------------------------------------------------------

def find_plugin() -> Path | None:
    """$GGML_CIQ_PLUGIN, else libggml-ciq next to the libggml_ciq in use (the installed package, GGML_CIQ_LIB's
    directory), else the newest one a checkout's build/ holds; None when there is none."""
    env = os.environ.get(PLUGIN_ENV)
    if env:
        return Path(env) if Path(env).is_file() else None
    places = [_PACKAGE_DIR]
    if os.environ.get("GGML_CIQ_LIB"):
        places.insert(0, Path(os.environ["GGML_CIQ_LIB"]).parent)
    for place in places:
        for name in PLUGIN_NAMES:
            if (place / name).is_file():
                return place / name
    builds = sorted((p for name in PLUGIN_NAMES for p in _PACKAGE_DIR.parent.glob(f"build/**/{name}")),
                    key=lambda p: p.stat().st_mtime)
    return builds[-1] if builds else None


def build(build_dir: Path | str, library: Path | str | None = None, ggml_version: str | None = None) -> Path:
    """Build the plugin alone (one source file; against an existing libggml_ciq, `library` or the one
    native.load() uses) into build_dir; ggml_version overrides the version it expects (tests simulate a mismatch).
    Returns the plugin's path."""
    from .errors import BackendError

    if library is None:
        from . import native

        library = native.load().path
    build_dir = Path(build_dir)
    defines = [f"-DGGML_CIQ_LIBRARY={Path(library).resolve()}", "-DCMAKE_BUILD_TYPE=Release"]
    if ggml_version:
        defines.append(f"-DGGML_CIQ_PLUGIN_GGML_VERSION={ggml_version}")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for command in (["cmake", "-S", str(_PLUGIN_SOURCE), "-B", str(build_dir), *generator, *defines],
                    ["cmake", "--build", str(build_dir), "--parallel"]):
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"building the ggml plugin failed: {exc}") from None
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-12:]
            raise BackendError("building the ggml plugin failed:\n" + "\n".join(tail))
    for name in PLUGIN_NAMES:
        if (build_dir / name).is_file():
            return build_dir / name
    raise BackendError(f"the plugin build wrote no {PLUGIN_NAMES[0]} into {build_dir}")


def build_info(path: Path | str) -> dict:
    """What a plugin file says about itself (ggml_ciq_plugin_info: the llama.cpp, llama-cpp-python and ggml
    versions it was built against), read without loading it into ggml."""
    import cffi

    from .errors import LibraryNotFoundError

    ffi = cffi.FFI()
    ffi.cdef("const char * ggml_ciq_plugin_info(void);")
    try:
        lib = ffi.dlopen(str(path), ffi.RTLD_LAZY | ffi.RTLD_LOCAL)  # ggml's symbols resolve only when called
        return json.loads(ffi.string(lib.ggml_ciq_plugin_info()).decode())
    except (OSError, AttributeError) as exc:
        raise LibraryNotFoundError(f"cannot read the ggml plugin {path}: {exc}") from None


_CDEF = """
struct ggml_backend_reg; struct ggml_backend_device;
struct ggml_backend_reg * ggml_backend_load(const char * path);
void ggml_backend_unload(struct ggml_backend_reg * reg);
const char * ggml_backend_reg_name(struct ggml_backend_reg * reg);
size_t ggml_backend_reg_dev_count(struct ggml_backend_reg * reg);
struct ggml_backend_device * ggml_backend_reg_dev_get(struct ggml_backend_reg * reg, size_t index);
const char * ggml_backend_dev_name(struct ggml_backend_device * device);
const char * ggml_backend_dev_description(struct ggml_backend_device * device);
"""


class Plugin:
    """The plugin loaded into llama.cpp's ggml (the one `llamacpp.LlamaCpp.load()` opens). Its devices are then
    part of ggml's registry: libllama uses a CPU device (type ACCEL) in every context, a GPU device where the model's
    device list names it. `unload()` takes it out again (only with no llama.cpp context alive)."""

    def __init__(self, path: Path | str | None = None, llama=None):
        """path: the plugin (default: find_plugin()); llama: the llamacpp.LlamaCpp to load it into (default: the
        process's, LlamaCpp.load())."""
        import cffi

        from . import native, quants
        from .errors import BackendError, LibraryNotFoundError
        from .llamacpp import LlamaCpp, _lib_file

        path = Path(path) if path is not None else find_plugin()
        if path is None or not path.is_file():
            raise LibraryNotFoundError(f"the ggml plugin libggml-ciq is not built (pip install . builds it where "
                                       f"llama-cpp-python {PINNED}'s headers can be had; or set {PLUGIN_ENV})")
        native.load()  # first: the plugin binds to this libggml_ciq (same soname), so its dispatch counters are ours
        native.plan("auto", "cpu", "any", quants.Q4_K, 1, 256, 1)  # the switches it plans with (GGML_CIQ_OFFLOAD...)
        self.ggml = llama or LlamaCpp.load()
        if self.ggml is LlamaCpp.load():  # ggml's log (load_backend: ..., a refusal) into libllama's captured log
            from .llama_model import _Library

            _Library.load()
        self.path, self.info = path, build_info(path)
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self._lib = self.ffi.dlopen(str(_lib_file(self.ggml.lib_dir, "ggml")))
        self._reg = self._lib.ggml_backend_load(str(path).encode())
        if self._reg == self.ffi.NULL:
            self._reg = None
            raise BackendError(f"ggml could not load the plugin {path}: built for ggml "
                               f"{self.info.get('ggml_version')} (llama.cpp {self.info.get('llama_cpp_commit')}), "
                               f"this llama.cpp has ggml {self.ggml.version} (its log says why)")

    @property
    def devices(self) -> list[str]:
        """The plugin's device names, e.g. ["CIQ_CPU"] over a CPU-only llama.cpp or ["CIQ0"] over a CUDA one."""
        self._alive()
        lib = self._lib
        return [self.ffi.string(lib.ggml_backend_dev_name(lib.ggml_backend_reg_dev_get(self._reg, i))).decode()
                for i in range(lib.ggml_backend_reg_dev_count(self._reg))]

    def describe(self) -> dict:
        """Path, devices (name, description) and build info, for `ggml-ciq info` and result files."""
        self._alive()
        lib = self._lib
        devices = []
        for i in range(lib.ggml_backend_reg_dev_count(self._reg)):
            dev = lib.ggml_backend_reg_dev_get(self._reg, i)
            devices.append({"name": self.ffi.string(lib.ggml_backend_dev_name(dev)).decode(),
                            "description": self.ffi.string(lib.ggml_backend_dev_description(dev)).decode()})
        return {"path": str(self.path), "devices": devices, **self.info}

    def _alive(self):
        if self._reg is None:
            from .errors import BackendError

            raise BackendError("the ggml plugin is unloaded")

    def unload(self):
        if self._reg is not None:
            self._lib.ggml_backend_unload(self._reg)
            self._reg = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unload()


def main(argv: list[str]) -> int:
    """`headers`: print the llama.cpp tree (fetching the sdist if needed) as CMake-readable KEY=VALUE lines."""
    if argv[:1] != ["headers"]:
        print("usage: python ggml_ciq/plugin.py headers", file=sys.stderr)
        return 2
    try:
        source = llamacpp_source()
    except (SourceError, OSError, tarfile.TarError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for key, value in source.items():
        print(f"{key.upper()}={value or ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
