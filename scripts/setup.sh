#!/usr/bin/env bash
# Idempotent set-up: Debian packages (when root and missing), then the local virtual environment.
# Re-installs the Python packages only when pyproject.toml or constraints.txt changed since the last run;
# constraints.txt holds the exact versions, pyproject.toml the supported ranges.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES="dataset-fashion-mnist wordnet-base chromium chromium-driver"
missing=""
for pkg in $DEB_PACKAGES; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "setup: warning: Debian packages missing and not root:$missing (the demo and some tests need them)" >&2
  fi
fi

PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $PYTHON"
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.oodeval-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes a few minutes)"
  # pip's "Location ... is ignored" warnings come from this machine's pip config; pipefail keeps pip's status
  pipq() { .venv/bin/python -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
  pipq --upgrade pip
  pipq -c constraints.txt -e '.[test]'
  .venv/bin/python -c "import oodeval, torch, timm, open_clip" || { echo "setup: install failed" >&2; exit 1; }
  echo "$want" > "$stamp"
fi
