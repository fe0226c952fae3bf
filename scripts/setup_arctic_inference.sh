#!/usr/bin/env bash
# Add arctic-inference 0.1.1's suffix decoding (what vLLM's `method: "suffix"` imports) to the vLLM
# environment, built from PyPI's sdist on a CPU machine. PyPI has no wheel of 0.1.1, and its sdist's build
# pins torch 2.7.0 (a CUDA build from PyPI) for its CUDA ops; suffix decoding is a separate C++ module
# (csrc/suffix_decoding, nanobind), so only that module is built here, with cmake, against the vLLM venv's
# Python. The package's Python files are copied beside it without its vLLM plugin entry point (the plugin
# patches vLLM for Arctic's own features; vLLM's suffix proposer needs only arctic_inference.suffix_decoding).
#
# Usage: bash scripts/setup_arctic_inference.sh [TARGET_DIR]
#   TARGET_DIR default: the site-packages of $SPECDEC_VLLM_PYTHON (else <repo>/.venv-vllm/bin/python).
#   With a TARGET_DIR elsewhere, set SPECDEC_VLLM_EXTRA_PATH=TARGET_DIR (the vLLM worker's PYTHONPATH; tests
#   that run the vLLM Python directly get it from there too).
# Needs: cmake >= 3.18, a C++20 compiler, network to PyPI.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
py="${SPECDEC_VLLM_PYTHON:-$repo/.venv-vllm/bin/python}"
target="${1:-$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# no build isolation: the metadata step would otherwise install the build pins (torch 2.7.0 among them)
"$py" -m pip download -q arctic-inference==0.1.1 --no-deps --no-binary :all: --no-build-isolation -d "$work"
tar xzf "$work"/arctic_inference-0.1.1.tar.gz -C "$work"
src="$work/arctic_inference-0.1.1"
"$py" -m pip install -q --target "$work/tools" nanobind==2.9.2   # arctic's own build pin
mkdir -p "$work/build"
PYTHONPATH="$work/tools" cmake -S "$src/csrc/suffix_decoding" -B "$work/build" -DPython_EXECUTABLE="$py" \
  -DCMAKE_BUILD_TYPE=Release > "$work/cmake.log"
cmake --build "$work/build" -j "$(nproc)" > "$work/build.log"
mkdir -p "$target"
rm -rf "$target/arctic_inference"
cp -r "$src/arctic_inference" "$target/"
cp "$work"/build/_C*.so "$target/arctic_inference/suffix_decoding/"
PYTHONPATH="$target${PYTHONPATH:+:$PYTHONPATH}" "$py" -c \
  "from arctic_inference.suffix_decoding import SuffixDecodingCache; SuffixDecodingCache(4, 1)"
echo "setup_arctic_inference: arctic_inference.suffix_decoding built into $target"
