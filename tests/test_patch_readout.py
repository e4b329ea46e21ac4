"""GL-MCM's patch readout through extraction and the grid (issue 32): equality with the full tensor,
refusal of a readout for other labels or tau, the cache key, the float16 bound, the grid path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from oodeval.features import FeatureSet
from oodeval.features.backbones import load_backbone
from oodeval.features.extract import extract
from oodeval.features.patchreadout import PatchReadout, float16_error_bound, local_mcm
from oodeval.features.valuepath import image_and_patch_features
from oodeval.zeroshot.scorers import GLMCM


def _images(folder: Path, n: int, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (40, 44, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    return folder


def _text(e: int, c: int, seed: int) -> np.ndarray:
    t = np.random.default_rng(seed).standard_normal((c, e))
    return t / np.linalg.norm(t, axis=1, keepdims=True)


@pytest.fixture
def extracted(tiny_clip: str, tmp_path: Path):
    """A tiny CLIP extracted with a readout at tau = 0.01, and the full float32 tensor of the same batch."""
    folder = _images(tmp_path / "img", 6, 1)
    model = f"open_clip:{tiny_clip}"
    text = _text(32, 5, 2)
    path = extract(model, folder, tmp_path / "store", patch_readouts=[PatchReadout(text, 0.01)], batch_size=8, progress=False)
    bb = load_backbone(model)
    x = torch.stack([bb.transform(Image.open(folder / f"{i}.png").convert("RGB")) for i in range(6)])
    with torch.no_grad():
        glob, patches = image_and_patch_features(bb.model, x)
    return FeatureSet.load(path), FeatureSet(features=glob.numpy(), extras={"patch_features": patches.numpy()}), text, model, folder


def test_extracted_readout_scores_equal_the_full_tensor_and_no_patch_tensor_is_stored(extracted) -> None:
    fs, full, text, _, _ = extracted
    assert "patch_features" not in fs.extras and all(v.ndim == 1 for v in fs.extras.values())
    (name,) = [k for k in fs.extras if k.startswith("patch_readout/")]
    assert fs.meta["patch_readouts"][name]["tau"] == 0.01 and fs.meta["patch_readouts"][name]["n_labels"] == 5
    np.testing.assert_array_equal(fs.features, full.features)
    np.testing.assert_allclose(GLMCM().score(fs, text, normalize=True), GLMCM().score(full, text, normalize=True), rtol=1e-12, atol=0)
    np.testing.assert_allclose(GLMCM(lam=0.5).score(fs, text, normalize=True), GLMCM(lam=0.5).score(full, text, normalize=True),
                               rtol=1e-12, atol=0)


def test_a_readout_for_other_labels_or_another_tau_is_refused(extracted) -> None:
    fs, _, text, _, _ = extracted
    with pytest.raises(ValueError, match=r"another label set or temperature .*at tau=0\.02; the label set or tau changed"):
        GLMCM(tau=0.02).score(fs, text)
    other = text.copy()
    other[0] = _text(32, 1, 9)[0]
    with pytest.raises(ValueError, match=r"not for these 5 labels .*at tau=0\.01"):
        GLMCM().score(fs, other)
    with pytest.raises(ValueError, match=r"not for these 4 labels"):
        GLMCM().score(fs, text[:4])


def test_a_new_label_set_or_tau_is_a_new_store_entry_the_same_one_is_reused(extracted, tmp_path: Path) -> None:
    fs, _, text, model, folder = extracted
    store = tmp_path / "store"
    same = extract(model, folder, store, patch_readouts=[PatchReadout(text.copy(), 0.01)], progress=False)
    assert FeatureSet.load(same).meta["key"] == fs.meta["key"]
    tau = FeatureSet.load(extract(model, folder, store, patch_readouts=[PatchReadout(text, 0.02)], progress=False))
    labels = FeatureSet.load(extract(model, folder, store, patch_readouts=[PatchReadout(text[:4], 0.01)], progress=False))
    assert len({fs.meta["key"], tau.meta["key"], labels.meta["key"]}) == 3
    assert GLMCM(tau=0.02).score(tau, text).shape == (6,) and GLMCM().score(labels, text[:4]).shape == (6,)
    with pytest.raises(ValueError, match="text tower"):
        extract(model, folder, store, patch_readouts=[PatchReadout(text, 0.03, text_tower="0" * 32)], progress=False)


def test_full_patch_tensor_only_when_asked_as_float16_within_the_stated_bound(extracted, tmp_path: Path) -> None:
    _, full, text, model, folder = extracted
    fs = FeatureSet.load(extract(model, folder, tmp_path / "store", patch_features=True, progress=False))
    stored = fs.extras["patch_features"]
    assert stored.dtype == np.float16 and stored.shape == full.extras["patch_features"].shape
    exact = full.extras["patch_features"].astype(np.float64)
    exact /= np.linalg.norm(exact, axis=-1, keepdims=True)
    half = stored.astype(np.float64)
    half /= np.linalg.norm(half, axis=-1, keepdims=True)
    cos_bound, rel_bound = float16_error_bound(exact.shape[-1], 0.01)
    assert np.abs((half - exact) @ text.T).max() <= cos_bound
    got, want = GLMCM().score(fs, text, normalize=True), GLMCM().score(full, text, normalize=True)
    mcm_part = GLMCM(lam=0.0).score(full, text, normalize=True)
    np.testing.assert_allclose(got - mcm_part, want - mcm_part, rtol=rel_bound, atol=0)


def test_float16_bound_holds_on_many_tokens_and_has_the_documented_size() -> None:
    rng = np.random.default_rng(3)
    e, tau = 256, 0.01
    u = rng.standard_normal((4000, e)) * rng.uniform(0.01, 1.0, (4000, 1)) ** 4  # spread magnitudes, tiny components
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    text = _text(e, 40, 4)
    half = u.astype(np.float16).astype(np.float64)
    half /= np.linalg.norm(half, axis=1, keepdims=True)
    cos_bound, rel_bound = float16_error_bound(e, tau)
    assert 0 < np.abs((half - u) @ text.T).max() <= cos_bound
    ref = local_mcm(torch.from_numpy(u[:, None]), torch.from_numpy(text), tau).numpy()
    approx = local_mcm(torch.from_numpy(half[:, None]), torch.from_numpy(text), tau).numpy()
    assert np.abs(approx / ref - 1).max() <= rel_bound
    cos, rel = float16_error_bound(1536, 0.01)
    assert abs(cos - 9.79e-4) < 1e-6 and abs(rel - 0.216) < 1e-3  # the figures docs/zeroshot.md states


def test_grid_stores_readouts_not_patch_tokens_and_scores_gl_mcm(tiny_clip: str, tmp_path: Path) -> None:
    from oodeval.experiment import load_config, run_experiment
    from oodeval.results import load_cell_scores, load_results

    _images(tmp_path / "id", 5, 5)
    _images(tmp_path / "ood", 4, 6)
    text = _text(32, 3, 7)
    np.save(tmp_path / "id_text.npy", text.astype(np.float32))
    cfg = {"seeds": [0], "bootstrap_draws": 10, "results": str(tmp_path / "r.parquet"), "store": str(tmp_path / "store"),
           "datasets": {"id_test": str(tmp_path / "id"), "ood": [{"name": str(tmp_path / "ood"), "label": "novel"}]},
           "models": [{"name": f"open_clip:{tiny_clip}", "label": "clip", "kind": "zero-shot", "pretrained": False, "patch_features": True,
                       "features": {"text:id": str(tmp_path / "id_text.npy")}}],
           "zeroshot": ["mcm", "gl_mcm", {"name": "gl_mcm", "hyperparameters": {"tau": 0.05}}]}
    results = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False).results
    df = load_results(results)
    assert (df["status"] == "ok").all(), df["error"].tolist()
    entries = [FeatureSet.load(p.parent) for p in (tmp_path / "store").rglob("meta.json")]
    assert len(entries) == 2
    for fs in entries:
        assert "patch_features" not in fs.extras and sorted(r["tau"] for r in fs.meta["patch_readouts"].values()) == [0.01, 0.05]
    saved = np.load(tmp_path / "id_text.npy").astype(np.float64)
    unit = saved / np.linalg.norm(saved, axis=-1, keepdims=True)  # the grid's label embeddings, bit for bit
    by_n = {len(fs): fs for fs in entries}  # 5 ID images, 4 OOD images
    for tau in (0.01, 0.05):
        row = df[(df["detector"] == "gl_mcm") & (df["hyperparameters"].str.contains("0.05") == (tau == 0.05))].iloc[0]
        ids, oods = load_cell_scores(row, results)
        np.testing.assert_array_equal(ids, GLMCM(tau=tau).score(by_n[5], unit, normalize=True))
        np.testing.assert_array_equal(oods, GLMCM(tau=tau).score(by_n[4], unit, normalize=True))


def test_run_check_prints_the_extraction_disk_and_refuses_when_the_store_has_less(tiny_clip: str, tmp_path: Path, monkeypatch,
                                                                                 capsys) -> None:
    from oodeval.cli import main
    from oodeval.experiment import disk, load_config, run_experiment

    _images(tmp_path / "id", 5, 5)
    _images(tmp_path / "ood", 4, 6)
    (tmp_path / "exp.toml").write_text(f"""
