"""WMMA fragment layouts on the CPU: ggml_ciq/wmma_layouts.py, the LAYOUT TABLE comment of
native/src/cuda/wmma_fragment.cuh and the header's load/store index math agree, and emulating each architecture's
lanes (sm80, RDNA3 gfx11, RDNA4 gfx12) on random int8 tiles reproduces the plain matrix product. Altering any table
entry, in the module, the comment or the code, must fail the check."""

import re
from pathlib import Path

import numpy as np
import pytest

from ggml_ciq.wmma_layouts import DIM, LANES, LAYOUTS, Layout, coordinates, evaluate

HEADER = Path(__file__).resolve().parents[1] / "native" / "src" / "cuda" / "wmma_fragment.cuh"
AMD_STRUCTS = {"gfx11": "LayoutGfx11", "gfx12": "LayoutGfx12"}


def header_table(text: str) -> dict:
    block = re.search(r"// LAYOUT TABLE\n(.*?)// END LAYOUT TABLE", text, re.S)
    assert block, "LAYOUT TABLE block missing"
    rows = [[cell.strip() for cell in line.lstrip("/ ").split("|")] for line in block.group(1).splitlines()]
    assert rows[0] == ["arch", "operand", "n", "first", "second"]
    table: dict = {}
    for arch, operand, n, first, second in rows[1:]:
        table.setdefault(arch, {})[operand] = Layout(int(n), first, second)
    return table


def _c_function(params: str, expr: str):
    """A one-line C++ `int f(int l, int v) { return expr; }` as a Python function (unnamed parameters ignored)."""
    names = [p.split()[1] if len(p.split()) == 2 else None for p in params.split(",")]

    def f(*args):
        scope = {name: arg for name, arg in zip(names, args) if name}
        return int(eval(expr.replace("/", "//"), {"__builtins__": {}}, scope))

    return f


def header_code(text: str) -> dict:
    """Per AMD arch: the load address of A/B element v and the store address of accumulator element v, lane l,
    as the header computes them (Layout struct functions inside load_ab / frag_store)."""
    load = re.search(r"reinterpret_cast<const Layout::ABRegs \*>\(tile \+ (.+?)\);", text).group(1)
    store = re.search(r"tile\[(.+?)\] = c\.x\[v\];", text).group(1)
    code = {}
    for arch, struct in AMD_STRUCTS.items():
        body = re.search(rf"struct {struct} {{\n(.*?)\n}};", text, re.S).group(1)
        functions = {name: _c_function(params, expr) for name, params, expr in
                     re.findall(r"int (\w+)\(([^)]*)\) \{ return (.+?); \}", body)}
        ab_bytes = 4 * int(re.search(r"int ABRegs __attribute__\(\(ext_vector_type\((\d+)\)\)\);", body).group(1))
        sum_regs = int(re.search(r"int SumRegs __attribute__\(\(ext_vector_type\((\d+)\)\)\);", text).group(1))

        def address(expr, lane, v, functions=functions):
            python = re.sub(r"Layout::(\w+)\(", r"\1(", expr).replace("DIM", str(DIM)).replace("/", "//")
            return int(eval(python, {"__builtins__": {}}, {**functions, "l": lane, "v": v}))

        code[arch] = {
            "ab_bytes": ab_bytes,
            "c_regs": sum_regs,
            # one vector load of ab_bytes consecutive bytes: element v sits v bytes after the lane's address
            "ab_address": lambda lane, v, address=address: address(load, lane, 0) + v,
            "c_address": lambda lane, v, address=address: address(store, lane, v),
        }
    return code


def tile_addresses(layout: Layout):
    """Shared-memory offset of each lane's register elements under the fragment contract (16-byte rows:
    A[row][k] at 16*row + k, B[k][col] at 16*col + k, D[row][col] at 16*row + col)."""
    return [[DIM * first + second for first, second in lane] for lane in coordinates(layout)]


