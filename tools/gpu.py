"""The GPU machine's experiment runner: `prepare` here, then a few verbs there; an A/B is a grid of settings x a command.

A lease (every line one `run` call; the machine goes back ~30 s after a call, its /tmp with it):
  here, with network:  python3 tools/gpu.py prepare      .device/, .device-extra/, .device-parts/, and each call's carry
  call 1 (carry as prepare printed):  export GGML_CIQ_COMMIT=SHA; python3 tools/gpu.py setup   (builds start, detached)
  the part calls:      python3 tools/gpu.py stage        (each carries a part + its model's .device-parts/FILE.sha256)
  then:                python3 tools/gpu.py wait && python3 tools/gpu.py test tests/test_cuda.py tests/test_plugin.py
                       python3 tools/gpu.py sanitize engine ops
                       python3 tools/gpu.py ab --grid GGML_CIQ_WGMMA_RS=0,1 -- ggml-ciq bench gemm ... --json {out}
                       python3 tools/gpu.py compare --tokens 512,4096; python3 tools/gpu.py pack
  or, for more than a call:  python3 tools/gpu.py wait && python3 tools/gpu.py chain tools/leases/NAME.txt --collect 400
                       python3 tools/gpu.py collect       (until exit 0; each call keeps the machine while it waits)
Results land under $OUT (default /tmp/out); a call brings back at most 8 files, 2 folders deep: end with `pack`.
Every verb has --help; docs/GPU.md has the recipes (plugin checks, llama-bench, lib-ab, diag builds).
Standard library only: the machine's python3 has no numpy, cffi or gguf until `setup` installs the carried wheels.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TMP = Path(os.environ.get("GGML_CIQ_GPU_TMP", "/tmp"))  # the machine's scratch space (tests point it elsewhere)
SDIST_NAME = "llama_cpp_python-0.3.36"
LLAMACPP_COMMIT = "0c1e570"  # what llama-cpp-python 0.3.36 vendors (its sdist carries no git metadata)
WHEELS = ("cffi==2.0.0", "pycparser==3.12", "gguf==0.19.0", "diskcache==5.6.3")  # diskcache: llama_cpp's package
MIB = 1 << 20
# GPU_LLAMACPP=native: every verb runs against setup --native-cpu's llama.cpp (CPU only, built for this host's CPU:
# AVX-512 and AMX on the H200's Xeon), its libraries and llama-cpp-python's package over them, never mixed.
LLAMACPP_ENV = "GPU_LLAMACPP"
CALL_LIMIT = 64 * MIB  # what one call carries, the tree included
OUT_FILES, OUT_FILE_BYTES, OUT_BYTES, OUT_DEPTH = 8, 16 * MIB, 64 * MIB, 2
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED = {"out", "cell", "rep"}  # placeholders of `ab` itself
PART_PREFIX = "gemma3-270m.gguf.part"
SUMS_SUFFIX = ".sha256"  # a model's parts travel with FILE.sha256 (the whole file's hash and name first)
# Catalog models that travel in parts (prepare --model): the name -> (its file on the machine, the variable that points
# the catalog at it there). Gemma's whole file is also {gemma}.
PART_MODELS = {"gemma3-270m": ("gemma3-270m.gguf", "GGML_CIQ_GEMMA3_270M"),
               "smollm2-135m": ("smollm2-135m.gguf", "GGML_CIQ_SMOLLM2_135M"),
               "qwen2.5-coder-0.5b": ("qwen2.5-coder-0.5b.gguf", "GGML_CIQ_QWEN25_CODER_05B")}


class UsageError(Exception):
    """A malformed argument or a missing prerequisite: one line on stderr, exit 2."""


def paths() -> dict:
    """Where setup puts things on the machine."""
    return {"site": TMP / "site", "device": TMP / "device", "sdist": TMP / SDIST_NAME, "llama_build": TMP / "llama-cuda",
            "llama_py": TMP / "llama", "ciq_build": TMP / "ciq-build", "ciq_src": TMP / "ciq-src",
            "base_src": TMP / "ciq-base-src",
            "base_build": TMP / "ciq-base", "jobs": TMP / "gpu-jobs", "logs": TMP / "gpu-logs", "parts": TMP / "parts",
            "gemma": TMP / "gemma3-270m.gguf", "commit": TMP / "ciq-commit",
            "native_build": TMP / "llama-native", "native_py": TMP / "llama-native-py"}


def out_dir() -> Path:
    out = Path(os.environ.get("OUT") or TMP / "out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def environment() -> dict:
    """The environment every command runs in: the wheels, this tree and llama.cpp's Python package on PYTHONPATH, the
    builds' libraries, the carried models. A variable already set wins."""
    p, env = paths(), dict(os.environ)
    native = env.get(LLAMACPP_ENV) == "native"  # setup --native-cpu's CPU-only -march=native build, whole
    llama_py = p["native_py"] if native else p["llama_py"]
    env["PYTHONPATH"] = os.pathsep.join([str(p["site"]), str(ROOT), str(llama_py)]
                                        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONUNBUFFERED"] = "1"
    gemma = p["gemma"] if p["gemma"].is_file() else p["device"] / "gemma3-270m-kquants.gguf"
    defaults = {"GGML_CIQ_LIB": p["ciq_build"] / "libggml_ciq.so", "GGML_CIQ_PLUGIN": p["ciq_build"] / "libggml-ciq.so",
                "GGML_CIQ_LLAMACPP_LIB": llama_py / "llama_cpp" / "lib", "GGML_CIQ_LLAMACPP_SRC": p["sdist"],
                "GGML_CIQ_GEMMA3_270M": gemma, "GGML_CIQ_CACHE": TMP / "ciq-cache",
                "GGML_CIQ_LLAMA3_VOCAB": p["device"] / "ggml-vocab-llama-bpe.gguf"}
    for name, (file, variable) in PART_MODELS.items():
        if name != "gemma3-270m" and (TMP / file).is_file():
            defaults[variable] = TMP / file
    for key, value in defaults.items():
        env.setdefault(key, str(value))
    if (p["device"] / "LLAMACPP_COMMIT").is_file():
        env.setdefault("GGML_CIQ_LLAMACPP_COMMIT", (p["device"] / "LLAMACPP_COMMIT").read_text().strip())
    if not env.get("GGML_CIQ_COMMIT") and p["commit"].is_file():  # setup's, for the lease's later calls
        env["GGML_CIQ_COMMIT"] = p["commit"].read_text().strip()
    return env


def placeholders() -> dict:
    p = paths()
    return {"gemma": str(p["gemma"]), "llama_bin": str(p["llama_build"] / "bin"), "plugin": str(p["ciq_build"] /
            "libggml-ciq.so"), "device": str(p["device"]), "OUT": str(out_dir())}


def substitute(argv: list, values: dict) -> list:
    """{name} in each argument replaced by values[name]; other braces are left as they are (python -c code). An
    argument that is one placeholder alone and comes out empty is left out (a grid value '' drops a flag)."""
    result = []
    for arg in argv:
        whole = arg.startswith("{") and arg.endswith("}") and arg[1:-1] in values
        for key, value in values.items():
            arg = arg.replace("{" + key + "}", value)
        if arg or not whole:
            result.append(arg)
    return result


def set_env(env: dict, settings: dict) -> dict:
    """KEY=VALUE settings into env ({gemma}, {plugin}... replaced in the values); an empty value unsets KEY."""
    for key, value in settings.items():
        value = substitute([value], placeholders())[0]
        if value:
            env[key] = value
        else:
            env.pop(key, None)
    return env


def parse_env(settings: list) -> dict:
    pairs = [s.partition("=") for s in settings]
    bad = [s for s, (key, eq, _) in zip(settings, pairs) if not eq or not KEY_RE.fullmatch(key)]
    if bad:
        raise UsageError(f"--env {bad[0]!r}: expected KEY=VALUE")
    return {key: value for key, _, value in pairs}


def resolve(argv: list) -> list:
    """ggml-ciq and python3 as this interpreter runs them (the machine has no installed entry point)."""
    if argv[0] == "ggml-ciq":
        return [sys.executable, "-m", "ggml_ciq.cli"] + argv[1:]
    if argv[0] in ("python3", "python"):
        return [sys.executable] + argv[1:]
    return argv


def execute(argv: list, env: dict, log: Path, timeout: float, stdout: Path | None = None) -> tuple:
    """Runs argv in its own process group with output (and stderr) into `log`; stdout alone into `stdout` if given.
    Returns (exit status, seconds): 124 when it ran past `timeout` (the group is killed), 127 when not found."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with open(log, "a") as err, open(stdout or os.devnull, "w") as out:
        err.write(f"== {' '.join(argv)}\n")
        err.flush()
        try:
            proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=out if stdout else err,
                                    stderr=err, start_new_session=True)
        except OSError as e:
            err.write(f"== not started: {e}\n")
            return 127, 0.0
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = 124
        seconds = time.monotonic() - t0
        err.write(f"== exit {rc} after {seconds:.1f} s\n")
    return rc, seconds


def last_line(text: str) -> str:
    """The last line of a command's output, not execute's own '== ' lines."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("== ")]
    return lines[-1] if lines else ""


def tail(path: Path, lines: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---- the grid -------------------------------------------------------------------------------------------------------

def parse_axis(text: str) -> list:
    """'KEY=V1,V2' or 'K1+K2=a+b,c+d' (keys set together) -> [(name part, {key: value})]. An empty value unsets an
    environment variable (its default)."""
    keys_text, eq, values_text = text.partition("=")
    keys = keys_text.split("+")
    if not eq or not all(KEY_RE.fullmatch(k) for k in keys):
        raise UsageError(f"--grid {text!r}: expected KEY=V1,V2,... or K1+K2=a+b,c+d")
    if len(set(keys)) != len(keys) or RESERVED & set(keys):
        raise UsageError(f"--grid {text!r}: a key twice, or one of {sorted(RESERVED)}")
    options = []
    for value in values_text.split(","):
        row = value.split("+") if len(keys) > 1 else [value]
        if len(row) != len(keys):
            raise UsageError(f"--grid {text!r}: {value!r} has {len(row)} values for {len(keys)} keys")
        settings = dict(zip(keys, row))
        options.append(("-".join(cell_part(k, v) for k, v in settings.items()), settings))
    if len({name for name, _ in options}) != len(options):
        raise UsageError(f"--grid {text!r}: a value twice")
    return options


def cell_part(key: str, value: str) -> str:
    short = key.lower()
    short = short[len("ggml_ciq_"):] if short.startswith("ggml_ciq_") else short
    return short + (re.sub(r"[^A-Za-z0-9._]", "_", value) if value else "default")


def lib_axis(names: str) -> list:
    """--libs new,base,diagN: GGML_CIQ_LIB (and the commit its results name) of setup's builds."""
    p, ours = paths(), environment().get("GGML_CIQ_COMMIT", "")
    options = []
    for name in names.split(","):
        lib, commit = (p["ciq_build"], ours) if name == "new" else (TMP / f"ciq-{name}", ours)
        if name == "base":
            lib = p["base_build"]
            commit_file = p["base_src"] / "COMMIT"
            commit = commit_file.read_text().strip() if commit_file.is_file() else "baseline"
        elif name != "new" and not re.fullmatch(r"diag\d+", name):
            raise UsageError(f"--libs {names!r}: {name!r} is none of new, base, diagN")
        if not (lib / "libggml_ciq.so").is_file():
            raise UsageError(f"--libs: no {lib / 'libggml_ciq.so'} (setup builds it: .baseline carried, --diag N)")
        options.append((name, {"GGML_CIQ_LIB": str(lib / "libggml_ciq.so"), "GGML_CIQ_COMMIT": commit}))
    return options


def expand(axes: list) -> list:
    """The cartesian product of the axes: [(cell name, {key: value})], the first axis varying slowest."""
    cells = []
    for combo in itertools.product(*axes):
        settings = {}
        for _, part in combo:
            if set(part) & set(settings):
                raise UsageError(f"--grid: {sorted(set(part) & set(settings))} set by two axes")
            settings.update(part)
        cells.append(("-".join(name for name, _ in combo), settings))
    return cells


def run_order(cells: list, repetition: int) -> list:
    """Repetition 0 runs the cells in grid order, 1 in reverse, 2 in order again...: drift between the first and the
    last cell of a round falls on every cell alike."""
    return list(cells) if repetition % 2 == 0 else list(reversed(cells))


def ab(args) -> int:
    command = strip_separator(args.command)
    if not command:
        raise UsageError("ab: no command (after --)")
    axes = [parse_axis(text) for text in args.grid] + ([lib_axis(args.libs)] if args.libs else [])
    if not axes:
        raise UsageError("ab: no --grid and no --libs")
    if not NAME_RE.fullmatch(args.name):
        raise UsageError(f"--name {args.name!r}: letters, digits, '.', '_', '-' only")
    if args.repeat < 1 or args.timeout <= 0:
        raise UsageError(f"--repeat {args.repeat}, --timeout {args.timeout}: at least 1 and above 0")
    parse_env(args.env)
    cells = expand(axes)
    in_command = {k for _, settings in cells for k in settings if any("{" + k + "}" in a for a in command)}
    out, scratch = out_dir(), TMP / "gpu-ab" / args.name
    (out / args.name).mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    writes_file = any("{out}" in a for a in command)
    index = {"name": args.name, "command": command, "grid": list(args.grid), "env": list(args.env), "libs": args.libs,
             "repeat": args.repeat, "commit": environment().get("GGML_CIQ_COMMIT"), "order": [], "runs": [],
             "complete": True}
    records = {name: {"cell": name, "settings": settings, "command": command, "runs": []} for name, settings in cells}
    t0, longest = time.monotonic(), 0.0
    for rep in range(args.repeat):
        order = run_order(cells, rep)
        index["order"].append([name for name, _ in order])
        for position, (name, settings) in enumerate(order):
            if time.monotonic() - t0 + longest > args.budget:
                index["complete"] = False
                print(f"ab {args.name}: stopping at r{rep + 1} {name}: the budget of {args.budget:.0f} s would run out")
                break
            run = run_cell(args, command, name, settings, rep, position, in_command, scratch, writes_file)
            longest = max(longest, run["seconds"])
            records[name]["runs"].append(run)
            index["runs"].append({k: run[k] for k in ("repetition", "position", "rc", "seconds")} | {"cell": name})
            print(f"{args.name} r{rep + 1} {name}: exit {run['rc']} after {run['seconds']:.1f} s  "
                  f"{last_line(run['output_tail'])[:150]}")
            write_json(out / args.name / f"{name}.json", records[name])
            write_index(out / f"{args.name}.json", index, records, cells)
        if not index["complete"]:
            break
    write_index(out / f"{args.name}.json", index, records, cells)
    count = sum(1 for f in out.rglob("*") if f.is_file())
    if count > OUT_FILES:
        print(f"{count} files under {out}: end the call with `python3 tools/gpu.py pack`")
    return 0 if all(r["rc"] == 0 for r in index["runs"]) and index["complete"] else 1


def write_index(path: Path, index: dict, records: dict, cells: list) -> None:
    write_json(path, index | {"cells": [{"cell": n, "settings": s, "file": f"{index['name']}/{n}.json",
                                         "rc": [r["rc"] for r in records[n]["runs"]]} for n, s in cells]})


def run_cell(args, command, name, settings, rep, position, in_command, scratch, writes_file) -> dict:
    stem = scratch / f"{name}-r{rep + 1}"
    result_path, log, stdout = Path(f"{stem}.json"), Path(f"{stem}.log"), Path(f"{stem}.stdout")
    for f in (result_path, log, stdout):
        f.unlink(missing_ok=True)
    env = set_env(set_env(environment(), parse_env(args.env)),
                  {k: v for k, v in settings.items() if k not in in_command})
    values = placeholders() | {"out": str(result_path), "cell": name, "rep": str(rep + 1)}
    values |= {k: v for k, v in settings.items() if k in in_command}
    argv = resolve(substitute(command, values))
    rc, seconds = execute(argv, env, log, args.timeout, None if writes_file else stdout)
    result, text = None, ""
    source = result_path if writes_file else stdout
    try:
        text = source.read_text()
        result = json.loads(text)
    except (OSError, ValueError):
        pass
    output = tail(log, 20) + ("" if result is not None or writes_file else "\n" + text[-2000:])
    return {"repetition": rep + 1, "position": position, "rc": rc, "seconds": round(seconds, 3), "argv": argv,
            "result": result, "output_tail": output.strip()}


def write_json(path: Path, data) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    tmp.replace(path)


def strip_separator(argv: list) -> list:
    return argv[1:] if argv[:1] == ["--"] else list(argv)


# ---- the machine's steps -------------------------------------------------------------------------------------------

def job_status(name: str) -> tuple:
    """('done', rc) | ('running', seconds) | ('lost', None) | ('none', None) for setup's background job `name`."""
    jobs = paths()["jobs"]
    if (jobs / f"{name}.rc").is_file():
        text = (jobs / f"{name}.rc").read_text().strip()
        return "done", int(text) if text.lstrip("-").isdigit() else 1
    if not (jobs / f"{name}.pid").is_file():
        return "none", None
    try:
        os.kill(int((jobs / f"{name}.pid").read_text()), 0)
    except (OSError, ValueError):
        return "lost", None
    return "running", time.time() - (jobs / f"{name}.pid").stat().st_mtime


def start_job(name: str, commands: list, env: dict, force: bool) -> str:
    """Runs the shell commands one after another in a new session (they outlive the call), log and status in
    /tmp/gpu-jobs/NAME.*; a job already built or running is left alone unless `force`."""
    state, rc = job_status(name)
    if state == "running" or (state == "done" and rc == 0 and not force):
        return f"{name}: {'running' if state == 'running' else 'built'}"
    jobs = paths()["jobs"]
    jobs.mkdir(parents=True, exist_ok=True)
    for suffix in ("rc", "pid", "log"):
        (jobs / f"{name}.{suffix}").unlink(missing_ok=True)
    script = jobs / f"{name}.sh"
    body = " && \\\n  ".join(commands)
    script.write_text(f"cd {ROOT}\n( {body} ) > {jobs / name}.log 2>&1\necho $? > {jobs / name}.rc.tmp\n"
                      f"mv {jobs / name}.rc.tmp {jobs / name}.rc\n")
    proc = subprocess.Popen(["bash", str(script)], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    (jobs / f"{name}.pid").write_text(str(proc.pid))
    return f"{name}: started"


def cmake(source, build, *options) -> str:
    return " ".join(["cmake -S", str(source), "-B", str(build), "-G Ninja"] + list(options))


def llama_job(name: str, build: Path, py: Path, options: list, targets: str, env: dict, args) -> str:
    """A llama.cpp build of the carried sdist into `build` (its `targets`), and llama-cpp-python's package in `py`
    over that build's libraries (its lib/ a link to the build's bin/: the two are never mixed)."""
    sdist = paths()["sdist"]
    return start_job(name, [cmake(sdist / "vendor" / "llama.cpp", build, *options),
                            f"ninja -C {build} -j {args.jobs} {targets}",
                            f"mkdir -p {py}", f"rm -rf {py / 'llama_cpp'}", f"cp -r {sdist / 'llama_cpp'} {py}/",
                            f"ln -s {build / 'bin'} {py / 'llama_cpp' / 'lib'}"], env, args.force)


def snapshot_sources(dest: Path) -> Path:
    """native/ with what its CMake reads beside it (ggml_ciq/plugin.py, models/) copied to dest; its native/."""
    shutil.rmtree(dest, ignore_errors=True)
    for name in ("native", "ggml_ciq", "models"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    return dest / "native"


def place_extras(p: dict) -> bool:
    """The carried .device-extra/ (the 8B's llama3 vocabulary, ...) into the device folder; whether there was one.
    setup and stage both do it, so a lease that stages no model still has them."""
    if not (ROOT / ".device-extra").is_dir():
        return False
    shutil.copytree(ROOT / ".device-extra", p["device"], dirs_exist_ok=True)
    return True


def setup(args) -> int:
    p = paths()
    if (ROOT / ".device").is_dir():
        shutil.copytree(ROOT / ".device", p["device"], dirs_exist_ok=True)
    place_extras(p)
    if os.environ.get("GGML_CIQ_COMMIT"):
        p["commit"].write_text(os.environ["GGML_CIQ_COMMIT"] + "\n")
    wheels = sorted((p["device"] / "whl").glob("*.whl"))
    if not wheels:
        raise UsageError(f"no wheels in {p['device'] / 'whl'}: carry .device (made by `prepare` here)")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(p["site"])] + [str(w) for w in wheels], check=True)
    if not p["sdist"].is_dir():
        extract(p["device"] / "llama_cpp_python.tar.gz", TMP)
    env = environment()
    archs = os.environ.get("GGML_CIQ_CUDA_ARCHITECTURES", args.archs)
    cuda = ["-DGGML_CIQ_CUDA=ON", f"-DGGML_CIQ_CUDA_ARCHITECTURES={archs}"]
    # The builds read a snapshot of the sources, not the tree: every later call lays the tree out anew (a stage call
    # during a build once left the compiler a missing file).
    building = [n for n in ["ciq"] + [f"diag{n}" for n in args.diag] if job_status(n)[0] == "running"]
    src = p["ciq_src"] / "native" if building else snapshot_sources(p["ciq_src"])  # never under a running build
    states = [start_job("ciq", [cmake(src, p["ciq_build"], *cuda), f"ninja -C {p['ciq_build']}"], env,
                        args.force)]
    if not args.no_llama:
        states.append(llama_job("llama", p["llama_build"], p["llama_py"], [
            "-DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON",
            "-DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=ON -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF",
            "-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"],
            "llama test-backend-ops llama-bench llama-perplexity", env, args))
    if args.native_cpu:
        states.append(llama_job("llama-native", p["native_build"], p["native_py"], [
            "-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF",
            "-DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF",
            "-DLLAMA_BUILD_SERVER=OFF -DLLAMA_OPENSSL=OFF"], "llama ggml", env, args))
    if (ROOT / ".baseline" / "native").is_dir():
        shutil.rmtree(p["base_src"], ignore_errors=True)
        shutil.copytree(ROOT / ".baseline", p["base_src"])
        base_commit = (p["base_src"] / "COMMIT").read_text().strip()
        states.append(start_job("base", [f"export GGML_CIQ_COMMIT={base_commit}", cmake(
            p["base_src"] / "native", p["base_build"], *cuda, "-DGGML_CIQ_PLUGIN=OFF"),
            f"ninja -C {p['base_build']}"], env, args.force))
    for n in args.diag:
        build = TMP / f"ciq-diag{n}"
        states.append(start_job(f"diag{n}", [cmake(src, build, *cuda, "-DGGML_CIQ_PLUGIN=OFF",
                                                   f"-DCMAKE_CUDA_FLAGS=-DCIQ_WGMMA_DIAG={n}"),
                                             f"ninja -C {build}"], env, args.force))
    print("; ".join(states) + " (`wait` blocks until they end)")
    subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,"
                    "temperature.gpu,power.draw", "--format=csv"], check=False)
    return 0


