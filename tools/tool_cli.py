"""The tools' common ending of main(): parse the arguments, run, and turn an expected failure into one line.

    from tool_cli import run_main        # tools/ is on sys.path when a tool runs as `python tools/NAME.py`
    return run_main("NAME", parser, run, argv)
"""

import sys

from ggml_ciq.errors import CiqError


def run_main(name: str, parser, run, argv=None) -> int:
    """run(parser's arguments); a CiqError or OSError is one line on stderr (`NAME: error: ...`) and exit status 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (CiqError, OSError) as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
