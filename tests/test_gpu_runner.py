"""tools/gpu.py, the GPU machine's runner, on the CPU: the grid (product, order, names), its argument errors, `ab` on
a trivial command, `pack` within what a call brings back, `stage` joining parts, and the plan of a lease's calls."""

import importlib.util
import io
import json
import random
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parent.parent / "tools" / "gpu.py"
SPEC = importlib.util.spec_from_file_location("tools_gpu", PATH)
gpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(gpu)

ECHO = ("import json, os, sys; json.dump(dict(x=os.environ.get('X'), y=os.environ.get('Y'), arg=sys.argv[2:]), "
        "open(sys.argv[1], 'w'))")


@pytest.fixture
def out(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "TMP", tmp_path / "machine")
    (tmp_path / "machine").mkdir()
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    monkeypatch.delenv("X", raising=False)
    monkeypatch.delenv("Y", raising=False)
    return tmp_path / "out"


def run_main(argv, capsys):
    """(exit status, stdout, stderr) of gpu.main, argparse's exits included."""
    try:
        rc = gpu.main(argv)
    except SystemExit as e:
        rc = e.code
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_grid_is_the_cartesian_product_first_axis_slowest():
    cells = gpu.expand([gpu.parse_axis("GGML_CIQ_WGMMA_RS=0,1"), gpu.parse_axis("GGML_CIQ_WGMMA_STREAMK=0,1,2")])
    assert [name for name, _ in cells] == ["wgmma_rs0-wgmma_streamk0", "wgmma_rs0-wgmma_streamk1",
                                           "wgmma_rs0-wgmma_streamk2", "wgmma_rs1-wgmma_streamk0",
                                           "wgmma_rs1-wgmma_streamk1", "wgmma_rs1-wgmma_streamk2"]
    assert cells[4][1] == {"GGML_CIQ_WGMMA_RS": "1", "GGML_CIQ_WGMMA_STREAMK": "1"}


def test_cell_names_joint_keys_empty_values_and_odd_characters():
    assert gpu.parse_axis("GGML_CIQ_WGMMA_RS+GGML_CIQ_WGMMA_CONFIG=1+,0+,1+1") == [
        ("wgmma_rs1-wgmma_configdefault", {"GGML_CIQ_WGMMA_RS": "1", "GGML_CIQ_WGMMA_CONFIG": ""}),
        ("wgmma_rs0-wgmma_configdefault", {"GGML_CIQ_WGMMA_RS": "0", "GGML_CIQ_WGMMA_CONFIG": ""}),
        ("wgmma_rs1-wgmma_config1", {"GGML_CIQ_WGMMA_RS": "1", "GGML_CIQ_WGMMA_CONFIG": "1"})]
    names = [name for name, _ in gpu.parse_axis("DEV=CIQ0/CUDA0,CUDA0 x")]
    assert names == ["devCIQ0_CUDA0", "devCUDA0_x"]
    assert all(gpu.NAME_RE.fullmatch(n) for n in names)


def test_order_alternates_across_repetitions():
    cells = gpu.expand([gpu.parse_axis("A=1,2,3")])
    orders = [[name for name, _ in gpu.run_order(cells, r)] for r in range(4)]
    assert orders == [["a1", "a2", "a3"], ["a3", "a2", "a1"], ["a1", "a2", "a3"], ["a3", "a2", "a1"]]


@pytest.mark.parametrize("argv", [
    ["ab", "--grid", "X", "--", "true"],
    ["ab", "--grid", "=1", "--", "true"],
    ["ab", "--grid", "X=1,1", "--", "true"],
    ["ab", "--grid", "A+B=1,2+3", "--", "true"],
    ["ab", "--grid", "A+A=1+2", "--", "true"],
    ["ab", "--grid", "out=1,2", "--", "true"],
    ["ab", "--grid", "1X=1", "--", "true"],
    ["ab", "--grid", "X=1,2", "--grid", "X+Y=3+4", "--", "true"],
    ["ab", "--grid", "X=1,2"],
    ["ab", "--", "true"],
    ["ab", "--grid", "X=1", "--name", "a/b", "--", "true"],
    ["ab", "--grid", "X=1", "--repeat", "two", "--", "true"],
    ["ab", "--libs", "old", "--", "true"],
    ["ab", "--grid", "X=1", "--repeat", "0", "--", "true"],
    ["prepare", "--part-size", "0"],
    ["run", "--env", "NOEQUALS", "--", "true"],
    ["ab", "--env", "1=2", "--grid", "X=1", "--", "true"],
    ["pack", "a b"],
    ["nosuchverb"],
])
def test_argument_errors_are_one_line_and_exit_2(argv, out, capsys):
    rc, stdout, stderr = run_main(argv, capsys)
    assert rc == 2
    assert len(stderr.strip().splitlines()) == 1, stderr
    assert "Traceback" not in stderr and "error" in stderr
    assert not (out / "ab").exists() or not any((out / "ab").iterdir())


