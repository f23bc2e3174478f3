#!/usr/bin/env bash
# Mutation testing of the statistics, the sweep/tuning logic and the checkpoint unpickler (docs/testing.md).
# Not part of CI: 15-25 minutes of CPU on 2 cores. Needs mutmut >= 3.8 in the venv (pip install 'mutmut==3.8.1'; 3.3.1
# fails with pytest 9 and installs a top-level package named "tests" that hides this repository's: the script removes it).
# Works in a scratch copy (build/mutation/, or $MUTATION_DIR) and prints mutmut's survivors at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
. .venv/bin/activate
python - <<'PY'
import importlib.util, pathlib, shutil
spec = importlib.util.find_spec("tests")
if spec and spec.origin and "site-packages" in spec.origin:  # mutmut 3.3.1's stray test package
    shutil.rmtree(pathlib.Path(spec.origin).parent)
PY
WORK=${MUTATION_DIR:-build/mutation}
rm -rf "$WORK"
mkdir -p "$WORK"
cp -r src tests pyproject.toml "$WORK"/
cd "$WORK"
# what is mutated (every function of these files; of checkpoint.py only the unpickler's mutants are run) and
# the tests that may kill them (the end-to-end sweep tests train whole studies: left out, they would take hours)
cat > setup.cfg <<'CFG'
[mutmut]
source_paths = src/
only_mutate =
    src/basecap/report/stats.py
    src/basecap/sweep.py
    src/basecap/report/sweep.py
    src/basecap/reuse.py
    src/basecap/checkpoint.py
pytest_add_cli_args_test_selection =
    tests/test_stats.py
    tests/test_sweep.py
    tests/test_reuse.py
    tests/test_checkpoint.py
    tests/test_independent_checks.py
pytest_add_cli_args =
    -p
    no:logging
    -p
    no:cacheprovider
    -k
    not end_to_end and not two_processes_share
use_git_change_detection = false
CFG
# basecap's lm-eval .pth file imports basecap at interpreter start-up, from the checkout: forget it, so that the
# tests import the mutated copy mutmut puts first on sys.path
MUTMUT='import sys; [sys.modules.pop(m) for m in list(sys.modules) if m.split(".")[0] == "basecap"]; from mutmut.__main__ import cli; cli()'
python -c "$MUTMUT" run --max-children "${MUTATION_CHILDREN:-2}" "basecap.report.stats.*" "basecap.sweep.*" "basecap.report.sweep.*" \
    "basecap.reuse.*" "basecap.checkpoint.xǁ_MetadataUnpicklerǁ*" || true
python -c "$MUTMUT" results
