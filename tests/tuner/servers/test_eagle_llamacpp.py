"""llama.cpp runs the bundled EAGLE-3 head from ``export --format llamacpp`` (issue 39): ``llama-server``
with ``--spec-type draft-eagle3`` and the head's GGUF (converted with ``--target-model-dir``), started by
the exported ``launch.sh`` as printed. Greedy outputs equal plain decoding's, and its draft counters equal
our engine's, step schedule aligned as for draft models (``profiler/backends/_llamacpp_parity.py``): at
``--spec-draft-p-min 0`` draft-eagle3 drafts the head's argmax chain, our chain drafter.

Needs the build of ``scripts/setup_llamacpp.sh`` (skipped with that reason otherwise; the export itself is
refused, naming the version, by a build without ``draft-eagle3``: ``tests/tuner/servers/test_eagle.py``).
Power: our loop run as is (first token drafted, drafts up to the whole budget) counts other steps, and a
head whose high feature layer is one off drafts other tokens; neither matches llama-server's counts.
"""
from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.llamacpp, pytest.mark.slow]

N_PREDICT = 40
N = 3


@pytest.fixture(scope="module")
def models():
    from specdec_tune.engine import load_model

    head = load_model("mini-eagle3", "cpu", "float32", "auto")
    assert head.forward == "eagle3"
    return load_model("mini-target", "cpu", "float32", "auto"), head


@pytest.fixture(scope="module")
def served(tmp_path_factory, llamacpp_build, models):
    from specdec_tune.engine.workloads import load_workload
    from specdec_tune.profiler.backends._llamacpp_server import LlamaServer, completions_with_counters
    from specdec_tune.profiler.runs import encode_prompt
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_exports

    tmp = tmp_path_factory.mktemp("eagle-llamacpp")
    result = TuningResult(candidate=Candidate("mini-eagle3", N), server="llamacpp", target="mini-target",
                          workload="functions")
    write_exports(result, ["llamacpp"], tmp)
    launch = tmp / "llamacpp" / "launch.sh"
    assert "--spec-type draft-eagle3" in launch.read_text()
    prompts = [encode_prompt(models[0], p.prompt, p.id).tolist() for p in load_workload("functions")[-3:]]
    env = {**os.environ, "PATH": f"{llamacpp_build.server.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    with LlamaServer(["sh", str(launch), "--threads", "1"], env=env, extra=("--metrics", "-np", "1")) as server:
        done, counts = completions_with_counters(server, prompts, N_PREDICT)
    return prompts, done, counts


def ours(models, prompts, schedule: str = "llama-server", layers: tuple[int, ...] | None = None):
    from specdec_tune.engine import DecodeConfig, build_drafter, speculative
    from specdec_tune.profiler.backends._llamacpp_parity import engine_like_llamacpp
    from specdec_tune.profiler.backends._vllm import counters_from_steps

    target, head = models
    out = []
    for ids in prompts:
        drafter = build_drafter(head.model, max_len=len(ids) + N_PREDICT + N + 2)
        if layers is not None:  # the planted bug: other target layers than the head was trained on
            drafter.features.layer_ids = layers
        with torch.inference_mode():
            if schedule == "own loop":  # the planted bug: our loop as is
                res = speculative(target.model, drafter, torch.tensor(ids),
                                  DecodeConfig(N_PREDICT, num_speculative_tokens=N, eos_token_id=None))
                cycles = res.cycles
            else:
                cycles = engine_like_llamacpp(target.model, drafter, torch.tensor(ids), N_PREDICT, N).cycles
        out.append(counters_from_steps([c.accepted for c in cycles], [c.drafted for c in cycles], N))
    return out


def test_llamacpp_runs_the_exported_head_with_our_outputs_and_counts(served, models):
    from specdec_tune.engine import DecodeConfig, autoregressive

    prompts, done, counts = served
    assert all(c.settings.get("speculative.types", "").endswith("draft-eagle3") for c in done)
    for ids, completion in zip(prompts, done):
        with torch.inference_mode():
            plain = autoregressive(models[0].model, torch.tensor(ids), DecodeConfig(N_PREDICT, eos_token_id=None))
        assert completion.token_ids == plain.token_ids
    assert all(k.accepted_per_pos[N - 1] > 0 for k in counts), counts  # every position is exercised
    assert ours(models, prompts) == list(counts)
    assert ours(models, prompts, schedule="own loop") != list(counts)  # power: the schedule matters
    assert ours(models, prompts, layers=(2, 8, 12)) != list(counts)  # power: the features matter (not 2, 8, 13)
