"""SIGKILL mid-run and resume; two torchrun ranks on gloo writing shards of one entry."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from oodeval.features import FeatureSet
from oodeval.features import store as store_mod
from oodeval.features.extract import extract

KW = {"num_classes": 2, "pretrained_cfg_overlay": {"input_size": [3, 24, 24]}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("resume") / "imgs"
    rng = np.random.default_rng(5)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(7):
            Image.fromarray(rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    (root / "b" / "3.png").write_bytes(b"not a png")
    return root


def _script(body: str, tmp_path: Path) -> Path:
    path = tmp_path / "run.py"
    path.write_text(textwrap.dedent(body))
    return path


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def test_sigkill_then_resume_loses_and_duplicates_no_rows(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "store"
    script = _script(f"""
        import os, signal
        from oodeval.features import store
        from oodeval.features.extract import extract
        real, calls = store.write_shard, []
        def write_then_die(*a, **k):
            real(*a, **k)
            calls.append(1)
            if len(calls) == 2:
                os.kill(os.getpid(), signal.SIGKILL)
        store.write_shard = write_then_die
        extract("test_resnet", {str(folder)!r}, {str(store)!r}, model_kwargs={KW!r}, batch_size=2, shard_size=3, progress=False)
    """, tmp_path)
    proc = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr
    partial = list((store / ".partial").iterdir())
    partial = [p for p in partial if p.is_dir()]
    assert len(partial) == 1 and sorted(p.name for p in partial[0].glob("shard-*.npz")) == ["shard-000000.npz", "shard-000001.npz"]

    written = []
    real = store_mod.write_shard
    monkeypatch.setattr(store_mod, "write_shard", lambda path, *a, **k: (written.append(path.name), real(path, *a, **k)))
    resumed = FeatureSet.load(extract("test_resnet", folder, store, model_kwargs=KW, batch_size=4, progress=False))
    assert written == ["shard-000002.npz", "shard-000003.npz", "shard-000004.npz"]  # 14 rows / 3 per shard
    assert not partial[0].exists()

    fresh = FeatureSet.load(extract("test_resnet", folder, tmp_path / "fresh", model_kwargs=KW, progress=False))
    assert len(resumed) == 13 and resumed.meta["n_skipped"] == 1
    np.testing.assert_array_equal(resumed.extras["manifest_index"], fresh.extras["manifest_index"])
    np.testing.assert_array_equal(resumed.extras["manifest_index"], np.delete(np.arange(14), 10))
    np.testing.assert_allclose(resumed.features, fresh.features, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(resumed.logits, fresh.logits, rtol=1e-5, atol=1e-6)


def test_torchrun_two_gloo_ranks_share_one_entry(folder: Path, tmp_path: Path) -> None:
    store, log = tmp_path / "store", tmp_path / "writes.log"
    script = _script(f"""
        import os
        from oodeval.features import store
        from oodeval.features.extract import extract
        real = store.write_shard
        def logged(path, *a, **k):
            real(path, *a, **k)
            with open({str(log)!r}, "a") as fh:
                fh.write(os.environ["RANK"] + " " + path.name + "\\n")
        store.write_shard = logged
        path = extract("test_resnet", {str(folder)!r}, {str(store)!r}, model_kwargs={KW!r}, batch_size=2, shard_size=4,
                       device="cpu", progress=False)
        with open({str(tmp_path)!r} + "/entry-" + os.environ["RANK"], "w") as fh:  # not stdout: ranks interleave
            fh.write(str(path))
    """, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)],
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    entries = {p.name[len("entry-"):]: p.read_text() for p in tmp_path.glob("entry-*")}
    assert set(entries) == {"0", "1"} and entries["0"] == entries["1"]
    writes = sorted(tuple(line.split()) for line in log.read_text().splitlines())
    assert writes == [("0", "shard-000000.npz"), ("0", "shard-000002.npz"), ("1", "shard-000001.npz"), ("1", "shard-000003.npz")]
    dist = FeatureSet.load(entries["0"])
    assert dist.meta["world_size"] == 2
    single = FeatureSet.load(extract("test_resnet", folder, tmp_path / "single", model_kwargs=KW, progress=False))
    np.testing.assert_array_equal(dist.extras["manifest_index"], single.extras["manifest_index"])
    np.testing.assert_allclose(dist.logits, single.logits, rtol=1e-5, atol=1e-6)
