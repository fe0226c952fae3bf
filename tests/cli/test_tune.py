"""`specdec-tune tune` end to end on tiny saved models: the --json contract, resume, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdec_tune.cli import main
from specdec_tune.db import list_measured, list_runs, open_database
from specdec_tune.tuner.model import Candidate, ServerDecision
from tests.support.readme_check import mismatches, read_files, read_readme, readme_section

KEYS = ("drafter", "num_speculative_tokens", "threshold", "schedule", "server", "measured_tokens_per_s",
        "predicted_tokens_per_s", "baseline_tokens_per_s", "speedup", "speedup_ci", "heldout", "study", "exports")


def run(args, capsys):
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune_cli")
    path = root / "w.jsonl"
    prompts = ["def add(a, b):", "class Point:", "for i in range(10):", "print(i, i * i)", "def sub(a, b):",
               "x = [i for i in range(3)]", "return a + b", "self.x = x"]
    path.write_text("".join(json.dumps({"id": str(i), "prompt": p}) + "\n" for i, p in enumerate(prompts)))
    return str(path)


def _args(tiny_model_dirs, workload, tmp_path, tune_flags, *extra):
    return ["tune", "--target", tiny_model_dirs["target"], "--drafts", f"{tiny_model_dirs['draft']},ngram",
            "--workload", workload, "--db", f"sqlite:///{tmp_path / 'r.db'}", *tune_flags, *extra]


@pytest.mark.slow
def test_tune_json_contract_resume_and_export(tiny_model_dirs, workload, tmp_path, tune_flags, capsys):
    import optuna

    from specdec_tune.tuner.model import Evaluator, TuningResult
    from specdec_tune.tuner.search import best_per_server, open_storage

    # --formats all: each server's file carries its own best (a measured winner of the whole space, such as a
    # heuristic schedule under load, may be one vLLM cannot run; --formats vllm would then refuse)
    args = _args(tiny_model_dirs, workload, tmp_path, tune_flags, "--server", "any", "--trials", "3", "--json",
                 "--export", str(tmp_path / "out"), "--formats", "all")
    code, out, err = run(args, capsys)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 1
    obj = json.loads(lines[0])
    for key in KEYS:
        assert key in obj, key
    assert obj["server"] == "any" and set(obj["best_per_server"]) == {"vllm", "sglang", "trtllm", "llamacpp", "hf"}
    assert obj["heldout"] is True and obj["profiled"] is True and obj["completed_trials"] == 3
    assert obj["measured_tokens_per_s"] > 0 and obj["baseline_tokens_per_s"] > 0
    assert obj["speedup"] == pytest.approx(obj["measured_tokens_per_s"] / obj["baseline_tokens_per_s"])
    lo, hi = obj["speedup_ci"]
    assert lo <= obj["speedup"] <= hi
    assert obj["exports"] and all(Path(p).is_file() and Path(p).is_relative_to(tmp_path / "out") for p in obj["exports"])
    assert any(p.endswith("README.md") for p in obj["exports"])
    assert set(obj["per_batch_size"]) == {"1", "2"}
    # the winner is the best *measured* (speedup pass by pass) of the confirmation set: the search's top two,
    # every server's best predicted inside its own space, plain decoding
    measured = {r["label"]: r["measured_speedup"] for r in obj["confirmation"]}
    assert "plain decoding" in measured and len(measured) >= 3
    winner = next(r for r in obj["confirmation"] if r["winner"])
    assert winner["measured_speedup"] == max(measured.values())
    storage = open_storage(obj["storage"])
    study = optuna.load_study(study_name=obj["study"], storage=storage)
    bests = best_per_server(Evaluator(open_database(f"sqlite:///{tmp_path / 'r.db'}"), obj["run_id"]),
                            [tiny_model_dirs["draft"]], 4, True)  # each server's best, predicted independently
    _check_servers(obj, bests, tmp_path / "out")
    # the result is stored in the study for export --study and the dashboard
    result = TuningResult.from_dict(study.user_attrs["result"])
    assert result.candidate.drafter == obj["drafter"] and result.heldout
    db = open_database(f"sqlite:///{tmp_path / 'r.db'}")
    assert len(list_runs(db)) == 1 and list_measured(db)

    # the same command resumes: the profile is reused, the study grows to the new budget
    code, out, err = run([*args[:args.index("--trials")], "--trials", "20", *args[args.index("--trials") + 2:]], capsys)
    assert code == 0, err
    again = json.loads(out)
    assert again["profiled"] is False and again["completed_trials"] == 20 and again["new_trials"] >= 17
    assert again["study"] == obj["study"] and len(list_runs(db)) == 1

    # restricted to vLLM: no θ, constant schedule, in the winner and in every measured candidate
    code, out, err = run([*args[:args.index("--server")], "--server", "vllm", "--trials", "50", "--json"], capsys)
    assert code == 0, err
    v = json.loads(out)
    assert v["server"] == "vllm" and v["threshold"] == 0 and v["schedule"] == "constant" and v["study"] != obj["study"]
    assert all(r["threshold"] == 0 and "vllm" in r["servers"] for r in v["confirmation"])
    assert v["sampler"] == "bruteforce" and set(v["best_per_server"]) == {"vllm"}


def _check_servers(obj: dict, bests: dict, out: Path) -> None:
    """Every server: its best predicted inside its own space was measured on the tuning prompts (whether the
    study visited it or not: ``tests/tuner/search/test_optuna.py`` shows a case it did not); its pick was measured
    held out against plain decoding with a CI; its file carries the pick only when the CI's lower bound is
    >= 1; the README states the files' configuration and numbers."""

    confirmed = {Candidate.from_dict(r) for r in obj["confirmation"]}
    assert {b.candidate for b in bests.values()} <= confirmed
    files, text = read_files(out), (out / "README.md").read_text()
    _check_not_written(obj, out, text)
    for srv, entry in obj["best_per_server"].items():
        d = ServerDecision.from_dict(entry)
        if srv in obj["not_written"]:
            continue
        assert d.server == srv and d.heldout and d.speedup_ci is not None and d.baseline_tokens_per_s > 0
        assert d.candidate in confirmed and srv in next(r["picked_by"] for r in obj["confirmation"]
                                                        if Candidate.from_dict(r) == d.candidate)
        assert d.speculates == (not d.candidate.is_plain and d.speedup_ci[0] >= 1.0), d
        plain_file = srv not in files or files[srv]["plain"]
        assert plain_file == (not d.speculates) == read_readme(text, srv)["plain"]
        assert entry["file_carries"] == d.shipped.label()
        if not d.candidate.is_plain:
            lo, hi = d.speedup_ci
            assert f"{d.speedup:.2f}× over plain decoding, measured on held-out prompts (95% CI {lo:.2f}–{hi:.2f})" \
                in readme_section(text, srv)
    assert mismatches(out) == []


