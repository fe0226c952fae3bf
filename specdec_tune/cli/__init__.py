"""The ``specdec-tune`` command-line face: parses, calls the rooms below, prints.

One module per command group; importing a module registers its commands on the shared Typer app.
:func:`main` applies the error policy (``docs/architecture.md``, Errors and bad input): a
:class:`SpecdecError` or a usage error (unknown command or option, missing or bad value) becomes one
line on stderr and exit code 2, never a traceback; Ctrl-C becomes one line (``interrupted: <what was
kept>``) and exit code 130.
"""
from __future__ import annotations

import importlib
import sys

from specdec_tune.cli._app import Interrupted, app
from specdec_tune.core.errors import SpecdecError

# Command modules, imported for their side effect of registering commands.
_COMMAND_MODULES = ("generate", "zoo", "db", "profile", "predict", "measure", "bench", "dashboard", "regress", "tune", "export")
for _name in _COMMAND_MODULES:
    importlib.import_module(f"specdec_tune.cli.{_name}")


def _click_classes() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(Exit, Abort, ClickException) classes of every click the installed Typer may raise.

    Typer >= 0.29 vendors its own click as ``typer._click`` (with ``Exit``/``Abort`` in
    ``typer.exceptions``); older Typer raises the ``click`` package's classes. Catch both, so a
    usage error is one line whatever a fresh install resolves.
    """
    exits: list[type] = []
    aborts: list[type] = []
    errors: list[type] = []
    for exc_mod, err_mod in (("typer.exceptions", "typer._click.exceptions"), ("click.exceptions", "click.exceptions")):
        try:
            em = importlib.import_module(exc_mod)
            cm = importlib.import_module(err_mod)
        except ImportError:
            continue
        exits += [getattr(em, "Exit")] if hasattr(em, "Exit") else []
        aborts += [getattr(em, "Abort")] if hasattr(em, "Abort") else []
        errors += [getattr(cm, "ClickException")] if hasattr(cm, "ClickException") else []
    return tuple(exits), tuple(aborts), tuple(errors)


_EXIT, _ABORT, _CLICK_ERROR = _click_classes()


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; return the process exit code (also used by the tests)."""
    try:
        result = app(args=argv, standalone_mode=False, prog_name="specdec-tune")
    except SpecdecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    except _EXIT as exc:
        code = int(getattr(exc, "exit_code", 0) or 0)
    except _CLICK_ERROR as exc:
        # Usage errors: one line naming the bad input and where to look, exit 2 (click's own code).
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        command = getattr(getattr(exc, "ctx", None), "command_path", None) or "specdec-tune"
        print(f"error: {' '.join(message.split())} (see '{command} --help')", file=sys.stderr)
        code = 2
    except (Interrupted, *_ABORT, KeyboardInterrupt) as exc:
        # Ctrl-C: one line saying what the command kept (a profile run, a study's trials), exit 130.
        kept = str(exc) if isinstance(exc, Interrupted) else ""
        print(f"interrupted: {kept}" if kept else "interrupted", file=sys.stderr)
        code = 130
    else:
        code = result if isinstance(result, int) else 0
        if code == 130:  # Typer's own answer to a Ctrl-C outside any command (while parsing)
            print("interrupted", file=sys.stderr)
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
