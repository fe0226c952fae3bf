"""SGLang's own argument parser reads ``export --format sglang`` as meant.

``tests/support/sglang_args.py`` runs in the SGLang side venv (``scripts/setup_sglang_env.sh``: sglang 0.5.23
without its CUDA dependencies) and feeds each exported command line to
``sglang.srt.server_args.prepare_server_args``, what ``python -m sglang.launch_server`` calls. Every
speculative field of the export (our schema's fields) must arrive with the value we wrote, under its
exact option name. The planted cases show the check fails on a wrong key, a truncated key (which
argparse would accept as an abbreviation) and a wrong value. Skipped, saying why, without the venv.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from specdec_tune.tuner.model import NGRAM, Candidate, TuningResult
from specdec_tune.tuner.servers import SglangSpeculativeArgs, render_exports

pytestmark = [pytest.mark.sglang, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
TARGET, DRAFT = "/models/mini-target", "/models/mini-draft-1l"
CANDIDATES = {"standalone": Candidate("mini-draft-1l", 5), "ngram": Candidate(NGRAM, 3, ngram_max=3, ngram_min=3)}


@pytest.fixture(scope="module")
def sglang_python() -> str:
    given = os.environ.get("SPECDEC_SGLANG_PYTHON", "").strip() or str(ROOT / ".venv-sglang" / "bin" / "python")
    if not Path(given).is_file():
        pytest.skip(f"no SGLang side venv ({given}): run scripts/setup_sglang_env.sh and set SPECDEC_SGLANG_PYTHON")
    return given


def meaning(c: Candidate) -> dict:
    """What the configuration means in SGLang's fields (speculative_hook: with top-k 1 a draft model's
    N steps verify N + 1 tokens; an NGRAM draft's first token is the last verified one)."""
    n = c.num_speculative_tokens
    if c.is_ngram:
        return {"speculative_algorithm": "NGRAM", "speculative_num_draft_tokens": n + 1,
                "speculative_ngram_min_bfs_breadth": 1, "speculative_ngram_max_bfs_breadth": 1}
    return {"speculative_algorithm": "STANDALONE", "speculative_draft_model_path": DRAFT, "speculative_num_steps": n,
            "speculative_eagle_topk": 1, "speculative_num_draft_tokens": n + 1}


def exported(c: Candidate) -> tuple[list[str], dict]:
    """The exported flags (sglang/flags.txt, one argument per line) and what they must mean."""
    r = TuningResult(candidate=c, server="sglang", target="mini-target", workload="functions",
                     target_path=TARGET, draft_path=None if c.is_ngram else DRAFT)
    flags = dict(render_exports(r, ["sglang"])["sglang"])["sglang/flags.txt"].split("\n")[:-1]
    return flags, meaning(c)


def problems(result: dict, meant: dict) -> list[str]:
    """How SGLang's parse of a command line misses what we meant (empty: it arrives as meant)."""
    if "error" in result:
        return [result["error"]]
    out = [f"{flag} is not an option string of SGLang's parser (argparse took it as an abbreviation)"
           for flag in result["inexact"]]
    got = result["fields"]
    out += [f"{k}: SGLang has {got.get(k, '<no such field>')!r}, we meant {v!r}" for k, v in meant.items() if got.get(k) != v]
    if result["model_path"] != TARGET:
        out.append(f"model_path: {result['model_path']!r}")
    return out


def plant(flags: list[str], kind: str) -> list[str]:
    bad = list(flags)
    if kind == "wrong key":
        bad[bad.index("--speculative-num-draft-tokens")] = "--speculative-num-draft-token-count"
    elif kind == "truncated key":
        bad[bad.index("--speculative-num-draft-tokens")] = "--speculative-num-draft"
    elif kind == "wrong value":
        i = bad.index("--speculative-num-draft-tokens")
        bad[i + 1] = str(int(bad[i + 1]) + 1)
    return bad


PLANTS = ("wrong key", "truncated key", "wrong value")


@pytest.fixture(scope="module")
def parsed(sglang_python) -> dict:
    """Every command line parsed by SGLang in one run of its venv (the import costs seconds)."""
    cases = {}
    for name, c in CANDIDATES.items():
        flags, meant = exported(c)
        cases[(name, None)] = (flags, meant)
        cases.update({(name, kind): (plant(flags, kind), meant) for kind in PLANTS})
    argvs = [["--model-path", TARGET, *flags] for flags, _ in cases.values()]
    proc = subprocess.run([sglang_python, str(ROOT / "tests" / "support" / "sglang_args.py")], input=json.dumps(argvs),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {key: (res, meant) for (key, (_, meant)), res in zip(cases.items(), json.loads(proc.stdout))}


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_sglang_parser_reads_every_speculative_field_as_meant(parsed, name):
    result, meant = parsed[(name, None)]
    assert problems(result, meant) == []
    assert result["fields"]["speculative_algorithm"] == meant["speculative_algorithm"]
    assert set(meant) <= set(result["fields"])  # each field we write is one of SGLang's
    assert set(SglangSpeculativeArgs.model_fields) <= set(result["fields"])  # and every field our schema can write


@pytest.mark.parametrize("kind", PLANTS)
@pytest.mark.parametrize("name", list(CANDIDATES))
def test_sglang_parser_check_fails_on_a_planted_bad_key(parsed, name, kind):
    result, meant = parsed[(name, kind)]
    found = problems(result, meant)
    assert found, f"planted {kind} went unnoticed"
    if kind == "wrong key":
        assert "unrecognized arguments: --speculative-num-draft-token-count" in found[0]
    if kind == "truncated key":  # SGLang itself accepts it, and reads the value as num_draft_tokens
        assert result["fields"]["speculative_num_draft_tokens"] == meant["speculative_num_draft_tokens"]
        assert "--speculative-num-draft is not an option string" in found[0]
