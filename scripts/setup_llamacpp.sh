#!/usr/bin/env bash
# Build llama.cpp's CPU `llama-server` and make its GGUF converter usable, for `export --format llamacpp`
# (which converts the user's models to GGUF) and the `llamacpp`-marked tests (which run the export).
#
# Source: PyPI's llama-cpp-python sdist, which vendors llama.cpp (vendor/llama.cpp: CMake project,
# tools/server, convert_hf_to_gguf.py, gguf-py). llama-cpp-python 0.3.36 vendors
# ggml-org/llama.cpp@0c1e57098 (its CHANGELOG.md), after the May 2026 rename of the speculative flags
# (--spec-type, --spec-draft-n-max, ... in common/arg.cpp).
#
# Usage: bash scripts/setup_llamacpp.sh [HOME_DIR]      (--print-home: print the default HOME_DIR, exit)
#   HOME_DIR defaults to <specdec-tune cache>/llamacpp/<version>-<cpu key> (specdec_tune/core/cache.py:
#   $SPECDEC_CACHE_DIR, else $XDG_CACHE_HOME/specdec-tune, else ~/.cache/specdec-tune). The CPU key is
#   the machine and a hash of its CPU flags (profiler/backends/_llamacpp.py cpu_key computes the same): the
#   build uses GGML_NATIVE (the host's instruction set), so two machines sharing a cache never share
#   a binary. `export --format llamacpp` and the tests find that folder; SPECDEC_LLAMACPP_DIR overrides.
#
# HOME_DIR/llama.cpp          the vendored source (convert_hf_to_gguf.py, conversion/, gguf-py/); an export on a
#                             machine this script never ran on fetches the converter's part alone into the same
#                             folder (profiler/backends/_llamacpp_fetch.py), which step 1 completes to the full source
# HOME_DIR/bin/llama-server   the CPU server (static: no shared libraries to find)
# HOME_DIR/pylib/py3.X        sentencepiece, for PYTHON (default: python3, i.e. the active venv)
# HOME_DIR/gguf/              converted models, keyed by their content (written by specdec-tune)
# The converter runs with specdec-tune's own Python: torch, numpy, safetensors, transformers, pyyaml
# and tqdm are already there, and gguf-py comes from the source tree. Its one missing requirement,
# sentencepiece (imported by the Llama converter even for BPE tokenizers), goes to pylib with
# `pip install --target`, so neither our venv nor a second torch is touched.
#
# Idempotent, step by step: the sdist is downloaded once (kept beside the builds of every CPU), the
# server is built only when HOME_DIR/bin/llama-server does not answer --version, sentencepiece is
# installed only when it does not import (FORCE=1 redoes everything). Prints each step's time, the
# total and the folder's size. JOBS (default 2) sets the build's parallelism.
set -euo pipefail
version="0.3.36"            # llama-cpp-python sdist
sdist_sha256="832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"  # PyPI's file (profiler/backends/_llamacpp_fetch.py)
llama_commit="0c1e57098"    # the llama.cpp commit it vendors
jobs="${JOBS:-2}"
python="${PYTHON:-python3}"
start=$(date +%s)

cpu_key() {  # the first flags/Features line of /proc/cpuinfo, newline included
  local line
  line=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo 2>/dev/null || true)
  echo "$(uname -m)-$(printf '%s\n' "$line" | sha256sum | cut -c1-12)"
}
if [ -n "${SPECDEC_CACHE_DIR:-}" ]; then cache="$SPECDEC_CACHE_DIR"
elif [ -n "${XDG_CACHE_HOME:-}" ]; then cache="$XDG_CACHE_HOME/specdec-tune"
else cache="$HOME/.cache/specdec-tune"; fi
default_home="$cache/llamacpp/$version-$(cpu_key)"
if [ "${1:-}" = "--print-home" ]; then echo "$default_home"; exit 0; fi
home="${1:-$default_home}"
server="$home/bin/llama-server"
pylib="$home/pylib/$("$python" -c 'import sys; print(f"py{sys.version_info.major}.{sys.version_info.minor}")')"
force="${FORCE:-0}"
mkdir -p "$home"
work=$(mktemp -d "$home/.setup.XXXXXX")
trap 'rm -rf "$work"' EXIT

