"""``generate --threshold-rule``: HF's rule runs end to end with the same greedy text; bad values are one line."""
from __future__ import annotations

import json

from specdec_tune.cli import main


def _generate(dirs, capsys, *extra):
    code = main(["generate", "--target", dirs["target"], "--draft", dirs["draft"], "--prompt", "def add(a, b):",
                 "--max-new-tokens", "12", "-N", "4", "--threshold", "0.05", "--device", "cpu", "--json", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def test_threshold_rule_hf_same_greedy_text(tiny_model_dirs, capsys):
    code, out, _ = _generate(tiny_model_dirs, capsys)
    code_hf, out_hf, _ = _generate(tiny_model_dirs, capsys, "--threshold-rule", "hf")
    assert code == code_hf == 0
    before, hf = json.loads(out), json.loads(out_hf)
    assert hf["text"] == before["text"] and hf["new_tokens"] == before["new_tokens"] == 12


def test_threshold_rule_bad_value_is_one_line(tiny_model_dirs, capsys):
    code, _, err = _generate(tiny_model_dirs, capsys, "--threshold-rule", "after")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:") and "--threshold-rule" in lines[0], err
