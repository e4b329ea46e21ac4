"""Zero-shot (VLM) cells of the grid on precomputed embeddings: logit-space and vocabulary scorers,
the vocabulary column, zero-shot accuracy, and Tab. 2 in the report."""

from __future__ import annotations

import numpy as np
import pytest

from oodeval.experiment import load_config, run_experiment
from oodeval.features import FeatureSet
from oodeval.report import build_views
from oodeval.results import load_cell_scores, load_results
from oodeval.zeroshot import score_zeroshot

E = 8


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture
def zs(tmp_path):
    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.normal(size=(E, E)))[0]
    id_text, neg_text = basis[:3], basis[3:7]
    y = rng.integers(0, 3, 60)
    id_img = unit(id_text[y] + 0.6 * rng.normal(size=(60, E)))
    ood_img = unit(neg_text[rng.integers(0, 4, 40)] + 0.6 * rng.normal(size=(40, E)))
    feats = {
        "id_test": str(FeatureSet(features=(3 * id_img).astype(np.float32), labels=y).save(tmp_path / "f" / "id")),
        "novel": str(FeatureSet(features=ood_img.astype(np.float32)).save(tmp_path / "f" / "ood")),
    }
    np.save(tmp_path / "id_text.npy", id_text)
    np.save(tmp_path / "wordnet.npy", neg_text[:2])
    np.save(tmp_path / "oracle.npy", neg_text)
    (tmp_path / "wordnet.txt").write_text("a\nb\n")
    (tmp_path / "oracle.txt").write_text("a\nb\nc\nd\n")
    feats.update({"text:id": str(tmp_path / "id_text.npy"), "text:wordnet": str(tmp_path / "wordnet.npy"), "text:oracle": str(tmp_path / "oracle.npy")})
    cfg = {
        "seeds": [0],
        "bootstrap_draws": 50,
        "results": str(tmp_path / "results.parquet"),
        "datasets": {"id_test": "val", "ood": ["novel"]},
        "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": feats}],
        "zeroshot": [
            "mcm",
            "energy",
            {"name": "neglabel", "vocabulary": "wordnet.txt", "hyperparameters": {"n_groups": 1}},
            {"name": "neglabel", "vocabulary": "oracle.txt", "hyperparameters": {"n_groups": 1}},
            {"name": "eoe", "vocabulary": "wordnet.txt"},
        ],
        "sweeps": [{"name": "oracle_size", "vocabulary": "oracle.txt", "sizes": [1, 2, 4, 9], "hyperparameters": {"n_groups": 1}}],
    }
    summary = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    stored = [unit(np.asarray(FeatureSet.load(feats[k]).features, np.float64)) for k in ("id_test", "novel")]
    return summary, *stored, id_text, neg_text, y


def test_zeroshot_cells(zs):
    summary, id_img, ood_img, id_text, neg_text, y = zs
    df = load_results(summary.results)
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    assert len(df) == 5 and summary.fits == 5
    assert sorted(df["vocabulary"].dropna()) == ["oracle", "wordnet", "wordnet"]
    row = df[(df["detector"] == "neglabel") & (df["vocabulary"] == "oracle")].iloc[0]
    ids, oods = load_cell_scores(row, summary.results)
    np.testing.assert_allclose(ids, score_zeroshot("neglabel", id_img, id_text, neg_text, n_groups=1), rtol=1e-9)
    np.testing.assert_allclose(oods, score_zeroshot("neglabel", ood_img, id_text, neg_text, n_groups=1), rtol=1e-9)
    acc = float(((id_img @ id_text.T).argmax(1) == y).mean())
    assert np.allclose(df["id_accuracy"], acc)
    assert (df["kind"] == "zero-shot").all()


def test_zeroshot_report_views(zs):
    summary = zs[0]
    df = load_results(summary.results)
    views, _ = build_views(df, summary.results)
    tab2 = next(v for v in views if v.key == "tab2")
    assert tab2.present
    cols = list(tab2.frame.columns)
    assert "logit-sp." in cols and "oracle" in cols and "neglabel:wordnet" in cols and "eoe:wordnet" in cols
    logit = df[df["vocabulary"].isna()]["fpr95"].min()
    best = df[df["vocabulary"].isna() & (df["fpr95"] == logit)]
    cis = {f"{100 * logit:.1f} [{100 * r['fpr95_lo']:.1f}, {100 * r['fpr95_hi']:.1f}]" for _, r in best.iterrows()}
    assert str(tab2.frame.iloc[0]["logit-sp."]) in cis  # the best logit-space scorer with its CI
    tab1 = next(v for v in views if v.key == "tab1")
    assert set(tab1.frame["FPR detector"]) <= {"mcm", "energy"}  # vocabularies stay out of Tab. 1
    assert not next(v for v in views if v.key == "tabA1").present  # no supervised model


