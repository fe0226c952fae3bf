#!/usr/bin/env bash
# One device call on a GPU machine (docs/gpu.md): carried wheels, the project, then benchmarks/gpu_check.py
# within LIMIT seconds. The main outputs are copied into $OUT every 5 s while it runs (a call cut short
# still returns them) and everything is packed into $OUT/gpu_check.tgz at the end (the device tool
# returns at most 8 files).
#   LIMIT=255 bash benchmarks/gpu_session.sh   # on the GPU machine, from the repository root, with $OUT set
set -uo pipefail
export PYTHONUNBUFFERED=1
LIMIT=${LIMIT:-520}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 1
export PYTHONPATH="$PWD:/tmp/site"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/install.log 2>&1 || echo "editable install failed (PYTHONPATH holds the checkout)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mkdir -p /tmp/gc
KEEP="summary.json profile.out bench.out measure_best.out pytest_gpu.out fidelity_heldout.json cuda_graphs_check.json"
( while sleep 5; do for f in $KEEP; do [ -f /tmp/gc/$f ] && cp /tmp/gc/$f "$OUT/"; done; done ) &
COPIER=$!
timeout "$LIMIT" python3 benchmarks/gpu_check.py --out /tmp/gc --budget-s $((LIMIT - 20)) "$@"
echo "gpu_check exit: $?"
kill $COPIER
for f in $KEEP; do [ -f /tmp/gc/$f ] && cp /tmp/gc/$f "$OUT/"; done
tar czf "$OUT/gpu_check.tgz" -C /tmp/gc . && ls -la "$OUT"
python3 - <<'PY'
import json, pathlib
p = pathlib.Path("/tmp/gc/summary.json")
if p.exists():
    s = json.loads(p.read_text())
    print(json.dumps({"goals": s.get("goals"), "steps": {k: (v["exit"], v["seconds"]) for k, v in s["steps"].items()}}, default=str))
PY