def _check_not_written(obj: dict, out: Path, text: str) -> None:
    """llama.cpp's files are written where its converter is (built, or fetched by an earlier export; the
    tests never fetch it), GGUF files included; elsewhere its row says why, as the README does."""
    from specdec_tune.profiler.backends._llamacpp import LlamaCpp, llamacpp_home

    converter = not LlamaCpp(llamacpp_home()).missing_converter()
    assert set(obj["not_written"]) == (set() if converter else {"llamacpp"}), obj["not_written"]
    if converter:
        named = json.loads((out / "llamacpp" / "gguf_sources.json").read_text())  # target.gguf, and a model draft's
        assert "target.gguf" in named and all((out / "llamacpp" / name).is_file() for name in named)
        return
    why = obj["not_written"]["llamacpp"]
    assert "GGUF converter" in why and "SPECDEC_LLAMACPP_FETCH=0" in why and "\n" not in why
    assert obj["best_per_server"]["llamacpp"]["file_carries"] == f"not written: {why}"
    assert f"- llamacpp: {why}" in text and not (out / "llamacpp").exists()
    assert not any("/llamacpp/" in p for p in obj["exports"])


@pytest.mark.slow
def test_tune_table_says_which_exports_were_not_written(tiny_model_dirs, workload, tmp_path, tune_flags, capsys,
                                                        monkeypatch):
    """Without llama.cpp's converter (and its fetch off), the terminal's servers table says on llama.cpp's
    row that its files were not written, and why, not only the export README."""
    monkeypatch.setenv("SPECDEC_LLAMACPP_DIR", str(tmp_path / "no-llama"))
    monkeypatch.setenv("SPECDEC_LLAMACPP_FETCH", "0")
    code, out, err = run(_args(tiny_model_dirs, workload, tmp_path, tune_flags, "--server", "any", "--trials", "3",
                               "--export", str(tmp_path / "out"), "--formats", "all"), capsys)
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.lstrip("│┃ ").startswith("llamacpp "))
    assert "not written: cannot write llamacpp/target.gguf:" in row and "SPECDEC_LLAMACPP_FETCH=0" in row, row
    assert not any(line.lstrip("│┃ ").startswith(("vllm ", "hf ")) and "not written" in line
                   for line in out.splitlines())
    assert not (tmp_path / "out" / "llamacpp").exists()


@pytest.mark.parametrize("extra, message", [
    (["--server", "tgi"], "unknown --server 'tgi'"),
    (["--n-max", "17"], "--n-max must be in 1..16"),
    (["--trials", "0"], "--trials must be >= 1"),
    (["--objectives", "memory"], "--objectives must be"),
    (["--measure-top", "0"], "--measure-top must be >= 1"),
    (["--temperature", "-1"], "--temperature must be >= 0"),
    (["--storage", "postgresql+psycopg://nobody@127.0.0.1:1/none"], "cannot open study storage"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_model_dirs, workload, tmp_path, tune_flags, capsys, extra, message):
    code, out, err = run(_args(tiny_model_dirs, workload, tmp_path, tune_flags, *extra), capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_bad_names_lose_nothing_stored(tiny_model_dirs, workload, tmp_path, tune_flags, capsys):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    code, _, err = run(["profile", "--target", tiny_model_dirs["target"], "--draft", "ngram", "--workload", workload,
                        "--db", url, "--device", "cpu", "--repeats", "1", "--k-max", "2", "--n-max", "2",
                        "--max-prompts", "1", "--max-new-tokens", "4", "--context-lens", "8"], capsys)
    assert code == 0, err
    for args, message in [
        (["--drafts", "no/such/draft"], "no/such/draft"),
        (["--workload", "nosuchworkload"], "unknown workload 'nosuchworkload'"),
        (["--storage", url], "is the results database"),
    ]:
        argv = _args(tiny_model_dirs, workload, tmp_path, tune_flags)
        if args[0] in argv:
            argv[argv.index(args[0]) + 1] = args[1]
        else:
            argv += args
        code, out, err = run(argv, capsys)
        assert code == 2 and err.count("\n") == 1 and message in err, err
    db = open_database(url)
    assert [r.status for r in list_runs(db)] == ["completed"]
