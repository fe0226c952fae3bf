"""`specdec-tune generate` end to end on tiny saved models, and its bad-input contract."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdec_tune.cli import main


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def base_args(tiny_model_dirs):
    return ["generate", "--target", tiny_model_dirs["target"], "--max-new-tokens", "12", "--device", "cpu"]


def test_generate_json_matches_baseline(base_args, tiny_model_dirs, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "def add(a, b):", "category": "code"}\n\n{"id": 2, "prompt": "class Point:"}\n')
    code, base_out, _ = run(base_args + ["--prompts", str(prompts), "--json"], capsys)
    assert code == 0
    base = [json.loads(line) for line in base_out.splitlines()]
    assert [b["prompt_id"] for b in base] == ["a", "2"]
    for draft in (tiny_model_dirs["draft"], "ngram"):
        code, out, _ = run(base_args + ["--prompts", str(prompts), "--json", "--draft", draft, "-N", "3"], capsys)
        assert code == 0
        spec = [json.loads(line) for line in out.splitlines()]
        for b, s in zip(base, spec):
            assert s["token_ids"] == b["token_ids"] and s["new_tokens"] == len(s["token_ids"]) <= 12
            for key in ("text", "seconds", "tokens_per_s", "cycles", "mean_tokens_per_cycle", "acceptance_per_position"):
                assert key in s
            assert s["cycles"] >= 1 and s["mean_tokens_per_cycle"] >= 1.0
            assert s["tokens_per_s"] == pytest.approx(s["new_tokens"] / s["seconds"])


def test_generate_human_output(base_args, tiny_model_dirs, capsys):
    code, out, _ = run(base_args + ["--prompt", "for i in range", "--draft", tiny_model_dirs["draft"]], capsys)
    assert code == 0
    assert "measured:" in out and "tokens/s" in out and "τ =" in out and "α =" in out


@pytest.mark.parametrize(
    "extra,needle",
    [
        (["--prompt", "x", "-N", "0", "--draft", "ngram"], "--num-speculative-tokens"),
        (["--prompt", "x", "-N", "65", "--draft", "ngram"], "--num-speculative-tokens"),
        (["--prompt", "x", "--threshold", "1.0"], "--threshold"),
        (["--prompt", "x", "--threshold", "-0.1"], "--threshold"),
        (["--prompt", "   "], "empty"),
        (["--prompt", "x", "--temperature", "-1"], "--temperature"),
        (["--prompt", "x", "--schedule", "fast"], "--schedule"),
        (["--prompt", "x", "--device", "tpu"], "--device"),
    ],
)
def test_bad_flags(base_args, extra, needle, capsys):
    code, _, err = run(base_args + extra, capsys)
    assert code == 2
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_missing_model_path(capsys, tmp_path):
    code, _, err = run(["generate", "--target", str(tmp_path / "nope"), "--prompt", "x"], capsys)
    assert code == 2 and "does not exist" in err and str(tmp_path / "nope") in err


def test_incompatible_tokenizers(base_args, tiny_model_dirs, capsys):
    code, _, err = run(base_args + ["--prompt", "x", "--draft", tiny_model_dirs["other"]], capsys)
    assert code == 2 and "do not share a vocabulary" in err
    assert tiny_model_dirs["other"] in err and tiny_model_dirs["target"] in err and "token" in err


def test_malformed_jsonl_names_file_and_line(base_args, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "ok"}\n{"id": "b", "prompt": \n')
    code, _, err = run(base_args + ["--prompts", str(bad)], capsys)
    assert code == 2 and "bad.jsonl" in err and ":2" in err


def test_subprocess_error_is_one_line_exit_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "specdec_tune.cli", "generate", "--target", str(tmp_path / "missing"), "--prompt", "x"],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("error:") and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        pytest.param(["nosuchcommand"], "nosuchcommand", marks=pytest.mark.slow),
        (["generate", "--bogus"], "--bogus"),
        pytest.param(["generate", "--target"], "--target", marks=pytest.mark.slow),
        pytest.param(["profile", "--workload"], "--workload", marks=pytest.mark.slow),
    ],
    ids=["unknown-command", "unknown-option", "missing-value", "missing-value-profile"],
)
def test_usage_errors_are_one_line_and_exit_2(args, needle):
    """In a real process, with whatever click the installed Typer raises (Typer >= 0.29 vendors its own
    as ``typer._click``): one line on stderr naming the bad input, exit code 2, no traceback."""
    proc = subprocess.run([sys.executable, "-m", "specdec_tune.cli", *args], capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_plain_and_speculative_generate_use_one_thread_count_and_print_it(base_args, tiny_model_dirs, capsys,
                                                                           monkeypatch, tmp_path):
    """Quickstart's two generate lines compare only at one thread count: generate calibrates on the target
    whatever the draft (the pair's calibration may differ), and prints the count beside tokens/s."""
    import torch

    from specdec_tune.profiler import threads as th

    if th.usable_cpus() < 2:
        pytest.skip("one usable CPU: every thread choice is 1")
    calibrated = []

    def calibrate(target, draft, counts, **_):  # alone 1 thread is fastest, with a draft 2 (a made-up machine)
        calibrated.append(draft is not None)
        best = 1 if draft is None else 2
        return {n: 1.0 if n == best else 2.0 for n in counts}

    monkeypatch.setattr(th, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(th, "calibrate", calibrate)
    monkeypatch.setattr(th, "idle_cpus", lambda *a, **k: float(th.usable_cpus()))
    before = torch.get_num_threads()
    lines = {}
    try:
        for draft in ("none", tiny_model_dirs["draft"], "ngram"):
            code, out, err = run(base_args + ["--prompt", "def add(a, b):", "--draft", draft], capsys)
            assert code == 0, err
            lines[draft] = next(line for line in out.splitlines() if line.startswith("measured:"))
    finally:
        torch.set_num_threads(before)
    assert calibrated == [False]  # once, on the target alone, then cached for every draft
    assert all(" tokens/s with 1 thread (" in line for line in lines.values()), lines
