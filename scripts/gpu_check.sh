#!/usr/bin/env bash
# The GPU proof of the Triton bundle: run on the GPU machine from the repo root.
#
#   scripts/gpu_check.sh [BUNDLE]        # BUNDLE defaults to artifacts/triton (built elsewhere by flyc-build)
#
# Runs the GPU tests (tests/gpu, marker gpu), the launch-overhead bench and the cold-start bench with the
# machine's python3 (torch + triton + ninja + pytest; no internet needed), and writes into ${OUT:-/tmp/out}:
#   env.txt, nvidia-smi.txt        what ran where
#   gpu-tests.log, gpu-tests.xml   pytest output and JUnit results; cubin_vs_driver.json (reader vs driver)
#   launch_overhead.{json,md,log}  per-call host time of a 4096-element add, every path
#   cold_start.{json,md,log}       import + load + first call, warm and first-build extension cache
#   dropin_block.{json,md,log}     a transformer block patched with rmsnorm/softmax: four arms (SKIP_DROPIN=1 skips)
#   summary.{json,md}              the table printed last
# Each step has its own time limit (total well under 13 minutes with dropin_block's inductor compiles); a
# failing step does not stop the others.
# Knobs: GPU_TESTS_LIMIT (s, default 300), BENCH_LIMIT (s, default 110), DROPIN_LIMIT (s, default 300),
# SKIP_LAUNCH_OVERHEAD=1, SKIP_COLD_START=1, SKIP_DROPIN=1;
# FLYSHIP_FLAVOR and friends pass through (scripts/gpu_check_hip_nvidia.sh runs this once per flavor).
# Exit status: 0 when every step passed, 1 otherwise.
set -uo pipefail

BUNDLE="${1:-artifacts/triton}"
OUT="${OUT:-/tmp/out}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
if [[ ! -f "$BUNDLE/manifest.json" ]]; then
  echo "gpu_check: expected a bundle at $BUNDLE (a folder with manifest.json); build one with" >&2
  echo "  flyc-build examples/triton/ops.py -o artifacts/triton --arch sm_90 --arch gfx942" >&2
  exit 2