def test_malformed_grid_as_a_process_prints_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(PATH), "ab", "--grid", "NOT A GRID", "--", "true"],
                          capture_output=True, text=True, env={"OUT": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["gpu.py ab: error: --grid 'NOT A GRID': expected KEY=V1,V2,... or "
                                                "K1+K2=a+b,c+d"]


@pytest.mark.parametrize("verb", ["prepare", "setup", "wait", "stage", "test", "sanitize", "ab", "compare", "run",
                                  "chain", "collect", "env", "pack"])
def test_every_verb_has_help(verb, capsys):
    rc, stdout, _ = run_main([verb, "--help"], capsys)
    assert rc == 0 and stdout.startswith(f"usage: gpu.py {verb}")


def test_ab_writes_one_json_per_cell_and_an_index(out, capsys):
    rc, stdout, _ = run_main(["ab", "--grid", "X=1,2", "--grid", "Y=a,b", "--repeat", "2", "--name", "t", "--",
                              "python3", "-c", ECHO, "{out}", "{cell}", "{rep}"], capsys)
    assert rc == 0, stdout
    index = json.loads((out / "t.json").read_text())
    names = ["x1-ya", "x1-yb", "x2-ya", "x2-yb"]
    assert index["order"] == [names, names[::-1]]
    assert [(r["repetition"], r["cell"]) for r in index["runs"]] == [(1, n) for n in names] + [(2, n) for n in
                                                                                              names[::-1]]
    assert sorted(f.name for f in (out / "t").iterdir()) == [f"{n}.json" for n in names]
    for name in names:
        cell = json.loads((out / "t" / f"{name}.json").read_text())
        assert [r["repetition"] for r in sorted(cell["runs"], key=lambda r: r["repetition"])] == [1, 2]
        for r in cell["runs"]:
            assert r["rc"] == 0
            assert r["result"] == {"x": cell["settings"]["X"], "y": cell["settings"]["Y"],
                                   "arg": [name, str(r["repetition"])]}
    assert len(list(out.rglob("*.json"))) == 5 <= gpu.OUT_FILES


def test_ab_reads_stdout_substitutes_grid_keys_and_unsets_empty_values(out, capsys, monkeypatch):
    monkeypatch.setenv("X", "inherited")
    code = "import json, os, sys; print(json.dumps(dict(x=os.environ.get('X'), n=sys.argv[1], env=os.environ.get('n'))))"
    rc, _, _ = run_main(["ab", "--grid", "X=,5", "--grid", "n=3,4", "--repeat", "1", "--", "python3", "-c", code,
                         "{n}"], capsys)
    assert rc == 0
    results = {c: json.loads((out / "ab" / f"{c}.json").read_text())["runs"][0]["result"] for c in
               ("xdefault-n3", "xdefault-n4", "x5-n3", "x5-n4")}
    assert results["xdefault-n3"] == {"x": None, "n": "3", "env": None}
    assert results["x5-n4"] == {"x": "5", "n": "4", "env": None}


def test_ab_env_is_set_in_every_cell_and_an_empty_flag_is_dropped(out, capsys):
    code = "import json, os, sys; print(json.dumps(dict(y=os.environ.get('Y'), args=sys.argv[1:])))"
    rc, _, _ = run_main(["ab", "--env", "Y={OUT}", "--grid", "flag=,--cuda-graph", "--repeat", "1", "--", "python3",
                         "-c", code, "{flag}", "x{flag}"], capsys)
    assert rc == 0
    result = {c: json.loads((out / "ab" / f"{c}.json").read_text())["runs"][0]["result"] for c in
              ("flagdefault", "flag__cuda_graph")}
    assert result["flagdefault"] == {"y": str(out), "args": ["x"]}
    assert result["flag__cuda_graph"] == {"y": str(out), "args": ["--cuda-graph", "x--cuda-graph"]}
    assert json.loads((out / "ab.json").read_text())["env"] == ["Y={OUT}"]


def test_ab_records_a_failing_run_and_exits_1(out, capsys):
    rc, stdout, _ = run_main(["ab", "--grid", "X=0,3", "--repeat", "1", "--", "python3", "-c",
                              "import os, sys; print('boom'); sys.exit(int(os.environ['X']))"], capsys)
    assert rc == 1
    index = json.loads((out / "ab.json").read_text())
    assert [c["rc"] for c in index["cells"]] == [[0], [3]]
    failed = json.loads((out / "ab" / "x3.json").read_text())["runs"][0]
    assert failed["result"] is None and "boom" in failed["output_tail"]
    assert "ab r1 x3: exit 3 after" in stdout and stdout.rstrip().endswith("boom")


def test_ab_stops_before_its_budget(out, capsys):
    rc, stdout, _ = run_main(["ab", "--grid", "X=1,2", "--repeat", "3", "--budget", "0.3", "--", "python3", "-c",
                              "import time; time.sleep(0.2); print('{}')"], capsys)
    index = json.loads((out / "ab.json").read_text())
    assert rc == 1 and not index["complete"] and 1 <= len(index["runs"]) < 6
    assert "budget" in stdout


def test_ab_timeout_is_exit_124(out, capsys):
    rc, _, _ = run_main(["ab", "--grid", "X=1", "--repeat", "1", "--timeout", "0.5", "--", "python3", "-c",
                         "import time; time.sleep(30)"], capsys)
    assert rc == 1
    assert json.loads((out / "ab.json").read_text())["runs"][0]["rc"] == 124


def make_tree(root: Path, rng: random.Random, count: int, size: int) -> dict:
    files = {}
    for i in range(count):
        rel = Path(*[f"d{rng.randrange(3)}" for _ in range(rng.randrange(5))], f"f{i}.txt")
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = rng.randbytes(size)
        (root / rel).write_bytes(data)
        files[str(rel)] = data
    return files


def unpack(out: Path) -> dict:
    pieces = sorted(out.iterdir())
    blob = b"".join(p.read_bytes() for p in pieces)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def within_limits(out: Path) -> bool:
    files = [f for f in out.rglob("*") if f.is_file()]
    return (len(files) <= 8 and all(len(f.relative_to(out).parts) <= 3 for f in files)
            and all(gpu.NAME_RE.fullmatch(part) for f in files for part in f.relative_to(out).parts))


def test_pack_brings_many_deep_files_within_the_limits(out, capsys):
    out.mkdir()
    files = make_tree(out, random.Random(0), 20, 300)
    assert not within_limits(out)
    rc, _, _ = run_main(["pack", "logs"], capsys)
    assert rc == 0 and within_limits(out)
    assert [f.name for f in out.iterdir()] == ["logs.tgz"]
    assert unpack(out) == files


def test_pack_splits_a_large_archive_into_pieces(out, capsys, monkeypatch):
    monkeypatch.setattr(gpu, "OUT_FILE_BYTES", 4096)
    out.mkdir()
    files = make_tree(out, random.Random(1), 12, 1500)  # random bytes: the archive stays ~18 KB
    rc, _, _ = run_main(["pack"], capsys)
    assert rc == 0 and within_limits(out)
    assert all(f.stat().st_size <= 4096 and f.name.startswith("results.tgz.part") for f in out.iterdir())
    assert unpack(out) == files


def test_pack_leaves_a_folder_within_the_limits(out, capsys):
    (out / "a").mkdir(parents=True)
    (out / "a" / "x.json").write_text("{}")
    rc, stdout, _ = run_main(["pack"], capsys)
    assert rc == 0 and "left as it is" in stdout and (out / "a" / "x.json").is_file()


def test_stage_joins_the_parts_once_all_are_carried(out, capsys, monkeypatch, tmp_path):
    root = tmp_path / "tree"
    monkeypatch.setattr(gpu, "ROOT", root)
    whole = tmp_path / "gemma.gguf"
    whole.write_bytes(random.Random(2).randbytes(10_000))
    gpu.split_parts(whole, tmp_path / "all-parts", 3000)
    parts = sorted(p.name for p in (tmp_path / "all-parts").iterdir() if ".part" in p.name)
    assert len(parts) == 4
    for i, name in enumerate(parts):  # one call per part, each with its sums file
        carried = root / ".device-parts"
        if carried.exists():
            for f in carried.iterdir():
                f.unlink()
        carried.mkdir(parents=True, exist_ok=True)
        for f in (name, "gemma3-270m.gguf.sha256"):
            (carried / f).write_bytes((tmp_path / "all-parts" / f).read_bytes())
        rc, stdout, _ = run_main(["stage"], capsys)
        assert rc == 0
        assert ("joined" in stdout) == (i == len(parts) - 1), stdout
    assert (gpu.TMP / "gemma3-270m.gguf").read_bytes() == whole.read_bytes()


def test_stage_joins_several_models_carried_in_any_order(out, capsys, monkeypatch, tmp_path):
    """Parts of two models in one folder, each with its own sums file: carried interleaved, a part and its model's sums
    a call, each model joined once its last part is here; a corrupt part is never joined."""
    root = tmp_path / "tree"
    monkeypatch.setattr(gpu, "ROOT", root)
    models = {"smollm2-135m.gguf": random.Random(3).randbytes(7_000),
              "qwen2.5-coder-0.5b.gguf": random.Random(4).randbytes(5_000)}
    for name, data in models.items():
        (tmp_path / name).write_bytes(data)
        gpu.split_parts(tmp_path / name, tmp_path / "all-parts", 2_000, name)
    parts = sorted(p.name for p in (tmp_path / "all-parts").iterdir() if ".part" in p.name)
    assert len(parts) == 4 + 3
    order = [parts[i] for i in (0, 4, 1, 5, 2, 6, 3)]
    for i, name in enumerate(order):
        carried = root / ".device-parts"
        for f in carried.iterdir() if carried.exists() else []:
            f.unlink()
        carried.mkdir(parents=True, exist_ok=True)
        sums = gpu.sums_of(f".device-parts/{name}").split("/")[-1]
        for f in (name, sums):
            (carried / f).write_bytes((tmp_path / "all-parts" / f).read_bytes())
        rc, stdout, _ = run_main(["stage"], capsys)
        assert rc == 0
    assert "qwen2.5-coder-0.5b.gguf: staged" in stdout and "smollm2-135m.gguf: joined" in stdout, stdout
    for name, data in models.items():
        assert (gpu.TMP / name).read_bytes() == data
    for f in (root / ".device-parts").iterdir():  # a call carrying nothing new
        f.unlink()
    (gpu.TMP / "smollm2-135m.gguf").unlink()
    corrupt = [p for p in parts if p.startswith("smollm2")][1]
    (gpu.paths()["parts"] / corrupt).write_bytes(b"corrupt")
    rc, stdout, _ = run_main(["stage"], capsys)
    assert rc == 0 and f"missing {corrupt}" in stdout and not (gpu.TMP / "smollm2-135m.gguf").exists()


def test_the_plan_keeps_every_call_within_64_mib():
    mib = gpu.MIB
    sums = f".device-parts/{gpu.PART_PREFIX[:-len('.part')]}{gpu.SUMS_SUFFIX}"
    items = [(".device", 33 * mib), (".device-extra", mib)]
    items += [(f".device-parts/{gpu.PART_PREFIX}{i:02d}", 48 * mib) for i in range(5)]
    items += [(sums, 500)]
    sizes = dict(items)
    calls = gpu.plan_calls(5 * mib, items)
    assert calls[0] == [".device", ".device-extra"]
    assert sorted(c for call in calls for c in call if "part" in c and not c.endswith(gpu.SUMS_SUFFIX)) == \
        [p for p, _ in items[2:7]]
    assert len(calls) == 6
    for call in calls:
        assert 5 * mib + sum(sizes[c] for c in call) <= gpu.CALL_LIMIT and len(call) <= 8
        assert any(".part" in c for c in call) <= (sums in call)
    assert gpu.auto_part_size(5 * mib) == 48 * mib and gpu.auto_part_size(33 * mib) == 30 * mib
    # today's tree: 31 MiB parts, the last one beside the 8B's vocabulary
    items = [(".device", 31 * mib), (".device-extra", 7 * mib)]
    items += [(f".device-parts/{gpu.PART_PREFIX}{i:02d}", 31 * mib) for i in range(7)] + [
        (f".device-parts/{gpu.PART_PREFIX}07", 24 * mib), (sums, 500)]
    calls = gpu.plan_calls(32 * mib, items)
    assert len(calls) == 9 and calls[1] == [".device-extra", f".device-parts/{gpu.PART_PREFIX}07", sums]
    # two models: each part with its own model's sums file, small parts sharing a call
    items = [(".device", 10 * mib), (".device-parts/a.gguf.part00", 40 * mib), (".device-parts/a.gguf.part01", 5 * mib),
             (".device-parts/a.gguf.sha256", 200), (".device-parts/b.gguf.part00", 6 * mib),
             (".device-parts/b.gguf.sha256", 200)]
    calls = gpu.plan_calls(2 * mib, items)
    assert calls == [[".device", ".device-parts/a.gguf.part00", ".device-parts/a.gguf.sha256",
                      ".device-parts/a.gguf.part01", ".device-parts/b.gguf.part00", ".device-parts/b.gguf.sha256"]]


def test_chain_runs_every_line_detached_and_collect_brings_the_results(out, capsys, monkeypatch, tmp_path):
    """A lease's steps past one call: `chain FILE` starts its lines in order in a new session (a failing line does not
    stop the rest; each writes into OUT=/tmp/lease-out, `$G` is the runner), `collect` waits for the last one and
    copies the results into $OUT; without a chain, or with an empty file, one-line errors and exit 2."""
    monkeypatch.setattr(gpu, "ROOT", tmp_path / "tree")
    (tmp_path / "tree" / "tools").mkdir(parents=True)
    (tmp_path / "tree" / "tools" / "gpu.py").write_text(PATH.read_text())
    rc, _, err = run_main(["collect", "--timeout", "0"], capsys)
    assert rc == 2 and "no chain" in err and err.count("\n") == 1
    (tmp_path / "tree" / "lines.txt").write_text("# a comment\n\n")
    rc, _, err = run_main(["chain", "lines.txt"], capsys)
    assert rc == 2 and "no command lines" in err
    (tmp_path / "tree" / "lines.txt").write_text("echo first > $OUT/a.txt\nfalse\n"
                                                 "sleep 0.2; $G env > $OUT/env.txt\n")
    rc, stdout, _ = run_main(["chain", "lines.txt"], capsys)
    assert rc == 0 and "3 lines" in stdout
    rc, stdout, err = run_main(["collect", "--timeout", "60", "--poll", "0.05"], capsys)
    assert rc == 0, (stdout, err)
    assert [line.split()[1] for line in stdout.splitlines() if line.startswith("== rc=")] == ["rc=0", "rc=1", "rc=0"]
    assert (out / "a.txt").read_text() == "first\n" and "PYTHONPATH" in (out / "env.txt").read_text()
    assert (out / "DONE").is_file() and "false" in (out / "chain.log").read_text()
    # started and collected in one call (--collect): the machine is held while it waits
    (tmp_path / "tree" / "lines.txt").write_text("sleep 0.2; echo second > $OUT/b.txt\n")
    rc, stdout, _ = run_main(["chain", "lines.txt", "--collect", "60", "--poll", "0.05"], capsys)
    assert rc == 0 and "1 lines" in stdout and "== rc=0" in stdout and (out / "b.txt").read_text() == "second\n"
    rc, _, err = run_main(["chain", "lines.txt", "--collect", "0"], capsys)
    assert rc == 2 and "--collect 0: seconds to wait" in err and err.count("\n") == 1
    rc, stdout, _ = run_main(["chain", "lines.txt", "--force"], capsys)
    assert rc == 0 and "call `collect` next" in stdout
    assert run_main(["collect", "--timeout", "60", "--poll", "0.05"], capsys)[0] == 0


def test_test_verb_passes_pytest_options_through():
    args = gpu.build_parser().parse_args(gpu.separate(["test", "--name", "cuda", "-k", "llamacpp", "tests/x.py"]))
    assert args.name == "cuda" and gpu.strip_separator(args.pytest_args) == ["-k", "llamacpp", "tests/x.py"]


def test_wait_reports_built_failed_and_still_building_jobs(out, capsys):
    env = gpu.environment()
    assert gpu.start_job("good", ["echo built > /dev/null", "echo done"], env, False) == "good: started"
    assert gpu.start_job("bad", ["echo compiling", "exit 3"], env, False) == "bad: started"
    rc, stdout, _ = run_main(["wait", "--timeout", "20", "--poll", "0.05"], capsys)
    assert rc == 1 and "good: exit 0" in stdout and "bad: exit 3" in stdout and "compiling" in stdout
    assert gpu.start_job("good", ["exit 9"], env, False) == "good: built"  # a built job is left alone
    gpu.start_job("slow", ["sleep 30"], env, False)
    rc, stdout, _ = run_main(["wait", "--timeout", "0.2", "--poll", "0.05"], capsys)
    assert rc == 1 and "slow: still building" in stdout
    pid = int((gpu.paths()["jobs"] / "slow.pid").read_text())
    gpu.os.killpg(pid, gpu.signal.SIGKILL)  # the job this test started, by its process group


def test_wait_without_setup_is_a_one_line_error(out, capsys):
    rc, _, stderr = run_main(["wait"], capsys)
    assert rc == 2 and stderr.count("\n") == 1


def test_ab_libs_axis_sets_each_build_and_its_commit(out, capsys, monkeypatch):
    monkeypatch.setenv("GGML_CIQ_COMMIT", "new1234")
    for build in ("ciq-build", "ciq-base", "ciq-diag1"):
        (gpu.TMP / build).mkdir()
        (gpu.TMP / build / "libggml_ciq.so").write_bytes(b"")
    (gpu.TMP / "ciq-base-src").mkdir()
    (gpu.TMP / "ciq-base-src" / "COMMIT").write_text("old5678\n")
    code = "import json, os; print(json.dumps([os.environ['GGML_CIQ_LIB'], os.environ['GGML_CIQ_COMMIT']]))"
    rc, _, _ = run_main(["ab", "--libs", "base,new,diag1", "--repeat", "1", "--", "python3", "-c", code], capsys)
    assert rc == 0
    result = {c: json.loads((out / "ab" / f"{c}.json").read_text())["runs"][0]["result"] for c in
              ("base", "new", "diag1")}
    assert result == {"base": [str(gpu.TMP / "ciq-base" / "libggml_ciq.so"), "old5678"],
                      "new": [str(gpu.TMP / "ciq-build" / "libggml_ciq.so"), "new1234"],
                      "diag1": [str(gpu.TMP / "ciq-diag1" / "libggml_ciq.so"), "new1234"]}
    rc, _, stderr = run_main(["ab", "--libs", "diag2", "--", "true"], capsys)
    assert rc == 2 and "ciq-diag2" in stderr


def test_native_llamacpp_runs_use_its_libraries_and_package_together(out, monkeypatch):
    """GPU_LLAMACPP=native (setup --native-cpu's build): libllama and llama-cpp-python's package both from the native
    build, never one from the CUDA build beside the other (that mix crashed llama_model_load); unset, the CUDA one."""
    for key in ("GGML_CIQ_LLAMACPP_LIB", "PYTHONPATH", gpu.LLAMACPP_ENV):
        monkeypatch.delenv(key, raising=False)
    cuda = gpu.environment()
    monkeypatch.setenv(gpu.LLAMACPP_ENV, "native")
    native = gpu.environment()
    root = gpu.TMP
    assert cuda["GGML_CIQ_LLAMACPP_LIB"] == str(root / "llama" / "llama_cpp" / "lib")
    assert native["GGML_CIQ_LLAMACPP_LIB"] == str(root / "llama-native-py" / "llama_cpp" / "lib")
    assert str(root / "llama-native-py") in native["PYTHONPATH"].split(":")
    assert str(root / "llama") not in native["PYTHONPATH"].split(":")
    args = gpu.build_parser().parse_args(["setup", "--native-cpu", "--no-llama"])
    assert args.native_cpu and args.no_llama


def test_setup_and_stage_place_the_carried_extras(out, monkeypatch, tmp_path):
    """The carried .device-extra/ (the 8B's vocabulary) lands in the device folder from setup as from stage: a lease
    that stages no model once ran setup alone and found no vocabulary to write the 8B from."""
    root = tmp_path / "tree"
    (root / ".device-extra").mkdir(parents=True)
    (root / ".device-extra" / "ggml-vocab-llama-bpe.gguf").write_bytes(b"vocab")
    monkeypatch.setattr(gpu, "ROOT", root)
    p = gpu.paths()
    assert gpu.place_extras(p) and (p["device"] / "ggml-vocab-llama-bpe.gguf").read_bytes() == b"vocab"
    (p["device"] / "ggml-vocab-llama-bpe.gguf").unlink()
    with pytest.raises(gpu.UsageError, match="no wheels"):  # setup without .device: the extras are in place first
        gpu.setup(gpu.build_parser().parse_args(["setup", "--no-llama"]))
    assert (p["device"] / "ggml-vocab-llama-bpe.gguf").read_bytes() == b"vocab"
    shutil.rmtree(root / ".device-extra")
    assert not gpu.place_extras(p)


def test_setup_builds_from_a_snapshot_of_the_sources(out):
    """setup's builds read a copy of native/ (and ggml_ciq/plugin.py, models/ beside it that its CMake reads), not the
    tree that every later call lays out anew; a second snapshot replaces the first whole."""
    dest = gpu.paths()["ciq_src"]
    src = gpu.snapshot_sources(dest)
    assert src == dest / "native" and (src / "CMakeLists.txt").is_file()
    assert (dest / "ggml_ciq" / "plugin.py").is_file() and (dest / "models" / "llama3_8b_synthetic.py").is_file()
    assert not list(dest.rglob("__pycache__"))
    (src / "stale.txt").write_text("left from an earlier lease")
    gpu.snapshot_sources(dest)
    assert not (src / "stale.txt").exists()


def test_kernel_profile_compare_reads_two_ncu_logs(tmp_path):
    """tools/kernel_profile.py compare: two ncu --csv logs side by side by kernel family (template arguments kept, the
    argument list cut at its matching parenthesis; ncu's own log lines skipped), largest difference first; a missing
    file one line and exit 2."""
    header = '"ID","Kernel Name","Grid Size","Block Size","Metric Name","Metric Unit","Metric Value"\n'
    rs = '"void gemm_wgmma_rs_kernel<(ciq_type)12, 256, 4, (ciq_type)12>(CUtensorMap_st, int)"'
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("==PROF== a log line\n" + header + f'"0",{rs},"(8,1,1)","(384,1,1)","gpu__time_duration.sum","usecond","12"\n'
                 + '"1","rms_norm(float *)","(512,1,1)","(256,1,1)","gpu__time_duration.sum","nsecond","3,200"\n')
    b.write_text(header + f'"0",{rs},"(8,1,1)","(384,1,1)","gpu__time_duration.sum","usecond","20"\n')
    tool = str(PATH.parent / "kernel_profile.py")
    proc = subprocess.run([sys.executable, tool, "compare", str(a), str(b), "--labels", "plugin", "engine"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "busy ms: plugin 0.015, engine 0.020 (engine - plugin: +0.005)"
    assert lines[2].split() == ["gemm_wgmma_rs_kernel<(ciq_type)12,", "256,", "4,", "(ciq_type)12>", "1", "0.012", "1",
                                "0.020", "+0.008"]
    assert lines[3].split() == ["rms_norm", "1", "0.003", "0", "0.000", "-0.003"]
    proc = subprocess.run([sys.executable, tool, "compare", str(tmp_path / "none.csv"), str(b)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("kernel_profile: cannot read") and \
        "Traceback" not in proc.stderr
