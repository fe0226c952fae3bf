"""llama.cpp as a real consumer: ``export --format llamacpp`` writes GGUF files and a command line that
``llama-server`` runs as printed; its greedy outputs equal our engine's, and its draft counters equal
ours once our loop schedules as llama-server does (profiler/llamacpp_parity.py has the three reasons,
read in llama.cpp 0c1e57098's source).

Needs the build of ``scripts/setup_llamacpp.sh`` (``SPECDEC_LLAMACPP_DIR`` or the cache folder the
script prints); skipped with that reason otherwise. The server runs the exported ``launch.sh`` itself
(``llama-server`` on PATH, as a user runs it), with ``--host 127.0.0.1 --port P --metrics -np 1
--threads 1`` appended through its ``"$@"``.
"""
from __future__ import annotations

import os

import pytest
import torch

from specdec_tune.profiler.vllm_backend import SpecCounters

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

N_PREDICT = 40
PROMPTS = 3  # the workload's last prompts


@pytest.fixture(scope="module")
def models():
    from specdec_tune.engine import load_model

    return load_model("mini-target", "cpu", "float32", "auto"), load_model("mini-draft-1l", "cpu", "float32", "auto")


@pytest.fixture(scope="module")
def prompts(models):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.runs import encode_prompt

    items = load_workload("functions")[-PROMPTS:]
    return [(p.prompt, encode_prompt(models[0], p.prompt, p.id).tolist()) for p in items]


def export(tmp_path, llama, n: int, theta: float = 0.0):
    """``export --format llamacpp`` of mini-target + mini-draft-1l (GGUF files included)."""
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_exports

    result = TuningResult(candidate=Candidate("mini-draft-1l", n, theta), server="llamacpp", target="mini-target",
                          workload="functions")
    written = write_exports(result, ["llamacpp"], tmp_path)
    names = sorted(p.name for p in written["llamacpp"])
    assert names == sorted(["flags.txt", "flags-before-spec-rename.txt", "launch.sh", "gguf_sources.json",
                            "target.gguf", "draft.gguf"]), names
    return tmp_path / "llamacpp" / "launch.sh"


def serve(launch, llama):
    """The exported launch.sh, run as printed with llama-server on PATH."""
    from specdec_tune.profiler.llamacpp_server import LlamaServer

    env = {**os.environ, "PATH": f"{llama.server.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return LlamaServer(["sh", str(launch), "--threads", "1"], env=env, extra=("--metrics", "-np", "1"))


def ours(models, prompts, n: int, drafter_of) -> tuple[SpecCounters, list[list[int]]]:
    from specdec_tune.profiler.llamacpp_parity import engine_like_llamacpp

    target, _ = models
    total, outs = SpecCounters(), []
    for _, ids in prompts:
        with torch.inference_mode():
            run = engine_like_llamacpp(target.model, drafter_of(len(ids) + N_PREDICT + n + 2), torch.tensor(ids),
                                       N_PREDICT, n)
        total = total + run.counters(n)
        outs.append(run.token_ids)
    return total, outs


def measure(server, prompts) -> tuple[SpecCounters, list[list[int]], list]:
    before = server.counters()
    done = [server.complete(ids, N_PREDICT) for _, ids in prompts]
    after = server.counters()
    delta = SpecCounters(after.drafts - before.drafts, after.draft_tokens - before.draft_tokens,
                         after.accepted - before.accepted,
                         tuple(a - b for a, b in zip(after.accepted_per_pos, before.padded(len(after.accepted_per_pos)))))
    return delta, [c.token_ids for c in done], done


def test_llamacpp_runs_the_export_with_our_outputs_and_counts(tmp_path, llamacpp_build, models, prompts):
    from specdec_tune.engine import build_drafter

    n = 4
    launch = export(tmp_path, llamacpp_build, n)
    with serve(launch, llamacpp_build) as server:
        # The converted vocabulary splits text as our tokenizer does (pre-tokenizer 'gpt-2').
        assert [server.tokenize(text) for text, _ in prompts] == [ids for _, ids in prompts]
        got, outs, done = measure(server, prompts)
    assert all(c.settings.get("speculative.types", "").endswith("draft-simple") for c in done)
    draft = models[1].model
    want, want_outs = ours(models, prompts, n, lambda m: build_drafter(draft, max_len=m))
    assert outs == want_outs  # greedy: llama-server speculative == plain greedy decoding of our engine
    assert got.drafts > 0 and len(got.accepted_per_pos) == n  # the exported N is the server's n_max
    assert sum(c.draft_tokens for c in done) == got.draft_tokens
    assert got == want
    # Power: our own loop (first token drafted, drafts up to the whole budget) counts other steps.
    from specdec_tune.engine import DecodeConfig, speculative

    plain = SpecCounters()
    for _, ids in prompts:
        with torch.inference_mode():
            res = speculative(models[0].model, build_drafter(draft, max_len=len(ids) + N_PREDICT + n + 2),
                              torch.tensor(ids), DecodeConfig(N_PREDICT, num_speculative_tokens=n, eos_token_id=None))
        plain = plain + SpecCounters(*_counts(res.cycles, n))
    assert plain != got


def _counts(cycles, n):
    from specdec_tune.profiler.vllm_backend import counters_from_steps

    c = counters_from_steps([x.accepted for x in cycles], [x.drafted for x in cycles], n)
    return c.drafts, c.draft_tokens, c.accepted, c.accepted_per_pos


def test_llamacpp_p_min_is_top_k_renormalized(tmp_path, llamacpp_build, models, prompts):
    """θ > 0: llama-server's counts equal our loop with draft-simple's rule (top-k 10 renormalized
    probability, :class:`LlamacppDrafter`) and differ from our rule 'before' (full-vocabulary
    probability) at the same θ: the exported θ drafts longer in llama.cpp than the engine predicts."""
    from specdec_tune.engine import build_drafter
    from specdec_tune.profiler.llamacpp_parity import LlamacppDrafter

    n, theta = 6, 0.5
    launch = export(tmp_path, llamacpp_build, n, theta)
    assert "--spec-draft-p-min 0.5" in launch.read_text()
    with serve(launch, llamacpp_build) as server:
        got, outs, _ = measure(server, prompts)
    draft = models[1].model
    want, want_outs = ours(models, prompts, n, lambda m: LlamacppDrafter(draft, m, p_min=theta))
    assert outs == want_outs and got == want
    engine_rule, _ = ours(models, prompts, n, lambda m: build_drafter(draft, max_len=m, threshold=theta))
    assert engine_rule != got and engine_rule.draft_tokens < got.draft_tokens
