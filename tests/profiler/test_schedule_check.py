"""Speculation turned off by a per-batch-size schedule must come back at full acceptance when the load
falls (TensorRT-LLM #16888): the engine's ``n_for_cycle``, the profiler's check, and a planted stale
drafter that the check catches."""
from __future__ import annotations


import pytest
import torch

from specdec_tune.engine import DecodeConfig, autoregressive
from specdec_tune.engine.drafters import ModelDrafter
from specdec_tune.profiler import schedule_check as sc
from tests.core.test_latency import _loaded
from tests.support.tiny import tiny_llama

VOCAB = 48


@pytest.fixture(scope="module")
def pair():
    """A target and a close draft (the target with a slightly perturbed head): high acceptance."""
    target = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    draft = tiny_llama(vocab=VOCAB, layers=2, seed=0, sharpness=4.0)
    with torch.no_grad():
        draft.lm_head.weight.add_(0.1 * torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(3),
                                                    dtype=torch.float64))
    return _loaded(target, "target"), _loaded(draft, "draft")


def test_schedule_lookup_and_load_plan():
    schedule = {1: 4, 4: 2, 16: 0}
    assert [sc.schedule_n(schedule, b) for b in (1, 3, 4, 15, 16, 64)] == [4, 4, 2, 2, 0, 0]
    plan = sc.load_plan(schedule, [1, 64, 1], 3)
    assert [plan(i) for i in range(10)] == [4, 4, 4, 0, 0, 0, 4, 4, 4, 4]


def test_off_cycles_are_plain_steps_and_outputs_stay_exact(pair):
    target, draft = pair
    ids = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(5))
    config = DecodeConfig(max_new_tokens=40, num_speculative_tokens=4)
    plan = sc.load_plan({1: 4, 16: 0}, [1, 64, 1], 4)
    result = sc._decode(target, draft, ids, config, plan)
    with torch.inference_mode():
        plain = autoregressive(target.model, ids, config).token_ids
    assert result.token_ids == plain  # greedy: speculation on or off, the same tokens
    off = [c for i, c in enumerate(result.cycles) if plan(i) == 0]
    assert off and all(c.drafted == 0 and c.emitted == 1 and c.draft_forwards == 0 for c in off)


def test_acceptance_comes_back_after_speculation_was_off(pair):
    target, draft = pair
    ids = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(5))
    check = sc.resume_check(target, draft, ids, DecodeConfig(max_new_tokens=60, num_speculative_tokens=4),
                            sc.load_plan({1: 4, 16: 0}, [1, 64, 1], 4))
    assert check.resume_cycle == 8 and check.off_cycles == 4 and check.drafted > 10
    assert check.fresh_rate > 0.5 and check.rate == pytest.approx(check.fresh_rate, abs=0.05)


class _Stale(ModelDrafter):
    """#16888 planted: while drafting was skipped, positions were claimed in the draft cache but never
    written; on resumption the drafter attends to those stale rows. The cache's buffer is
    ``torch.empty``, so the rows are filled with seeded noise, as stale entries of other tokens would be:
    left uninitialised, what the drafter reads (and whether the check can see it) depends on whatever
    memory the allocator handed out, and the test was flaky."""

    def propose(self, context, max_tokens):
        seen = self.cache.get_seq_length()
        missed = context.shape[0] - seen
        if seen > 0 and missed > 2:  # not the prompt's prefill: tokens missed while drafting was off
            noise = torch.Generator().manual_seed(seen)
            for layer in self.cache.layers:
                start, layer.length = layer.length, layer.length + missed - 1  # claimed, not written
                for buffer in (layer._k, layer._v):
                    rows = buffer[:, :, start:layer.length]
                    rows.copy_(4 * torch.randn(rows.shape, generator=noise, dtype=rows.dtype))
        return super().propose(context, max_tokens)


def test_the_check_catches_a_drafter_that_does_not_catch_up(pair, monkeypatch):
    target, draft = pair
    real = sc.build_drafter

    def stale(model, **kw):
        d = real(model, **kw)
        return _Stale(model, kw["max_len"]) if isinstance(d, ModelDrafter) else d

    monkeypatch.setattr(sc, "build_drafter", stale)
    ids = torch.randint(0, VOCAB, (6,), generator=torch.Generator().manual_seed(5))
    check = sc.resume_check(target, draft, ids, DecodeConfig(max_new_tokens=60, num_speculative_tokens=4),
                            sc.load_plan({1: 4, 16: 0}, [1, 64, 1], 4))
    assert check.rate < 0.8 * check.fresh_rate  # acceptance collapsed after resumption: caught


# --------------------------------------------------------------------------- in the regression suite


def _suite(path, workload, target, draft, export_dir) -> str:
    path.write_text(f"""
name = "schedule"
threads = 1
[[benchmark]]
name = "resume"
target = "{target}"
workload = "{workload}"
prompts = 3
max_new_tokens = 40
repeats = 1
export = "{export_dir}"
load = [1, 64, 1]
load_cycles = 3
""")
    return str(path)


def _export(folder, draft: str):
    import json

    (folder / "vllm").mkdir(parents=True)
    (folder / "vllm" / "speculative_config.json").write_text(json.dumps({
        "method": "draft_model", "model": draft, "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 15, 4], [16, 64, 0]]}))
    return folder


@pytest.mark.parametrize("stale", [False, True], ids=["catches up", "planted stale drafter"])
def test_regress_checks_an_exported_schedule_under_a_load_trace(tmp_path, capsys, tiny_model_dirs, monkeypatch, stale):
    import json

    from specdec_tune.cli import main

    workload = tmp_path / "w.jsonl"
    workload.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in
                                enumerate(["def add(a, b):", "class Point:", "for i in range(10):"])))
    target = tiny_model_dirs["target"]
    export = _export(tmp_path / "tuned", target)  # the target as its own draft: acceptance 1 when caught up
    if stale:
        monkeypatch.setattr(sc, "build_drafter", lambda model, **kw: _Stale(model, kw["max_len"]))
    code = main(["regress", "--suite", _suite(tmp_path / "s.toml", workload, target, target, export),
                 "--db", f"sqlite:///{tmp_path / 'r.db'}", "--json"])
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    cell = next(c for c in report["cells"] if c["metric"] == "resume_acceptance")
    if stale:
        assert cell["verdict"] == "fail" and code == 1, cell
        assert cell["details"]["acceptance_after_resume"] < 0.9 * cell["details"]["fresh_acceptance"]
    else:
        assert cell["verdict"] == "ok" and cell["details"]["fresh_acceptance"] > 0.9 and code == 3  # first run: baseline
