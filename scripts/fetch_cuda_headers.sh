#!/usr/bin/env bash
# CUDA 13's headers (cuda.h, the driver API) from PyPI, for the CPU test of the test-only hip-nvidia flavor
# (tests/loader/test_hip_nvidia.py) on a machine without the CUDA toolkit. Nothing here is committed.
#
#   scripts/fetch_cuda_headers.sh [DEST]    # DEST defaults to ~/.cache/flyship/cuda-13.0.96
#   FLYSHIP_TEST_CUDA_INCLUDE=DEST/include make test
#
# The wheel nvidia-cuda-runtime 13.0.96 (about 2 MB) holds nvidia/cu13/include/cuda.h; only its include/
# folder is unpacked. CUDA 13.0 matches the H200 machine's toolkit and driver (580, CUDA 13.0).
set -euo pipefail
DEST="${1:-$HOME/.cache/flyship/cuda-13.0.96}"
PY="${PYTHON:-python3}"
if [[ -f "$DEST/include/cuda.h" ]]; then echo "$DEST/include"; exit 0; fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-cuda-runtime==13.0.96"
mkdir -p "$DEST"
"$PY" - "$tmp"/nvidia_cuda_runtime-*.whl "$DEST" <<'PYEOF'
import sys, zipfile
from pathlib import Path

wheel, dest = sys.argv[1], Path(sys.argv[2])
prefix = "nvidia/cu13/include/"
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = dest / "include" / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
PYEOF
test -f "$DEST/include/cuda.h"
echo "$DEST/include"
