"""Parse an SGLang command line with SGLang's own parser (run by the SGLang side venv's Python).

Standalone: the side venv (scripts/setup_sglang_env.sh) has sglang 0.5.23 but not specdec-tune. Reads
a JSON list of command lines on stdin (each a list: what follows ``python -m sglang.launch_server``),
runs ``sglang.srt.server_args.prepare_server_args`` on each (the function ``sglang/launch_server.py``
calls: ``ServerArgs.add_cli_args``, argparse, ``ServerArgs.from_cli_args``) and prints a JSON list,
one object per command line: the resulting ``speculative_*`` fields and ``model_path``, and
``inexact``: options given that are not one of the parser's option strings (argparse accepts
unambiguous abbreviations, so a truncated flag would otherwise pass); or ``{"error": "..."}``
(argparse's message) when SGLang's parser refuses the command line.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys


def parse(argv: list[str], known: set[str]) -> dict:
    """One command line through SGLang's own parser."""
    from sglang.srt.server_args import prepare_server_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = prepare_server_args(argv)
    except SystemExit:
        return {"error": (err.getvalue().strip().splitlines() or ["exit"])[-1]}
    inexact = [a.split("=", 1)[0] for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]
    fields = {name: getattr(args, name) for name in dir(args)
              if name.startswith("speculative_") and not callable(getattr(args, name))}
    return {"model_path": args.model_path, "fields": fields, "inexact": inexact}


def main() -> int:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    known = set(parser._option_string_actions)  # every option string the parser registered
    print(json.dumps([parse(argv, known) for argv in json.load(sys.stdin)], default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
