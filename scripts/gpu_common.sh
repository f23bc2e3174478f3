# Sourced by scripts/gpu_check.sh and scripts/gpu_top1.sh (run from the repository root).
#
# gpu_setup OUT_DIR [MODULE[=PIP_REQUIREMENT] ...]
#   Sets PY: $PYTHON if set, else the first of .venv/bin/python, python3, python whose torch sees a CUDA
#   device (exit 1 if none). The environment's torch is used as is (never reinstalled). Installs the
#   listed requirements whose module does not import (offline from $WHEELS, a folder of wheels, when
#   set), pip-installs basecap editable without dependencies (falling back to PYTHONPATH=src), and
#   writes the versions to OUT_DIR/device.txt.
#
# gpu_pytest SECONDS JUNIT_XML PYTEST_ARGS...
#   Runs `pytest -m gpu PYTEST_ARGS` (killed after SECONDS) and fails (returns 1) on any failure or
#   error, on any skipped GPU test, and when no test ran: on a GPU machine a skip means a path went
#   unchecked.

gpu_setup() {
  local out="$1"; shift
  mkdir -p "$out"
  has_cuda() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; }
  PY="${PYTHON:-}"
  if [ -z "$PY" ]; then
    for cand in .venv/bin/python python3 python; do
      if command -v "$cand" >/dev/null 2>&1 && has_cuda "$cand"; then PY="$cand"; break; fi
    done
  fi
  if [ -z "$PY" ] || ! has_cuda "$PY"; then
    echo "gpu: no Python whose torch sees a CUDA device (set PYTHON=...)" >&2
    exit 1
  fi
  echo "gpu: using $PY"

  local missing=() req
  for req in "$@"; do
    if ! "$PY" -c "import importlib.util as u, sys; sys.exit(0 if u.find_spec('${req%%=*}') else 1)"; then
      missing+=("${req#*=}")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "gpu: installing ${missing[*]}"
    if [ -n "${WHEELS:-}" ]; then
      "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${missing[@]}"
    else
      "$PY" -m pip install -q "${missing[@]}"
    fi
  fi
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$out/pip_install.log" 2>&1; then
    echo "gpu: editable install failed (see $out/pip_install.log); using PYTHONPATH=src"
  fi
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

  "$PY" - <<'EOF' | tee "$out/device.txt"
import importlib.metadata as md
import torch, basecap
print("torch", torch.__version__, "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
for dist in ("flash-linear-attention", "triton"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "not installed")
print("basecap from", basecap.__file__)
EOF
}

gpu_pytest() {
  local seconds="$1" xml="$2"; shift 2
  local rc=0
  rm -f "$xml"
  timeout "$seconds" "$PY" -m pytest "$@" -m gpu -q -rfEs -p no:cacheprovider -o addopts="" --junitxml="$xml" || rc=$?
  "$PY" - "$xml" <<'EOF' || rc=1
import sys
import xml.etree.ElementTree as ET

try:
    root = ET.parse(sys.argv[1]).getroot()
except (OSError, ET.ParseError) as e:
    sys.exit(f"GPU tests: no report ({e})")
suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
print("GPU tests: {tests} run, {failures} failed, {errors} errors, {skipped} skipped".format(**n))
if n["skipped"]:
    sys.exit("GPU tests: FAILED: a skipped GPU test counts as a failure on a GPU machine")
if n["tests"] == 0 or n["failures"] or n["errors"]:
    sys.exit("GPU tests: FAILED")
EOF
  return "$rc"
}