def wait(args) -> int:
    """Exit 0: every job built; 1: one failed; 3: still building at the deadline (call wait again)."""
    jobs = paths()["jobs"]
    names = sorted(f.stem for f in jobs.glob("*.sh")) if jobs.is_dir() else []
    if not names:
        raise UsageError("no build jobs: run setup first (in this lease: /tmp goes with the machine)")
    deadline = time.monotonic() + args.timeout
    while any(job_status(n)[0] == "running" for n in names) and time.monotonic() < deadline:
        time.sleep(args.poll)
    failed = building = False
    for name in names:
        state, value = job_status(name)
        log = jobs / f"{name}.log"
        if state == "running":
            print(f"{name}: still building after {value:.0f} s: call wait again")
            building = True
            continue
        print(f"{name}: {'exit ' + str(value) if state == 'done' else state}")
        lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
        print("\n".join([line for line in lines if "ggml_ciq plugin" in line][:1] + lines[-(2 if value == 0 else 15):]))
        failed = failed or state != "done" or value != 0
    bin_dir = paths()["llama_build"] / "bin"
    if job_status("llama") == ("done", 0) and bin_dir.is_dir():
        print(" ".join(sorted(f.name for f in bin_dir.iterdir() if re.match(r"lib|test-backend|llama-", f.name))))
    return 1 if failed else 3 if building else 0


