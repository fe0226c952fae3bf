"""Build ``edits``: a multi-turn editing workload whose continuations repeat earlier text (suffix decoding's case).

Agents and editors send the same material again and again: a file is shown, the model writes a revision,
the next request carries the file *and that answer* and asks for another revision. Each session here is one
held-out function (5-17 lines, a one-line header) in three turns:

1. the function, then the header again renamed (``def name_v2(...):``), the prompt ending at the body's
   indentation;
2. turn 1's prompt, the target's own greedy answer to it, then the header with a new keyword argument
   (``def name(..., strict=False):``);
3. turn 2's prompt, its answer, then the header renamed once more (``def name_checked(...):``).

Later turns hold the model's earlier answers, so their continuations repeat text the prompt holds (the
request's own suffix tree, prompt lookup) and text earlier requests produced (suffix decoding's global
tree). The answers come from the target the workload is built for (``answer``: its greedy continuation),
as in a real conversation; with another target the prompts stay valid text but repeat less.

Sessions are laid out in pairs, turn by turn (A1 B1 A2 B2 A3 B3, then the next pair), so the alternating
tuning / held-out split (``specdec_tune.core.splits``) puts every turn of A in one half and every turn of B
in the other: no held-out prompt contains a tuning prompt's function or answer.
"""
from __future__ import annotations

import ast
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from specdec_tune.training.corpus import SourceFile, parsed

TURNS = ("rename", "new_argument", "rename_again")


@dataclass(frozen=True)
class _Function:
    relpath: str
    name: str
    source: str  # the whole function, header first
    header: str  # its header line


def _functions(files: list[SourceFile]) -> Iterator[_Function]:
    for f, tree, lines in parsed(files):
        for node in ast.walk(tree):
            if (isinstance(node, ast.FunctionDef) and node.args.args and not node.decorator_list
                    and 4 <= node.end_lineno - node.lineno <= 16 and node.body[0].lineno == node.lineno + 1):
                yield _Function(f.relpath, node.name, "".join(lines[node.lineno - 1:node.end_lineno]),
                                lines[node.lineno - 1])


def _headers(fn: _Function) -> tuple[str, str, str]:
    """The three turns' headers: renamed, with a new keyword argument, renamed again."""
    h, name = fn.header, fn.name
    close = h.rstrip().rfind(")")
    return (h.replace(f"def {name}(", f"def {name}_v2(", 1), h[:close] + ", strict=False" + h[close:],
            h.replace(f"def {name}(", f"def {name}_checked(", 1))


def session(fn: _Function, answer: Callable[[str], str]) -> list[str]:
    """The three prompts of one session; ``answer`` is the target's continuation of a prompt."""
    indent = fn.header[:len(fn.header) - len(fn.header.lstrip())] + "    "
    text, prompts = fn.source + "\n", []
    for k, header in enumerate(_headers(fn)):
        text += header + indent
        prompts.append(text)
        if k + 1 < len(TURNS):
            text += answer(text) + "\n\n"
    return prompts


def build_edit_workload(files: list[SourceFile], count_tokens: Callable[[str], int], answer: Callable[[str], str],
                        *, sessions: int = 14, min_tokens: int = 48, max_tokens: int = 560,
                        seed: int = 0) -> list[dict]:
    """The ``edits`` records (module docstring): ``sessions`` sessions (even: they come in pairs) of
    functions from distinct files, every prompt between ``min_tokens`` and ``max_tokens`` tokens.

    Returns:
        JSON-ready records ``{"id", "category", "prompt", "source", "session", "turn"}`` in workload order.
    """
    rng = random.Random(f"{seed}:edits")
    pool = list(_functions(files))
    rng.shuffle(pool)
    chosen: list[tuple[_Function, list[str]]] = []
    used: set[str] = set()
    for fn in pool:
        if len(chosen) >= sessions - sessions % 2:
            break
        if fn.relpath in used or count_tokens(fn.source) < min_tokens // 2:
            continue
        prompts = session(fn, answer)
        if count_tokens(prompts[0]) < min_tokens or count_tokens(prompts[-1]) > max_tokens:
            continue
        used.add(fn.relpath)
        chosen.append((fn, prompts))
    records: list[dict] = []
    for pair in range(0, len(chosen) - 1, 2):
        for turn, category in enumerate(TURNS):
            for s in (pair, pair + 1):
                fn, prompts = chosen[s]
                records.append({"id": f"edits-{len(records):03d}", "category": category, "prompt": prompts[turn],
                                "source": f"{fn.relpath}:{fn.name}", "session": s, "turn": turn + 1})
    return records
