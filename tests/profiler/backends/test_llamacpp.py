"""The llama.cpp pieces that need no llama-server build: where it is looked for, the converter shim's
tokenizer rule, the /metrics parser, the refusal when the converter is missing, and the export's GGUF files
made by the converter alone (skipped without it)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_tune.core.errors import InputError
from specdec_tune.profiler.backends import _gguf_convert as shim
from specdec_tune.profiler.backends._llamacpp import ENV_VAR, LlamaCpp, llamacpp_home
from specdec_tune.profiler.backends._llamacpp_server import parse_metrics
from specdec_tune.profiler.backends._vllm import SpecCounters

ROOT = Path(__file__).resolve().parents[3]
ZOO = ROOT / "specdec_tune" / "engine" / "zoo" / "models"


def test_the_script_and_the_package_agree_on_the_build_folder(monkeypatch):
    """scripts/setup_llamacpp.sh builds where specdec-tune looks (same cache, version and CPU key)."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    printed = subprocess.run(["bash", str(ROOT / "scripts" / "setup_llamacpp.sh"), "--print-home"],
                             capture_output=True, text=True, check=True).stdout.strip()
    assert Path(printed) == llamacpp_home()
    monkeypatch.setenv(ENV_VAR, "/somewhere/else")
    assert llamacpp_home() == Path("/somewhere/else")


@pytest.mark.parametrize("change,gpt2", [
    (None, True),
    (lambda t: t.update(normalizer={"type": "NFC"}), False),
    (lambda t: t["pre_tokenizer"].update(add_prefix_space=True), False),
    (lambda t: t["pre_tokenizer"].update(use_regex=False), False),
    (lambda t: t["model"].update(byte_fallback=True), False),
    (lambda t: t.update(pre_tokenizer={"type": "Metaspace"}), False),
])
def test_the_shim_names_only_gpt2_byte_level_pre_tokenization(tmp_path, change, gpt2):
    spec = json.loads((ZOO / "mini-target" / "tokenizer.json").read_text())
    if change:
        change(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    assert shim.byte_level_gpt2(tmp_path) is gpt2


def test_metrics_page_parsing():
    page = "\n".join([
        "# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps",
        "# TYPE llamacpp:spec_decode_num_drafts_total counter",
        "llamacpp:spec_decode_num_drafts_total 36",
        "llamacpp:spec_decode_num_draft_tokens_total 135",
        "llamacpp:spec_decode_num_accepted_tokens_total 80",
        "llamacpp:prompt_tokens_total 1003",
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 26',
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 21',
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 16',
        'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 17',
    ])
    assert parse_metrics(page) == SpecCounters(36, 135, 80, (26, 21, 17, 16))
    assert parse_metrics("llamacpp:requests_processing 0") == SpecCounters()


def _gguf_facts(llama: LlamaCpp, path: Path) -> tuple[str, int]:
    """(general.architecture, tensor count) of a GGUF file, read by llama.cpp's own gguf-py."""
    code = ("import sys; from gguf import GGUFReader; r = GGUFReader(sys.argv[1]); "
            "f = r.fields['general.architecture']; print(bytes(f.parts[f.data[0]]).decode(), len(r.tensors))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(llama.source / "gguf-py")}).stdout.split()
    return out[0], int(out[1])


def _tensor_count(model_dir: str) -> int:
    from safetensors import safe_open

    n = 0
    for f in Path(model_dir).glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            n += len(list(st.keys()))
    return n


def test_the_converter_alone_writes_the_exports_gguf_files(llamacpp_converter, tiny_model_dirs, tmp_path):
    """llama.cpp's export needs its converter, not its server: target.gguf and draft.gguf are GGUF files of
    the Llama architecture holding every tensor of their model, beside flags that name them, and the README's
    llama.cpp section agrees with the flags."""
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_formats
    from tests.support.readme_check import mismatches

    r = TuningResult(candidate=Candidate("draft", 3, 0.2), server="llamacpp", target="target", workload="w",
                     target_path=tiny_model_dirs["target"], draft_path=tiny_model_dirs["draft"])
    written = write_formats(r, ["llamacpp"], tmp_path)
    assert written.not_written == {} and written.carries == {"llamacpp": "draft N=3 θ=0.2"}
    for name in ("target", "draft"):
        assert _gguf_facts(llamacpp_converter, tmp_path / "llamacpp" / f"{name}.gguf") == \
            ("llama", _tensor_count(tiny_model_dirs[name]))
    flags = (tmp_path / "llamacpp" / "flags.txt").read_text().split("\n")
    assert flags[flags.index("--spec-draft-model") + 1] == "draft.gguf"
    assert mismatches(tmp_path) == []


def test_llamacpp_export_without_llama_cpp_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_exports

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-llama"))
    monkeypatch.setenv("SPECDEC_LLAMACPP_FETCH", "0")  # an offline machine: the converter cannot be fetched
    assert LlamaCpp(tmp_path / "no-llama").missing()
    r = TuningResult(candidate=Candidate("mini-draft-1l", 4), server="llamacpp", target="mini-target",
                     workload="functions")
    with pytest.raises(InputError) as exc:
        write_exports(r, ["llamacpp"], tmp_path / "out")
    assert "scripts/setup_llamacpp.sh" in str(exc.value) and "\n" not in str(exc.value)
    assert "GGUF converter" in str(exc.value) and "SPECDEC_LLAMACPP_FETCH=0" in str(exc.value)
    assert not (tmp_path / "out").exists()
    out = write_exports(r, ["all"], tmp_path / "all")  # under all: listed with the reason
    assert "llamacpp" not in out and "- llamacpp: cannot write llamacpp/target.gguf" in \
        (tmp_path / "all" / "README.md").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_setup_script_is_valid_bash():
    for script in ("setup_llamacpp.sh", "setup_sglang_env.sh"):
        subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], check=True)
