"""ggml-ciq command line: diff, bench (gemm, attention, plot), prefill, compare, fetch, info. Errors: one line, exit 2."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .errors import CiqError, LlamaCppCrash
from .resources import free_host_bytes


def _console():
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=200)


def _progress(console):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def _fmt(v, spec=".2e"):
    return "-" if v is None else format(v, spec)


def _print_table(console, title: str, columns, rows, stacks=(), stacked_note: str = "") -> None:
    """A table readable at the console's width (80 columns and up): numbers and short texts are never cut, names
    (kind "name") wrap rather than lose characters. `columns` are (header, kind) with kind "name", "text" or
    "number" (right-aligned); `rows` lists of strings. Where the table is wider than the console, each of `stacks`
    ((column indices, header)) becomes one column holding those values one above the other, and `stacked_note`
    joins the title."""
    from rich import box
    from rich.measure import Measurement
    from rich.table import Table

    def build(title, columns, rows):
        table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
        for header, kind in columns:
            table.add_column(header, justify="right" if kind == "number" else "left", no_wrap=kind != "name",
                             overflow="fold" if kind == "name" else "ellipsis")
        for row in rows:
            table.add_row(*row)
        return table

    table = build(title, columns, rows)
    if stacks and Measurement.get(console, console.options.update_width(10**6), table).maximum > console.width:
        stacked = {i for indices, _ in stacks for i in indices}
        order = sorted([(indices[0], indices, header) for indices, header in stacks]
                       + [(i, (i,), None) for i in range(len(columns)) if i not in stacked])
        kinds = [("number" if all(columns[i][1] == "number" for i in indices) else
                  "name" if any(columns[i][1] == "name" for i in indices) else "text") for _, indices, _ in order]
        table = build(f"{title}; {stacked_note}" if stacked_note else title,
                      [(header if header is not None else columns[indices[0]][0], kind)
                       for (_, indices, header), kind in zip(order, kinds)],
                      [["\n".join(row[i] for i in indices) for _, indices, _ in order] for row in rows])
    console.print(table)


def _write_json(path: str, payload: dict) -> None:
    """Every JSON the CLI writes records its environment (environment.describe(); a command's own entries win)."""
    from . import environment

    payload = {**payload, "environment": {**environment.describe(), **(payload.get("environment") or {})}}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, indent=2) + "\n")


# ----------------------------------------------------------------------------------------------
# Arguments: every value is checked when parsed (types below) and every combination before the command starts
# (CHECKS); a bad one is one line, exit 2.

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line: 'ggml-ciq: error: diff: argument --tokens: must be >= 1, got -5'."""

    def error(self, message):
        command = self.prog.split(" ", 1)[1] + ": " if " " in self.prog else ""
        print(f"ggml-ciq: error: {command}{message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)

    def parse_known_args(self, args=None, namespace=None):
        """A command's own parser (one without subcommands: diff, bench gemm, ...) refuses the arguments it does not
        take itself, so that the error names the command whose --help lists what it takes."""
        namespace, extras = super().parse_known_args(args, namespace)
        if extras and self._subparsers is None and " " in self.prog:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return namespace, extras


def _whole(low: int, high: int | None = None):
    """A whole number in [low, high]."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expects a whole number, got {text!r}") from None
        if value < low or (high is not None and value > high):
            bounds = f">= {low}" if high is None else f"from {low} to {high}"
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {value}")
        return value
    return parse


def _whole_list(low: int):
    """Comma-separated whole numbers >= low."""
    one = _whole(low)

    def parse(text: str) -> list[int]:
        items = text.split(",")
        if not all(item.strip().lstrip("+-").isdigit() for item in items):
            raise argparse.ArgumentTypeError(f"expects comma-separated whole numbers, got {text!r}")
        return [one(item) for item in items]
    return parse


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expects a number, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _semantics_list(text: str) -> tuple[str, ...]:
    """Comma-separated engine semantics (llamacpp, exact, fast), each once."""
    from .engine import SEMANTICS

    items = tuple(item.strip() for item in text.split(","))
    bad = [item for item in items if item not in SEMANTICS]
    if bad or len(set(items)) != len(items):
        raise argparse.ArgumentTypeError(f"expects distinct names from {', '.join(SEMANTICS)}, got {text!r}")
    return items


def _text(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty")
    return text


def _output_file(*suffixes: str):
    """A file the command may create or overwrite: not a directory, in a directory that exists or can be made and is
    writable, with one of `suffixes` when given."""
    def parse(text: str) -> str:
        path = Path(text).expanduser()
        if suffixes and path.suffix.lower() not in suffixes:
            raise argparse.ArgumentTypeError(f"{text} must end in {' or '.join(suffixes)}")
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory")
        _check_writable_dir(path.parent, text)
        return text
    return parse


def _check_writable_dir(directory: Path, text: str) -> None:
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: {existing} is not writable")


def _output_dir(text: str) -> str:
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    _check_writable_dir(path, text)
    return text


def _from_library(check):
    """A type that defers to a ggml_ciq check (device, variant, shape); its CiqError becomes the argument's error."""
    def parse(text: str):
        try:
            return check(text)
        except CiqError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = check.__name__
    return parse


def _device(text: str) -> str:
    from . import native

    native.parse_device(text)
    return text


def _engine_device(text: str) -> str:
    """prefill's --device: a device, or "reference" (the float64 reference ops)."""
    return text if text == "reference" else _device(text)


def _variant(text: str) -> str:
    from . import native

    native.variant_id(text)
    return text


def _variants(text: str) -> list[str]:
    return [_variant(v.strip()) for v in text.split(",")]


def _shape(text: str):
    from . import bench

    return bench.parse_shape(text)


def _attention_case(text: str):
    from . import attention_bench

    return attention_bench.parse_case(text)


def _attention_kernels(text: str) -> list[str]:
    from . import ops

    kernels = [k.strip() for k in text.split(",")]
    known = [k for k in ops.ATTENTION_KERNELS if k != "auto"]
    for k in kernels:
        if k not in known:
            raise CiqError(f"unknown attention kernel {k!r} (choose from {', '.join(known)})")
    return kernels


def _used(args, *flags: str) -> list[str]:
    """The flags among `flags` the user gave (not at their defaults)."""
    return [flag for flag in flags if getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False, "auto")]


def _check_diff(args) -> None:
    from . import diff

    if args.prompt is None:
        stray = _used(args, "--layer-bar", "--flash-attn", "--spread", "--llamacpp-extra-buffers")
        if stray:
            raise CiqError(f"{', '.join(stray)} belong to diff --prompt (the diff on llama.cpp's own activations)")
    else:
        stray = _used(args, "--tokens", "--seed", "--backend", "--variant", "--tensor", "--all-quantized")
        if stray:
            raise CiqError(f"diff --prompt runs llama.cpp's own activations through our kernel of --reference's "
                           f"semantics; {', '.join(stray)} belong to the random-activation diff")
    args.tokens = 32 if args.tokens is None else args.tokens
    args.seed = 0 if args.seed is None else args.seed
    args.layer_bar = 1e-4 if args.layer_bar is None else args.layer_bar
    if args.backend not in diff.BACKENDS:
        raise CiqError(f"unknown --backend {args.backend!r} (choose from {', '.join(diff.BACKENDS)})")
    if args.reference not in diff.REFERENCES:
        raise CiqError(f"unknown --reference {args.reference!r} (choose from {', '.join(diff.REFERENCES)})")
    if args.variant not in ("auto", "cpu") and args.backend in ("ciq-cpu", "reference"):
        raise CiqError(f"--variant {args.variant} is a GPU kernel; --backend {args.backend} does not run it")


