"""The environment a result was measured in, for every JSON the CLI writes: our commit and build, llama.cpp's
version and commit, the GPUs with their clocks at the time, the CPU, the time."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

from .errors import CiqError, InvalidArgumentError

_GPU_QUERY = "name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu"


def ciq_commit() -> str | None:
    """Our commit: $GGML_CIQ_COMMIT (a tree that travels without .git), this checkout's git, else the commit the
    library was built from (embedded at build time: an installed wheel)."""
    if os.environ.get("GGML_CIQ_COMMIT"):
        return os.environ["GGML_CIQ_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=Path(__file__).parent,
                                capture_output=True, text=True, timeout=5).stdout.strip()
        if commit:
            return commit
    except (OSError, subprocess.SubprocessError):
        pass
    built = _build_info().get("commit")
    return built if built and built != "unknown" else None


def _build_info() -> dict:
    try:
        from . import native

        return native.build_info()
    except CiqError:
        return {}


def gpus() -> list[str] | None:
    """One nvidia-smi line per GPU (name, driver, SM clock now and max, memory clock, power, temperature)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={_GPU_QUERY}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")),
                        platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


# The environment variables that choose kernels, plans or fusions (the A/B switches): a result records those set.
SWITCHES = ("GGML_CIQ_VARIANT", "GGML_CIQ_OFFLOAD", "GGML_CIQ_CPU_ISA", "GGML_CIQ_FUSE", "GGML_CIQ_WGMMA_TAIL",
            "GGML_CIQ_WGMMA_PDL", "GGML_CIQ_WGMMA_CONFIG", "GGML_CIQ_WGMMA_STREAMK", "GGML_CIQ_WGMMA_RS", "GGML_CIQ_ATTENTION_SPLIT", "GGML_CIQ_ATTENTION_WGMMA",
            "GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM", "GGML_CIQ_WGMMA_GROUP", "GGML_CIQ_FUSE_GLU",
            "GGML_CIQ_PLUGIN_GRAPHS", "GGML_CIQ_PLUGIN_FUSE_RULE", "GGML_CIQ_PLUGIN_STATS",
            "GGML_CIQ_PLUGIN_ATTENTION", "GGML_CIQ_PLUGIN_GROUP", "GGML_CIQ_PLUGIN_TIMELINE",
            "GGML_CIQ_PLUGIN_ROPE_KV")


def switches() -> dict:
    """The SWITCHES set in this process's environment, name -> value."""
    return {name: os.environ[name] for name in SWITCHES if os.environ.get(name)}


def switch(name: str, default: bool = True) -> bool:
    """An on/off environment variable: 1/on/true/yes or 0/off/false/no (any case); unset or empty: default; anything
    else an InvalidArgumentError naming it (never a silent guess)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise InvalidArgumentError(f"{name}={os.environ[name]!r}: expected 1 or 0 (on/off)")


def describe() -> dict:
    """Everything above in one record (llama.cpp's part only where its libraries load), with the switches set."""
    env = {"ggml_ciq_commit": ciq_commit(), "ggml_ciq": _build_info() or None, "gpus": gpus(), "cpu": cpu_model(),
           "cores": os.cpu_count(), "python": platform.python_version(),
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "switches": switches()}
    try:
        from .llamacpp import LlamaCpp

        llama = LlamaCpp.load()
        env.update(llamacpp_version=llama.version, llamacpp_commit=llama.commit, llamacpp_lib=str(llama.lib_dir))
    except CiqError:
        env.update(llamacpp_version=None, llamacpp_commit=None, llamacpp_lib=None)
    return env
