"""The CLI in an 80-column terminal: every table fits, tensor names stay whole and every number keeps its exponent
(before, `diff` at 80 columns cut names to "blk…" and numbers to "7.5…").

The commands run in a pseudo-terminal of 80 x 50 (rich reads the width from it, as in a user's terminal); the
escape sequences of colours and the progress bar are stripped before reading the text.
"""

import fcntl
import io
import json
import os
import pty
import re
import struct
import subprocess
import sys
import tempfile
import termios

from rich.console import Console

from ggml_ciq import cli

WIDTH = 80
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def run_in_terminal(*args, timeout=300) -> tuple[int, list[str]]:
    """`python -m ggml_ciq.cli ARGS` on a pseudo-terminal of WIDTH columns: exit code, visible lines."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, WIDTH, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "ggml_ciq.cli", *map(str, args)], stdin=slave, stdout=slave,
                            stderr=slave, close_fds=True, cwd=tempfile.gettempdir())
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 1 << 16)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    rc = proc.wait(timeout=timeout)
    text = ESCAPES.sub("", b"".join(chunks).decode(errors="replace"))
    return rc, re.split(r"\r\n|\n|\r", text)


def assert_fits(lines):
    wide = [line for line in lines if len(line) > WIDTH]
    assert not wide, f"{len(wide)} lines wider than {WIDTH} columns, e.g. {wide[0]!r}"
    assert not any("…" in line for line in lines), "a cell was cut: " + next(l for l in lines if "…" in l)


def test_diff_at_80_columns(llama, native_lib, tmp_path):
    rc, lines = run_in_terminal("diff", "--backend", "ciq-cpu", "--reference", "llamacpp-cpu", "--tokens", 5,
                                "--json", tmp_path / "d.json")
    assert rc == 0, "\n".join(lines[-20:])
    assert_fits(lines)
    report = json.loads((tmp_path / "d.json").read_text())
    text = "\n".join(lines)
    for t in report["tensors"]:
        assert any(re.search(rf"(^| ){re.escape(t['name'])}( |$)", line) for line in lines), t["name"]
        for key in ("ours_vs_llamacpp", "ours_vs_llamacpp_maxabs", "llamacpp_vs_f64", "llamacpp_vs_f64_maxabs",
                    "ours_vs_f64", "ours_vs_f64_maxabs"):
            assert re.search(rf"(^| ){re.escape(format(t[key], '.2e'))}( |$)", text, re.M), (t["name"], key)
    assert "NMSE above max|d|" in text  # the stacked layout says how to read a cell


def test_prefill_at_80_columns(native_lib):
    rc, lines = run_in_terminal("prefill", "--tokens", 3)
    assert rc == 0, "\n".join(lines[-20:])
    assert_fits(lines)
    assert any("next token" in line for line in lines) and any("keep-quant GEMM" in line for line in lines)


def test_info_at_80_columns(native_lib):
    rc, lines = run_in_terminal("info")
    assert rc == 0, "\n".join(lines[-20:])
    assert_fits(lines)  # long paths wrap instead of ending in "…"


def test_the_widest_table_at_80_columns():
    """bench gemm --backend ciq-cuda's 13 columns (a GPU run; here through the same table function): every value
    whole at 80 columns, one above the other where needed; at 200 columns one line per row."""
    columns = [(c, "text" if c == "variant" else "number") for c in
               ("type", "rows", "K", "tokens", "variant", "us", "best us", "gemm-only us", "TFLOP/s", "llama.cpp us",
                "speedup", "bf16 us", "of bf16")]
    rows = [["Q6_K", "14336", "4096", "2048", "wmma-bigtile", "12345.6", "12001.2", "11999.9", "1234.5", "23456.7",
             "1.90", "9876.5", "80%"]]
    stacks = [((0, 1, 2), "type\nrows\nK"), ((5, 6, 7), "us\nbest\nGEMM only"), ((9, 10), "llama.cpp us\nspeedup"),
              ((11, 12), "bf16 us\nof bf16")]
    for width, lines_per_row in ((80, 3), (200, 1)):
        console = Console(width=width, record=True, file=io.StringIO())
        cli._print_table(console, "ciq-cuda vs llama.cpp CUDA mul_mat (NVIDIA H200)", columns, rows, stacks)
        lines = console.export_text().splitlines()
        assert max(map(len, lines)) <= width and not any("…" in line for line in lines)
        text = "\n".join(lines)
        assert all(re.search(rf"(^| ){re.escape(cell)}( |$)", text, re.M) for cell in rows[0]), text
        body = [line for line in lines if "12345.6" in line or "12001.2" in line or "11999.9" in line]
        assert len(body) == lines_per_row, text