def _bench_defaults(args) -> None:
    """bench gemm's and bench attention's: the CPU backend, 5 timed runs, --json a writable file."""
    args.backend = args.backend or "ciq-cpu"
    args.repeat = 5 if args.repeat is None else args.repeat
    if args.json:
        args.json = _as_check(_output_file(), "--json", args.json)


def _check_bench_gemm(args) -> None:
    from . import bench

    _bench_defaults(args)
    if args.shapes:
        bench.shape_set(args.shapes)
    if args.backend == "ciq-cpu":
        stray = _used(args, "--variants", "--ab", "--no-llamacpp", "--no-ceiling", "--plot")
        if stray:
            raise CiqError(f"{', '.join(stray)} belong to --backend ciq-cuda")
        return
    if args.threads is not None:
        raise CiqError("--threads sets our CPU kernels' threads; --backend ciq-cuda runs on the GPU")
    if args.ab is not None:
        stray = _used(args, "--variants", "--no-llamacpp", "--no-ceiling", "--plot")
        if stray:
            raise CiqError(f"--ab times two variants against each other; {', '.join(stray)} belong to the full "
                           f"benchmark")
        if len(args.ab) != 2:
            raise CiqError(f"--ab takes two variants, e.g. --ab wmma,wmma-shared (got {len(args.ab)})")
    if args.plot:
        args.plot = _as_check(_output_file(".png", ".svg", ".pdf"), "--plot", args.plot)


def _check_bench_attention(args) -> None:
    _bench_defaults(args)
    if args.cases:
        from . import attention_bench

        attention_bench.case_set(args.cases)
    if args.backend == "ciq-cuda" and args.threads is not None:
        raise CiqError("--threads sets the CPU threads; --backend ciq-cuda runs on the GPU")


def _check_bench_plot(args) -> None:
    if not args.json or not args.plot:
        raise CiqError("bench plot needs --json SAVED_FILE and --plot OUT.png")
    if not Path(args.json).is_file():
        raise CiqError(f"bench plot: no saved results at {args.json}")
    args.plot = _as_check(_output_file(".png", ".svg", ".pdf"), "--plot", args.plot)


def _check_bench(args) -> None:
    """bench's checks, per op (a flag of another op is argparse's: its subparser does not take it)."""
    {"gemm": _check_bench_gemm, "attention": _check_bench_attention, "plot": _check_bench_plot}[args.op](args)


def _as_check(parse, flag: str, value):
    """A type's check run after parsing (where the meaning of a flag depends on another): CiqError on failure."""
    try:
        return parse(value)
    except argparse.ArgumentTypeError as exc:
        raise CiqError(f"argument {flag}: {exc}") from None


def _check_prefill(args) -> None:
    if sum(a is not None for a in (args.prompt, args.tokens, args.ids)) != 1:
        raise CiqError("give exactly one of --prompt TEXT, --tokens N and --ids LIST")
    if args.ctx_size is not None and args.tokens is not None and args.tokens > args.ctx_size:
        raise CiqError(f"a prompt of {args.tokens} tokens is longer than the context ({args.ctx_size} tokens)")
    if args.cuda_graph:
        from . import native

        if args.device == "reference" or native.parse_device(args.device) < 0:
            raise CiqError(f"--cuda-graph runs the prefill as CUDA graphs: it needs --device cuda, not {args.device}")


def _check_fetch(args) -> None:
    from . import catalog

    if args.filename is None:
        if args.model not in catalog.CATALOG:
            raise CiqError(f"{args.model!r} is not a catalog model ({', '.join(catalog.CATALOG)}); "
                           f"for the hub give REPO_ID FILENAME")
        if args.dir is not None:
            raise CiqError("--dir is where hub downloads go; a catalog model lives in the cache")
    elif args.model.count("/") != 1 or not all(args.model.split("/")):
        raise CiqError(f"a hub download takes REPO_ID FILENAME with REPO_ID as owner/name, got {args.model!r}")


EXTRA_BUFFERS_HELP = ("load llama.cpp's model with its CPU extra buffer types (repacked weights; llama.cpp's own "
                      "default), to measure them: off by default, since on CPUs with AMX llama.cpp 0c1e570 segfaults "
                      "there (upstream issue 20824) and our CPU engine follows llama.cpp's plain-buffer arithmetic")


def _warn_extra_buffers(console, args) -> None:
    from .llama_model import EXTRA_BUFFERS_WARNING

    if args.llamacpp_extra_buffers:
        console.print(f"[yellow]warning:[/] {EXTRA_BUFFERS_WARNING}", highlight=False)


def _llamacpp_path(llamacpp: dict) -> str:
    """One line: which llama.cpp CPU arithmetic the comparison ran against (LlamaModel.provenance)."""
    if not llamacpp:
        return "llama.cpp CPU: provenance unknown"
    path = llamacpp.get("llamacpp_cpu_path", "unknown")
    buffers = ", ".join(llamacpp.get("weight_buffers") or ["-"])
    note = ("ours follows this arithmetic, bit for bit" if path == "avx2" and not llamacpp.get("extra_buffers") else
            "ours follows llama.cpp's AVX2 plain-buffer arithmetic: expect rounding-level differences (weight GEMMs "
            "bit for bit on an AVX-512 build too, its other ops not; an AVX2 build, CMAKE_ARGS=-DGGML_NATIVE=OFF, is "
            "bit for bit end to end)")
    return (f"llama.cpp CPU: {path} build, weights in {buffers} (extra buffer types "
            f"{'on' if llamacpp.get('extra_buffers') else 'off'}); {note}")


def _check_compare(args) -> None:
    if args.cuda_graph and args.device != "cuda":
        raise CiqError(f"--cuda-graph times our prefills as CUDA graphs: it needs --device cuda, not {args.device}")


CHECKS = {"diff": _check_diff, "bench": _check_bench, "prefill": _check_prefill, "fetch": _check_fetch,
          "compare": _check_compare}


# ----------------------------------------------------------------------------------------------

