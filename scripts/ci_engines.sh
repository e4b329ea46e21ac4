#!/usr/bin/env bash
# CI step after `make test`: the grid on real engines (tests/test_engines.py). Installs Slurm, munge,
# MariaDB (Debian) and Ray/submitit (PyPI) when missing, then, in a private network namespace whose
# only interface is loopback, starts a Ray cluster of two nodes and a single-node Slurm with
# accounting (scripts/engines.sh), runs the tests marked `engines`, and stops every engine by its
# own command, also when a test or a start fails. Every step is bounded: a daemon that does not come
# up fails with its log (ENGINES_WAIT seconds), the tests get TEST_TIMEOUT seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-.venv/bin/python}
TEST_TIMEOUT=${TEST_TIMEOUT:-420}

[ "$(id -u)" = 0 ] || { echo "ci_engines: needs root (Slurm's daemons, a network namespace)" >&2; exit 1; }
timeout 240 bash scripts/engines.sh install
started=$(date +%s)
bash scripts/engines.sh isolated bash -c '
  set -u
  trap "bash scripts/engines.sh stop all" EXIT
  # Ray >= 2.5x: token authentication is on once ~/.ray/auth_token exists (a local Ray instance of `make test` leaves it)
  if [ -f "$HOME/.ray/auth_token" ]; then export RAY_AUTH_MODE=token; fi
  bash scripts/engines.sh start ray > "${ENGINES_DIR:-/tmp/oodeval-engines}/start-ray.out" 2>&1 & ray=$!
  bash scripts/engines.sh start slurm || exit 1
  wait $ray || { cat "${ENGINES_DIR:-/tmp/oodeval-engines}/start-ray.out" >&2; exit 1; }
  cat "${ENGINES_DIR:-/tmp/oodeval-engines}/start-ray.out"
  OODEVAL_ENGINES=ray,slurm timeout --kill-after=20 '"$TEST_TIMEOUT"' "$PY" -m pytest -q -p no:cacheprovider --durations=4 -m engines tests/test_engines.py
'
echo "ci_engines: engines up, tested and stopped in $(( $(date +%s) - started )) s"
