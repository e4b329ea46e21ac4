"""Report tables on a hand-made results table whose best entries are known by construction."""

from __future__ import annotations

import pandas as pd
import pytest

from oodeval.report import build_views, write_report
from oodeval.report.views import Cell, prepare
from oodeval.results import hp_json, save_results

# (model, detector) -> dataset -> (FPR@95, AUROC); seeds add -0.01 / +0.01 around these values
SUP = {
    ("resA", "msp"): {"fi": (0.80, 0.70), "near": (0.30, 0.90), "far": (0.50, 0.80)},
    ("resA", "energy"): {"fi": (0.75, 0.65), "near": (0.20, 0.91), "far": (0.40, 0.85)},
    ("resA", "mahalanobis"): {"fi": (0.85, 0.78), "near": (0.25, 0.95), "far": (0.45, 0.82)},
    ("resB", "msp"): {"fi": (0.60, 0.80), "near": (0.10, 0.97), "far": (0.35, 0.88)},
    ("resB", "energy"): {"fi": (0.70, 0.75), "near": (0.15, 0.96), "far": (0.30, 0.90)},
    ("resB", "mahalanobis"): {"fi": (0.65, 0.85), "near": (0.12, 0.99), "far": (0.32, 0.89)},
}
ZS = {  # clip on fi: (detector, vocabulary) -> FPR@95
    ("mcm", None): 0.90,
    ("energy", None): 0.88,
    ("neglabel", "wordnet"): 0.80,
    ("neglabel", "gpt"): 0.70,
    ("neglabel", "oracle"): 0.20,
}


def rows() -> list[dict]:
    out = []

    def add(model, kind, det, dataset, split, fpr, auroc, vocab=None, acc=0.8):
        for seed, d in ((0, -0.01), (1, 0.01)):
            hp = {"vocabulary": vocab} if vocab else {}
            out.append(
                dict(model=model, weights="", detector=det, hyperparameters=hp_json(hp), dataset=dataset, split=split,
                     seed=seed, fpr95=fpr + d, tnr95=1 - fpr - d, auroc=auroc + d, detection_error=0.3 + d,
                     id_accuracy=acc + d, n_id=100, n_ood=40, kind=kind, label=det, vocabulary=vocab, status="ok")
            )  # fmt: skip

    for (model, det), per in SUP.items():
        for dataset, (fpr, auc) in per.items():
            add(model, "supervised", det, dataset, "all", fpr, auc, acc=0.8 if model == "resA" else 0.9)
        fpr, auc = per["fi"]
        add(model, "supervised", det, "fi", "fine_grained=True", fpr + 0.05, auc)
        add(model, "supervised", det, "fi", "fine_grained=False", fpr - 0.05, auc)
    for (det, vocab), fpr in ZS.items():
        add("clip", "zero-shot", det, "fi", "all", fpr, 0.6, vocab=vocab, acc=0.7)
    out.append(dict(model="resA", weights="", detector="knn", hyperparameters="{}", dataset="fi", split="all", seed=0,
                    kind="supervised", label="knn", status="error", error="ValueError: boom"))  # fmt: skip
    return out


@pytest.fixture
def table(tmp_path):
    path = tmp_path / "results.parquet"
    save_results(pd.DataFrame(rows()), path)
    return path


def view(views, key):
    return next(v for v in views if v.key == key)


def text(cell) -> str:
    return str(cell).strip()


def test_tab1_best_per_model_chosen_independently(table):
    from oodeval.results import load_results

    views, choice = build_views(load_results(table), table, primary="fi")
    t = view(views, "tab1").frame.set_index("Model")
    assert text(t.loc["resA", "FPR@95"]) == "75.0" and t.loc["resA", "FPR detector"] == Cell("Energy", title="energy")
    assert text(t.loc["resA", "AUROC"]) == "78.0" and t.loc["resA", "AUROC detector"] == Cell("Maha", title="mahalanobis")
    assert text(t.loc["resB", "FPR@95"]) == "60.0" and t.loc["resB", "FPR detector"].title == "msp"
    assert t.loc["resB", "FPR@95"].bold and not t.loc["resA", "FPR@95"].bold
    assert text(t.loc["resB", "Top-1"]) == "90.0"
    # the zero-shot group ignores vocabulary scorers: logit-space best is energy 88.0
    assert t.loc["clip", "Group"] == "zero-shot" and text(t.loc["clip", "FPR@95"]) == "88.0"
    assert choice["model"] == "resB"  # lowest mean best FPR over the OOD sets


