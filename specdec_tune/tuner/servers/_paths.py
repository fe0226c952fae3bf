"""The model paths an export names, and how they are pointed at the serving host's copies.

A result names its models by the paths they were tuned from: a bundled name's folder inside this
checkout, a local folder, or a hub id. Those paths rarely exist on the machine that serves, so two
ways lead elsewhere:

- at export time, ``--model-root DIR`` (:func:`under_root`): every file names ``DIR/<folder name>``
  for each local model folder, JSON and YAML included (a server reads those files as they are, with no
  variables). Hub ids are left as they are: a server resolves them itself.
- at launch time, each ``launch.sh`` reads ``TARGET_MODEL`` and ``DRAFT_MODEL`` (:func:`script`),
  defaulting to the paths the files name.
"""
from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import TuningResult

TARGET_VAR = "TARGET_MODEL"
DRAFT_VAR = "DRAFT_MODEL"


def model_path(name: str | None) -> str | None:
    """A bundled model name becomes its folder; anything else (path, hub id) is returned as given."""
    if not name:
        return name
    from specdec_tune.profiler import model_source

    return model_source(name)


def file_paths(result: TuningResult) -> tuple[str, str | None]:
    """``(target, draft)`` as the files of ``result`` name them (draft ``None``: plain decoding or n-gram)."""
    target = result.target_path or model_path(result.target) or result.target
    c = result.candidate
    draft = None if c.is_plain or c.is_ngram else (result.draft_path or model_path(c.drafter))
    return target, draft


def check_root(root: str | None, flag: str = "--model-root") -> str | None:
    """``--model-root`` as given (a folder on the serving host: it need not exist here).

    Raises:
        InputError: an empty value.
    """
    if root is None:
        return None
    if not root.strip():
        raise InputError(f"{flag} is empty; give the folder that holds the models on the serving host")
    return root.strip()


def _is_local(path: str) -> bool:
    """A filesystem path (absolute, or a folder here), not a hub id such as ``org/name``."""
    return os.path.isabs(os.path.expanduser(path)) or Path(path).expanduser().exists()


def under_root(path: str | None, root: str | None) -> str | None:
    """``root/<folder name>`` for a local model folder; a hub id, or no root, is returned as given."""
    if not path or not root or not _is_local(path):
        return path
    name = Path(os.path.normpath(os.path.expanduser(path))).name
    return str(PurePosixPath(root) / name)


def relocated(result: TuningResult, root: str | None) -> TuningResult:
    """``result`` with the paths its files name moved under ``root`` (unchanged without one)."""
    if not root:
        return result
    target, draft = file_paths(result)
    return replace(result, target_path=under_root(target, root), draft_path=under_root(draft, root))


@dataclass(frozen=True)
class Var:
    """A shell variable in a launch command: ``"$NAME"``, defaulting to ``value`` (the path the files name;
    ``None``: the script sets it)."""

    name: str
    value: str | None = None


Word = str | Var | tuple  # a command-line word: text, a variable, or pieces of both joined


def _word(word: Word) -> str:
    pieces = word if isinstance(word, tuple) else (word,)
    return "".join(f'"${p.name}"' if isinstance(p, Var) else shlex.quote(p) for p in pieces if p != "")


def variables(cmd: list[Word]) -> list[Var]:
    """The distinct variables of ``cmd`` a user may set (those with a default), in order."""
    seen: dict[str, Var] = {}
    for word in cmd:
        for p in word if isinstance(word, tuple) else (word,):
            if isinstance(p, Var) and p.value is not None:
                seen.setdefault(p.name, p)
    return list(seen.values())


def defaults(variables_: list[Var]) -> str:
    """``NAME=${NAME:-'default'}`` lines for ``variables_`` (empty without any)."""
    return "".join(f"{v.name}=${{{v.name}:-{shlex.quote(v.value)}}}\n" for v in variables_ if v.value is not None)


def command(cmd: list[Word]) -> str:
    """The command line, each word quoted for ``sh``, variables expanded in double quotes."""
    return " ".join(_word(w) for w in cmd)


def script(cmd: list[Word], note: str, body: str = "", also: tuple[Var, ...] = ()) -> str:
    """A launch script: its note, a default for each model variable (those of ``cmd``, then ``also``:
    variables ``body`` reads), ``body`` (more lines), then the command with the caller's arguments
    appended."""
    declared = variables([*cmd, *also])
    head = "#!/bin/sh\n" + f"# {note}\n"
    if declared:
        names = " / ".join(v.name for v in declared)
        head += f"# model paths: set {names} to serve other copies than the paths below (README, Model paths)\n"
    return head + defaults(declared) + body + command(cmd) + ' "$@"\n'


_REWRITE = ('import sys, yaml; p = sys.argv; d = yaml.safe_load(open(p[1])); '
            'd["speculative_config"]["speculative_model"] = p[2]; yaml.safe_dump(d, open(p[3], "w"), sort_keys=False)')


def options_script(base: list[Word], options: str, draft: str | None, note: str) -> str:
    """TensorRT-LLM's launch script: ``base --extra_llm_api_options FILE`` with ``FILE`` found beside the
    script. The YAML names the draft and cannot read a variable, so a ``DRAFT_MODEL`` other than the one
    it names is served from a copy of the file that names it (written by Python's yaml, which
    TensorRT-LLM installs)."""
    opts = Var("OPTIONS")  # set by the script, never read from the environment
    body = f'OPTIONS="$(dirname "$0")"/{shlex.quote(options)}\n'
    also: tuple[Var, ...] = ()
    if draft is not None:
        also = (Var(DRAFT_VAR, draft),)
        body += (f'if [ "${DRAFT_VAR}" != {shlex.quote(draft)} ]; then  # the file names the draft at export\n'
                 '  COPY=$(mktemp) || exit 1\n'
                 f'  python3 -c {shlex.quote(_REWRITE)} "$OPTIONS" "${DRAFT_VAR}" "$COPY" || exit 1\n'
                 '  OPTIONS=$COPY\n'
                 'fi\n')
    return script([*base, "--extra_llm_api_options", opts], note, body, also)


def spliced(text: str, var: Var, encoded: str) -> tuple:
    """``text`` as one word whose every ``encoded`` (the variable's default, as ``text`` encodes it)
    is replaced by the variable."""
    parts = text.split(encoded)
    out: list = [parts[0]]
    for part in parts[1:]:
        out += [var, part]
    return tuple(out)
