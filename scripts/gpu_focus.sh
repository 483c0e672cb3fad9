#!/usr/bin/env bash
# A short GPU run of chosen items, for a session with little device time left (scripts/gpu_check.sh runs everything).
# Run on the GPU machine from the repo root, bundles built elsewhere (sm_90):
#
#   OUT=/tmp/out bash scripts/gpu_focus.sh
#
# Steps, each with its own time limit, a failing one does not stop the others; logs under $OUT:
#   ext_build_bench  bench/extension_build.py: cold builds per grouping of the core's units ($EXT_BENCH_UNITS)
#   cold_build   the CUDA flavor's extension built from nothing (empty extension cache), wall and CPU seconds
#   gpu-tests    $FOCUS_TESTS (default: the tuning race, verify's unwritten-output check, the flavor and the op tests)
#   launch_overhead  per-call host time of every path (fewer calls than gpu_check.sh: --calls 5000 --repeats 7)
#   dropin_block the drop-in block bench in the compile modes $DROPIN_MODES (only when set)
#   hip_nvidia   the HIP shim on HIP's NVIDIA platform: cold build, the flavor and op tests (SKIP_HIP=1 skips)
set -uo pipefail

OUT="${OUT:-/tmp/out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
"$PY" -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/flyship-site . >/dev/null
if ! "$PY" -c 'import elftools, msgpack, filelock' 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --upgrade --target /tmp/flyship-site .whl/*.whl >/dev/null
fi
export PYTHONPATH="/tmp/flyship-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1
export CXX="${FLYSHIP_GPU_CXX:-c++}" FLYSHIP_GPU_OUT="$OUT"
export FLYSHIP_GPU_BUNDLE="$PWD/artifacts/triton" FLYSHIP_GPU_TUNED_BUNDLE="$PWD/artifacts/tuned"
export FLYSHIP_GPU_EARLY_RETURN_BUNDLE="$PWD/artifacts/early_return"
EXT="${FLYSHIP_EXTENSIONS_DIR:-/tmp/flyship-focus-extensions}"
"$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "cpus", __import__("os").cpu_count())' \
  | tee "$OUT/env.txt"

step() {  # step NAME SECONDS CMD...
  local name="$1" limit="$2"
  shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  echo "$name ${PIPESTATUS[0]} $((SECONDS - t0))" | tee -a "$OUT/steps.txt"
}

cold_build() {  # cold_build FLAVOR DIR: build the extension from nothing in DIR; print wall and CPU seconds
  rm -rf "$2"
  FLYSHIP_EXTENSIONS_DIR="$2" "$PY" - "$1" <<'EOF'
import json, os, resource, sys, time
t0 = time.perf_counter()
from flyship.loader import extension
extension.extension(None if sys.argv[1] == "cuda" else sys.argv[1])
wall = time.perf_counter() - t0
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
me = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"flavor": sys.argv[1], "wall_s": round(wall, 2), "compiler_cpu_s": round(ch.ru_utime + ch.ru_stime, 2),
                  "python_cpu_s": round(me.ru_utime + me.ru_stime, 2), "cores": os.cpu_count()}))
EOF
}

: > "$OUT/steps.txt"
[[ -z "${EXT_BENCH_UNITS:-}" ]] || step ext_build_bench "${EXT_BENCH_LIMIT:-300}" "$PY" bench/extension_build.py \
  --flavor cuda --units $EXT_BENCH_UNITS --out "$OUT"
export -f cold_build
export PY
step cold_build 120 bash -c 'cold_build "$@"' _ cuda "$EXT/cuda"
export FLYSHIP_EXTENSIONS_DIR="$EXT/cuda"
step gpu-tests "${TESTS_LIMIT:-150}" "$PY" -m pytest --import-mode=importlib -m gpu -v -rA -p no:cacheprovider \
  ${FOCUS_TESTS:-tests/gpu/test_tuning_race.py tests/gpu/test_verify_unwritten.py tests/gpu/test_flavor.py tests/gpu/test_triton_ops.py tests/gpu/test_fast_call.py}
step launch_overhead "${BENCH_LIMIT:-60}" "$PY" bench/launch_overhead.py --bundle "$FLYSHIP_GPU_BUNDLE" --out "$OUT" \
  --calls 5000 --repeats 7
[[ -z "${DROPIN_MODES:-}" ]] || step dropin_block "${DROPIN_LIMIT:-240}" "$PY" bench/dropin_block.py \
  --bundle "$FLYSHIP_GPU_BUNDLE" --out "$OUT" --modes "$DROPIN_MODES"
if [[ "${SKIP_HIP:-0}" != 1 ]]; then
  export FLYSHIP_FLAVOR=hip-nvidia FLYSHIP_HIP_NVIDIA_INCLUDE="$PWD/tests/gpu/hip_nvidia/include"
  export FLYSHIP_GPU_EXPECT_FLAVOR=hip-nvidia
  step hip_cold_build 120 bash -c 'cold_build "$@"' _ hip-nvidia "$EXT/hip-nvidia"
  export FLYSHIP_EXTENSIONS_DIR="$EXT/hip-nvidia"
  step hip_tests 90 "$PY" -m pytest --import-mode=importlib -m gpu -q -rA -p no:cacheprovider tests/gpu/test_flavor.py \
    tests/gpu/test_triton_ops.py
fi
cat "$OUT/steps.txt"
