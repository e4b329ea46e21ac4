"""Zero-shot (VLM) cells of the grid on precomputed embeddings: logit-space and vocabulary scorers,
the vocabulary column, zero-shot accuracy, and Tab. 2 in the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from oodeval.experiment import load_config, run_experiment
from oodeval.features import FeatureSet
from oodeval.report import build_views
from oodeval.report.views import Cell
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
    cols = [(c.title if isinstance(c, Cell) else str(c)) for c in tab2.frame.columns]  # a scorer-named column's id is its tooltip
    assert "logit-sp." in cols and "oracle" in cols and "neglabel:wordnet" in cols and "eoe:wordnet" in cols
    logit = df[df["vocabulary"].isna()]["fpr95"].min()
    best = df[df["vocabulary"].isna() & (df["fpr95"] == logit)]
    cis = {f"{100 * logit:.1f} [{100 * r['fpr95_lo']:.1f}, {100 * r['fpr95_hi']:.1f}]" for _, r in best.iterrows()}
    assert str(tab2.frame.iloc[0]["logit-sp."]) in cis  # the best logit-space scorer with its CI
    tab1 = next(v for v in views if v.key == "tab1")
    assert {(c.title if isinstance(c, Cell) else str(c)) for c in tab1.frame["FPR detector"]} <= {"mcm", "energy"}  # vocabularies stay out of Tab. 1
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


# ---------------------------------------------------------------- repeated LLM generations (paper Tab. 2 / A4)
class _LLM:
    """A ChatClient stand-in whose answer depends on the request's generation (its ``seed``)."""

    model = "fake-llm"

    def __init__(self, names_of) -> None:
        self.names_of = names_of

    def complete(self, messages, seed=None, **params):
        return "\n".join(f"- {n}" for n in self.names_of(seed))


@pytest.fixture
def generations(tmp_path):
    """Two VLMs x 3 EOE generations (EOE's prompts from a user file) x 2 sibling generations (ours),
    each vocabulary file generated by oodeval's LLM functions and given precomputed label embeddings."""
    from oodeval.zeroshot.llm_vocab import generate_eoe, generate_siblings, siblings_vocabulary
    from oodeval.zeroshot.prompts import prompts_provenance

    rng = np.random.default_rng(7)
    basis = np.linalg.qr(rng.normal(size=(E, E)))[0]
    id_text, neg = basis[:3], basis[3:]
    prompts = tmp_path / "eoe-release.toml"
    prompts.write_text('[eoe.fine_grained]\nfirst = "EOE: {n_id} classes {id_names}; {batch} outliers"\nagain = "{batch} more"\n')
    names = ["cat", "dog", "fox"]
    words = [f"w{i}" for i in range(12)]
    feats_text = {"text:id": str(tmp_path / "id_text.npy")}
    np.save(tmp_path / "id_text.npy", id_text)
    embed = {w: unit(neg[i % 5] + 0.3 * rng.normal(size=E)) for i, w in enumerate(words)}
    for g in range(3):  # generation g names 2 + 2g of the outlier words: the FPR@95 differs by generation
        vocab = generate_eoe(_LLM(lambda seed: words[: 2 + 2 * seed]), names, n_classes=2 + 2 * g, batch=50, generation=g, prompts=prompts)
        vocab.save(tmp_path / f"EOE-gen{g}.json")
        np.save(tmp_path / f"EOE-gen{g}.npy", np.stack([embed[w] for w in vocab.labels]))
        feats_text[f"text:EOE-gen{g}"] = str(tmp_path / f"EOE-gen{g}.npy")
    for g in range(2):
        per_class = generate_siblings(_LLM(lambda seed: words[4 * seed : 4 * seed + 5]), names, k=5, generation=g, progress=False)
        vocab = siblings_vocabulary(per_class, provenance={"generations": [g], **prompts_provenance(None, ("siblings",))})  # as `vocab llm`
        vocab.save(tmp_path / f"GPT-gen{g}.json")
        np.save(tmp_path / f"GPT-gen{g}.npy", np.stack([embed[w] for w in vocab.labels]))
        feats_text[f"text:GPT-gen{g}"] = str(tmp_path / f"GPT-gen{g}.npy")
    models = []
    for m, noise in (("vlm-a", 0.5), ("vlm-b", 0.8)):
        y = rng.integers(0, 3, 80)
        id_img = unit(id_text[y] + noise * rng.normal(size=(80, E)))
        ood_img = unit(neg[rng.integers(0, 5, 60)] + noise * rng.normal(size=(60, E)))
        feats = {"id_test": str(FeatureSet(features=id_img.astype(np.float32), labels=y).save(tmp_path / m / "id")),
                 "novel": str(FeatureSet(features=ood_img.astype(np.float32)).save(tmp_path / m / "ood")), **feats_text}
        models.append({"name": "open_clip:ViT-B-32", "label": m, "kind": "zero-shot", "features": feats})
    cfg = {
        "seeds": [0], "bootstrap_draws": 20, "results": str(tmp_path / "results.parquet"), "eoe_prompts": str(prompts),
        "datasets": {"id_test": "val", "ood": ["novel"]}, "models": models,
        "zeroshot": ["mcm", {"name": "eoe", "vocabulary": "EOE-gen{g}.json", "generations": 3},
                     {"name": "neglabel", "vocabulary": "GPT-gen{g}.json", "generations": 2, "hyperparameters": {"n_groups": 1}}],
        "sweeps": [{"name": "siblings_k", "kind": "siblings", "vocabulary": "GPT-gen1.json", "sizes": [1, 3, 100],
                    "hyperparameters": {"n_groups": 1}}],
    }  # fmt: skip
    config = load_config(cfg, base_dir=tmp_path)
    return config, run_experiment(config, progress=False), prompts, embed, id_text


