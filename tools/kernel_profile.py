"""Where one engine prefill spends its GPU time, kernel by kernel (issue 16).

Two modes:
  run:        python3 tools/kernel_profile.py run MODEL --tokens N --semantics S [--cuda-graph]
              Two warm prefills, then one more between cuProfilerStart and cuProfilerStop. Meant to run under Nsight
              Compute with the profiler off at the start:
                ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
                    --log-file OUT.csv python3 tools/kernel_profile.py run ...
              (ncu serializes the kernels and times each alone: the sum is the GPU's busy time without overlap or
              the gaps between kernels. Under ncu every launch is intercepted, so the prefill's own wall time comes
              from `ggml-ciq prefill --repeat 5` without it: docs/GPU.md's recipe runs both.)
  summarize:  python3 tools/kernel_profile.py summarize OUT.csv [--wall-ms W] [--json J]
              The kernels of that one prefill grouped by name: count, total and share of the busy time; with the
              prefill's wall time (measured without ncu), the time no kernel ran.
  compare:    python3 tools/kernel_profile.py compare A.csv B.csv [--labels A B]
              Two such profiles side by side by kernel name (e.g. the plugin's pp512 micro-batch under
              `ncu ... llama-bench -dev CIQ0 -p 512 -n 0 -r 1 --no-warmup` against the engine's): count and ms each,
              and B - A, largest differences first.
"""

import argparse
import csv
import ctypes
import json
import re
import sys
from collections import defaultdict

from ggml_ciq.errors import CiqError


def run(args) -> None:
    import numpy as np

    from ggml_ciq import catalog
    from ggml_ciq.engine import Transformer
    from ggml_ciq.model import ModelFile

    engine = Transformer(ModelFile(catalog.resolve_model(args.model)), device="cuda", semantics=args.semantics)
    tokens = np.random.default_rng(0).integers(0, engine.hp.n_vocab, args.tokens).tolist()  # as `prefill` draws them
    for _ in range(2):
        engine.forward(tokens, graph=args.cuda_graph)
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuCtxSynchronize()
    cuda.cuProfilerStart()
    engine.forward(tokens, graph=args.cuda_graph)
    cuda.cuCtxSynchronize()
    cuda.cuProfilerStop()
    print(f"profiled one prefill of {len(tokens)} tokens, {args.semantics}{', CUDA graphs' if args.cuda_graph else ''}")


def kernel_family(name: str) -> str:
    """A demangled kernel name without its arguments, template parameters kept short: gemm_q32_kernel<6>."""
    name = re.sub(r"\(anonymous namespace\)::", "", name.strip())
    if name.endswith(")"):  # the argument list: from its matching "(" (template arguments may hold casts)
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"^(void|static)\s+", "", name)
    if len(name) > 90:
        name = name[:87] + "..."
    return name


def read_rows(path: str) -> list:
    """(kernel family, ns, grid, block) per profiled launch of an ncu --csv log; exit 2 on a bad file."""
    rows = []
    try:
        with open(path, newline="") as f:
            lines = [line for line in f if line.startswith('"')]  # ncu's own log lines are not CSV
    except OSError as exc:
        print(f"kernel_profile: cannot read {path}: {exc.strerror}", file=sys.stderr)
        sys.exit(2)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        ns = value * {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}.get(unit, 1)
        rows.append((kernel_family(row["Kernel Name"]), ns, row.get("Grid Size", ""), row.get("Block Size", "")))
    if not rows:
        print(f"kernel_profile: {path} has no gpu__time_duration.sum rows (was ncu run with --csv and that "
              "metric?)", file=sys.stderr)
        sys.exit(2)
    return rows


def compare(args) -> None:
    labels = args.labels or ["A", "B"]
    sides = []
    for path in (args.a, args.b):
        by = defaultdict(lambda: [0, 0.0])
        for name, ns, _, _ in read_rows(path):
            by[name][0] += 1
            by[name][1] += ns
        sides.append(by)
    names = sorted(set(sides[0]) | set(sides[1]),
                   key=lambda n: -abs(sides[1].get(n, [0, 0.0])[1] - sides[0].get(n, [0, 0.0])[1]))
    busy = [sum(v[1] for v in side.values()) / 1e6 for side in sides]
    print(f"busy ms: {labels[0]} {busy[0]:.3f}, {labels[1]} {busy[1]:.3f} ({labels[1]} - {labels[0]}: "
          f"{busy[1] - busy[0]:+.3f})")
    print(f"{'kernel':80s} {labels[0][:10]:>10s} {'ms':>8s} {labels[1][:10]:>10s} {'ms':>8s} {'diff ms':>8s}")
    for n in names:
        (ca, na), (cb, nb) = sides[0].get(n, [0, 0.0]), sides[1].get(n, [0, 0.0])
        print(f"{n[:80]:80s} {ca:10d} {na / 1e6:8.3f} {cb:10d} {nb / 1e6:8.3f} {(nb - na) / 1e6:+8.3f}")


def summarize(args) -> None:
    rows = read_rows(args.csv)
    by = defaultdict(lambda: [0, 0.0, set()])
    for name, ns, grid, block in rows:
        by[name][0] += 1
        by[name][1] += ns
        by[name][2].add(grid)
    busy = sum(v[1] for v in by.values())
    table = [{"kernel": name, "count": count, "ms": ns / 1e6, "grids": sorted(grids)[:8]}
             for name, (count, ns, grids) in sorted(by.items(), key=lambda kv: -kv[1][1])]
    if args.json:  # first: a reader that stops early (| head) must not cost the file
        with open(args.json, "w") as f:
            json.dump({"kernels": len(rows), "busy_ms": busy / 1e6, "wall_ms": args.wall_ms, "by_kernel": table}, f,
                      indent=1)
    print(f"{len(rows)} kernels, busy {busy / 1e6:.3f} ms"
          + (f", wall {args.wall_ms:.3f} ms: no kernel running {max(0.0, args.wall_ms - busy / 1e6):.3f} ms"
             if args.wall_ms else ""))
    print(f"{'kernel':92s} {'count':>6s} {'ms':>8s} {'share':>6s} {'us each':>8s}")
    for row in table:
        ms, count = row["ms"], row["count"]
        print(f"{row['kernel']:92s} {count:6d} {ms:8.3f} {100 * ms * 1e6 / busy:5.1f}% {ms * 1e3 / count:8.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("--tokens", type=int, default=512)
    r.add_argument("--semantics", default="fast", choices=("fast", "exact", "llamacpp"))
    r.add_argument("--cuda-graph", action="store_true")
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    c.add_argument("--labels", nargs=2)
    s = sub.add_parser("summarize")
    s.add_argument("csv")
    s.add_argument("--wall-ms", type=float, default=None)
    s.add_argument("--json")
    args = p.parse_args(argv)
    try:
        {"run": run, "summarize": summarize, "compare": compare}[args.mode](args)
    except CiqError as exc:  # a bad model path, no GPU: one line
        print(f"kernel_profile: {exc}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:  # a reader that stopped early (| head)
        sys.stderr.close()


if __name__ == "__main__":
    main()
