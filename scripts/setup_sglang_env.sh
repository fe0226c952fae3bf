#!/usr/bin/env bash
# Create the side environment in which SGLang's own argument parser reads our exported SGLang flags
# (the `sglang`-marked tests: tests/tuner/servers/test_sglang_parser.py).
#
# SGLang 0.5.23 requires CUDA-only packages (flashinfer, sgl-kernel, cuda-python, torch 2.14.1 with
# CUDA ...) that neither install nor run on a CPU machine, so it is installed with --no-deps and only
# what `sglang.srt.server_args` imports is added. That import chain is not GPU-free:
# sglang/srt/utils/common.py imports torch and triton at module level (the CPU torch 2.13.0 wheel and
# triton's wheel import without a GPU), plus numpy, msgspec, orjson, psutil, pybase64, requests,
# packaging, pillow, starlette, pydantic, pyzmq, tqdm, IPython and aiohttp. What is checked is the
# parser `python -m sglang.launch_server` runs (server_args.prepare_server_args: ServerArgs.add_cli_args,
# argparse, ServerArgs.from_cli_args); resolution (ServerArgs.resolve_once) is not run: it loads the
# model config through sglang.srt.configs, which needs transformers 5.19 and torchvision on top.
#
# Usage: bash scripts/setup_sglang_env.sh [VENV_DIR]     (default: <repo>/.venv-sglang)
# Then:  export SPECDEC_SGLANG_PYTHON=<VENV_DIR>/bin/python
#
# Idempotent: a venv whose sglang 0.5.23 ServerArgs imports is left as it is unless FORCE=1. Prints
# the time it took and the environment's size.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/.venv-sglang}"
sglang_version="0.5.23"
torch_version="2.13.0"
start=$(date +%s)
check="import importlib.metadata as m, sys; assert m.version('sglang') == '$sglang_version'; from sglang.srt.server_args import prepare_server_args"

if [ "${FORCE:-0}" != 1 ] && [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "$check" 2>/dev/null; then
  echo "setup_sglang_env: $venv already parses with sglang $sglang_version"
  echo "SPECDEC_SGLANG_PYTHON=$venv/bin/python"
  exit 0
fi

python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
# The CPU torch wheel first (a bare torch requirement could pull a CUDA build).
"$py" -m pip install -q "torch==$torch_version"
"$py" -m pip install -q --no-deps "sglang==$sglang_version"
# What the import of sglang.srt.server_args needs, pinned (found by importing it in a bare venv).
"$py" -m pip install -q "torch==$torch_version" triton==3.9.0 numpy==2.4.6 msgspec==0.22.0 orjson==3.13.0 \
  psutil==7.2.2 pybase64==1.5.1 requests==2.34.2 packaging==26.4 pillow==13.0.0 starlette==1.10.0 \
  pydantic==2.14.4 pyzmq==27.3.0 tqdm==4.70.1 ipython==9.18.1 aiohttp==3.14.5
"$py" -c "$check; print('setup_sglang_env: sglang', m.version('sglang'), 'ServerArgs imports')"

end=$(date +%s)
echo "setup_sglang_env: done in $((end - start)) s; size $(du -sh "$venv" | cut -f1)"
echo "SPECDEC_SGLANG_PYTHON=$py"
