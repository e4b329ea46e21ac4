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
