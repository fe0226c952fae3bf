"""Portable exports: ``--model-root`` makes every exported file name the serving host's copies of the
models, and each ``launch.sh`` reads ``TARGET_MODEL`` / ``DRAFT_MODEL``. The files are read as their
servers read them (tests/support/readme_check.py) and the launch scripts are run by ``sh`` with the servers
replaced by stubs that print the arguments they were given."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specdec_tune.tuner.model import NGRAM, Candidate, TuningResult
from specdec_tune.tuner.servers import render_exports, write_exports
from tests.support.readme_check import mismatches, read_files

ROOT = "/srv/models"
FORMATS = ["vllm", "sglang", "trtllm", "hf"]  # llama.cpp needs its converter: rendered below instead


def _result(here: Path, c: Candidate, **kw) -> TuningResult:
    """A tuned result whose models are folders on this machine (as a user's own pair would be)."""
    for name in ("my-target", "my-draft"):
        (here / name).mkdir(parents=True, exist_ok=True)
    return TuningResult(candidate=c, server="any", target="my-target", workload="functions",
                        target_path=str(here / "my-target"),
                        draft_path=None if c.is_ngram else str(here / "my-draft"),
                        per_batch_size={1: 4, 4: 3}, **kw)


def _texts(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): p.read_text() for p in out.rglob("*") if p.is_file()}


def test_model_root_rewrites_the_paths_in_every_file(tmp_path):
    here = tmp_path / "checkout"
    r = _result(here, Candidate("my-draft", 4))
    out = tmp_path / "out"
    write_exports(r, FORMATS, out, model_root=ROOT)
    files = read_files(out)  # each server's file as the server reads it
    assert {s: f["draft"] for s, f in files.items() if s != "hf"} == {
        "vllm": f"{ROOT}/my-draft", "sglang": f"{ROOT}/my-draft", "trtllm": f"{ROOT}/my-draft"}
    assert mismatches(out) == []  # the README's sections name the same paths
    texts = _texts(out)
    readme = texts.pop("README.md")
    for path, text in texts.items():  # no file a server reads names the checkout
        assert str(here) not in text, path
    assert f"- target `my-target`: `{ROOT}/my-target`" in readme
    assert f"- draft `my-draft`: `{ROOT}/my-draft`" in readme and "TARGET_MODEL=" in readme
    # llama.cpp's sources file names the serving host's copies too (its flags name the GGUF files beside them)
    llama = dict(render_exports(r, ["llamacpp"], ROOT)["llamacpp"])
    assert json.loads(llama["llamacpp/gguf_sources.json"]) == {
        "target.gguf": {"model": f"{ROOT}/my-target", "outtype": "f32"},
        "draft.gguf": {"model": f"{ROOT}/my-draft", "outtype": "f32"}}
    assert all(str(here) not in text for text in llama.values())


def test_without_a_root_the_files_name_the_paths_here_and_hub_ids_stay(tmp_path):
    here = tmp_path / "checkout"
    r = _result(here, Candidate("my-draft", 4))
    out = tmp_path / "out"
    write_exports(r, ["vllm"], out)
    assert json.loads((out / "vllm" / "speculative_config.json").read_text())["model"] == str(here / "my-draft")
    assert "as they are on the machine that exported them" in (out / "README.md").read_text()
    hub = TuningResult(candidate=Candidate("org/hub-draft", 4), server="any", target="org/hub-target",
                       workload="functions")
    cfg = json.loads(dict(render_exports(hub, ["vllm"], ROOT)["vllm"])["vllm/speculative_config.json"])
    assert cfg["model"] == "org/hub-draft"  # a hub id: the server resolves it itself


# ------------------------------------------------------------------------------- launch.sh, run