def test_tabA1_and_tabA2(table):
    from oodeval.results import load_results

    views, _ = build_views(load_results(table), table, primary="fi")
    a1 = view(views, "tabA1").frame
    assert [(c.text, c.title) for c in a1["Detector"]] == [("MSP", "msp"), ("Energy", "energy"), ("Maha", "mahalanobis")]  # paper labels, ids as tooltips
    a1 = a1.assign(Detector=[c.title for c in a1["Detector"]]).set_index("Detector")
    assert list(a1.columns) == ["resA", "resB"]  # supervised models only
    assert list(a1.index) == ["msp", "energy", "mahalanobis"]  # the paper's order
    assert text(a1.loc["energy", "resA"]) == "75.0 / 65.0" and a1.loc["energy", "resA"].bold
    assert a1.loc["mahalanobis", "resA"].underline and not a1.loc["mahalanobis", "resA"].bold
    a2 = view(views, "tabA2").frame
    names = [text(x) for x in a2["Dataset"]]
    assert names == ["near", "far", "Mean", "fi"]  # primary last, after the mean of the others
    a2 = a2.assign(Dataset=names).set_index("Dataset")
    assert text(a2.loc["near", "resA"]) == "20.0 / 95.0"  # best FPR and best AUROC, independently
    assert text(a2.loc["Mean", "resA"]) == "30.0 / 90.0"  # mean of (20, 40) and (95, 85)
    assert text(a2.loc["Mean", "resB"]) == "20.0 / 94.5"  # (10, 30) and (99, 90)
    assert text(a2.loc["fi", "Mean"]) == "67.5 / 81.5"  # supervised models only


def test_vocabulary_split_and_cnc_views(table):
    from oodeval.results import load_results

    views, _ = build_views(load_results(table), table, primary="fi")
    t2 = view(views, "tab2").frame.set_index("Model")
    assert text(t2.loc["clip", "logit-sp."]) == "88.0"
    assert [text(t2.loc["clip", c]) for c in ("wordnet", "gpt", "oracle")] == ["80.0", "70.0", "20.0"]
    assert t2.loc["clip", "gpt"].bold and not t2.loc["clip", "oracle"].bold
    a4 = view(views, "splits").frame
    assert [text(x) for x in a4["Dataset / split"]] == ["fi", "fine_grained=False", "fine_grained=True"]
    # msp: mean over resA/resB of the split values, (0.75 + 0.55) / 2 on the ordinary part
    assert text(a4.iloc[1][Cell("MSP", title="msp")]) == "65.0"  # a detector column, headed by its label
    cnc = view(views, "cnc").frame
    cnc = cnc.assign(Detector=[c.title for c in cnc["Detector"]])
    r = cnc[(cnc["Model"] == "resA") & (cnc["Detector"] == "msp") & (cnc["OOD set"] == "near")].iloc[0]
    # seeds give 0.71 and 0.69: mean 70.00, sample std (ddof=1) = 0.02 / sqrt(2) = 1.41 points
    assert r["TNR@TPR95"] == "70.00 ± 1.41" and r["runs"] == "2"
    mean_row = cnc[(cnc["Model"] == "resA") & (cnc["Detector"] == "msp")].iloc[-1]
    assert text(mean_row["OOD set"]) == "mean over OOD sets"
    # per seed the mean of (fi, near, far) TNR: 1 - (0.8 + 0.3 + 0.5)/3 -+ 0.01
    assert text(mean_row["TNR@TPR95"]) == f"{100 * (1 - 1.6 / 3):.2f} ± 1.41"


def test_views_without_data_are_omitted_with_a_note(tmp_path):
    only = [r for r in rows() if r["kind"] == "supervised" and r["split"] == "all"]
    path = tmp_path / "r.parquet"
    save_results(pd.DataFrame(only), path)
    paths = write_report(path, tmp_path / "rep", primary="fi")
    md = paths["markdown"].read_text()
    assert "omitted: no zero-shot results with a vocabulary" in md
    assert "omitted: no OOD set has a split column" in md
    assert "omitted: no vocabulary sweep data" in md
    assert "omitted: no stored scores" in md  # hand-made rows have no score files
    assert "75.0" in md and "\\begin{tabular}" in paths["latex"].read_text()


def test_prepare_averages_over_seeds_and_names_hyperparameter_variants(tmp_path):
    df = pd.DataFrame(rows())
    extra = df[(df["detector"] == "energy") & (df["model"] == "resA")].copy()
    extra["hyperparameters"] = '{"temperature":2.0}'
    frame = prepare(pd.concat([df, extra]))
    dets = set(frame[frame["model"] == "resA"]["det"])
    assert {"energy defaults", "energy temperature=2.0", "msp"} <= dets
    near = frame[(frame["model"] == "resA") & (frame["det"] == "msp") & (frame["dataset"] == "near")]
    assert near["fpr95"].iloc[0] == pytest.approx(0.30) and near["runs"].iloc[0] == 2


def test_unknown_primary_or_model(table):
    with pytest.raises(ValueError, match="primary OOD set 'nope'"):
        write_report(table, table.parent / "x", primary="nope")
    with pytest.raises(ValueError, match="model 'nope'"):
        write_report(table, table.parent / "x", model="nope")
    with pytest.raises(FileNotFoundError):
        write_report(table.parent / "missing.parquet", table.parent / "x")
