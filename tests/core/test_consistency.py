"""The consistency rule for greedy outputs (specdec_tune.core.consistency): exact identity in float32, a
near-tie of the reference's logits allowed in bfloat16/float16; on the real engine in bf16 on the CPU
with the bundled models, with a deliberately wrong verifier that the rule must still flag."""
from __future__ import annotations

import json

import pytest
import torch

from specdec_tune.cli import main
from specdec_tune.core.consistency import TOLERANCE_ULPS, first_difference, judge, overall, tolerance, ulp
from specdec_tune.engine import DecodeConfig, load_model
from specdec_tune.engine import verifiers as verifiers_module
from specdec_tune.engine.workloads import load_workload
from specdec_tune.profiler.logit_margins import check_outputs, rounding_spread
from specdec_tune.profiler.runs import DraftSpec, decode_once, encode_prompt
from specdec_tune.tuner.regress._compare import _correctness_cell


def test_ulp_follows_the_significand():
    assert ulp(10.0, "bfloat16") == 0.0625 and ulp(-10.0, "bfloat16") == 0.0625  # 2^(3-7)
    assert ulp(1.0, "bfloat16") == 2**-7 and ulp(1.0, "float16") == 2**-10 and ulp(1.0, "float32") == 2**-23
    assert tolerance("float32", 10.0) == 0.0 and tolerance("torch.bfloat16", 10.0) == TOLERANCE_ULPS * 0.0625
    with pytest.raises(ValueError, match="int8"):
        tolerance("int8", 1.0)


def test_rule_on_pairs_of_outputs():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None and first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2
    assert judge([1, 2, 3], [1, 2, 3], "float32").status == "identical"
    assert judge([1, 2, 3], [1, 5, 3], "float32", margin=0.0, top_logit=10.0).status == "differ"  # exact in fp32
    tol = tolerance("bfloat16", 10.0)
    tie = judge([1, 2, 3], [1, 5, 7], "bfloat16", margin=tol, top_logit=10.0)
    assert tie.status == "near-tie" and tie.position == 1 and "near-tie" in tie.reason
    assert judge([1, 2, 3], [1, 5, 7], "bfloat16", margin=-tol / 2, top_logit=10.0).status == "near-tie"
    assert judge([1, 2, 3], [1, 5, 7], "bfloat16", margin=tol * 1.01, top_logit=10.0).status == "differ"
    assert judge([1, 2, 3], [1, 5, 7], "bfloat16").status == "differ"  # no margin measured: not excused
    assert judge([1, 2], [1, 2, 3], "bfloat16", margin=0.0, top_logit=1.0).status == "differ"  # lengths
    assert overall(["identical", "near-tie"]) == "near-tie" and overall(["near-tie", "differ"]) == "differ"
    assert overall([]) == "identical"


def _sample(pid, plain, out, dtype, margin=None, top=None):
    parted = None if plain == out else {"position": first_difference(plain, out), "margin": margin, "top_logit": top}
    return {"prompt_id": pid, "plain_token_ids": plain, "token_ids": out, "dtype": dtype, "parted": parted}


def test_regress_correctness_cell_applies_the_rule():
    tie = tolerance("bfloat16", 12.0) / 2
    ok = _correctness_cell("b", [_sample("p0", [1, 2], [1, 2], "bfloat16"),
                                 _sample("p1", [1, 2], [1, 9], "bfloat16", tie, 12.0)], 0.0)
    assert ok.verdict == "ok" and ok.details["near_ties"] == {"p1": 1} and ok.details["parted_share"] == 0.5
    assert ok.details["verdict"] == "near-tie" and ok.details["dtype"] == "bfloat16"
    bad = _correctness_cell("b", [_sample("p1", [1, 2], [1, 9], "bfloat16", 3.0, 12.0)], 0.0)
    assert bad.verdict == "fail" and bad.details["differing_prompts"] == ["p1"]
    fp32 = _correctness_cell("b", [_sample("p1", [1, 2], [1, 9], "float32", 0.0, 12.0)], 0.0)
    assert fp32.verdict == "fail"
    legacy = {"prompt_id": "p", "plain_token_ids": [1, 2], "token_ids": [1, 3]}  # stored before the rule
    assert _correctness_cell("b", [legacy], 0.0).verdict == "fail"


@pytest.fixture(scope="module")
def bf16_pair():
    return load_model("mini-target", "cpu", "bf16"), load_model("mini-draft-1l", "cpu", "bf16")


def _accept_all(draft_tokens, target_logits):
    """PLANTED BUG: accepts every drafted token whatever the target says."""
    length = draft_tokens.shape[0]
    return torch.stack([torch.tensor(length), target_logits[length].argmax()])


def _accept_one_more(draft_tokens, target_logits):
    """PLANTED BUG: accepts one token past the first mismatch."""
    target_ids = target_logits.argmax(dim=-1)
    length = draft_tokens.shape[0]
    good = int((draft_tokens == target_ids[:length]).to(torch.int64).cumprod(0).sum())
    n = min(good + 1, length)
    return torch.stack([torch.tensor(n), target_ids[n]])


