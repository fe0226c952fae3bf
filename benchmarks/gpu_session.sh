#!/usr/bin/env bash
# The one device call on a lent GPU machine (docs/gpu.md, "The one call"), from the repository root with $OUT
# set and the wheelhouse of scripts/gpu_wheels.sh carried as wheels/: the wheels, the project, then
# benchmarks/gpu_check.py within BUDGET seconds of stages (default 350: the call ends inside 7 minutes).
# Everything lands in /tmp/gc; $OUT keeps four files, rewritten after every stage (the machine returns at most
# 8): summary.json, events.jsonl, goals.txt and gpu_check.tgz (the whole folder: databases, figures, outputs).
#   bash benchmarks/gpu_session.sh [gpu_check.py options, e.g. --only fidelity,tau]
set -uo pipefail
export PYTHONUNBUFFERED=1
BUDGET=${BUDGET:-350}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheels/*.whl \
  || { echo "error: the carried wheels did not install (carry wheels/: bash scripts/gpu_wheels.sh)"; exit 2; }
export PYTHONPATH="$PWD:/tmp/site"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 \
  || echo "note: the editable install failed (PYTHONPATH holds the checkout): $(tail -1 /tmp/install.log)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory --format=csv,noheader
python3 benchmarks/gpu_check.py --out /tmp/gc --pack "$OUT" --budget-s "$BUDGET" "$@"
echo "gpu_check exit: $?"
ls -la "$OUT"
