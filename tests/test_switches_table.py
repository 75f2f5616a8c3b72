"""The runtime switches' one table (native/src/switches.cpp k_switches): every switch the Python side records
(environment.SWITCHES) has its row, and switches.cpp is the one native file that reads the environment."""
import re
from pathlib import Path

from ggml_ciq import environment

SRC = Path(__file__).resolve().parents[1] / "native" / "src"


def test_table_lists_every_recorded_switch():
    text = (SRC / "switches.cpp").read_text()
    table = text[text.index("k_switches[SWITCH_COUNT] = {"):]
    rows = set(re.findall(r'\{[A-Z_]+, "(GGML_CIQ_[A-Z0-9_]+)"', table))
    assert rows == set(environment.SWITCHES)


def test_only_switches_cpp_reads_the_environment():
    readers = sorted(str(p.relative_to(SRC)) for p in SRC.rglob("*") if p.suffix in (".cpp", ".cu", ".cuh", ".h")
                     and re.search(r"\bgetenv\s*\(", p.read_text()))
    assert readers == ["switches.cpp"]
