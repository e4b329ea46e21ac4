#!/usr/bin/env bash
# Installs oodeval with `pip install .` into a fresh venv that already holds other versions of numpy and
# pandas inside the declared ranges (default: the lower bounds), checks pip kept them, then runs the tests
# there. Usage: scripts/check_install.sh [NUMPY_VERSION PANDAS_VERSION] (takes a few minutes; needs PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
numpy=${1:-2.0.2}
pandas=${2:-2.3.3}
venv=$(mktemp -d)/venv
"${PYTHON:-python3.11}" -m venv "$venv"
pipq() { "$venv/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
pipq "numpy==$numpy" "pandas==$pandas"
grep -v -E "^(numpy|pandas)==" constraints.txt > "$venv/constraints.txt"
pipq -c "$venv/constraints.txt" '.[test]'
got=$("$venv/bin/python" -c "import numpy, pandas; print(numpy.__version__, pandas.__version__)")
[ "$got" = "$numpy $pandas" ] || { echo "check_install: pip replaced numpy/pandas: $got" >&2; exit 1; }
echo "check_install: installed beside numpy $numpy and pandas $pandas; running the tests there"
HF_HUB_OFFLINE=1 "$venv/bin/python" -m pytest -q -p no:cacheprovider