def stage(args) -> int:
    """Keeps the carried parts; joins each model whose parts are all here (checked against its sums file FILE.sha256,
    whose first line names the whole file) into /tmp/FILE, once."""
    p = paths()
    place_extras(p)
    p["parts"].mkdir(parents=True, exist_ok=True)
    if (ROOT / ".device-parts").is_dir():
        for f in (ROOT / ".device-parts").iterdir():
            shutil.copy2(f, p["parts"] / f.name)
    sums_files = sorted(p["parts"].glob("*" + SUMS_SUFFIX))
    if not sums_files:
        print(f"no parts yet (carry .device-parts/PART and its .device-parts/FILE{SUMS_SUFFIX})")
        return 0
    for sums in sums_files:
        join_parts(sums, p)
    return 0


def join_parts(sums: Path, p: dict) -> None:
    """One model: how many of its parts are here, or the whole file joined and checked."""
    entries = [line.split(None, 1) for line in sums.read_text().splitlines() if line.strip()]
    whole_hash, whole_name = entries[0][0], entries[0][1].strip()  # split_parts writes the whole file's line first
    target = TMP / whole_name
    if target.is_file():
        print(f"{target}: staged")
        return
    parts = [(h, n.strip()) for h, n in entries if ".part" in n]
    missing = [n for h, n in parts if not (p["parts"] / n).is_file() or sha256(p["parts"] / n) != h]
    print(f"{target.name}: {len(parts) - len(missing)} of {len(parts)} parts here"
          + (f"; missing {' '.join(missing)}" if missing else ""))
    if missing:
        return
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "wb") as joined:
        for _, name in parts:
            with open(p["parts"] / name, "rb") as part:
                shutil.copyfileobj(part, joined, 16 * MIB)
    if sha256(tmp) != whole_hash:
        raise UsageError(f"{tmp}: the joined parts do not match {sums.name}")
    tmp.replace(target)
    print(f"{target}: joined, {target.stat().st_size / MIB:.1f} MiB, checked")


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(MIB), b""):
            digest.update(block)
    return digest.hexdigest()


