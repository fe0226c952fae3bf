"""Entry point of the ``specdec-tune`` console script.

Each command lives in its own ``cli_*`` module; importing the module registers it on the shared app.
"""
from __future__ import annotations

import importlib
import sys

import click

from specdec_tune.errors import SpecdecError
from specdec_tune.tuner._app import app

# Command modules, imported for their side effect of registering commands. Listed by name so that a
# command module that is still missing in a checkout does not break the others.
_COMMAND_MODULES = ("cli_generate", "cli_zoo", "cli_db", "cli_profile", "cli_bench")
for _name in _COMMAND_MODULES:
    try:
        importlib.import_module(f"specdec_tune.tuner.{_name}")
    except ModuleNotFoundError as exc:  # only the command module itself may be absent
        if exc.name != f"specdec_tune.tuner.{_name}":
            raise


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code (also used by the tests)."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="specdec-tune")
    except SpecdecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except click.exceptions.Exit as exc:
        code = exc.exit_code
    except click.ClickException as exc:
        exc.show()
        code = exc.exit_code
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        code = 130
    else:
        code = result if isinstance(result, int) else 0
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