def registers_to_matrix(regs, layout: Layout) -> np.ndarray:
    """The 16x16 matrix [first][second] the hardware reads from the lanes' registers; replicated copies must agree."""
    matrix = np.full((DIM, DIM), np.iinfo(np.int64).min)
    for lane, coords in enumerate(coordinates(layout)):
        for v, (first, second) in enumerate(coords):
            assert 0 <= first < DIM and 0 <= second < DIM, f"lane {lane} element {v} outside the tile"
            if matrix[first, second] != np.iinfo(np.int64).min:
                assert matrix[first, second] == regs[lane][v], f"replicas of [{first}][{second}] differ"
            matrix[first, second] = regs[lane][v]
    assert (matrix != np.iinfo(np.int64).min).all(), "the lanes do not cover the tile"
    return matrix


def matrix_to_registers(matrix: np.ndarray, layout: Layout):
    return [[int(matrix[first, second]) for first, second in lane] for lane in coordinates(layout)]


def emulate(arch: str, layouts: dict, code: dict, rng) -> None:
    """Two accumulating MMAs (a Q4_K sub-block: 2 k-slices) through the code's loads and store and the table's
    register semantics; the stored tile must equal A0 @ B0 + A1 @ B1."""
    table = layouts[arch]
    if arch in code:
        impl = code[arch]
        assert impl["ab_bytes"] == table["A"].n == table["B"].n, "A/B register width"
        assert impl["c_regs"] == table["C"].n, "accumulator width"
        ab_address = [[impl["ab_address"](lane, v) for v in range(table["A"].n)] for lane in range(LANES)]
        c_address = [[impl["c_address"](lane, v) for v in range(table["C"].n)] for lane in range(LANES)]
        ab_addresses = {"A": ab_address, "B": ab_address}
    else:  # nvcuda::wmma: load/store_matrix_sync with ldm 16 implement the contract for whatever the layout is
        ab_addresses = {"A": tile_addresses(table["A"]), "B": tile_addresses(table["B"])}
        c_address = tile_addresses(table["C"])

    for name, addresses in (("A", ab_addresses["A"]), ("B", ab_addresses["B"]), ("C", c_address)):
        assert all(0 <= a < DIM * DIM for lane in addresses for a in lane), f"{arch} {name}: outside the tile"

    acc = [[0] * table["C"].n for _ in range(LANES)]  # frag_zero
    expected = np.zeros((DIM, DIM), np.int64)
    for _ in range(2):
        a = rng.integers(-128, 128, (DIM, DIM))  # A[row][k], stored at 16*row + k
        bt = rng.integers(-128, 128, (DIM, DIM))  # B[k][col] stored at 16*col + k
        a_regs = [[a.flat[address] for address in lane] for lane in ab_addresses["A"]]
        b_regs = [[bt.flat[address] for address in lane] for lane in ab_addresses["B"]]
        d = (registers_to_matrix(a_regs, table["A"]) @ registers_to_matrix(b_regs, table["B"]).T
             + registers_to_matrix(acc, table["C"]))
        acc = matrix_to_registers(d, table["C"])
        expected += a @ bt.T

    stored = np.full(DIM * DIM, np.iinfo(np.int64).min)
    for lane in range(LANES):
        for v in range(table["C"].n):
            stored[c_address[lane][v]] = acc[lane][v]
    assert (stored.reshape(DIM, DIM) == expected).all(), f"{arch}: stored tile is not the matrix product"


def check(layouts: dict, text: str) -> None:
    # Comparisons are bound to names first: pytest would otherwise diff the large structures on failure, which
    # the alteration tests provoke on purpose (and which takes minutes).
    table = header_table(text)
    same_archs = table.keys() == layouts.keys()
    assert same_archs, "architectures differ between header and module"
    for arch, operands in layouts.items():
        same_operands = table[arch].keys() == operands.keys()
        assert same_operands, f"{arch}: operands differ"
        for operand, layout in operands.items():
            documented = table[arch][operand]
            agree = documented.n == layout.n and coordinates(documented) == coordinates(layout)
            assert agree, f"{arch} {operand}: header table {documented} != ggml_ciq/wmma_layouts.py {layout}"
    code = header_code(text)
    same_code = code.keys() == {arch for arch in layouts if arch.startswith("gfx")}
    assert same_code, "AMD layout structs differ from the table's architectures"
    for arch in layouts:
        emulate(arch, layouts, code, np.random.default_rng(0))


