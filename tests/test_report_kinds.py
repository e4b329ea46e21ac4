"""Post-hoc detectors and zero-shot scorers that share a registry name are told apart in reports."""

import pandas as pd

from oodeval.report.views import ZS_PREFIX, add_det, order_detectors


def _rows(entries):
    return pd.DataFrame([{"model": m, "kind": k, "detector": d, "label": None, "vocabulary": v, "hyperparameters": "{}"}
                         for m, k, d, v in entries])  # fmt: skip


def test_a_zero_shot_scorer_sharing_a_post_hoc_name_is_shown_with_zs():
    rows = _rows([("resnet50", "supervised", "mcm", None), ("resnet50", "supervised", "energy", None),
                  ("clip", "zero-shot", "mcm", None), ("clip", "zero-shot", "neglabel", "wordnet"),
                  ("clip", "zero-shot", "gl_mcm", None)])  # fmt: skip
    assert list(add_det(rows)["det"]) == ["mcm", "energy", f"{ZS_PREFIX}mcm", "neglabel[wordnet]", "gl_mcm"]
    assert order_detectors(["zs:mcm", "energy", "mcm"]) == ["energy", "mcm", "zs:mcm"]  # zs:mcm ranks where mcm does


def test_names_stay_plain_where_only_one_kind_shows_them():
    zero_shot_only = _rows([("clip", "zero-shot", "mcm", None), ("clip", "zero-shot", "energy", None)])
    assert list(add_det(zero_shot_only)["det"]) == ["mcm", "energy"]
    assert list(add_det(zero_shot_only)["detector"]) == ["mcm", "energy"]  # the stored names are untouched


def test_every_paper_detector_and_zero_shot_scorer_is_shown_by_the_papers_label():
    from oodeval import detectors
    from oodeval.report.labels import det_cell, detector_label
    from oodeval.zeroshot import scorers

    # the paper's Tab. A1 rows, in its order, and its zero-shot scorers (Tab. 1, Sec. 4.1)
    paper = ["MSP", "MaxLogit", "KL-Match.", "Energy", "GEN", "E+ReAct", "ASH-S", "SCALE", "DICE", "Maha", "rMaha", "Maha++",
             "rMaha++", "k-NN", "cosine", "MCM", "fDBD", "NECO", "NAC", "ViM", "NNGuide"]  # fmt: skip
    assert [detector_label(n) for n in detectors.names("paper21")] == paper
    assert [detector_label(f"{ZS_PREFIX}{n}") for n in scorers.scorer_names()] == [
        f"{ZS_PREFIX}{x}" for x in ("MCM", "MaxLogit", "Energy", "GEN", "Entropy", "Margin", "GL-MCM", "NegLabel", "EOE", "CSP", "AdaNeg")]  # fmt: skip
    for shared in set(detectors.names()) & set(scorers.scorer_names()):  # one label whichever registry is asked first
        assert detector_label(shared) == detector_label(f"{ZS_PREFIX}{shared}").removeprefix(ZS_PREFIX)
    # what a view adds to a name stays; a name without a declared label, or no registry name, is kept
    assert detector_label("knn k=5") == "k-NN k=5" and detector_label("neglabel[wordnet]") == "NegLabel[wordnet]"
    assert detector_label("neglabel:wordnet") == "NegLabel:wordnet"  # a Tab. 2 column of one of several scorers
    assert detector_label("residual") == "residual"  # a ViM subclass does not inherit ViM's label
    assert detector_label("my detector") == "my detector" and detector_label("mypkg:Det") == "mypkg:Det"
    cell = det_cell("relative_mahalanobis_pp", bold=True)
    assert (cell.text, cell.title, cell.bold) == ("rMaha++", "relative_mahalanobis_pp", True)