def cmd_diff(args) -> int:
    from . import catalog, native, quants
    from .diff import DiffReport, Differ, activations, not_diffed, select_tensors
    from .model import ModelFile

    if args.prompt is not None:
        return _diff_activations(args)
    console = _console()
    path = catalog.resolve_model(args.model)
    model = ModelFile(path)
    differ = Differ(args.backend, args.reference, variant=args.variant, threads=args.threads, tokens=args.tokens)
    tensors = select_tensors(model, lambda t: differ.takes(t, args.tokens), args.all_quantized, args.tensor)
    if not tensors:
        types = sorted({t.type_name for t in model.quantized_weights()})
        hint = ("and none of a type ggml-ciq decodes" if args.all_quantized
                else "--all-quantized lists them with llama.cpp vs float64")
        raise CiqError(f"{path}: no weight of a type our kernels multiply on {differ.backend} "
                       f"({', '.join(types) or 'no quantized weights'}); {hint} "
                       f"(ours: {', '.join(quants.type_name(t) for t in native.weight_types(differ.device))})")
    _check_diff_memory(tensors, args.tokens)
    report = DiffReport(str(path), args.tokens, args.seed, differ.backend, differ.reference, differ.semantics, args.bar,
                        environment=differ.environment(), not_diffed=not_diffed(model, tensors))
    with _progress(console) as progress:
        task = progress.add_task("diff", total=len(tensors))
        for tensor in tensors:
            progress.update(task, description=tensor.name)
            report.tensors.append(differ.run(tensor, activations(tensor, args.tokens, args.seed), args.bar))
            progress.advance(task)

    columns = [("tensor", "name"), ("type", "text"), ("rows x K", "text"), ("kernel", "text"),
               ("ours vs llama NMSE", "number"), ("max|d|", "number"), ("llama vs f64 NMSE", "number"),
               ("max|d|", "number"), ("ours vs f64 NMSE", "number"), ("max|d|", "number")]
    if not differ.same_semantics:
        columns.append((f"ours vs {differ.semantics} model", "number"))
    columns.append(("", "text"))
    rows = []
    for t in report.tensors:
        cells = [t.name, t.type, f"{t.rows} x {t.k}", t.variant or "-", _fmt(t.ours_vs_llamacpp),
                 _fmt(t.ours_vs_llamacpp_maxabs), _fmt(t.llamacpp_vs_f64), _fmt(t.llamacpp_vs_f64_maxabs),
                 _fmt(t.ours_vs_f64), _fmt(t.ours_vs_f64_maxabs)]
        if not differ.same_semantics:
            cells.append(_fmt(t.ours_vs_own_reference))
        rows.append(cells + ["[green]ok[/]" if t.passed else "[red]FAIL[/]"])
    _print_table(console, f"{model.config.name}: {differ.backend} ({differ.semantics} semantics) vs "
                          f"{differ.reference}, {args.tokens} tokens", columns, rows,
                 stacks=[((1, 2, 3), "type\nrows x K\nkernel"), ((4, 5), "ours vs\nllama"),
                         ((6, 7), "llama\nvs f64"), ((8, 9), "ours\nvs f64")], stacked_note="NMSE above max|d|")
    s = report.summary()
    verdict = "PASS" if not s["failed"] else "FAIL"
    rule = (f"above the bar {args.bar:.0e}" if differ.same_semantics else
            f"further from f64 than llama.cpp or above the bar {args.bar:.0e} vs the {differ.semantics} model")
    console.print(f"{verdict}: {s['compared']} tensors compared, {s['failed']} {rule}; "
                  f"worst ours-vs-llama.cpp NMSE {_fmt(s['worst_ours_vs_llamacpp'])}, "
                  f"worst llama.cpp-vs-f64 NMSE {_fmt(s['worst_llamacpp_vs_f64'])}")
    if report.not_diffed:
        by_why = {}
        for t in report.not_diffed:
            by_why.setdefault(t["why"], []).append(f"{t['name']} ({t['type']})")
        for why, names in by_why.items():
            shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
            console.print(f"not diffed, {why} on {differ.backend}: {shown}", highlight=False)
    if args.json:
        _write_json(args.json, report.to_json())
    return 1 if s["failed"] else 0


def _check_diff_memory(tensors, tokens: int) -> None:
    """OutOfMemoryError before any work when one tensor's diff would not fit in free host memory: activations in
    float32 and float64, four outputs (ours, llama.cpp's, the float64 truth, a model of our semantics) and the
    float64 differences of max|d|, and the float64 weight rows of the truth (8192 at a time)."""
    worst = max(tensors, key=lambda t: tokens * (12 * t.k + 48 * t.rows) + 8 * min(t.rows, 8192) * t.k)
    _check_host_memory(tokens * (12 * worst.k + 48 * worst.rows) + 8 * min(worst.rows, 8192) * worst.k,
                       f"--tokens {tokens}: the diff of {worst.name} ({worst.rows} x {worst.k})")


def _check_host_memory(need: int, what: str) -> None:
    from .errors import OutOfMemoryError

    free = free_host_bytes()
    if need > free:
        raise OutOfMemoryError(f"{what} needs about {need / 2**30:.1f} GiB of host memory, {free / 2**30:.1f} GiB "
                               f"is free")


def _diff_activations(args) -> int:
    """diff --prompt: llama.cpp's own prefill captured; our kernels on its inputs; our engine's hidden states."""
    from . import bench, catalog, native
    from .diff import activation_diff

    console = _console()
    path = catalog.resolve_model(args.model)
    _warn_extra_buffers(console, args)
    with _progress(console) as progress:
        task = progress.add_task("llama.cpp prefill (capturing)", total=None)
        report = activation_diff(path, args.prompt, reference=args.reference, bar=args.bar, layer_bar=args.layer_bar,
                                 threads=args.threads, flash_attn=_on_off(args.flash_attn),
                                 progress=lambda what: progress.update(task, description=what, advance=1),
                                 extra_buffers=args.llamacpp_extra_buffers, spread=args.spread)
    cuda = report.reference == "llamacpp-cuda"
    report.environment = (bench.gpu_environment() if cuda else
                          bench.cpu_environment(args.threads or native.build_info()["threads"]))
    columns = [("layer", "number"), ("tensor", "name"), ("type", "text"), ("rows x K", "text"), ("kernel", "text"),
               ("NMSE vs llama.cpp", "number"), ("max|d|", "number"), ("", "text")]
    rows = [["-" if t.layer is None else str(t.layer), t.name, t.type, f"{t.rows} x {t.k}", t.kernel, _fmt(t.nmse),
             _fmt(t.max_abs), ("[green]ok[/]" if t.passed else "[red]FAIL[/]") if t.judged else "listed"]
            for t in report.tensors]
    _print_table(console, f"{path.name}: our kernels ({report.semantics} semantics) on llama.cpp's captured inputs, "
                          f"{report.tokens} prompt tokens, {report.reference}", columns, rows,
                 stacks=[((2, 3, 4), "type\nrows x K\nkernel"), ((5, 6), "NMSE vs\nllama.cpp")],
                 stacked_note="NMSE above max|d|")
    spread = f", or llama.cpp's own spread where larger: its prefill with {report.spread}" if report.spread else ""
    columns = [("layer", "number"), ("NMSE", "number"), ("max|d|", "number")] + \
        ([("llama.cpp spread", "number")] if report.spread else []) + [("", "text")]
    _print_table(console, f"our engine's hidden state after each layer vs llama.cpp's l_out (bar "
                          f"{report.layer_bar:.0e}{spread})", columns,
                 [[str(d.layer), _fmt(d.nmse), _fmt(d.max_abs)] + ([_fmt(d.spread)] if report.spread else []) +
                  ["[red]first above the bar[/]" if d.layer == report.first_diverging_layer else ""]
                  for d in report.layers])
    if not cuda:
        console.print(_llamacpp_path(report.llamacpp), highlight=False)
    s = report.summary()
    console.print(f"{'PASS' if not s['failed'] else 'FAIL'}: {s['judged']} tensors judged at NMSE <= "
                  f"{report.bar:.0e}, {s['failed']} above, worst {_fmt(s['worst_judged_nmse'])}; "
                  f"{s['tensors'] - s['judged']} other tensors listed")
    diverging = report.first_diverging_layer
    console.print(f"hidden states: {'no layer' if diverging is None else f'layer {diverging} is the first'} above "
                  f"NMSE {report.layer_bar:.0e}{' or llama.cpp' + chr(39) + 's own spread' if report.spread else ''}; "
                  f"logits NMSE {_fmt(report.logits_nmse)}")
    if args.json:
        _write_json(args.json, report.to_json())
    for error in report.errors:  # llama.cpp's crash in its spread prefill: the diff above ran without the spread
        print(f"ggml-ciq: {error['message']}", file=sys.stderr)
    return 1 if s["failed"] or report.errors else 0