def test(args) -> int:
    log = out_dir() / f"pytest-{args.name}.txt"
    log.unlink(missing_ok=True)
    rc, _ = execute([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider"]
                    + strip_separator(args.pytest_args), environment(), log, args.timeout)
    print(tail(log, args.lines))
    return rc


def sanitize(args) -> int:
    """compute-sanitizer over tools/sanitize_case.py: each CASE (comma-joined variants run in one process) or, with
    none, every kernel."""
    worst = 0
    for case in args.cases or [""]:
        for tool in args.tools.split(","):
            log = out_dir() / f"sanitizer-{tool}{'-' + case.replace(',', '_') if case else ''}.txt"
            log.unlink(missing_ok=True)
            rc, seconds = execute(["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                                   "tools/sanitize_case.py"] + [c for c in case.split(",") if c],
                                  environment(), log, args.limit)
            print(f"{tool} {case or 'all'}: exit {rc} after {seconds:.0f} s  {last_line(tail(log, 4))}")
            worst = worst or rc
    return worst


def compare(args) -> int:
    """`ggml-ciq compare` at each token count: Gemma 3 270M (staged) with the plugin arm when built (the registry's
    offload table; GGML_CIQ_OFFLOAD=all for every weight), or the synthetic Llama-3-8B (speed only)."""
    p, env = paths(), environment()
    gemma = args.model == "gemma3-270m"
    if gemma and not p["gemma"].is_file():
        raise UsageError(f"no {p['gemma']}: stage the parts first")
    model = str(p["gemma"]) if gemma else args.model
    name = Path(args.model).stem
    plugin = gemma and not args.no_plugin and (p["llama_build"] / "bin" / "libggml-cuda.so").is_file() and \
        (p["ciq_build"] / "libggml-ciq.so").is_file()
    reference = args.reference or ("on" if gemma else "off")
    limit = args.limit or (280 if gemma else 400)
    worst = 0
    for tokens in (args.tokens or ("512,4096" if gemma else "512,2048")).split(","):
        stem = f"compare-{name}-{tokens}" + ("-graph" if args.graph else "") + (f"-{args.tag}" if args.tag else "")
        argv = [sys.executable, "-m", "ggml_ciq.cli", "compare", model, "--tokens", tokens, "--device", "cuda",
                "--repeat", str(args.repeat), "--reference", reference, "--json", str(out_dir() / f"{stem}.json")]
        argv += (["--plugin"] if plugin else []) + (["--cuda-graph"] if args.graph else [])
        argv += ["--plot", str(out_dir() / f"{stem}.png")] if gemma else []
        log = p["logs"] / f"{stem}.txt"
        log.unlink(missing_ok=True)
        rc, seconds = execute(argv, env, log, limit)
        print(f"== {stem}: exit {rc} after {seconds:.0f} s\n{tail(log, args.lines)}")
        worst = worst or rc
    return worst


def run(args) -> int:
    """One command with this environment, its output in $OUT/NAME.txt (stdout alone in NAME.json: --json-stdout)."""
    command = strip_separator(args.command)
    if not command:
        raise UsageError("run: no command (after --)")
    name = args.name or re.sub(r"[^A-Za-z0-9._-]", "_", Path(command[0]).name)
    if not NAME_RE.fullmatch(name):
        raise UsageError(f"--name {name!r}: letters, digits, '.', '_', '-' only")
    env = set_env(environment(), parse_env(args.env))
    log = out_dir() / f"{name}.txt"
    log.unlink(missing_ok=True)
    rc, seconds = execute(resolve(substitute(command, placeholders())), env, log, args.timeout,
                          out_dir() / f"{name}.json" if args.json_stdout else None)
    print(f"{name}: exit {rc} after {seconds:.1f} s\n{tail(log, args.lines)}")
    return rc


def show_env(args) -> int:
    """The environment as shell exports: eval "$(python3 tools/gpu.py env)" for a one-off shell."""
    env = environment()
    for key in sorted(k for k in env if k.startswith("GGML_CIQ_") or k in ("PYTHONPATH", "PYTHONUNBUFFERED")):
        print(f"export {key}={shlex.quote(env[key])}")
    return 0


def out_problems(out: Path) -> list:
    """What would keep $OUT's files from coming back whole."""
    files = [f for f in out.rglob("*") if f.is_file() or f.is_symlink()]
    problems = [f"{len(files)} files (at most {OUT_FILES})"] if len(files) > OUT_FILES else []
    total = 0
    for f in files:
        rel = f.relative_to(out)
        total += f.lstat().st_size
        if len(rel.parts) > OUT_DEPTH + 1:
            problems.append(f"{rel}: more than {OUT_DEPTH} folders down")
        if not all(NAME_RE.fullmatch(part) for part in rel.parts):
            problems.append(f"{rel}: a name with other characters")
        if f.is_symlink() or f.lstat().st_size > OUT_FILE_BYTES:
            problems.append(f"{rel}: a link or over 16 MiB")
    return problems + ([f"{total / MIB:.1f} MiB in all"] if total > OUT_BYTES else [])


def pack(args) -> int:
    """Everything under $OUT into NAME.tgz (16 MiB pieces NAME.tgz.partNN if larger), unless it already comes back
    whole (--force: pack anyway)."""
    if not NAME_RE.fullmatch(args.name):
        raise UsageError(f"pack {args.name!r}: letters, digits, '.', '_', '-' only")
    out = out_dir()
    problems = out_problems(out)
    if not problems and not args.force:
        print(f"{out}: within the limits, left as it is")
    else:
        packed = Path(tempfile.mkdtemp(dir=TMP)) / f"{args.name}.tgz"
        with tarfile.open(packed, "w:gz") as tar:
            for entry in sorted(out.iterdir()):
                tar.add(entry, arcname=entry.name)
        size = packed.stat().st_size
        if size > OUT_BYTES:
            raise UsageError(f"packed {size / MIB:.1f} MiB, over the {OUT_BYTES // MIB} MiB a call brings back; "
                             f"$OUT left as it is, the archive in {packed}")
        for entry in out.iterdir():
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        if size <= OUT_FILE_BYTES:
            shutil.move(str(packed), out / packed.name)
        else:
            with open(packed, "rb") as f:
                for i, piece in enumerate(iter(lambda: f.read(OUT_FILE_BYTES), b"")):
                    (out / f"{packed.name}.part{i:02d}").write_bytes(piece)
            packed.unlink()
        packed.parent.rmdir()
        print(f"packed ({'; '.join(problems) or 'forced'}):")
    for f in sorted(out.rglob("*")):
        if f.is_file():
            print(f"  {f.relative_to(out)}  {f.stat().st_size} bytes")
    return 0


def chain_dir() -> Path:
    return TMP / "lease-out"


def chain(args) -> int:
    """FILE's lines, one after another, in a new session (they outlive the call; a call in flight, e.g. `collect`,
    keeps the machine): each a shell command with this environment, `$G` this runner and OUT=/tmp/lease-out, so the
    verbs' results gather there; each line's start, exit code and output go to its chain.log, a failure does not stop
    the rest. Then `collect` - in the same call (--collect SECONDS): the machine goes back 30 s after a call ends, and
    a chain started by a call that then ends dies with it unless another call comes in time."""
    if args.collect is not None and args.collect <= 0:
        raise UsageError(f"--collect {args.collect:g}: seconds to wait, above 0")
    path = ROOT / args.file
    if not path.is_file():
        raise UsageError(f"{args.file}: no such file (the lines of a chain, e.g. tools/leases/*.txt)")
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    if not lines:
        raise UsageError(f"{args.file}: no command lines")
    out = chain_dir()
    if out.is_dir() and not (out / "DONE").is_file() and (out / "chain.log").is_file() and not args.force:
        raise UsageError(f"a chain is running ({out}/chain.log; --force starts another)")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    log = out / "chain.log"
    log.write_text("")
    steps = [f"printf '== %s %s\\n' \"$(date +%T)\" {shlex.quote(line)} >> {log}\n( {line} ) >> {log} 2>&1\n"
             f"echo \"== rc=$? $(date +%T)\" >> {log}\n" for line in lines]
    script = TMP / "lease-chain.sh"
    script.write_text(f"cd {ROOT}\n" + "".join(steps) + f"touch {out / 'DONE'}\n")
    env = dict(environment(), OUT=str(out), G=f"{sys.executable} {ROOT / 'tools' / 'gpu.py'}")
    subprocess.Popen(["bash", str(script)], env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)
    print(f"chain: {len(lines)} lines of {args.file} started; `collect` waits for them")
    if args.collect is None:
        print("chain: call `collect` next, back to back (the machine goes back 30 s after this call, the chain with "
              "it), or start chains with --collect SECONDS")
        return 0
    return collect(argparse.Namespace(timeout=args.collect, poll=args.poll, name=args.name))


def collect(args) -> int:
    """Waits for the chain (at most --timeout s), then copies /tmp/lease-out into $OUT and packs it: exit 0 when the
    chain has ended, 3 when it still runs (what it had so far comes back; call collect again)."""
    out = chain_dir()
    if not (out / "chain.log").is_file():
        raise UsageError("no chain: start one with `chain FILE` (in this lease: /tmp goes with the machine)")
    deadline = time.monotonic() + args.timeout
    while not (out / "DONE").is_file() and time.monotonic() < deadline:
        time.sleep(args.poll)
    done = (out / "DONE").is_file()
    print("\n".join(line for line in (out / "chain.log").read_text(errors="replace").splitlines()
                    if line.startswith("== ")))
    shutil.copytree(out, out_dir(), dirs_exist_ok=True)
    pack(argparse.Namespace(name=args.name, force=False))
    if not done:
        print("the chain still runs: call collect again")
    return 0 if done else 3


# ---- here, with network --------------------------------------------------------------------------------------------

def extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "fully_trusted_filter"):  # the sdist, as tar itself would unpack it
            tar.extractall(dest, filter="fully_trusted")
        else:
            tar.extractall(dest)


def tree_bytes() -> int:
    """What every call carries: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.split(b"\0")
    total = 0
    for name in filter(None, listed):
        path = ROOT / os.fsdecode(name)
        if path.is_file() or path.is_symlink():
            total += path.lstat().st_size
    return total


def folder_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def sums_of(part: str) -> str:
    """The sums file a carried part travels with: .device-parts/FILE.partNN -> .device-parts/FILE.sha256."""
    return part.rsplit(".part", 1)[0] + SUMS_SUFFIX


def plan_calls(tree: int, items: list) -> list:
    """[(carried path, bytes)] into as few calls as first fit makes, each at most CALL_LIMIT with the tree and 8 paths,
    each call with a part carrying that model's sums file too -> [[path, ...]]; the first item opens the first call."""
    sizes = dict(items)
    calls = []
    for path, _ in items:
        if path.endswith(SUMS_SUFFIX):
            continue
        need = [path] + ([sums_of(path)] if ".part" in path else [])
        for call in calls:
            merged = call + [c for c in need if c not in call]
            if tree + sum(sizes.get(c, 0) for c in merged) <= CALL_LIMIT and len(merged) <= 8:
                call[:] = merged
                break
        else:
            calls.append(need)
    return calls


def print_plan(part_size: int | None = None) -> int:
    tree = tree_bytes()
    items = [(str(f.relative_to(ROOT)), folder_bytes(f)) for f in
             [ROOT / ".device", ROOT / ".baseline", ROOT / ".device-extra"] if f.exists()]
    if (ROOT / ".device-parts").is_dir():
        items += [(f".device-parts/{f.name}", f.stat().st_size) for f in sorted((ROOT / ".device-parts").iterdir())]
    sizes = dict(items)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    print(f"the tree: {tree / MIB:.1f} MiB of the {CALL_LIMIT // MIB} MiB a call carries"
          + (f"; parts of {part_size / MIB:.0f} MiB" if part_size else ""))
    if not items:
        print("nothing prepared: python3 tools/gpu.py prepare")
    worst = 0
    for i, call in enumerate(plan_calls(tree, items), 1):
        size = tree + sum(sizes[c] for c in call)
        verbs = ["setup"] if {".device", ".baseline"} & set(call) else []
        verbs += ["stage"] if any(c.startswith((".device-parts", ".device-extra")) for c in call) else []
        line = " && ".join(f"python3 tools/gpu.py {v}" for v in verbs or ["stage"])
        if ".device" in call:
            line = f"export GGML_CIQ_COMMIT={commit.strip()}; {line}"
        fits = size <= CALL_LIMIT
        worst = worst or (0 if fits else 1)
        print(f"call {i}: {size / MIB:.1f} MiB{'' if fits else ' (OVER THE LIMIT: a smaller --part-size)'}, "
              f"carry {json.dumps(call)}\n    {line}")
    return worst


def auto_part_size(tree: int) -> int:
    """48 MiB, or what fits beside the tree (1 MiB spare)."""
    return max(MIB, min(48 * MIB, (CALL_LIMIT - tree - MIB) // MIB * MIB))


def prepare(args) -> int:
    """Here, with network: what the GPU machine cannot download, into git-ignored folders that calls carry."""
    if args.part_size is not None and args.part_size < 1:
        raise UsageError(f"--part-size {args.part_size}: at least 1 (MiB)")
    if args.plan_only:
        return print_plan()
    if args.baseline:
        prepare_baseline(args.baseline)
        if args.baseline_only:
            return print_plan()
    device = ROOT / ".device"
    shutil.rmtree(device, ignore_errors=True)
    (device / "whl").mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps"]
    subprocess.run(pip + ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--platform",
                          "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64", "--platform",
                          "manylinux2014_x86_64", "-d", str(device / "whl")] + list(WHEELS), check=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(pip + ["--no-binary", ":all:", "-d", tmp, f"llama-cpp-python=={SDIST_NAME.split('-')[1]}"],
                       check=True)
        extract(Path(tmp) / f"{SDIST_NAME}.tar.gz", Path(tmp))
        src = Path(tmp) / SDIST_NAME
        vendor = src / "vendor" / "llama.cpp"
        for sub in (src / ".git", src / "docs", vendor / "docs", vendor / "media", vendor / "benches",
                    vendor / "tools" / "ui", vendor / ".git"):
            shutil.rmtree(sub, ignore_errors=True) if sub.is_dir() else sub.unlink(missing_ok=True)
        extra = ROOT / ".device-extra"  # the 8B's vocabulary (models/llama3_8b_synthetic.py --vocab)
        shutil.rmtree(extra, ignore_errors=True)
        extra.mkdir()
        shutil.copy2(vendor / "models" / "ggml-vocab-llama-bpe.gguf", extra)
        for model in (vendor / "models").rglob("*.gguf"):
            model.unlink()
        with tarfile.open(device / "llama_cpp_python.tar.gz", "w:gz") as tar:
            tar.add(src, arcname=SDIST_NAME)
    (device / "LLAMACPP_COMMIT").write_text(LLAMACPP_COMMIT + "\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "tools/gemma_kquants.py", str(device / "gemma3-270m-kquants.gguf")], cwd=ROOT,
                   env=env, check=True)
    # llama-perplexity --kl-divergence text: chapters 2 and 3 of the Vim user manual (Debian vim-runtime), 13.2k
    # Gemma tokens of real English
    manual = Path("/usr/share/vim/vim90/doc")
    (device / "perplexity-text.txt").write_bytes(b"".join((manual / n).read_bytes() for n in ("usr_02.txt",
                                                                                               "usr_03.txt")))
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "vim-runtime"], capture_output=True, text=True)
    (device / "perplexity-text.source").write_text(f"{manual}/usr_02.txt + usr_03.txt (vim-runtime {version.stdout})\n")
    part_size = args.part_size * MIB if args.part_size else auto_part_size(tree_bytes())
    shutil.rmtree(ROOT / ".device-parts", ignore_errors=True)
    for name in dict.fromkeys(args.model or ["gemma3-270m"]):
        code = f"from ggml_ciq import catalog; print(catalog.resolve_model({name!r}))"
        model = Path(subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                                    check=True).stdout.strip())
        split_parts(model, ROOT / ".device-parts", part_size, PART_MODELS[name][0])
    return print_plan(part_size)


