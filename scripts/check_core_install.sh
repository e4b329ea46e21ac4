#!/usr/bin/env bash
# Installs the core of oodeval (`pip install .`, no extras) into a fresh venv, checks that no extra's
# package came with it (torch, timm, open_clip, transformers, matplotlib, pyarrow, scikit-image, pillow),
# scores saved FeatureSets with `oodeval score` there, and prints the venv's size.
# Usage: scripts/check_core_install.sh (a minute or two; needs PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(mktemp -d)
venv=$root/venv
"${PYTHON:-python3.11}" -m venv "$venv"
pipq() { "$venv/bin/python" -m pip install -q "$@" 2>&1 | { grep -v "is ignored: it is neither" || true; }; }
pipq -c constraints.txt .
"$venv/bin/python" - "$root" <<'PY'
import importlib.util, sys
from pathlib import Path
extras = ["torch", "torchvision", "timm", "open_clip", "transformers", "matplotlib", "pyarrow", "skimage", "PIL", "safetensors"]
present = [m for m in extras if importlib.util.find_spec(m) is not None]
assert not present, f"the core install brought {present}"
import numpy as np
from oodeval.features import FeatureSet
rng = np.random.default_rng(0)
w = rng.normal(size=(4, 8)).astype(np.float32)
for name, n, shift in (("train", 200, 1.0), ("test", 80, 1.0), ("ood", 60, 0.0)):
    labels = rng.integers(0, 4, n) if name != "ood" else None
    x = rng.normal(size=(n, 8)).astype(np.float32) + shift * (w[labels] if labels is not None else 0)
    FeatureSet(x, labels=labels, logits=x @ w.T, weight=w, bias=np.zeros(4, np.float32)).save(Path(sys.argv[1]) / name)
PY
"$venv/bin/oodeval" score --train "$root/train" --test "$root/test" --ood "far=$root/ood" --detectors msp,energy,vim,knn \
    --set knn.k=10 --draws 200 --no-progress
echo "check_core_install: core venv $(du -sh "$venv" | cut -f1), no torch; scoring saved FeatureSets works"
