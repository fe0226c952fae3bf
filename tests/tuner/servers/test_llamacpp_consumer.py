"""llama.cpp as a real consumer: ``export --format llamacpp`` writes GGUF files and a command line that
``llama-server`` runs as printed; its greedy outputs equal our engine's, and its draft counters equal
ours once our loop schedules as llama-server does (profiler/backends/_llamacpp_parity.py has the three reasons,
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
    from specdec_tune.profiler.backends._llamacpp_server import LlamaServer

    env = {**os.environ, "PATH": f"{llama.server.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return LlamaServer(["sh", str(launch), "--threads", "1"], env=env, extra=("--metrics", "-np", "1"))


def parity(models, prompts, served, n: int, theta: float, schedule: str = "llama-server"):
    """Each prompt compared (profiler/backends/_llamacpp_parity.py): equal, or different only at a float32 tie.
    ``schedule="own loop"`` is the planted bug: our ``speculative()`` as is (first token drafted,
    drafts up to the whole budget), which llama-server's counts must not match."""
    from specdec_tune.engine import DecodeConfig, speculative
    from specdec_tune.profiler.backends._llamacpp_parity import LlamacppDrafter, ParityRun, compare_prompt, engine_like_llamacpp

    target, draft = models
    done, counts = served
    out = []
    for (_, ids), completion, server in zip(prompts, done, counts):
        drafter = LlamacppDrafter(draft.model, len(ids) + N_PREDICT + n + 2, p_min=theta)
        with torch.inference_mode():
            if schedule == "own loop":
                res = speculative(target.model, drafter, torch.tensor(ids),
                                  DecodeConfig(N_PREDICT, num_speculative_tokens=n, eos_token_id=None))
                run = ParityRun(res.token_ids, list(res.cycles))
            else:
                run = engine_like_llamacpp(target.model, drafter, torch.tensor(ids), N_PREDICT, n)
        out.append(compare_prompt(target.model, ids, completion.token_ids, server, run, drafter, n))
    return out


def serve_and_count(tmp_path, llama, prompts, n: int, theta: float = 0.0):
    from specdec_tune.profiler.backends._llamacpp_server import completions_with_counters

    launch = export(tmp_path, llama, n, theta)
    with serve(launch, llama) as server:
        # The converted vocabulary splits text as our tokenizer does (pre-tokenizer 'gpt-2').
        tokenized = [server.tokenize(text) for text, _ in prompts]
        served = completions_with_counters(server, [ids for _, ids in prompts], N_PREDICT)
    return launch, tokenized, served


def test_llamacpp_runs_the_export_with_our_outputs_and_counts(tmp_path, llamacpp_build, models, prompts):
    n = 4
    _, tokenized, served = serve_and_count(tmp_path, llamacpp_build, prompts, n)
    assert tokenized == [ids for _, ids in prompts]
    done, counts = served
    assert all(c.settings.get("speculative.types", "").endswith("draft-simple") for c in done)
    assert all(c.draft_tokens == k.draft_tokens for c, k in zip(done, counts))  # response timings == /metrics
    assert sum(k.drafts for k in counts) > 0 and all(len(k.accepted_per_pos) in (0, n) for k in counts)  # N = n_max
    results = parity(models, prompts, served, n, 0.0)
    assert all(r.explained for r in results), [r.verdict for r in results]
    assert sum(r.equal for r in results) >= len(results) - 1, [r.verdict for r in results]
    # Power: our own loop counts other steps; no float32 tie explains that.
    planted = parity(models, prompts, served, n, 0.0, schedule="own loop")
    assert not all(r.explained for r in planted), [r.verdict for r in planted]


def test_llamacpp_p_min_is_top_k_renormalized(tmp_path, llamacpp_build, models, prompts):
    """θ > 0: llama-server's counts equal our loop with draft-simple's rule (top-k 10 renormalized
    probability, :class:`LlamacppDrafter`) and differ from our rule 'before' (full-vocabulary
    probability) at the same θ: the exported θ drafts longer in llama.cpp than the engine predicts."""
    from specdec_tune.engine import build_drafter
    from specdec_tune.profiler.backends._llamacpp_parity import engine_like_llamacpp

    n, theta = 6, 0.5
    launch, _, served = serve_and_count(tmp_path, llamacpp_build, prompts, n, theta)
    assert "--spec-draft-p-min 0.5" in launch.read_text()
    results = parity(models, prompts, served, n, theta)
    assert all(r.explained for r in results) and sum(r.equal for r in results) >= len(results) - 1
    # Our rule 'before' at the same θ stops earlier: fewer draft tokens than llama-server drafted.
    target, draft = models
    ours_tokens = 0
    for _, ids in prompts:
        with torch.inference_mode():
            run = engine_like_llamacpp(target.model, build_drafter(draft.model, max_len=len(ids) + N_PREDICT + n + 2,
                                                                   threshold=theta), torch.tensor(ids), N_PREDICT, n)
        ours_tokens += run.counters(n).draft_tokens
    assert ours_tokens < sum(k.draft_tokens for k in served[1])
