#!/usr/bin/env bash
# One FlyDSL venv of the version test matrix: scripts/matrix_venv.sh <python> <flydsl version> <cache dir>
# (tests/matrix runs it; make test-matrix names the cache dir).
# Prints the venv's python. Venvs are cached under <cache dir> and reused:
#   <cache>/base-pyX.Y         torch (CPU where the machine has it) + numpy + flyship's compile-stage deps
#   <cache>/flydsl-V-pyX.Y     flydsl==V only; sees the base venv's packages through a .pth file
# so each FlyDSL version costs one ~75 MB wheel, not another torch.
set -euo pipefail
PY=$1; VER=$2; CACHE=$3
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
BASE=$CACHE/base-py$PYV
VENV=$CACHE/flydsl-$VER-py$PYV
# The torch requirement of this Python's base venv: FLYSHIP_MATRIX_TORCH_PY311 etc., else "torch".
PIN_VAR=FLYSHIP_MATRIX_TORCH_PY${PYV/./}
TORCH_PIN=${!PIN_VAR:-torch}
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-py$PYV"; flock 9  # one builder per Python at a time
if [ ! -f "$BASE/.ok" ]; then
  rm -rf "$BASE"; "$PY" -m venv "$BASE"
  # torch with its dependencies: PyPI's Linux torch is a CUDA build, and with --no-deps it does not
  # import (libcudnn.so.9 missing), so a Python without a local CPU wheel gets the nvidia-* packages too.
  "$BASE/bin/python" -m pip install -q "$TORCH_PIN" >&2
  "$BASE/bin/python" -m pip install -q numpy click 'msgpack>=1.0' 'pyelftools>=0.30' 'filelock>=3.12' jsonschema pytest >&2
  "$BASE/bin/python" -c 'import torch, numpy' >&2
  touch "$BASE/.ok"
fi
if [ ! -f "$VENV/.ok" ]; then
  rm -rf "$VENV"; "$PY" -m venv "$VENV"
  SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  BSITE=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$BSITE" > "$SITE/_flyship_matrix_base.pth"
  "$VENV/bin/python" -m pip install -q --no-deps "flydsl==$VER" >&2
  touch "$VENV/.ok"
fi
echo "$VENV/bin/python"
