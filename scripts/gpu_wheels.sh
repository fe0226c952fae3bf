#!/usr/bin/env bash
# A wheelhouse of what a lent GPU machine lacks (it has torch and transformers, and no network): the
# project's pure-Python dependencies and the small compiled ones, as binary wheels for its Python, at the
# versions installed here (the ones the tests ran with). docs/gpu.md, "The one call", carries the folder and
# installs them there with
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site wheels/*.whl
#
#   bash scripts/gpu_wheels.sh [DIR]      # default DIR: wheels (ignored by git; carried to the device)
# Environment: PYVER (default 3.12: the GPU machine's Python), EXTRA (more requirement names to add, e.g.
# "scipy" for a machine without it), SKIP (names to leave out).
set -euo pipefail
DIR=${1:-wheels}
PYVER=${PYVER:-3.12}
# What `import specdec_tune.cli`, `profile`, `measure`, `predict` and benchmarks/gpu_check.py need that the lent
# machines' image lacks (/work/.library/device/KINDS.md lists its packages: torch, transformers, numpy, scipy,
# typer, rich, click, pyyaml, tqdm, packaging, typing-extensions, markupsafe, narwhals, nvidia-ml-py are there),
# and their own needs not there (typing_extensions: pydantic needs a recent one). plotly draws gpu_check's
# figures. About 19 MB: with the checkout (~29 MB) under the device call's 64 MiB.
NAMES="optuna sqlalchemy alembic pydantic pydantic_core annotated_types typing_inspection typing_extensions greenlet mako \
colorlog plotly ${EXTRA:-}"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
rm -rf "$DIR" && mkdir -p "$DIR"  # one version of each: two stop the install there
FROZEN=$(python -m pip freeze 2>/dev/null | tr 'A-Z-' 'a-z_')
: > "$DIR/requirements.txt"
for name in $NAMES; do
  case " ${SKIP:-} " in *" $name "*) continue ;; esac
  pin=$(printf '%s\n' "$FROZEN" | grep -E "^${name}==" | head -1 || true)
  echo "${pin:-$name}" >> "$DIR/requirements.txt"
done
python -m pip download --quiet --only-binary=:all: --no-deps --python-version "$PYVER" --implementation cp \
  "${PLATFORMS[@]}" -d "$DIR" -r "$DIR/requirements.txt"
echo "wheelhouse $DIR: $(ls "$DIR"/*.whl | wc -l) wheels, $(du -sh "$DIR" | cut -f1) (requirements: $DIR/requirements.txt)"
