"""llama.cpp's GGUF converter fetched alone when an export needs it, without the network: a local sdist
with the real one's layout (a converter that writes a stand-in GGUF file), served by a stand-in ``pip``
through the same code path (:class:`PipSource`)."""
from __future__ import annotations

import shutil

import pytest

from specdec_tune.profiler.backends._llamacpp import LlamaCpp, LlamacppError, find_llamacpp, llamacpp_home, require_converter
from specdec_tune.profiler.backends._llamacpp_fetch import FETCH_ENV, PipSource, sdist_file
from tests.support import fake_llamacpp as fake



def test_the_converter_alone_is_fetched_into_the_scripts_folder(fresh_llamacpp, capsys):
    folder, source = fresh_llamacpp
    llama = require_converter("exporting", source=source)
    assert llama.home == llamacpp_home() and not llama.missing_converter()
    assert llama.missing() == ["llama-server"] and find_llamacpp() is None  # the server is still not built
    got = sorted(str(p.relative_to(llama.source)) for p in llama.source.rglob("*") if p.is_file())
    assert got == ["LICENSE", "conversion/__init__.py", "conversion/base.py", "convert_hf_to_gguf.py",
                   "gguf-py/gguf/__init__.py", "models/templates/chat.jinja"]
    assert (llama.pylib / "sentencepiece" / "__init__.py").is_file()
    assert sdist_file().is_file()  # kept where scripts/setup_llamacpp.sh looks for it, so it builds from it
    calls = fake.calls(folder)
    assert calls[0].startswith("-m pip download --no-binary llama-cpp-python --no-deps llama-cpp-python==0.3.36")
    assert calls[1].startswith("-m pip install -q --target") and calls[1].endswith("sentencepiece>=0.1.98,<0.3.0")
    err = capsys.readouterr().err
    assert "downloaded 50% of 76.6 MB" in err and "downloaded 100% of 76.6 MB" in err and FETCH_ENV in err
    # a second export finds it: nothing is fetched again
    require_converter("exporting", source=source)
    assert len(fake.calls(folder)) == 2


def test_a_kept_sdist_is_reused_and_only_missing_parts_are_fetched(fresh_llamacpp):
    folder, source = fresh_llamacpp
    llama = require_converter("exporting", source=source)
    shutil.rmtree(llama.pylib)  # sentencepiece gone: installed again, the sdist not downloaded again
    require_converter("exporting", source=source)
    assert [c.split()[2] for c in fake.calls(folder)] == ["download", "install", "install"]
    shutil.rmtree(llama.source)  # the converter gone: unpacked again from the kept sdist
    require_converter("exporting", source=source)
    assert [c.split()[2] for c in fake.calls(folder)] == ["download", "install", "install"]
    assert not llama.missing_converter()


def test_a_sdist_with_another_checksum_unpacks_nothing(fresh_llamacpp):
    folder, source = fresh_llamacpp
    with pytest.raises(LlamacppError) as exc:
        require_converter("exporting", source=PipSource(python=source.python, sha256="0" * 64))
    assert "sha256" in str(exc.value) and "nothing was unpacked" in str(exc.value) and "\n" not in str(exc.value)
    assert not LlamaCpp(llamacpp_home()).source.exists() and not sdist_file().exists()


def test_a_failed_download_is_one_line(fresh_llamacpp):
    folder, source = fresh_llamacpp
    broken = PipSource(python=str(fake.pip(folder, folder / "none.tar.gz", fail="No matching distribution found")),
                       sha256=source.sha256)
    with pytest.raises(LlamacppError) as exc:
        require_converter("exporting", source=broken)
    msg = str(exc.value)
    assert "fetching it failed" in msg and "No matching distribution found" in msg and "\n" not in msg
    assert "scripts/setup_llamacpp.sh" in msg


def test_with_the_fetch_off_nothing_is_fetched_and_the_refusal_says_so(fresh_llamacpp, monkeypatch):
    folder, source = fresh_llamacpp
    monkeypatch.setenv(FETCH_ENV, "0")
    with pytest.raises(LlamacppError) as exc:
        require_converter("exporting", source=source)
    assert f"{FETCH_ENV}=0" in str(exc.value) and fake.calls(folder) == []


def test_export_on_a_fresh_machine_writes_the_gguf_files(fresh_llamacpp, tiny_model_dirs, capsys):
    """``export --format llamacpp`` where llama.cpp was never set up: the converter is fetched, the models
    converted with it, and target.gguf and draft.gguf written beside the flags that name them."""
    from specdec_tune.tuner.model import Candidate, TuningResult
    from specdec_tune.tuner.servers import write_formats

    folder, _ = fresh_llamacpp  # the export fetches from the default source: the stand-in
    r = TuningResult(candidate=Candidate("draft", 4), server="llamacpp", target="target", workload="functions",
                     target_path=tiny_model_dirs["target"], draft_path=tiny_model_dirs["draft"])
    written = write_formats(r, ["llamacpp"], folder / "out")
    assert written.not_written == {}
    assert (folder / "out" / "llamacpp" / "target.gguf").read_bytes() == b"GGUF" + b"target"
    assert (folder / "out" / "llamacpp" / "draft.gguf").read_bytes() == b"GGUF" + b"draft"
    assert "fetching it into" in capsys.readouterr().err
