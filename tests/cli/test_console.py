"""The commands' console (``cli._app.console``): tables print in full when piped, and a label that does
not fit a narrow terminal wraps onto more lines instead of ending in an ellipsis."""
from __future__ import annotations

import logging

from rich.table import Table

from specdec_tune.cli import main
from specdec_tune.cli._app import console

LABELS = ("→ mini-draft-1l N=7 θ=0.3", "  mini-draft-2l N=7 θ=0.3")
PATH = "/home/someone/checkouts/specdec-tune/engine/zoo/models/mini-draft-2l-with-a-long-folder-name"


def _confirmation_table() -> Table:
    """Shaped like ``tune``'s confirmation table (the one that printed ``mini-draft… N=7``)."""
    table = Table(title="measured on the tuning prompts (interleaved)", title_justify="left")
    for col in ("configuration", "measured tokens/s", "95% CI", "predicted tokens/s", "servers", "path"):
        table.add_column(col)
    for label in LABELS:
        table.add_row(label, "1,234.5", "[1,200.0, 1,260.3]", "1,250.1", "hf, llama.cpp, sglang, trtllm, vllm", PATH)
    return table


def test_piped_tables_print_in_full(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    console().print(_confirmation_table())
    out = capsys.readouterr().out
    assert "…" not in out
    for label in LABELS:
        assert sum(label.strip() in line and PATH in line for line in out.splitlines()) == 1, out


def test_piped_text_is_not_wrapped(monkeypatch, capsys):
    monkeypatch.delenv("COLUMNS", raising=False)
    line = " ".join(f"word{i}" for i in range(60))  # about 400 characters
    console().print(line, markup=False, highlight=False)
    console(stderr=True).print(line, markup=False, highlight=False)
    out, err = capsys.readouterr()
    assert out == line + "\n" and err == line + "\n"


def test_a_narrow_terminal_folds_labels_instead_of_cutting_them(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "60")  # an explicit width is respected, piped or not
    console().print(_confirmation_table())
    out = capsys.readouterr().out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 60
    assert "1l" in out and "2l" in out  # the two drafts can be told apart


def test_engine_notices_reach_stderr_as_one_line(capsys):
    """The engine logs (it never prints); the CLI shows its notices on stderr, one line each."""
    assert main(["zoo", "list", "--no-measure", "--json"]) == 0
    capsys.readouterr()
    logging.getLogger("specdec_tune.engine.lean_kernels").warning("building the kernels (test)")
    out, err = capsys.readouterr()
    assert out == "" and err == "specdec-tune: building the kernels (test)\n"
