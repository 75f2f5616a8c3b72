"""Per-lane register layouts of the 16x16x16 int8 WMMA fragments (native/src/cuda/wmma_fragment.cuh).

The header's LAYOUT TABLE comment documents these rows, its Layout structs implement the AMD ones, and
tests/test_wmma_layouts.py checks all three against each other and against a plain matrix product. The header
cites the sources.

Register element v (0..n-1) of lane l (0..31) holds A[first][second] (row, k), B[second][first] (col, k) or
C[first][second] (row, col). Expressions are C integer arithmetic on non-negative ints ('/' truncates).
"""

from __future__ import annotations

import re
from typing import NamedTuple

LANES = 32
DIM = 16


class Layout(NamedTuple):
    n: int  # register elements per lane
    first: str
    second: str


LAYOUTS: dict[str, dict[str, Layout]] = {
    # CUDA sm_80+: nvcuda::wmma hides it; PTX's mma.m16n8k16 .s8 fragments, once per 8-column half.
    "sm80": {
        "A": Layout(8, "l/4 + 8*(v/4)", "4*(l%4) + v%4"),
        "B": Layout(8, "l/4 + 8*(v/4)", "4*(l%4) + v%4"),
        "C": Layout(8, "l/4 + 8*((v/2)%2)", "2*(l%4) + v%2 + 8*(v/4)"),
    },
    # RDNA3, wave32, v_wmma_i32_16x16x16_iu8: whole rows per lane, lanes 16-31 repeat 0-15.
    "gfx11": {
        "A": Layout(16, "l%16", "v"),
        "B": Layout(16, "l%16", "v"),
        "C": Layout(8, "2*v + l/16", "l%16"),
    },
    # RDNA4, wave32, v_wmma_i32_16x16x16_iu8 (gfx12 encoding): lanes 16-31 hold k 8-15 and C rows 8-15.
    "gfx12": {
        "A": Layout(8, "l%16", "8*(l/16) + v"),
        "B": Layout(8, "l%16", "8*(l/16) + v"),
        "C": Layout(8, "v + 8*(l/16)", "l%16"),
    },
}

_EXPR = re.compile(r"[lv0-9+*/%() ]+")


def evaluate(expr: str, lane: int, v: int = 0) -> int:
    """Value of a layout expression for lane `lane` (l), element v."""
    if not _EXPR.fullmatch(expr):
        raise ValueError(f"not a layout expression: {expr!r}")
    return int(eval(expr.replace("/", "//"), {"__builtins__": {}}, {"l": lane, "v": v}))


def coordinates(layout: Layout) -> list[list[tuple[int, int]]]:
    """[lane][element] -> (first, second)."""
    return [[(evaluate(layout.first, lane, v), evaluate(layout.second, lane, v)) for v in range(layout.n)]
            for lane in range(LANES)]