def split_parts(model: Path, folder: Path, part_size: int, name: str = "gemma3-270m.gguf") -> None:
    """The whole model file in parts of part_size bytes named NAME.partNN, with NAME.sha256 (the whole file's line
    first: its name on the machine), beside whatever other models the folder holds."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"{name}.part*"):
        old.unlink()
    lines = [f"{sha256(model)}  {name}"]
    with open(model, "rb") as f:
        for i, piece in enumerate(iter(lambda: f.read(part_size), b"")):
            part = folder / f"{name}.part{i:02d}"
            part.write_bytes(piece)
            lines.append(f"{hashlib.sha256(piece).hexdigest()}  {part.name}")
    (folder / f"{name}{SUMS_SUFFIX}").write_text("\n".join(lines) + "\n")


def prepare_baseline(commit: str) -> None:
    """That commit's native/ in .baseline/ (setup builds it when carried), its header saying this tree's API version:
    valid only while the calls bench gemm makes are the same in both."""
    base = ROOT / ".baseline"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir()
    archive = subprocess.run(["git", "archive", commit, "native"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(base)], input=archive, check=True)
    short = subprocess.run(["git", "rev-parse", "--short", commit], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.strip()
    (base / "COMMIT").write_text(short + "\n")
    pattern = re.compile(r"^#define GGML_CIQ_API_VERSION (\d+)", re.M)
    version = pattern.search((ROOT / "native/include/ggml_ciq.h").read_text()).group(1)
    header = base / "native/include/ggml_ciq.h"
    header.write_text(pattern.sub(f"#define GGML_CIQ_API_VERSION {version}", header.read_text()))


# ---- the command line ----------------------------------------------------------------------------------------------

class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help)\n")


def log_options(p, name: str | None, lines: int):
    """--name, --timeout and --lines of the verbs that log one command."""
    p.add_argument("--name", default=name, help=f"the log's name (default {name or 'the program'})")
    p.add_argument("--timeout", type=float, default=540, help="seconds (default 540)")
    p.add_argument("--lines", type=int, default=lines, help=f"lines of the log to print (default {lines})")
    return p


def build_parser() -> Parser:
    parser = Parser(prog="gpu.py", description=__doc__.split("\n", 1)[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 1)[1])
    sub = parser.add_subparsers(dest="verb", required=True, parser_class=Parser)

    p = sub.add_parser("prepare", help="here, with network: .device/, .device-extra/, .device-parts/; the calls' plan")
    p.add_argument("--part-size", type=int, metavar="MIB",
                   help="the Gemma file's part size (default: 48 MiB, or what fits a call beside the tree)")
    p.add_argument("--baseline", metavar="COMMIT", help="also that commit's native/ in .baseline/ (for --libs base)")
    p.add_argument("--baseline-only", action="store_true", help="with --baseline: stage nothing else")
    p.add_argument("--plan-only", action="store_true", help="only print what each call carries")
    p.add_argument("--model", action="append", choices=sorted(PART_MODELS),
                   help="a catalog model whose whole file travels in parts, each with its own sums file "
                        "(repeatable; default gemma3-270m)")
    p.set_defaults(func=prepare)

    p = sub.add_parser("setup", help="wheels -> /tmp/site; starts the CUDA builds in the background (then: wait)")
    p.add_argument("--no-llama", action="store_true", help="no llama.cpp CUDA build (library tests, lib-ab)")
    p.add_argument("--native-cpu", action="store_true",
                   help="also a CPU-only llama.cpp built -march=native (AVX-512 / AMX where the host has them) and "
                        "llama-cpp-python's package over it, for GPU_LLAMACPP=native runs of any verb")
    p.add_argument("--diag", type=int, action="append", default=[], metavar="N",
                   help="also the library with CIQ_WGMMA_DIAG=N in /tmp/ciq-diagN (for --libs diagN)")
    p.add_argument("--archs", default="90a", help="GGML_CIQ_CUDA_ARCHITECTURES (default 90a)")
    p.add_argument("--jobs", type=int, default=16, help="ninja -j for llama.cpp (default 16)")
    p.add_argument("--force", action="store_true", help="rebuild what is built already")
    p.set_defaults(func=setup)

    p = sub.add_parser("wait", help="block until setup's builds end (exit 3: still building at --timeout)")
    p.add_argument("--timeout", type=float, default=540, help="seconds (default 540: inside a 10-minute call)")
    p.add_argument("--poll", type=float, default=5, help=argparse.SUPPRESS)
    p.set_defaults(func=wait)

    p = sub.add_parser("stage", help="keep the carried Gemma parts; join and check them once all are here")
    p.set_defaults(func=stage)

    p = log_options(sub.add_parser("test", help="pytest with this environment, log in $OUT/pytest-NAME.txt"), "gpu", 15)
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="pytest's arguments, as they are")
    p.set_defaults(func=test)

    p = sub.add_parser("sanitize", help="compute-sanitizer over tools/sanitize_case.py -> $OUT/sanitizer-TOOL-CASE.txt")
    p.add_argument("cases", nargs="*", help="engine, ops, fusion, attention-split, attention-wgmma, attention-masked, "
                   "rope-rows-set, wgmma-block32, "
                   "wgmma-stream-k, wgmma-rs, wgmma-group-glu, or variants (mma,q32: one process); none: every kernel")
    p.add_argument("--tools", default="memcheck,racecheck", help="default memcheck,racecheck")
    p.add_argument("--limit", type=float, default=500, help="seconds per tool and case (default 500)")
    p.set_defaults(func=sanitize)

    p = sub.add_parser("ab", help="a grid of settings x a command: one JSON per cell + NAME.json under $OUT",
                       description="Runs the command once per cell and repetition, the cells in grid order, then "
                       "reversed, alternately. {out} in the command is the run's JSON file (else its stdout is read "
                       "as JSON); {cell}, {rep}, {gemma}, {llama_bin}, {plugin}, {device}, {OUT} and a grid key "
                       "written {KEY} are replaced (an argument that is only {KEY} is dropped when its value is "
                       "empty); other keys are environment variables, an empty value unsets one. -> $OUT/NAME/CELL.json (every "
                       "run's result and output tail) and $OUT/NAME.json (settings, order, exit codes).")
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                   help="an axis; K1+K2=a+b,c+d sets keys together; an empty value unsets (repeatable)")
    p.add_argument("--libs", metavar="new,base,diagN", help="an axis over setup's library builds (GGML_CIQ_LIB)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set in every cell (repeatable)")
    p.add_argument("--repeat", type=int, default=2, help="rounds over the grid (default 2)")
    p.add_argument("--name", default="ab", help="the result files' name (default ab)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per run (default 300)")
    p.add_argument("--budget", type=float, default=540, help="no run started that would end past it (default 540 s)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command")
    p.set_defaults(func=ab)

    p = sub.add_parser("compare", help="ggml-ciq compare: Gemma 3 270M (staged) or the synthetic 8B -> $OUT")
    p.add_argument("--model", default="gemma3-270m", help="gemma3-270m (default) or llama3-8b-synthetic")
    p.add_argument("--tokens", default=None, help="comma-separated (default 512,4096; the 8B 512,2048)")
    p.add_argument("--graph", action="store_true", help="our arms as CUDA graphs")
    p.add_argument("--reference", choices=("on", "off"), help="the float64 arm (default: on for Gemma, off for the 8B)")
    p.add_argument("--repeat", type=int, default=5, help="default 5")
    p.add_argument("--tag", help="a suffix of the result names (A/B arms)")
    p.add_argument("--no-plugin", action="store_true", help="no plugin arm even when built")
    p.add_argument("--limit", type=float, default=None, help="seconds per token count (default 280; the 8B 400)")
    p.add_argument("--lines", type=int, default=40, help="lines of each log to print (default 40)")
    p.set_defaults(func=compare)

    p = log_options(sub.add_parser("run", help="one command with this environment -> $OUT/NAME.txt"), None, 12)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="set for the command (repeatable)")
    p.add_argument("--json-stdout", action="store_true", help="stdout alone into $OUT/NAME.json (llama-bench -o json)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the command ({gemma}, {llama_bin}, {plugin}, ...)")
    p.set_defaults(func=run)

    p = sub.add_parser("chain", help="a file's command lines one after another, detached, into /tmp/lease-out")
    p.add_argument("file", help="the lines, relative to the tree (tools/leases/*.txt); $G is this runner")
    p.add_argument("--force", action="store_true", help="start even while another chain runs")
    p.add_argument("--collect", type=float, metavar="SECONDS",
                   help="then `collect --timeout SECONDS` in this call (the machine stays held while it waits)")
    p.add_argument("--poll", type=float, default=5, help=argparse.SUPPRESS)
    p.add_argument("--name", default="lease", help="the archive's name when collected and packed (default lease)")
    p.set_defaults(func=chain)

    p = sub.add_parser("collect", help="wait for the chain, its results into $OUT, packed (exit 3: still running)")
    p.add_argument("--timeout", type=float, default=540, help="seconds (default 540: inside a 10-minute call)")
    p.add_argument("--poll", type=float, default=5, help=argparse.SUPPRESS)
    p.add_argument("--name", default="lease", help="the archive's name when packed (default lease)")
    p.set_defaults(func=collect)

    p = sub.add_parser("env", help="this environment as shell exports")
    p.set_defaults(func=show_env)

    p = sub.add_parser("pack", help="$OUT into NAME.tgz when it would not come back whole (8 files, 2 folders deep)")
    p.add_argument("name", nargs="?", default="results", help="default results")
    p.add_argument("--force", action="store_true", help="pack even when within the limits")
    p.set_defaults(func=pack)
    return parser


OWN_OPTIONS = {"test": {"--name", "--timeout", "--lines"}}


def separate(argv: list) -> list:
    """`test`'s own options first, then pytest's arguments as they are (argparse would take -k for its own)."""
    if not argv or argv[0] not in OWN_OPTIONS:
        return argv
    i = 1
    while i < len(argv) and (argv[i] in OWN_OPTIONS[argv[0]] or argv[i].split("=")[0] in OWN_OPTIONS[argv[0]]):
        i += 1 if "=" in argv[i] else 2
    if i < len(argv) and argv[i] not in ("-h", "--help", "--"):
        return argv[:i] + ["--"] + argv[i:]
    return argv


def main(argv: list | None = None) -> int:
    argv = separate(list(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(line_buffering=True)  # in order with the commands' output, through a pipe too
    try:
        return args.func(args)
    except BrokenPipeError:
        return 0
    except UsageError as e:
        print(f"gpu.py {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"gpu.py {args.verb}: error: {' '.join(map(str, e.cmd))[:200]} exited {e.returncode}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