def test_sweep_curve_recorded_and_drawn(zs, tmp_path):
    import pandas as pd

    from oodeval.report import sweeps_path, write_report

    summary = zs[0]
    sw = pd.read_parquet(sweeps_path(summary.results))
    assert list(sw["size"]) == [1, 2, 4]  # 9 exceeds the 4-label vocabulary and is dropped
    assert (sw["model"] == "clip").all() and (sw["dataset"] == "novel").all() and (sw["param"] == "M").all()
    df = load_results(summary.results)
    full = df[(df["detector"] == "neglabel") & (df["vocabulary"] == "oracle")]["fpr95"].iloc[0]
    assert sw["fpr95"].iloc[-1] == pytest.approx(full, abs=1e-12)  # the whole vocabulary = the grid cell
    paths = write_report(summary.results, tmp_path / "rep", draws=20)
    assert paths["sweep0_0"].is_file()
    assert "Fig. A2" in paths["markdown"].read_text()


def test_a_sweep_whose_vocabulary_or_sizes_changed_is_recomputed(zs, tmp_path):
    import pandas as pd

    from oodeval.report import sweeps_path

    summary = zs[0]
    path = sweeps_path(summary.results)
    before = path.read_bytes()
    cfg = {
        "seeds": [0], "bootstrap_draws": 50, "results": str(summary.results),
        "datasets": {"id_test": "val", "ood": ["novel"]},
        "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": {
            "id_test": str(tmp_path / "f" / "id"), "novel": str(tmp_path / "f" / "ood"),
            "text:id": str(tmp_path / "id_text.npy"), "text:oracle": str(tmp_path / "oracle.npy")}}],
        "zeroshot": ["mcm"],
        "sweeps": [{"name": "oracle_size", "vocabulary": "oracle.txt", "sizes": [1, 2, 4, 9], "hyperparameters": {"n_groups": 1}}],
    }  # fmt: skip
    run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    assert path.read_bytes() == before  # nothing changed: the recorded curve is reused
    cfg["sweeps"][0]["sizes"] = [2, 3]
    run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    assert list(pd.read_parquet(path)["size"]) == [2, 3]
    # the vocabulary's embeddings change in place (its first two labels swapped): recomputed
    emb = np.load(tmp_path / "oracle.npy")
    curve = pd.read_parquet(path)["fpr95"].tolist()
    np.save(tmp_path / "oracle.npy", emb[[2, 3, 0, 1]])
    run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    again = pd.read_parquet(path)
    assert list(again["size"]) == [2, 3] and again["fpr95"].tolist() != curve


def test_non_finite_image_embeddings_fail_their_cells_naming_set_array_and_count(zs, tmp_path):
    ood = FeatureSet.load(tmp_path / "f" / "ood")
    x = np.array(ood.features)
    x[[4, 9]] = np.nan
    FeatureSet(features=x, meta={"dataset": "nan-set"}).save(tmp_path / "f" / "nan")
    cfg = {
        "seeds": [0], "bootstrap_draws": 50, "results": str(tmp_path / "nan.parquet"),
        "datasets": {"id_test": "val", "ood": ["novel", "bad"]},
        "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": {
            "id_test": str(tmp_path / "f" / "id"), "novel": str(tmp_path / "f" / "ood"), "bad": str(tmp_path / "f" / "nan"),
            "text:id": str(tmp_path / "id_text.npy")}}],
        "zeroshot": ["mcm"],
    }  # fmt: skip
    summary = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    df = load_results(summary.results).set_index("dataset")
    assert df.loc["novel", "status"] == "ok" and df.loc["bad", "status"] == "error" and not summary.ok
    assert f"FeatureSet 'nan-set' has non-finite values: features has {2 * E} non-finite values (first in row 4)" in df.loc["bad", "error"]


def test_default_scorers_record_gl_mcm_as_an_error_saying_why(tmp_path):
    rng = np.random.default_rng(2)
    text = unit(rng.normal(size=(3, E)))
    feats = {"id_test": str(FeatureSet(features=unit(rng.normal(size=(20, E))).astype(np.float32)).save(tmp_path / "id")),
             "novel": str(FeatureSet(features=unit(rng.normal(size=(20, E))).astype(np.float32)).save(tmp_path / "ood"))}
    np.save(tmp_path / "id_text.npy", text)
    feats["text:id"] = str(tmp_path / "id_text.npy")
    cfg = {"seeds": [0], "bootstrap_draws": 10, "results": str(tmp_path / "r.parquet"),
           "datasets": {"id_test": "val", "ood": ["novel"]},
           "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": feats}]}
    df = load_results(run_experiment(load_config(cfg, base_dir=tmp_path), progress=False).results)
    assert sorted(df["detector"]) == sorted(["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "gl_mcm"])
    gl = df[df["detector"] == "gl_mcm"].iloc[0]
    assert gl["status"] == "error" and "gl_mcm needs patch features" in gl["error"]
    assert (df[df["detector"] != "gl_mcm"]["status"] == "ok").all()