TOKENIZE = """
import sys, llama_cpp
model = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
print(",".join(map(str, model.tokenize(sys.stdin.read().encode()))))
"""


def _tokenize(path, prompt: str) -> list[int]:
    """llama.cpp's tokenizer for the GGUF's own vocabulary (llama-cpp-python, in a child process)."""
    import importlib.util
    import subprocess
    import sys

    if importlib.util.find_spec("llama_cpp") is None:
        raise CiqError("--prompt needs llama.cpp's tokenizer: pip install 'ggml-ciq[llamacpp]' (or use --tokens N)")
    proc = subprocess.run([sys.executable, "-c", TOKENIZE, str(path)], input=prompt, capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise CiqError(f"llama.cpp could not tokenize with {path}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return [int(t) for t in proc.stdout.strip().split(",")]


def cmd_prefill(args) -> int:
    import numpy as np
    from rich.markup import escape

    from . import catalog, native
    from .engine import Transformer
    from .model import ModelFile

    console = _console()
    path = catalog.resolve_model(args.model)
    model = ModelFile(path)
    args.semantics = args.semantics or ("llamacpp" if args.device in ("cpu", "reference") else "fast")
    engine = Transformer(model, device=args.device, n_ctx=args.ctx_size, n_ubatch=args.ubatch,
                         semantics=args.semantics)
    if args.tokens is not None:
        engine.reserve(args.tokens)  # too long or too big: said before any token is drawn
    if args.prompt is not None:
        tokens = _tokenize(path, args.prompt)
    elif args.ids is not None:
        tokens = args.ids
    else:
        tokens = np.random.default_rng(args.seed).integers(0, engine.hp.n_vocab, args.tokens).tolist()
    engine.check_tokens(tokens)
    if args.cuda_graph and native.device_count() == 0:
        raise CiqError("--cuda-graph needs a CUDA GPU, and this build or machine has none")
    runs = []
    for _ in range(args.repeat + (args.repeat > 1)):  # with --repeat N > 1: one warm-up run first, not counted
        logits = engine.forward(tokens, graph=args.cuda_graph)
        runs.append(dict(engine.ops.timings))
    timed = runs[1:] if args.repeat > 1 else runs
    if args.cuda_graph and engine.graph_error:
        console.print(f"[yellow]note: a micro-batch ran eagerly, its CUDA graph capture failed: "
                      f"{escape(engine.graph_error)}[/yellow]")
    t = dict(timed[int(np.argsort([r["total"] for r in timed])[len(timed) // 2])])  # the median run's timings
    total = t.pop("total")
    where = ("CPU, float64 reference ops" if args.device == "reference" else
             f"CPU, {args.semantics} semantics on {native.build_info()['threads']} threads" if args.device == "cpu"
             else f"{native.device_name(args.device)}, libggml_ciq ops and kernels, {args.semantics} semantics"
                  + (", CUDA graphs" if args.cuda_graph else ""))
    how = f"median of {args.repeat} after a warm-up" if args.repeat > 1 else "one run, cold"
    console.print(f"{model.config.name}: {len(tokens)} tokens in {total * 1e3:.1f} ms = "
                  f"{len(tokens) / total:.1f} tokens/s ({where}; n_ctx {engine.n_ctx}, n_ubatch {engine.n_ubatch}; "
                  f"{how})")
    last = logits[-1].astype(np.float64)
    probs = np.exp(last - last.max())
    probs /= probs.sum()
    top = np.argsort(-last)[:args.top]
    next_tokens = [{"id": int(i), "text": model.token_text(int(i)), "p": float(probs[i])} for i in top]
    _print_table(console, "next token", [("id", "number"), ("token", "name"), ("p", "number")],
                 [[str(n["id"]), escape(repr(n["text"])), f"{n['p']:.3f}"] for n in next_tokens])
    _print_table(console, "time by op class", [("op class", "text"), ("ms", "number"), ("share", "number")],
                 [[name, f"{t.get(name, 0.0) * 1e3:.1f}", f"{t.get(name, 0.0) / total:.0%}"]
                  for name in ("keep-quant GEMM", "other GEMM", "attention", "rest")])
    memory, kv = engine.ops.memory_bytes(), engine.kv_cache_bytes()
    console.print(f"memory: {memory / 2**20:.1f} MiB held by the ops (weights, activations and the K/V cache), of "
                  f"which K/V cache {kv / 2**20:.1f} MiB ({engine.kv_cache[0][0].shape[0]} positions, "
                  f"{'f64' if args.device == 'reference' else 'f16'})")
    if args.json:
        _write_json(args.json, {"model": str(path), "tokens": len(tokens), "seconds": {**t, "total": total},
                                "runs_seconds": [r["total"] for r in timed], "repeat": args.repeat,
                                "cuda_graph": bool(args.cuda_graph), "semantics": args.semantics,
                                "tokens_per_second": len(tokens) / total, "memory_bytes": memory,
                                "kv_cache_bytes": kv, "top": [int(i) for i in top], "next_tokens": next_tokens})
    return 0


def cmd_compare(args) -> int:
    from . import bench, catalog, native
    from .compare import plot_compare, run_compare

    console = _console()
    path = catalog.resolve_model(args.model)
    if args.device == "cuda" and native.device_count() == 0:
        raise CiqError("compare --device cuda: no CUDA device (or libggml_ciq built without CUDA)")
    semantics = args.semantics or (("llamacpp", "exact", "fast") if args.device == "cuda" else ("llamacpp", "exact"))
    _warn_extra_buffers(console, args)
    with _progress(console) as progress:
        tasks = {}

        def advance(arm):
            if arm not in tasks:
                timed = arm in ("llama.cpp", "llama.cpp + plugin") or arm.startswith("ours")
                tasks[arm] = progress.add_task(f"{arm} prefill", total=args.repeat + 1 if timed else 1)
            progress.advance(tasks[arm])

        n_tokens = 512 if args.tokens is None and args.prompt is None else args.tokens
        result = run_compare(path, n_tokens, args.prompt, repeat=args.repeat, device=args.device,
                             threads=args.threads, flash_attn=_on_off(args.flash_attn), semantics=semantics,
                             reference=args.reference == "on", plugin=args.plugin, progress=advance,
                             cuda_graph=args.cuda_graph, extra_buffers=args.llamacpp_extra_buffers)
    threads = args.threads or native.build_info()["threads"]
    result.environment = bench.gpu_environment() if args.device == "cuda" else bench.cpu_environment(threads)
    _print_compare(console, path.name, result)
    if args.json:
        _write_json(args.json, result.to_json())
    if args.plot:
        plot_compare(result, args.plot)
    for error in result.errors:  # llama.cpp's crash: what finished is above and in --json
        print(f"ggml-ciq: {error['message']}", file=sys.stderr)
    return 1 if result.errors else 0


def _print_compare(console, name: str, result) -> None:
    """compare's output, readable at 80 columns: the text, prefill speed, the distances, the verdict."""
    text = result.text
    console.print(f"{name}: {result.tokens} tokens of {text['source']} ({text['text_tokens']} tokens once; "
                  + ("[bold]repeated to length[/]" if text["repeated"] else "not repeated") + f"); "
                  f"{result.environment.get('device', result.device)}")
    llama = result.arm("llama.cpp")
    base = llama.tokens_per_second if llama else None
    rows = []
    for arm in result.arms:
        settings = ", ".join(f"{k.replace('_', ' ')} {('on' if v else 'off') if isinstance(v, bool) else v}"
                             for k, v in arm.settings.items() if k in ("semantics", "flash_attn", "n_ubatch"))
        if arm.kind == "reference":
            settings += f", one run {arm.seconds[0]:.1f} s"
        tps = arm.tokens_per_second
        rows.append([arm.name, settings, _fmt(tps, ".1f"), _fmt(tps / base if tps and base else None, ".2f")])
    _print_table(console, f"prefill, median of {result.repeat}", [("arm", "name"), ("settings", "name"),
                                                                   ("tokens/s", "number"), ("x llama.cpp", "number")],
                 rows)
    for arm in result.arms:
        if arm.kind == "ours":
            console.print(f"{arm.name} memory: {_mib(arm.memory['ops_memory_bytes'])} (llama.cpp's buffers on the "
                          f"device {_mib(llama.memory['device_buffers_total'] if llama else None)})")
    if result.device == "cpu":
        console.print(_llamacpp_path(result.llamacpp), highlight=False)
    _print_table(console, f"logits, {result.tokens} positions; KL(p || q)",
                 [("p", "name"), ("q", "name"), ("top-1", "number"), ("KLD mean", "number"), ("KLD max", "number"),
                  ("NMSE", "number")],
                 [[pair.p, pair.q, f"{pair.agreement['top1']:.2%}", _fmt(pair.agreement["kld_mean"]),
                   _fmt(pair.agreement["kld_max"]), _fmt(pair.agreement["nmse"])] for pair in result.pairs])
    console.print(f"spread: llama.cpp against llama.cpp with {result.spread}")
    labels = {"llamacpp_kld_vs_llamacpp": ("ours llamacpp vs llama.cpp: mean KLD", "<= the spread's", ".2e"),
              "llamacpp_top1_disagreement_vs_llamacpp": ("ours llamacpp vs llama.cpp: top-1 misses",
                                                         "<= the spread's", ".2%"),
              "exact_kld_vs_reference": ("ours exact vs reference: mean KLD", "<= half llama.cpp's", ".2e")}
    v = result.verdict
    for key, (what, bar, spec) in labels.items():
        if key in v:
            met = v[key]["met"]
            word = "[yellow]not judged[/]" if met is None else "[green]meets[/]" if met else "[red]misses[/]"
            console.print(f"{word}: {what} {_fmt(v[key]['value'], spec)} {bar} {_fmt(v[key]['bar'], spec)}"
                          + (f" ({v[key]['note'].removeprefix('not judged: ')})" if met is None else ""))
    console.print(f"verdict: {'[green]PASS[/]' if v['met'] else '[red]FAIL[/]'}")


def _on_off(value: str) -> bool | None:
    return None if value == "auto" else value == "on"


def _mib(nbytes) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f} MiB"


def cmd_fetch(args) -> int:
    from . import catalog

    if args.filename is None:
        print(catalog.resolve_model(args.model))
    else:
        print(catalog.fetch(args.model, args.filename, args.dir))
    return 0


def cmd_info(args) -> int:
    from rich.table import Table

    from . import catalog, native

    console = _console()
    table = Table(title="ggml-ciq", show_header=False)
    table.add_column("what", no_wrap=True)
    table.add_column("value", overflow="fold")  # paths whole, wrapped at a narrow terminal's edge
    try:
        info = native.build_info()
        table.add_row("libggml_ciq", str(native.load().path))
        table.add_row("build", json.dumps(info))
        devices = ["cpu"] + [f"cuda:{i}" for i in range(native.device_count())]
        for dev in devices:
            available = [v for v in native.VARIANTS[1:] if native.variant_available(dev, v)]
            table.add_row(f"device {dev}", f"{native.device_name(dev)}; variants: {', '.join(available)}")
    except CiqError as exc:
        table.add_row("libggml_ciq", f"[red]{exc}[/]")
    try:
        from .llamacpp import LlamaCpp

        llama = LlamaCpp.load(args.llamacpp_lib)
        table.add_row("llama.cpp", f"{llama.lib_dir} (ggml {llama.version}, commit {llama.commit})")
        table.add_row("llama.cpp devices", ", ".join(llama.devices()))
    except CiqError as exc:
        llama = None
        table.add_row("llama.cpp", f"[red]{exc}[/]")
    table.add_row("ggml plugin", _plugin_info(llama))
    for name, (description, _) in catalog.CATALOG.items():
        table.add_row(f"model {name}", description)
    table.add_row("cache", str(catalog.cache_dir()))
    console.print(table)
    return 0


def _plugin_info(llama) -> str:
    """The ggml plugin's path, what it was built against and the device it offers in this llama.cpp (docs/PLUGIN.md)."""
    from . import plugin

    path = plugin.find_plugin()
    if path is None:
        return f"not built (pip install . builds it where llama-cpp-python {plugin.PINNED}'s headers can be had)"
    try:
        built = plugin.build_info(path)
        text = (f"{path}, built against llama.cpp {built['llama_cpp_commit']} (llama-cpp-python "
                f"{built['llama_cpp_python']}, ggml {built['ggml_version']})")
        if llama is None:
            return text
        with plugin.Plugin(path, llama) as loaded:
            devices = ", ".join(f"{d['name']} ({d['description']})" for d in loaded.describe()["devices"])
        return f"{text}; device: {devices or 'none here'}"
    except CiqError as exc:
        return f"{path}: [red]{exc}[/]"


def cmd_bench_plot(args) -> int:
    from . import bench

    try:
        saved = json.loads(Path(args.json).read_text())
    except (OSError, ValueError) as exc:
        raise CiqError(f"bench plot: cannot read {args.json}: {exc}") from None
    if saved.get("schema") == "docs/COMPARE_JSON.md":
        from .compare import load_compare_json, plot_compare

        plot_compare(load_compare_json(args.json), args.plot)
    else:
        bench.plot_json(args.json, args.plot)
    return 0


def cmd_bench_gemm(args) -> int:
    from . import bench, catalog
    from .model import ModelFile

    shapes = list(args.shape or [])
    tokens = args.tokens
    if args.shapes:
        set_shapes, set_tokens = bench.shape_set(args.shapes)
        shapes += set_shapes
        tokens = tokens or set_tokens
    if args.model or not shapes:
        shapes += bench.model_shapes(ModelFile(catalog.resolve_model(args.model)))
    tokens = tokens or [32]
    # the largest case's activations (drawn in float64, then float32, quantized on both sides) and outputs
    n, shape = max(((n, s) for n in tokens for s in shapes), key=lambda c: c[0] * (16 * c[1].k + 8 * c[1].rows))
    _check_host_memory(n * (16 * shape.k + 8 * shape.rows), f"bench gemm at {n} tokens on {shape.rows} x {shape.k}")
    return (_bench_cpu if args.backend == "ciq-cpu" else _bench_cuda)(args, shapes, tokens)


def cmd_bench_attention(args) -> int:
    from . import attention_bench, bench, native

    device = "cuda" if args.backend == "ciq-cuda" else "cpu"
    if device == "cuda" and native.device_count() == 0:
        raise CiqError("bench attention --backend ciq-cuda: no CUDA device (or libggml_ciq built without CUDA)")
    cases = list(args.case or [])
    if args.cases or not cases:
        cases += attention_bench.case_set(args.cases or "gemma3-270m")
    for c in cases:  # q, the K/V caches and both outputs, float32 on the host
        _check_host_memory(4 * (3 * c.tokens * c.heads * c.head_dim + 2 * (c.n_past + c.tokens) * c.heads_kv *
                                c.head_dim), f"bench attention on {c.label}")
    kernels = args.kernels or attention_bench.default_kernels(device)
    threads = args.threads or (os.cpu_count() or 1) if device == "cpu" else None
    console = _console()
    skipped = []
    with _progress(console) as progress:
        task = progress.add_task("bench", total=len(cases) * len(kernels))
        rows = attention_bench.bench_attention(cases, device, kernels, repeat=args.repeat,
                                               llamacpp=not args.no_llamacpp, threads=threads,
                                               progress=lambda: progress.advance(task), skipped=skipped)
    unrun = [k for k in (args.kernels or []) if not any(r.kernel == k for r in rows)]
    if unrun:
        raise CiqError(f"attention kernel {', '.join(unrun)} runs none of these cases on the {device.upper()} "
                       f"(ggml-ciq info lists each kernel's device)")
    env = (bench.gpu_environment(llamacpp=not args.no_llamacpp) if device == "cuda"
           else bench.cpu_environment(threads))
    _print_table(console, f"ciq attention vs llama.cpp FLASH_ATTN_EXT ({env['device']})",
                 [(col, "text" if col == "kernel" else "number")
                  for col in ("tokens", "n_past", "heads", "kv heads", "D", "window", "kernel", "us", "TFLOP/s",
                              "llama.cpp us", "speedup", "NMSE vs llama.cpp")],
                 [[str(r.tokens), str(r.n_past), str(r.heads), str(r.heads_kv), str(r.head_dim), str(r.window),
                   r.kernel, f"{r.us:.1f}", f"{r.tflops:.2f}", _fmt(r.llamacpp_us, ".1f"), _fmt(r.speedup, ".2f"),
                   _fmt(r.nmse_vs_llamacpp)] for r in rows],
                 stacks=[((0, 1), "tokens\nn_past"), ((2, 3, 4, 5), "heads\nkv\nD\nwindow"),
                         ((9, 10), "llama.cpp us\nspeedup")])
    for label, who, why in skipped:
        console.print(f"not run: {label} on {who}: {why}")
    by_kernel = {k: bench.geomean(r.speedup for r in rows if r.kernel == k and r.speedup)
                 for k in dict.fromkeys(r.kernel for r in rows if r.speedup)}
    for k, value in by_kernel.items():
        console.print(f"geomean speedup over llama.cpp FLASH_ATTN_EXT, {k}: {value:.2f}x")
    if args.json:
        _write_json(args.json, {"schema": "docs/BENCH_JSON.md", "bench": "attention", "environment": env,
                                "rows": bench.rows_to_json(rows), "geomean_speedup": by_kernel,
                                "skipped": [{"case": c, "who": w, "why": y} for c, w, y in skipped]})
    return 0


def _bench_cpu(args, shapes, tokens) -> int:
    from . import bench

    console = _console()
    threads = args.threads or os.cpu_count() or 1
    with _progress(console) as progress:
        task = progress.add_task("bench", total=len(shapes) * len(tokens))
        rows = bench.bench_cpu(shapes, tokens, threads, repeat=args.repeat, progress=lambda: progress.advance(task))
    env = bench.cpu_environment(threads)
    _print_table(console, f"ciq-cpu vs llama.cpp CPU mul_mat, {threads} threads ({env['device']})",
                 [(col, "number") for col in ("type", "rows", "K", "tokens", "ciq us", "llama.cpp us",
                                              "ciq / llama.cpp")],
                 [[r.type, str(r.rows), str(r.k), str(r.tokens), f"{r.ciq_us:.0f}", f"{r.llamacpp_us:.0f}",
                   f"{r.ratio:.2f}"] for r in rows],
                 stacks=[((0, 1, 2), "type\nrows\nK"), ((4, 5), "ciq us\nllama.cpp us")])
    geo = bench.geomean(r.ratio for r in rows)
    by_type = {t: bench.geomean(r.ratio for r in rows if r.type == t) for t in dict.fromkeys(r.type for r in rows)}
    for t, value in by_type.items():
        console.print(f"geomean ciq/llama.cpp time ratio, {t}: {value:.2f}")
    console.print(f"geomean ciq/llama.cpp time ratio: {geo:.2f}")
    if args.json:
        _write_json(args.json, {"schema": "docs/BENCH_JSON.md", "environment": env, "rows": bench.rows_to_json(rows),
                                "geomean_ratio": geo, "geomean_ratio_by_type": by_type})
    return 0


def _bench_cuda(args, shapes, tokens) -> int:
    from . import bench, native

    console = _console()
    if native.device_count() == 0:
        raise CiqError("bench gemm --backend ciq-cuda: no CUDA device (or libggml_ciq built without CUDA)")
    if args.ab:
        return _bench_ab(args, shapes, tokens, console)
    variants = args.variants or [v for v in native.GPU_VARIANTS if native.variant_available("cuda", v)]
    with _progress(console) as progress:
        task = progress.add_task("bench", total=len(shapes) * len(tokens) * len(variants))
        rows = bench.bench_gpu(shapes, tokens, variants, repeat=args.repeat, llamacpp=not args.no_llamacpp,
                               ceiling=not args.no_ceiling, progress=lambda: progress.advance(task))
    env = bench.gpu_environment(llamacpp=not args.no_llamacpp)
    _print_table(console, f"ciq-cuda vs llama.cpp CUDA mul_mat ({env['device']})",
                 [(col, "text" if col == "variant" else "number")
                  for col in ("type", "rows", "K", "tokens", "variant", "us", "best us", "gemm-only us", "TFLOP/s",
                              "llama.cpp us", "speedup", "bf16 us", "of bf16")],
                 [[r.type, str(r.rows), str(r.k), str(r.tokens), r.variant, f"{r.us:.1f}", f"{r.best_us:.1f}",
                   f"{r.gemm_only_us:.1f}", f"{r.tflops:.1f}", _fmt(r.llamacpp_us, ".1f"), _fmt(r.speedup, ".2f"),
                   _fmt(r.bf16_us, ".1f"), _fmt(r.bf16_fraction, ".0%")] for r in rows],
                 stacks=[((0, 1, 2), "type\nrows\nK"), ((5, 6, 7), "us\nbest\nGEMM only"),
                         ((9, 10), "llama.cpp us\nspeedup"), ((11, 12), "bf16 us\nof bf16")])
    geo = bench.geomeans(rows)
    for key, value in geo.items():
        console.print(f"geomean speedup over llama.cpp, {key}: {value:.2f}x")
    if args.json:
        _write_json(args.json, {"schema": "docs/BENCH_JSON.md", "environment": env, "rows": bench.rows_to_json(rows),
                                "geomean_speedup": geo})
    if args.plot:
        bench.plot_gpu(rows, args.plot, f"keep-quant GEMM on {env['device']}")
    return 0


def _bench_ab(args, shapes, tokens, console) -> int:
    from . import bench, native

    a, b = args.ab
    with _progress(console) as progress:
        task = progress.add_task("A/B", total=len(shapes) * len(tokens))
        rows = bench.bench_ab(shapes, tokens, a, b, repeat=args.repeat, progress=lambda: progress.advance(task))
    _print_table(console, f"A/B, interleaved: A = {a}, B = {b} ({native.device_name('cuda')})",
                 [(col, "number") for col in ("type", "rows", "K", "tokens", "A us", "B us", "A/B time")],
                 [[r.type, str(r.rows), str(r.k), str(r.tokens), f"{r.a_us:.1f}", f"{r.b_us:.1f}", f"{r.ratio:.3f}"]
                  for r in rows],
                 stacks=[((0, 1, 2), "type\nrows\nK"), ((4, 5), "A us\nB us")])
    ratios = [r.ratio for r in rows]
    summary = {"a": a, "b": b, "geomean": bench.geomean(ratios), "min": min(ratios), "max": max(ratios)}
    console.print(f"B is {summary['geomean']:.3f}x A's speed (geomean; min {summary['min']:.3f}, max {summary['max']:.3f})")
    if args.json:
        _write_json(args.json, {"schema": "docs/BENCH_JSON.md", "environment": bench.gpu_environment(llamacpp=False),
                                "ab": summary, "rows": bench.rows_to_json(rows)})
    return 0


# ----------------------------------------------------------------------------------------------

def _bench_flags(p) -> None:
    """The flags bench gemm and bench attention share."""
    p.add_argument("--backend", choices=("ciq-cpu", "ciq-cuda"), default=None, help="ciq-cpu (default) or ciq-cuda")
    p.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None)
    p.add_argument("--repeat", type=_whole(1), default=None, help="timed runs per case (default 5)")
    p.add_argument("--no-llamacpp", action="store_true", help="time our kernels only")
    p.add_argument("--json", help="write the results here")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ggml-ciq", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("diff", help="per-tensor GEMM diff against llama.cpp and float64")
    p.add_argument("model", nargs="?", help="GGUF path or catalog name (default: the embedded default model)")
    p.add_argument("--tokens", type=_whole(1), default=None, help="activation rows (default 32)")
    p.add_argument("--seed", type=_whole(0), default=None, help="activations' seed (default 0)")
    p.add_argument("--backend", default="auto", help="auto (GPU if present), ciq-cpu, ciq-cuda or reference (numpy)")
    p.add_argument("--reference", default="auto", help="auto, llamacpp-cpu or llamacpp-cuda")
    p.add_argument("--variant", type=_from_library(_variant), default="auto",
                   help="kernel variant for ciq-cuda (default auto)")
    p.add_argument("--all-quantized", action="store_true", help="also report llama.cpp vs f64 for other quant types")
    p.add_argument("--tensor", action="append", help="only this tensor (repeatable)")
    p.add_argument("--bar", type=_positive_number, default=1e-10, help="max NMSE of ours vs llama.cpp (default 1e-10)")
    p.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None)
    p.add_argument("--json", type=_output_file(), help="write the full report here")
    p.add_argument("--prompt", type=_text, help="diff on real activations: capture llama.cpp's prefill of this text (our kernels "
                                    "on its mul_mat inputs, our engine's hidden states vs its l_out-N)")
    p.add_argument("--layer-bar", type=_positive_number, default=None, help="with --prompt: hidden-state NMSE naming the first "
                                                                 "diverging layer (default 1e-4)")
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="with --prompt: llama.cpp's flash attention (auto: on for CUDA, off on the CPU)")
    p.add_argument("--spread", choices=("auto", "on", "off"), default="auto",
                   help="with --prompt: a second llama.cpp prefill, flash attention toggled: its own spread per layer "
                        "raises that layer's bar to it (auto: unless ours follows this llama.cpp bit for bit: its "
                        "CUDA build and its AVX2 CPU build)")
    p.add_argument("--llamacpp-extra-buffers", action="store_true", help=EXTRA_BUFFERS_HELP)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("bench", help="benchmarks: gemm, attention, or plot a saved --json file")
    bench_ops = p.add_subparsers(dest="op", required=True)

    p = bench_ops.add_parser("gemm", help="our keep-quant GEMMs against llama.cpp's mul_mat on weight shapes")
    _bench_flags(p)
    p.add_argument("--model", help="GGUF path or catalog name whose weight shapes to time")
    p.add_argument("--shape", type=_from_library(_shape), action="append", help="TYPE:ROWS:K (repeatable)")
    p.add_argument("--shapes", help="shape set: seed6 or llama3-8b")
    p.add_argument("--tokens", type=_whole_list(1), default=None,
                   help="comma-separated token counts (default: the set's, else 32)")
    p.add_argument("--variants", type=_from_library(_variants),
                   help="comma-separated GPU kernel variants (default: all available)")
    p.add_argument("--no-ceiling", action="store_true", help="skip the dense bf16 cuBLAS ceiling")
    p.add_argument("--ab", type=_from_library(_variants),
                   help="A,B: two variants timed alternately, per-shape ratio and geomean")
    p.add_argument("--plot", help="write grouped TFLOP/s bars (PNG; needs matplotlib)")
    p.set_defaults(func=cmd_bench_gemm)

    p = bench_ops.add_parser("attention", help="our attention kernels against llama.cpp's FLASH_ATTN_EXT per "
                                               "prefill micro-batch")
    _bench_flags(p)
    p.add_argument("--case", type=_from_library(_attention_case), action="append",
                   help="TOKENS:N_PAST:HEADS:HEADS_KV:HEAD_DIM[:WINDOW] (repeatable)")
    p.add_argument("--cases", help="case set gemma3-270m (default) or llama3-8b")
    p.add_argument("--kernels", type=_from_library(_attention_kernels),
                   help="comma-separated kernels (default: GPU simt,mma,mma_llamacpp,wgmma; CPU cpu,ggml)")
    p.set_defaults(func=cmd_bench_attention)

    p = bench_ops.add_parser("plot", help="redraw a saved --json file of bench gemm (GPU) or compare")
    p.add_argument("--json", help="the saved results to draw")
    p.add_argument("--plot", help="the figure to write (.png, .svg or .pdf; needs matplotlib)")
    p.set_defaults(func=cmd_bench_plot)

    p = sub.add_parser("prefill", help="run a prompt through a GGUF model: tokens/s, next tokens, time by op class")
    p.add_argument("model", nargs="?", help="GGUF path or catalog name (default: the embedded default model)")
    p.add_argument("--prompt", type=_text, help="text, tokenized by llama.cpp's tokenizer")
    p.add_argument("--tokens", type=_whole(1), help="N random token ids instead of a prompt")
    p.add_argument("--ids", type=_whole_list(0), help="comma-separated token ids instead of a prompt")
    p.add_argument("--seed", type=_whole(0), default=0)
    p.add_argument("--top", type=_whole(1), default=5)
    p.add_argument("--device", type=_from_library(_engine_device), default="cpu",
                   help="cpu, cuda[:N] or reference (the float64 model the GGUF defines, on the CPU)")
    p.add_argument("--semantics", choices=("llamacpp", "exact", "fast"), default=None,
                   help="llamacpp: llama.cpp's arithmetic on the device (CPU: bit for bit); exact: the most exact "
                        "fast path; fast: the fastest kernels (default: fast on a GPU, llamacpp on the CPU; "
                        "docs/SEMANTICS.md)")
    p.add_argument("--ctx-size", type=_whole(1), default=None,
                   help="context length (default: the GGUF's context_length)")
    p.add_argument("--ubatch", type=_whole(1), default=512, help="tokens per micro-batch (default 512, as llama.cpp)")
    p.add_argument("--repeat", type=_whole(1), default=1,
                   help="timed prefills; above 1, after an untimed warm-up, and the median reported (default 1: "
                        "one cold run)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="GPU: run each micro-batch as a CUDA graph, captured on its first run and replayed after "
                        "(the same values; no time by op class)")
    p.add_argument("--json", type=_output_file())
    p.set_defaults(func=cmd_prefill)

    p = sub.add_parser("compare", help="llama.cpp, our engine and the float64 reference on the same tokens: "
                                       "logits distances, llama.cpp's own spread, prefill tokens/s, memory")
    p.add_argument("model", nargs="?", help="GGUF path or catalog name (default: the embedded default model)")
    p.add_argument("--tokens", type=_whole(1), default=None, help="prompt length: the text cut (or, if shorter, "
                                                                  "repeated) to N tokens (default 512; with "
                                                                  "--prompt: the prompt as it is)")
    p.add_argument("--prompt", type=_text, help="text (default: the GCC runtime exception and GNU GPL v3 that "
                                                "numpy's LICENSE.txt bundles, ~8.6k tokens of English)")
    p.add_argument("--repeat", type=_whole(1), default=3, help="timed prefills per arm, after a warm-up (median)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--semantics", type=_semantics_list, default=None,
                   help="our engine's arms, comma-separated from llamacpp, exact, fast (default: all three on a GPU, "
                        "llamacpp,exact on the CPU, where fast is llamacpp; docs/SEMANTICS.md)")
    p.add_argument("--reference", choices=("on", "off"), default="on",
                   help="the float64 reference arm on the CPU (default on; ~0.1 s per token on 2 cores)")
    p.add_argument("--threads", type=_whole(1, MAX_THREADS), default=None)
    p.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                   help="llama.cpp's flash attention (auto: on for CUDA as llama-bench, off on the CPU, where it "
                        "depends on the micro-batch size)")
    p.add_argument("--json", type=_output_file())
    p.add_argument("--plot", type=_output_file(".png", ".svg", ".pdf"),
                   help="write tokens/s and per-position KL divergence of every pair (PNG; needs matplotlib)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="time our prefills as CUDA graphs (captured in one more untimed prefill; GPU only)")
    p.add_argument("--plugin", action="store_true",
                   help="a third arm: llama.cpp with the ggml-ciq backend plugin loaded (docs/PLUGIN.md; on the CPU "
                        "it takes MUL_MATs only with GGML_CIQ_OFFLOAD=all)")
    p.add_argument("--llamacpp-extra-buffers", action="store_true", help=EXTRA_BUFFERS_HELP)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("fetch", help="a catalog model (generated or assembled) or a GGUF from the Hugging Face hub")
    p.add_argument("model", help="catalog name, or a hub REPO_ID (with FILENAME)")
    p.add_argument("filename", nargs="?", help="GGUF file in the hub repository")
    p.add_argument("--dir", type=_output_dir, help="download directory (default: the cache's downloads/)")
    p.set_defaults(func=cmd_fetch)

    p = sub.add_parser("info", help="build, devices, llama.cpp libraries, models")
    p.add_argument("--llamacpp-lib", default=None)
    p.set_defaults(func=cmd_info)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in CHECKS:
            CHECKS[args.command](args)
        return args.func(args)
    except LlamaCppCrash as exc:  # not the user's doing: reported as llama.cpp's, exit 1
        print(f"ggml-ciq: {exc}", file=sys.stderr)
        return 1
    except CiqError as exc:
        print(f"ggml-ciq: error: {exc}", file=sys.stderr)
        return 2
    except MemoryError:
        print("ggml-ciq: error: out of host memory", file=sys.stderr)
        return 2
    except OSError as exc:  # writing a result: a full disk, a directory removed meanwhile
        print(f"ggml-ciq: error: {exc.strerror or exc}{f': {exc.filename}' if exc.filename else ''}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # an optional package (matplotlib for plots, say) is not installed
        print(f"ggml-ciq: error: the Python package {exc.name} is not installed (pip install {exc.name})",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ggml-ciq: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
