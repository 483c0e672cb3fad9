#!/usr/bin/env bash
# Both driver shims on one NVIDIA GPU, one command (issue 16): run on the GPU machine from the repo root.
#
#   scripts/gpu_check_hip_nvidia.sh [BUNDLE]     # BUNDLE defaults to artifacts/triton (sm_90 + gfx942)
#
# 1. the CUDA flavor (csrc/driver_cuda.cpp), as scripts/gpu_check.sh always ran it   -> $OUT/cuda/
# 2. the HIP flavor's shim (csrc/driver_hip.cpp) built for HIP's NVIDIA platform: FLYSHIP_FLAVOR=hip-nvidia,
#    the test-only header tests/gpu/hip_nvidia/include (HIP calls -> CUDA driver API), the CUDA headers and
#    libcuda                                                                          -> $OUT/hip-nvidia/
# Each is scripts/gpu_check.sh (the GPU tests, tests/gpu + tests/loader -m gpu, then the launch-overhead bench)
# with FLYSHIP_GPU_EXPECT_FLAVOR set, so tests/gpu/test_flavor.py fails if the other shim ran. Then
# $OUT/summary.md and summary.json put both side by side. The cold-start bench is skipped (SKIP_COLD_START=0 runs it).
#
# Needs: python3 with CUDA torch, triton, ninja, pytest; cuda.h (found as the cuda flavor finds it: torch's
# CUDA_HOME, $CUDA_HOME/include, /usr/local/cuda/include; set CUDA_HOME to choose); libcuda; pyelftools and
# msgpack importable or carried as wheels in .whl/. Time: about 2 x 2 minutes; the limits keep it under 10.
# Exit status: 0 when both runs passed every step, 1 otherwise (2: no bundle).
set -uo pipefail

BUNDLE="${1:-artifacts/triton}"
OUT="${OUT:-/tmp/out}"
PY="${PYTHON:-python3}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$OUT"
export SKIP_COLD_START="${SKIP_COLD_START:-1}" GPU_TESTS_LIMIT="${GPU_TESTS_LIMIT:-180}" BENCH_LIMIT="${BENCH_LIMIT:-90}"
# Separate extension caches: each flavor builds its own extension from scratch, in its own run.
EXT_ROOT="${FLYSHIP_EXTENSIONS_DIR:-/tmp/flyship-gpu-check-extensions}"

status=0
echo "=== flavor cuda"
env -u FLYSHIP_FLAVOR -u FLYSHIP_HIP_NVIDIA_INCLUDE OUT="$OUT/cuda" FLYSHIP_GPU_EXPECT_FLAVOR=cuda \
  FLYSHIP_EXTENSIONS_DIR="$EXT_ROOT/cuda" bash "$HERE/scripts/gpu_check.sh" "$BUNDLE" || status=1
[[ -f "$OUT/cuda/env.txt" ]] || exit 2  # gpu_check.sh refused before running anything (no bundle)
echo "=== flavor hip-nvidia (test-only: the HIP shim on HIP's NVIDIA platform)"
OUT="$OUT/hip-nvidia" FLYSHIP_FLAVOR=hip-nvidia FLYSHIP_HIP_NVIDIA_INCLUDE="$HERE/tests/gpu/hip_nvidia/include" \
  FLYSHIP_GPU_EXPECT_FLAVOR=hip-nvidia FLYSHIP_EXTENSIONS_DIR="$EXT_ROOT/hip-nvidia" \
  bash "$HERE/scripts/gpu_check.sh" "$BUNDLE" || status=1

"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
flavors = ("cuda", "hip-nvidia")
runs = {f: json.loads((out / f / "summary.json").read_text()) if (out / f / "summary.json").exists() else {}
        for f in flavors}
rows = ["| item | " + " | ".join(flavors) + " |", "| --- |" + " --- |" * len(flavors)]


def cell(run: dict, key: str) -> str:
    return str(run.get(key, "no result"))


rows.append("| GPU tests | " + " | ".join(", ".join(f"{v} {k}" for k, v in sorted(runs[f].get("tests", {}).items()))
                                          or "no results" for f in flavors) + " |")
for f in flavors:
    for name in runs[f].get("failed_tests", []):
        rows.append(f"| FAILED ({f}) | {name} |" + " |" * (len(flavors) - 1))
steps = sorted({s for f in flavors for s in runs[f].get("steps", {})})
for s in steps:
    vals = []
    for f in flavors:
        st = runs[f].get("steps", {}).get(s)
        vals.append("not run" if st is None else ("ok" if st["exit"] == 0 else f"FAILED (exit {st['exit']})")
                    + (f" in {st['seconds']} s" if st else ""))
    rows.append(f"| step {s} | " + " | ".join(vals) + " |")
paths = [p for f in flavors for p in runs[f].get("launch_overhead", {})]
for p in dict.fromkeys(paths):
    vals = []
    for f in flavors:
        v = runs[f].get("launch_overhead", {}).get(p)
        vals.append(f"{v:.2f} us/call" if isinstance(v, (int, float)) else str(v or "-")[:60])
    rows.append(f"| {p} | " + " | ".join(vals) + " |")
table = "\n".join(rows) + "\n"
(out / "summary.md").write_text(table)
(out / "summary.json").write_text(json.dumps(runs, indent=1))
print("\n== both flavors (" + str(out) + ")\n" + table)
PYEOF
exit $status