def test_header_table_matches_module():
    table = header_table(HEADER.read_text())
    assert {arch: {op: (lay.n, coordinates(lay)) for op, lay in ops.items()} for arch, ops in table.items()} == {
        arch: {op: (lay.n, coordinates(lay)) for op, lay in ops.items()} for arch, ops in LAYOUTS.items()}


@pytest.mark.parametrize("arch", AMD_STRUCTS)
def test_code_addresses_match_table(arch):
    code = header_code(HEADER.read_text())[arch]
    for operand in "AB":
        expected = tile_addresses(LAYOUTS[arch][operand])
        got = [[code["ab_address"](lane, v) for v in range(LAYOUTS[arch][operand].n)] for lane in range(LANES)]
        assert got == expected, f"{arch} {operand}: load addresses"
    expected = tile_addresses(LAYOUTS[arch]["C"])
    got = [[code["c_address"](lane, v) for v in range(LAYOUTS[arch]["C"].n)] for lane in range(LANES)]
    assert got == expected, f"{arch} C: store addresses"


@pytest.mark.parametrize("arch", LAYOUTS)
@pytest.mark.parametrize("seed", range(4))
def test_emulated_wmma_is_matrix_product(arch, seed):
    emulate(arch, LAYOUTS, header_code(HEADER.read_text()), np.random.default_rng(seed))


def test_documented_lane_facts():
    """The statements the header cites, lane by lane."""
    c11, c12 = coordinates(LAYOUTS["gfx11"]["C"]), coordinates(LAYOUTS["gfx12"]["C"])
    a11, a12 = coordinates(LAYOUTS["gfx11"]["A"]), coordinates(LAYOUTS["gfx12"]["A"])
    for lane in range(LANES):
        assert a11[lane] == a11[lane % 16] == [(lane % 16, k) for k in range(16)]  # gfx11: lanes 16-31 repeat 0-15
        assert a12[lane] == [(lane % 16, 8 * (lane // 16) + k) for k in range(8)]  # gfx12: upper lanes hold k 8-15
        assert c11[lane] == [(2 * i + lane // 16, lane % 16) for i in range(8)]
        assert c12[lane] == [(i + 8 * (lane // 16), lane % 16) for i in range(8)]
    assert evaluate("l/4 + 8*(v/4)", 31, 7) == 15


def test_check_passes_unaltered():
    check(LAYOUTS, HEADER.read_text())


def _alterations():
    for arch, operands in LAYOUTS.items():
        # "both": module and comment altered alike; only the AMD code can disagree (nvcuda::wmma is opaque)
        for where in ("module", "header", "both") if arch in AMD_STRUCTS else ("module", "header"):
            for operand in operands:
                for field in ("first", "second"):
                    yield pytest.param(arch, operand, field, where, id=f"{arch}-{operand}-{field}-{where}")


@pytest.mark.parametrize("arch,operand,field,where", list(_alterations()))
def test_altered_table_is_detected(arch, operand, field, where):
    text = HEADER.read_text()
    layouts = {a: dict(ops) for a, ops in LAYOUTS.items()}
    layout = layouts[arch][operand]
    altered = f"({getattr(layout, field)} + 1) % 16"  # still a permutation of the tile: only the cross-checks see it
    if where in ("module", "both"):
        layouts[arch][operand] = layout._replace(**{field: altered})
    if where in ("header", "both"):
        row = re.compile(rf"^(//\s+{arch}\s+\|\s+{operand}\s+\|.*)$", re.M)
        line = row.search(text).group(1)
        cells = line.split("|")
        cells[3 if field == "first" else 4] = f" {altered} "
        text = text.replace(line, "|".join(cells).rstrip())
        assert text != HEADER.read_text()
    with pytest.raises(AssertionError):
        check(layouts, text)


@pytest.mark.parametrize("arch", AMD_STRUCTS)
@pytest.mark.parametrize("function", ["ab_index", "ab_k", "c_row", "c_col"])
def test_altered_code_is_detected(arch, function):
    text = HEADER.read_text()
    struct = re.search(rf"struct {AMD_STRUCTS[arch]} {{\n.*?\n}};", text, re.S).group(0)
    altered = re.sub(rf"(int {function}\([^)]*\) {{ return )(.+?);", r"\1(\2 + 1) % 16;", struct)
    assert altered != struct
    with pytest.raises(AssertionError):
        check(LAYOUTS, text.replace(struct, altered))