store = "store"
results = "r.parquet"
[datasets]
id_test = "id"
ood = [{{ name = "ood", label = "novel" }}]
[[models]]
name = "open_clip:{tiny_clip}"
label = "tiny"
kind = "zero-shot"
pretrained = false
patch_features = true
full_patch_features = true
""")
    np.save(tmp_path / "id_text.npy", _text(32, 3, 7))
    toml = (tmp_path / "exp.toml").read_text() + 'features = { "text:id" = "id_text.npy" }\n[[zeroshot]]\nname = "gl_mcm"\n'
    (tmp_path / "exp.toml").write_text(toml)
    (row,) = disk.estimate_disk(load_config(tmp_path / "exp.toml"))
    assert row.per_image == 4 * 32 + 16 + 8 + 2 * 16 * 32 and row.images == 9  # E = 32, P = (32 / 8)^2 = 16, one readout
    need = row.total + 2 * row.largest
    monkeypatch.setattr(disk, "free_bytes", lambda path: need)
    assert main(["run", str(tmp_path / "exp.toml"), "--check"]) == 0
    out = capsys.readouterr().out
    assert f"tiny: extraction writes {disk.format_bytes(row.total)} for 9 images ({disk.format_bytes(row.per_image)} per image" in out
    monkeypatch.setattr(disk, "free_bytes", lambda path: need - 1)
    assert main(["run", str(tmp_path / "exp.toml"), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"the store {tmp_path / 'store'} has {disk.format_bytes(need - 1)} ({need - 1:,} bytes) free but the zero-shot models' " \
           f"extraction needs {disk.format_bytes(need)} ({need:,} bytes; tiny {disk.format_bytes(row.total)}" in err
    run_experiment(load_config(tmp_path / "exp.toml"), progress=False)  # the estimate covers what extraction writes
    written = sum(f.stat().st_size for f in (tmp_path / "store").rglob("*") if f.is_file() and "text" not in f.relative_to(tmp_path / "store").parts)
    assert row.total - 2 * 8192 <= written <= row.total


def test_content_hash_of_wide_rows_is_chunked_by_bytes_and_unchanged() -> None:
    """Saving a full patch tensor hashes it; 65536 rows of (P, E) at once would copy the whole array."""
    from oodeval._io import hash_arrays

    a = np.random.default_rng(8).standard_normal((50, 7, 5)).astype(np.float16)
    whole = hash_arrays({"p": a})  # one chunk: 50 rows x 70 bytes
    assert hash_arrays({"p": a}, chunk_bytes=70 * 3) == hash_arrays({"p": a}, chunk_rows=1) == whole
    assert hash_arrays({"p": a[:-1]}, chunk_bytes=70 * 3) != whole