# 1. The vendored source (needed by the build and by the converter). CMakeLists.txt: the converter fetched
# alone by an export (profiler/backends/_llamacpp_fetch.py) is not enough to build.
if [ "$force" = 1 ] || [ ! -f "$home/llama.cpp/convert_hf_to_gguf.py" ] || [ ! -f "$home/llama.cpp/CMakeLists.txt" ]; then
  sdist_dir="$cache/llamacpp/sdist"
  sdist="$sdist_dir/llama_cpp_python-$version.tar.gz"
  if [ ! -s "$sdist" ] || ! echo "$sdist_sha256  $sdist" | sha256sum -c --status; then
    mkdir -p "$sdist_dir"
    # pip reads the sdist's metadata with its build backend (scikit-build-core, installed in an
    # isolated environment for that; 17 s on a quiet network) but builds nothing.
    "$python" -m pip download -q --no-binary llama-cpp-python --no-deps "llama-cpp-python==$version" -d "$work/dl"
    echo "$sdist_sha256  $work/dl/llama_cpp_python-$version.tar.gz" | sha256sum -c --status \
      || { echo "setup_llamacpp: the downloaded sdist's sha256 is not $sdist_sha256"; exit 1; }
    mv "$work/dl/llama_cpp_python-$version.tar.gz" "$sdist"
  fi
  # Only the vendored llama.cpp; its vocabulary test files and docs are not needed to build or convert.
  tar -xzf "$sdist" -C "$work" --strip-components=2 --exclude='*/models/*.gguf*' --exclude='*/docs/*' \
    "llama_cpp_python-$version/vendor/llama.cpp"
  rm -rf "$home/llama.cpp"
  mv "$work/llama.cpp" "$home/llama.cpp"
  echo "setup_llamacpp: source of llama.cpp $llama_commit ready ($(( $(date +%s) - start )) s)"
fi

# 2. llama-server: CPU only, static, the server target alone. LLAMA_USE_PREBUILT_UI=OFF: the web UI
# would be downloaded from a Hugging Face bucket (tools/ui/CMakeLists.txt); the API needs no UI.
# No OpenSSL: the server listens on 127.0.0.1 only.
if [ "$force" = 1 ] || ! "$server" --version >/dev/null 2>&1; then
  build="$work/build"
  step=$(date +%s)
  cmake -S "$home/llama.cpp" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT="$llama_commit" >"$work/cmake.log" 2>&1 \
    || { tail -30 "$work/cmake.log"; exit 1; }
  cmake --build "$build" --target llama-server -j "$jobs" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; exit 1; }
  mkdir -p "$home/bin"
  cp "$build/bin/llama-server" "$server.tmp" && mv "$server.tmp" "$server"
  echo "setup_llamacpp: llama-server built in $(( $(date +%s) - step )) s with -j$jobs (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
fi

# 3. The converter's one requirement our venv lacks, in its own range
# (requirements/requirements-convert_legacy_llama.txt).
if [ "$force" = 1 ] || ! PYTHONPATH="$pylib" "$python" -c "import sentencepiece" 2>/dev/null; then
  rm -rf "$pylib"
  "$python" -m pip install -q --target "$pylib" "sentencepiece>=0.1.98,<0.3.0"
fi

# Smoke checks: the server answers --version; the converter's modules import with our Python.
"$server" --version 2>&1 | head -1
PYTHONPATH="$pylib:$home/llama.cpp/gguf-py" "$python" -c \
  "import sys, gguf, sentencepiece; print('setup_llamacpp: gguf-py and sentencepiece import with', sys.executable)"

echo "setup_llamacpp: done in $(( $(date +%s) - start )) s; size $(du -sh --exclude=.setup.* "$home" | cut -f1)"
echo "SPECDEC_LLAMACPP_DIR=$home"
