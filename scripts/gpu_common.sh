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

# gpu_summary OUT_DIR LENGTH...
#   Writes OUT_DIR/summary.md, one table of what scripts/gpu_check.sh measured: the GPU tests per file (from
#   gpu_tests.xml), the selection benchmark (selection/selection.json: Top-1 Chunk Approx against SDPA at each
#   LENGTH, layer and mixing op, forward+backward, peak memory; the model step and decode), the 110m training
#   throughput (throughput/throughput.json). Returns 1 when a benchmark row is missing (a refused variant, an
#   out-of-memory, a crash), after writing what there is.
gpu_summary() {
  local out="$1"; shift
  "$PY" - "$out" "$@" <<'EOF_PY'
import json, sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

out, lengths = Path(sys.argv[1]), [int(x) for x in sys.argv[2:]]
lines, missing = [], []

def load(p):
    try:
        return json.loads((out / p).read_text())
    except (OSError, ValueError):
        missing.append(p)
        return None

lines += ["# GPU check", ""]
dev = out / "device.txt"
if dev.exists():
    lines += ["```", dev.read_text().strip(), "```", ""]
lines += ["## GPU tests", "", "| file | run | failed | errors | skipped |", "|---|---|---|---|---|"]
try:
    per = defaultdict(lambda: [0, 0, 0, 0])
    for case in ET.parse(out / "gpu_tests.xml").getroot().iter("testcase"):
        row = per[case.get("classname", "?")]
        row[0] += 1
        for i, tag in ((1, "failure"), (2, "error"), (3, "skipped")):
            row[i] += case.find(tag) is not None
    lines += [f"| {f} | {a} | {b} | {c} | {d} |" for f, (a, b, c, d) in sorted(per.items())]
except (OSError, ET.ParseError):
    missing.append("gpu_tests.xml")

sel = load("selection/selection.json")
if sel:
    lines += ["", "## Selection: Top-1 Chunk Approx (Triton tile kernel) vs SDPA, forward + backward", "",
              "| T | layer SDPA s | layer Top-1 s | layer speed-up | op SDPA s | op Top-1 s | op speed-up | peak SDPA GiB | peak Top-1 GiB |",
              "|---|---|---|---|---|---|---|---|---|"]
    rows = {(r["variant"], r["T"], part): r for part in ("layer", "core") for r in sel.get(part, [])}
    for T in lengths:
        cells = []
        for part in ("layer", "core"):
            a, b = rows.get(("sdpa", T, part)), rows.get(("top1_chunk_approx", T, part))
            for v, r in (("sdpa", a), ("top1_chunk_approx", b)):
                if r is None:
                    missing.append(f"selection {part} {v} T={T}")
            cells += [f"{a['wall_s']:.4f}" if a else "-", f"{b['wall_s']:.4f}" if b else "-",
                      f"{a['wall_s'] / b['wall_s']:.2f}x" if a and b else "-"]
        a, b = rows.get(("sdpa", T, "layer")), rows.get(("top1_chunk_approx", T, "layer"))
        gib = lambda r: f"{r['peak_bytes'] / 2**30:.2f}" if r and "peak_bytes" in r else "-"
        lines.append(f"| {T} | " + " | ".join(cells) + f" | {gib(a)} | {gib(b)} |")
    lines.append("")
    for r in sel.get("model", []):
        lines.append(f"model training step T={r['T']} {r['variant']}: {r['wall_s']:.3f} s")
    for r in sel.get("decode", []):
        lines.append(f"decode ctx={r['ctx']} {r['variant']}: {r['ms_per_token']:.2f} ms/token")
    for k, t in (sel.get("targets") or {}).items():
        lines.append(f"target {k}: {t['value']:.2f} (want {t['target']}) {'MET' if t['met'] else 'MISSED'}")
    lines.append("\n(the paper: Top-1 Chunk 4.5x Transformer++'s pre-training speed at 100k tokens)")

thr = load("throughput/throughput.json")
if thr:
    lines += ["", f"## Training throughput, {thr['meta'].get('preset')} preset, {thr['meta'].get('dtype')}", "",
              "| mixer | T | tokens/s | vs Transformer++ | peak GiB |", "|---|---|---|---|---|"]
    base = {r["T"]: r.get("tokens_per_s") for r in thr["rows"] if r["mixer"] == "attention"}
    for r in thr["rows"]:
        if r.get("oom") or "tokens_per_s" not in r:
            missing.append(f"throughput {r['mixer']} T={r['T']} (OOM)")
            lines.append(f"| {r['mixer']} | {r['T']} | OOM | - | - |")
            continue
        ratio = f"{r['tokens_per_s'] / base[r['T']]:.2f}x" if base.get(r["T"]) else "-"
        lines.append(f"| {r['mixer']} | {r['T']} | {r['tokens_per_s']:.0f} | {ratio} | {r.get('peak_mem_gib', float('nan')):.2f} |")

if missing:
    lines += ["", "**Missing: " + "; ".join(missing) + "**"]
(out / "summary.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
sys.exit(1 if missing else 0)
EOF_PY
}
