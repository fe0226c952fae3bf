"""`specdec-tune tune --drafts ...,suffix` end to end on tiny saved models: the search covers suffix decoding's
four vLLM fields and N, only vLLM's space holds it, and every server's file is written (vLLM's method suffix
where its pick is suffix decoding, the others their own best)."""
from __future__ import annotations

import json

import optuna
import pytest

from specdec_tune.cli import main
from specdec_tune.tuner.model import ServerDecision
from specdec_tune.tuner.search import open_storage

FIELDS = ("suffix_max_tree_depth", "suffix_max_cached_requests", "suffix_max_spec_factor", "suffix_min_token_prob")


@pytest.mark.slow
def test_tune_searches_and_exports_suffix_decoding(tiny_model_dirs, tmp_path, tune_flags, capsys):
    # repetitive traffic: the second half of the prompts repeats the first
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)"] * 2
    workload = tmp_path / "rep.jsonl"
    workload.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    code = main(["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram,suffix",
                 "--workload", str(workload), "--db", f"sqlite:///{tmp_path / 'r.db'}", *tune_flags, "--server", "any",
                 "--trials", "40", "--json", "--export", str(tmp_path / "out"), "--formats", "all"])
    out, err = capsys.readouterr()
    assert code == 0, err
    obj = json.loads(out.strip().splitlines()[-1])
    study = optuna.load_study(study_name=obj["study"], storage=open_storage(obj["storage"]))
    tried = [t.params for t in study.trials if t.params.get("drafter") == "suffix"]
    assert tried, [t.params for t in study.trials]
    for field in FIELDS:  # every field is a searched parameter, and the search moved it
        assert len({p[field] for p in tried}) > 1, field
    decided = {s: ServerDecision.from_dict(d) for s, d in obj["best_per_server"].items()}
    assert all(not d.candidate.is_suffix for s, d in decided.items() if s != "vllm")
    assert set(decided) == {"vllm", "sglang", "trtllm", "llamacpp", "hf"}
    assert {"vllm", "sglang", "trtllm", "llamacpp"} <= {p.split("/")[-2] for p in obj["exports"]}  # hf: plain = no file
    vllm = decided["vllm"]
    cfg = json.loads((tmp_path / "out" / "vllm" / "speculative_config.json").read_text()) if vllm.speculates else {}
    assert (cfg.get("method") == "suffix") == (vllm.speculates and vllm.candidate.is_suffix)