def _stubs(folder: Path) -> dict[str, str]:
    """Servers on PATH that print their argv as JSON (and the options file TensorRT-LLM is given)."""
    folder.mkdir()
    stub = ("import json, sys\nargv = sys.argv[1:]\nout = {'argv': argv}\n"
            "if '--extra_llm_api_options' in argv:\n"
            "    out['options'] = open(argv[argv.index('--extra_llm_api_options') + 1]).read()\n"
            "print(json.dumps(out))\n")
    for name in ("vllm", "python", "trtllm-serve"):
        path = folder / name
        path.write_text(f"#!{sys.executable}\n{stub}")
        path.chmod(0o755)
    (folder / "python3").symlink_to(sys.executable)  # the TensorRT-LLM script rewrites its YAML with it
    env = {k: v for k, v in os.environ.items() if k not in ("TARGET_MODEL", "DRAFT_MODEL")}
    return {**env, "PATH": f"{folder}{os.pathsep}{env.get('PATH', '')}"}


def _launch(script: Path, env: dict[str, str], **variables: str) -> dict:
    proc = subprocess.run(["sh", str(script), "--port", "8000"], env={**env, **variables}, capture_output=True,
                          text=True, timeout=60, cwd=script.parent.parent.parent)  # not the script's folder
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _served(fmt: str, run: dict) -> tuple[str, str | None]:
    """(target, draft) as the server would take them from its command line (and options file)."""
    argv = run["argv"]
    if fmt == "vllm":
        spec = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else {}
        return argv[1], spec.get("model")
    if fmt == "sglang":
        draft = argv[argv.index("--speculative-draft-model-path") + 1] if "--speculative-draft-model-path" in argv \
            else None
        return argv[argv.index("--model-path") + 1], draft
    options = yaml.safe_load(run["options"]) if "options" in run else {}
    return argv[0], (options.get("speculative_config") or {}).get("speculative_model")


@pytest.mark.parametrize("c", [Candidate("my-draft", 4), Candidate(NGRAM, 3, ngram_max=3, ngram_min=1),
                               Candidate("none", 0)], ids=["draft", "ngram", "plain"])
def test_launch_scripts_read_target_model_and_draft_model(tmp_path, c):
    here = tmp_path / "checkout"
    out = tmp_path / "out"
    write_exports(_result(here, c), ["vllm", "sglang", "trtllm"], out, model_root=ROOT)
    env = _stubs(tmp_path / "bin")
    draft = None if c.is_plain or c.is_ngram else f"{ROOT}/my-draft"
    for fmt in ("vllm", "sglang", "trtllm"):
        script = out / fmt / "launch.sh"
        as_exported = _launch(script, env)
        assert _served(fmt, as_exported) == (f"{ROOT}/my-target", draft), fmt
        assert as_exported["argv"][-2:] == ["--port", "8000"]  # the caller's arguments pass through
        moved = _launch(script, env, TARGET_MODEL="/data/t 2", DRAFT_MODEL="/data/d 2")
        assert _served(fmt, moved) == ("/data/t 2", None if draft is None else "/data/d 2"), fmt
    # the vLLM command's inline JSON is the exported file but for the draft's path
    spec = json.loads((out / "vllm" / "speculative_config.json").read_text()) if not c.is_plain else None
    moved = _launch(out / "vllm" / "launch.sh", env, DRAFT_MODEL="/data/d")
    if spec is not None:
        inline = json.loads(moved["argv"][moved["argv"].index("--speculative-config") + 1])
        assert inline == {**spec, **({"model": "/data/d"} if draft else {})}


def test_cli_model_root_flag(tmp_path, capsys):
    import optuna

    from specdec_tune.cli import main

    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    r = _result(tmp_path / "checkout", Candidate("my-draft", 4))
    optuna.create_study(study_name="done", storage=storage).set_user_attr("result", r.to_dict())
    code = main(["export", "--study", "done", "--storage", storage, "--format", "sglang",
                 "--out", str(tmp_path / "o"), "--model-root", "/mnt/m"])
    assert code == 0, capsys.readouterr().err
    flags = (tmp_path / "o" / "sglang" / "flags.txt").read_text().split("\n")
    assert flags[flags.index("--speculative-draft-model-path") + 1] == "/mnt/m/my-draft"
    capsys.readouterr()
    for args, words in ((["export", "--study", "done", "--storage", storage, "--format", "vllm", "--out",
                          str(tmp_path / "x"), "--model-root", " "], "--model-root is empty"),
                        (["tune", "--target", "mini-target", "--drafts", "ngram", "--workload", "functions",
                          "--model-root", "/mnt/m"], "--model-root goes with --export")):
        assert main(args) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()