@pytest.mark.slow
@pytest.mark.parametrize("verifier", ["correct", "PLANTED: accepts every draft token", "PLANTED: one token too many"])
def test_bf16_speculative_against_target_only_with_the_rule(bf16_pair, monkeypatch, verifier):
    """bf16 on the CPU, bundled models, 8 prompts × 32 tokens: the correct verifier gives no `differ`
    (identical or near-ties only); either wrong verifier flags the run, with at least half the prompts
    `differ` (where the distilled draft is wrong the target is often nearly tied, so the first wrong
    token of some prompts falls within the tolerance: measured 5 of 8 `differ` for accept-all)."""
    target, draft = bf16_pair
    if verifier != "correct":
        monkeypatch.setattr(verifiers_module, "greedy_accept",
                            _accept_all if "every" in verifier else _accept_one_more)
    cfg = DecodeConfig(max_new_tokens=32, num_speculative_tokens=4, eos_token_id=target.eos_token_id)
    statuses = []
    torch.set_num_threads(1)
    for p in load_workload("functions")[:8]:
        ids = encode_prompt(target, p.prompt, p.id)
        ref = decode_once(target, DraftSpec("none"), ids, cfg).token_ids
        out = decode_once(target, DraftSpec("model", draft), ids, cfg).token_ids
        statuses.append(check_outputs(target, ids, ref, out).status)
    if verifier == "correct":
        assert "differ" not in statuses, statuses
    else:
        assert overall(statuses) == "differ" and statuses.count("differ") >= 4, statuses


def test_rounding_spread_is_zero_in_float32_and_moves_in_bf16(tiny_model_dirs):
    """The measurement behind the tolerance: k-token forwards vs one-token forwards. In float64 on the
    tiny model the logits agree to float64 rounding; in bf16 some positions move by whole ulps."""
    exact = load_model(tiny_model_dirs["target"], "cpu", "float32")
    exact.model.double()
    exact.dtype = torch.float64
    ids = encode_prompt(exact, "def add(a, b):")
    rows = rounding_spread(exact, ids, 12, [3, 0])
    assert len(rows) == 24 and max(r.max_abs for r in rows) < 1e-9
    bf16 = load_model("mini-target", "cpu", "bf16")
    rows = rounding_spread(bf16, encode_prompt(bf16, "def fibonacci(n):"), 24, [5])
    assert max(r.max_abs for r in rows) > 0  # bf16 rounds the two paths differently somewhere


@pytest.mark.slow
def test_bench_in_bf16_reports_the_consistency_verdict(tmp_path, capsys):
    prompts = tmp_path / "w.jsonl"
    prompts.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n"
                               for i, p in enumerate(["def add(a, b):", "class Point:", "import os\n"])))
    code = main(["bench", "--target", "mini-target", "--draft", "mini-draft-1l", "-N", "4", "--workload", str(prompts),
                 "--max-new-tokens", "24", "--device", "cpu", "--dtype", "bf16", "--threads", "1", "--json"])
    res = json.loads(capsys.readouterr().out)
    c = res["consistency"]
    assert code == 0 and res["dtype"] == "bfloat16" and c["dtype"] == "bfloat16" and c["reference"] == "hf_generate"
    assert c["verdict"] in ("identical", "near-tie") and c["prompts_parted"] == len({p["prompt"] for p in c["parted"]})
    assert all(p["status"] == "near-tie" and p["margin"] is not None for p in c["parted"])


def _bf16_suite(path, workload):
    path.write_text(f"""
name = "bf16"
threads = 1
[[benchmark]]
name = "bf16-1l"
target = "mini-target"
draft = "mini-draft-1l"
workload = "{workload}"
prompts = 4
max_new_tokens = 24
num_speculative_tokens = 4
repeats = 1
device = "cpu"
dtype = "bf16"
""")
    return str(path)


@pytest.mark.slow
@pytest.mark.parametrize("verifier", ["correct", "PLANTED: accepts every draft token"])
def test_regress_in_bf16_flags_a_wrong_verifier(tmp_path, capsys, monkeypatch, verifier):
    """`regress` (what the nightly workflow runs) in bf16 on the CPU: the correct engine passes the
    correctness cell (no baseline yet: exit 3); a wrong verifier fails it (exit 1)."""
    if verifier != "correct":
        monkeypatch.setattr(verifiers_module, "greedy_accept", _accept_all)
    code = main(["regress", "--suite", _bf16_suite(tmp_path / "s.toml", "functions"), "--db",
                 f"sqlite:///{tmp_path / 'r.db'}", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cell = next(c for c in report["cells"] if c["metric"] == "correctness")
    assert cell["details"]["dtype"] == "bfloat16"
    if verifier == "correct":
        assert code == 3 and cell["verdict"] == "ok", cell
    else:
        assert code == 1 and cell["verdict"] == "fail" and cell["details"]["differing_prompts"]


def test_the_nightly_workflow_runs_regress_and_fails_on_its_exit_1():
    import yaml

    from tests.conftest import ROOT

    flow = yaml.safe_load((ROOT / ".github/workflows/nightly.yml").read_text())
    job = flow["jobs"]["regress"]
    assert (ROOT / job["env"]["SUITE"]).is_file()
    run = next(step["run"] for step in job["steps"] if "specdec-tune regress" in step.get("run", ""))
    assert "0|3) exit 0" in run and "*) exit $code" in run  # 1 (regression or correctness) fails the job