fi
BUNDLE="$(cd "$BUNDLE" && pwd)"
export FLYSHIP_GPU_BUNDLE="$BUNDLE" FLYSHIP_GPU_OUT="$OUT"
# flyship is a package tree mapped by setup.py (no symlinks): install this checkout into a private folder (the
# GPU image's setuptools cannot make an editable install offline). Python must then never put the checkout itself
# first on sys.path, where its flyship/ folder (the package root alone) would shadow the installed package:
# PYTHONSAFEPATH=1 (python -P, 3.11+) for every Python started here, and pytest's importlib import mode.
"$PY" -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/flyship-site . >/dev/null
# The GPU image lacks pyelftools and msgpack and cannot download: wheels carried in .whl/ (see docs/perf.md).
if ! "$PY" -c 'import elftools, msgpack' 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --upgrade --target /tmp/flyship-site .whl/*.whl >/dev/null
fi
export PYTHONPATH="/tmp/flyship-site${PYTHONPATH:+:$PYTHONPATH}" PYTHONSAFEPATH=1
"$PY" -c 'import flyship.bundle, flyship.loader, elftools, msgpack' || { echo "gpu_check: flyship is not importable" >&2; exit 2; }
# The CUDA image's default CXX (/opt/gcc/bin/g++) links libstdc++ statically into shared objects; an
# extension built so crashes on its first C++ exception, and the loader refuses such a compiler. Use the
# system compiler unless told otherwise.
export CXX="${FLYSHIP_GPU_CXX:-c++}"
# One extension cache for the tests and the benches (the cold-start bench makes its own empty one).
export FLYSHIP_EXTENSIONS_DIR="${FLYSHIP_EXTENSIONS_DIR:-/tmp/flyship-gpu-check-extensions}"

{
  date -u +"%Y-%m-%dT%H:%M:%SZ"
  uname -a
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", torch.version.hip); print("gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")'
  "$PY" -c 'import triton; print("triton", triton.__version__)' 2>&1
  "$PY" -c 'import json, sys; m = json.load(open(sys.argv[1])); print("bundle", sys.argv[1], "built by python", m["build"]["python"], "frontends", m["build"]["frontends"], "ops", [o["name"] for o in m["ops"]])' "$BUNDLE/manifest.json"
  echo "FLYSHIP_FLAVOR=${FLYSHIP_FLAVOR:-} (empty: from the torch build)"
  "$PY" -c 'from flyship.loader import extension; c = extension.config(); print("extension", c.flavor, c.name, "includes", c.include_dirs, "cflags", c.cflags, "links", c.ldflags)' 2>&1
} > "$OUT/env.txt" 2>&1
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
cat "$OUT/env.txt"

status=0
step() {  # step NAME SECONDS CMD...: run with a time limit, tee its log, remember failures
  local name="$1" limit="$2"
  shift 2
  echo "== $name (limit ${limit}s)"
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "$name $rc $((SECONDS - t0))" >> "$OUT/steps.txt"
  [[ $rc -eq 0 ]] || status=1
}
: > "$OUT/steps.txt"
step gpu-tests "${GPU_TESTS_LIMIT:-300}" "$PY" -m pytest --import-mode=importlib tests/gpu tests/loader -m gpu -v -rA -p no:cacheprovider \
  --junitxml="$OUT/gpu-tests.xml"
[[ "${SKIP_LAUNCH_OVERHEAD:-0}" == 1 ]] || step launch_overhead "${BENCH_LIMIT:-110}" "$PY" bench/launch_overhead.py \
  --bundle "$BUNDLE" --out "$OUT"
[[ "${SKIP_COLD_START:-0}" == 1 ]] || step cold_start "${BENCH_LIMIT:-110}" "$PY" bench/cold_start.py --bundle "$BUNDLE" \
  --out "$OUT"
[[ "${SKIP_DROPIN:-0}" == 1 ]] || step dropin_block "${DROPIN_LIMIT:-300}" "$PY" bench/dropin_block.py \
  --bundle "$BUNDLE" --out "$OUT"

"$PY" - "$OUT" <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET
from pathlib import Path

out = Path(sys.argv[1])
summary = {"flavor": os.environ.get("FLYSHIP_FLAVOR") or "from the torch build", "steps": {}, "tests": {},
           "failed_tests": [], "skipped_tests": []}
for line in (out / "steps.txt").read_text().split("\n"):
    if line.strip():
        name, rc, secs = line.split()
        summary["steps"][name] = {"exit": int(rc), "seconds": int(secs)}
xml = out / "gpu-tests.xml"
if xml.exists():
    for case in ET.parse(xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        if case.find("failure") is not None or case.find("error") is not None:
            summary["failed_tests"].append(name)
            state = "failed"
        elif case.find("skipped") is not None:
            summary["skipped_tests"].append(f"{name}: {case.find('skipped').get('message', '')[:200]}")
            state = "skipped"
        else:
            state = "passed"
        summary["tests"][state] = summary["tests"].get(state, 0) + 1
rows = ["| item | result |", "| --- | --- |", f"| flavor (FLYSHIP_FLAVOR) | {summary['flavor']} |"]
for name, s in summary["steps"].items():
    rows.append(f"| step {name} | {'ok' if s['exit'] == 0 else 'FAILED (exit %d)' % s['exit']} in {s['seconds']} s |")
rows.append(f"| GPU tests | {', '.join(f'{v} {k}' for k, v in sorted(summary['tests'].items())) or 'no results'} |")
for name in summary["failed_tests"]:
    rows.append(f"| FAILED | {name} |")
lo = out / "launch_overhead.json"
if lo.exists():
    data = json.loads(lo.read_text())
    summary["launch_overhead"] = {r["path"]: r.get("median_us", r.get("skipped")) for r in data["rows"]}
    for r in data["rows"]:
        value = f"{r['median_us']:.2f} us/call ({r['ratio_to_torch_add']:.2f} x torch.add)" if "median_us" in r \
            else f"skipped: {r['skipped'][:80]}"
        rows.append(f"| {r['path']} | {value} |")
cs = out / "cold_start.json"
if cs.exists():
    data = json.loads(cs.read_text())
    summary["cold_start"] = {"warm": data["flyship_warm"], "first_build": data["flyship_first_build"]}
    w, c = data["flyship_warm"], data["flyship_first_build"]
    rows.append(f"| cold start, warm cache: import flyship + load | {w['import_flyship'] + w['load']:.2f} s "
                f"(first call {w['first_call'] * 1e3:.1f} ms) |")
    rows.append(f"| cold start, first extension build: load | {c['load']:.2f} s |")
table = "\n".join(rows) + "\n"
(out / "summary.json").write_text(json.dumps(summary, indent=1))
(out / "summary.md").write_text(table)
print("\n== summary (" + str(out) + ")\n" + table)
EOF
exit $status
