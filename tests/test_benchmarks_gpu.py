"""benchmarks/gpu.sh runs end to end on the CPU at a tiny size (the GPU run uses the same steps)."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_script_runs_on_cpu_at_a_tiny_size():
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu.sh"), "--device", "cpu", "--tiny"],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"extraction loop \(JPEG -> store\): +[0-9.]+ img/s", text)
    assert text.count("== detectors:") == 2
    for name in ("mahalanobis", "relative_mahalanobis_pp", "knn", "vim", "nnguide", "neco", "fdbd", "dice", "kl_matching"):
        assert len(re.findall(rf"^{name} +[0-9.]+ +[0-9.]+ ", text, flags=re.M)) == 2, name
    assert "device cpu" in text