def test_generations_expand_and_record_their_prompts(generations):
    import json

    config, summary, prompts, _, _ = generations
    assert [s.vocabulary.rsplit("/", 1)[1] for s in config.zeroshot if s.vocabulary] == [
        "EOE-gen0.json", "EOE-gen1.json", "EOE-gen2.json", "GPT-gen0.json", "GPT-gen1.json"]
    df = load_results(summary.results)
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    src = df.dropna(subset=["vocabulary"]).set_index(["model", "vocabulary"])["vocabulary_source"].map(json.loads)
    assert src[("vlm-a", "EOE-gen2")]["prompt_file"] == str(prompts) and src[("vlm-a", "EOE-gen2")]["generation"] == 2
    assert src[("vlm-b", "GPT-gen0")]["prompt_file"] == "oodeval default" and src[("vlm-b", "GPT-gen0")]["kind"] == "llm-siblings"


def test_tab2_is_the_mean_and_std_over_generations(generations):
    from oodeval.report.views import pct

    _, summary, _, _, _ = generations
    df = load_results(summary.results)
    views, _ = build_views(df, summary.results)
    tab2 = next(v for v in views if v.key == "tab2").frame.set_index("Model")
    eoe = df[df["detector"] == "eoe"].pivot(index="vocabulary", columns="model", values="fpr95")  # generations x models
    assert eoe["vlm-a"].nunique() > 1  # the generations differ, so the std is not trivially 0
    for m in ("vlm-a", "vlm-b"):
        want = f"{pct(eoe[m].mean())} ± {100 * eoe[m].std(ddof=1):.1f} (3 gen.)"
        assert str(tab2.loc[m, "EOE"]) == want
    mean_row = next(str(v) for k, v in tab2.loc[:, "EOE"].items() if str(k) == "Mean")
    per_gen = eoe.mean(axis=1)  # per generation the mean over the models, then mean ± std over generations
    assert mean_row == f"{pct(per_gen.mean())} ± {100 * per_gen.std(ddof=1):.1f} (3 gen.)"
    assert "GPT" in tab2.columns and "GPT-gen0" not in tab2.columns and "(2 gen.)" in str(tab2.loc["vlm-a", "GPT"])


def test_siblings_sweep_runs_from_the_preset_kind(generations):
    import pandas as pd

    from oodeval.report import sweeps_path
    from oodeval.zeroshot.sweeps import sweep_siblings
    from oodeval.zeroshot.vocabulary import Vocabulary

    _, summary, _, embed, id_text = generations
    curves = pd.read_parquet(sweeps_path(summary.results))
    got = curves[(curves["sweep"] == "siblings_k") & (curves["model"] == "vlm-a")]
    assert got["size"].tolist() == [1, 3, 100] and set(got["param"]) == {"k"}
    vocab = Vocabulary.load(Path(summary.results).parent / "GPT-gen1.json")
    fs = [FeatureSet.load(Path(summary.results).parent / "vlm-a" / k) for k in ("id", "ood")]
    unit_fs = [FeatureSet(features=unit(np.asarray(f.features, np.float64))) for f in fs]
    want = sweep_siblings(*unit_fs, id_text, vocab.provenance["per_class"], lambda labels: np.stack([embed[w] for w in labels]),
                          [1, 3, 100], 0, "neglabel", n_groups=1)
    np.testing.assert_allclose(got["fpr95"].to_numpy(), want["fpr95"], rtol=1e-12)


def test_check_says_which_eoe_vocabularies_use_oodevals_own_wording(generations, tmp_path):
    from dataclasses import replace

    from oodeval.experiment.check import eoe_prompt_notes
    from oodeval.zeroshot.llm_vocab import generate_eoe

    config = generations[0]
    assert eoe_prompt_notes(config) == ([], [])  # every EOE file came from the eoe_prompts file
    generate_eoe(_LLM(lambda seed: ["w1", "w2"]), ["cat"], n_classes=2, generation=1).save(tmp_path / "EOE-gen1.json")
    notes, problems = eoe_prompt_notes(config)
    assert problems == [] and len(notes) == 1 and "1 EOE vocabulary file(s) were generated with oodeval's own prompt wording" in notes[0]
    assert notes[0].endswith("EOE-gen1")
    notes, _ = eoe_prompt_notes(replace(config, eoe_prompts=None))
    assert "no `eoe_prompts` file is set" in notes[0]
