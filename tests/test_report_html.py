"""A report of a synthetic grid: every file, Tab. A6 against Eq. 5, sweeps, and the HTML page
rendered in headless Chromium (tables present, every image decoded)."""

from __future__ import annotations

import base64
import re

import numpy as np
import pytest

from oodeval import cli
from oodeval.experiment import run_experiment
from oodeval.features import FeatureSet
from oodeval.report import save_sweep, write_report


def make_sets(root) -> dict[str, str]:
    rng = np.random.default_rng(3)
    C, D = 3, 6
    W = rng.normal(size=(C, D)).astype(np.float32)
    b = np.zeros(C, np.float32)
    mu = rng.normal(size=(C, D)) * 2.0

    def fs(n, ood_scale=None, extras=None):
        if ood_scale is None:
            y = rng.integers(0, C, n)
            z = (mu[y] + rng.normal(size=(n, D))).astype(np.float32)
        else:
            y = np.full(n, -1)
            z = (rng.normal(size=(n, D)) * ood_scale).astype(np.float32)
        return FeatureSet(features=z, labels=y, logits=z @ W.T + b, weight=W, bias=b, extras=extras or {})

    sets = {
        "id_train": fs(150),
        "id_test": fs(120),
        "small": fs(40, 1.5, {"fine_grained": np.arange(40) % 2 == 0}),
        "big": fs(200, 2.5),
    }
    return {k: str(v.save(root / "feats" / k)) for k, v in sets.items()}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    paths = make_sets(tmp)
    cfg = {
        "seeds": [0, 1],
        "bootstrap_draws": 100,
        "results": str(tmp / "results.parquet"),
        "datasets": {"id_train": "t", "id_test": "v", "ood": [{"name": "small", "split_column": "fine_grained"}, "big"]},
        "models": [{"name": "synthetic", "features": paths}],
        "detectors": ["msp", "energy", "mahalanobis", {"name": "knn", "hyperparameters": {"k": 5}}],
    }
    summary = run_experiment(cfg, progress=False)
    save_sweep(summary.results, "wordnet_size", "synthetic", "small", [10, 100, 1000], [0.5, 0.4, 0.45])
    save_sweep(summary.results, "wordnet_size", "other", "small", [10, 100, 1000], [0.6, 0.5, 0.55])
    out = tmp / "rep"
    paths = write_report(summary.results, out, draws=200)
    return summary, paths


def test_every_report_file(report):
    summary, paths = report
    for key in ("markdown", "latex", "html", "fig1", "roc", "hist", "figA4", "figRanks", "sweep0_0"):
        assert paths[key].is_file() and paths[key].stat().st_size > 0, key
    for key in ("fig1", "roc", "hist", "figA4", "figRanks", "sweep0_0"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = paths["html"].read_text()
    assert "src=\"figures" not in html and "http" not in html.split("<body>")[1]  # self-contained
    imgs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(imgs) == 6  # the five above and the critical-difference diagram
    assert base64.b64decode(imgs[0])[:4] == b"\x89PNG"
    md = paths["markdown"].read_text()
    assert "Tab. A6" in md and "fine\\_grained=True" in md and "![Fig. 1" in md


def test_tabA6_matches_equation_5(report):
    from oodeval.metrics import fpr_at_tpr
    from oodeval.report import build_views
    from oodeval.results import load_cell_scores, load_results

    summary, _ = report
    df = load_results(summary.results)
    views, choice = build_views(df, summary.results, primary="small", draws=400)
    assert choice["n"] == 40
    a6 = next(v for v in views if v.key == "tabA6").frame.set_index("Dataset")
    big = df[(df["dataset"] == "big") & (df["split"] == "all") & (df["seed"] == 0)]
    best = big.loc[big["fpr95"].idxmin()]
    p = fpr_at_tpr(*load_cell_scores(best, summary.results))
    n, N = 40, 200
    assert a6.loc["big", "closed form"] == f"{100 * np.sqrt(p * (1 - p) / n * (N - n) / (N - 1)):.2f}"
    assert a6.loc["big", "full"] == f"{100 * p:.2f}"
    mean, std = float(a6.loc["big", "mean"]), float(a6.loc["big", "std"])
    # unbiased: the mean over 400 draws lies within 4 standard errors of the full value
    assert abs(mean - 100 * p) < 4 * std / np.sqrt(400) + 1e-9
    # the std over draws agrees with the closed form within 25 % (sampling noise of 400 draws)
    assert std == pytest.approx(float(a6.loc["big", "closed form"]), rel=0.25)
    rho = float(a6.loc["big", "rho"])
    assert -1.0 <= rho <= 1.0
    # the primary set itself: plug-in closed form only, no draws
    assert a6.loc["small", "mean"] == "–"
    p_small = float(a6.loc["small", "full"]) / 100
    assert a6.loc["small", "closed form"] == f"{100 * np.sqrt(p_small * (1 - p_small) / 40):.2f}"


def test_cli_report(report, tmp_path, capsys):
    summary, _ = report
    assert cli.main(["report", str(summary.results), "--out", str(tmp_path / "r"), "--draws", "50", "--dataset", "big"]) == 0
    assert (tmp_path / "r" / "report.html").is_file()
    assert "html" in capsys.readouterr().out
    assert cli.main(["report", str(tmp_path / "none.parquet"), "--out", str(tmp_path / "r2")]) == 2


@pytest.mark.needs("chromium")
def test_html_renders_in_headless_chromium(report, tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    _, paths = report
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chrome-profile'}"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(paths["html"].resolve().as_uri())
        assert "oodeval report" in driver.title
        tables = {t.get_attribute("data-view"): t for t in driver.find_elements(By.CSS_SELECTOR, "table[data-view]")}
        assert {"tab1", "tabA1", "tabA2", "splits", "tabA6", "cnc"} <= set(tables)
        assert len(tables["tabA1"].find_elements(By.CSS_SELECTOR, "tbody tr")) == 4
        assert len(tables["cnc"].find_elements(By.CSS_SELECTOR, "tbody tr")) == 4 * 3
        # the paper's labels, each with its registry name as the tooltip
        names = tables["tabA1"].find_elements(By.CSS_SELECTOR, "tbody td:first-child span[title]")
        assert [(n.text, n.get_attribute("title")) for n in names] == [("MSP", "msp"), ("Energy", "energy"), ("Maha", "mahalanobis"), ("k-NN", "knn")]
        assert "mahalanobis" not in tables["tabA1"].text
        # readable contrast: every detector name of Tabs. 3, A6, A7 in the body's text colour, none muted grey
        body = driver.execute_script("return getComputedStyle(document.body).color;")
        for key in ("tab3", "tabA6", "tabA7"):
            spans = tables[key].find_elements(By.CSS_SELECTOR, "tbody span[title]")
            assert spans and {driver.execute_script("return getComputedStyle(arguments[0]).color;", s) for s in spans} == {body}, key
        ci = re.compile(r"^(\d+\.\d) \[(\d+\.\d), (\d+\.\d)\]$")
        for key, css in (("tab1", "tbody td"), ("tabA1", "tbody td:not(:first-child)"), ("tabA2", "tbody td:not(:first-child)")):
            cells = [c.text for c in tables[key].find_elements(By.CSS_SELECTOR, css)]
            with_ci = [m for t in cells for part in t.split(" / ") if (m := ci.match(part))]
            assert len(with_ci) >= 2, (key, cells)
            assert all(float(lo) <= float(v) <= float(hi) for v, lo, hi in (m.groups() for m in with_ci))
        images = driver.find_elements(By.CSS_SELECTOR, "figure img")
        assert len(images) == 6
        for img in images:
            complete, width = driver.execute_script("return [arguments[0].complete, arguments[0].naturalWidth];", img)
            assert complete and width > 0
        notes = driver.find_elements(By.CSS_SELECTOR, "ul.summary li.omitted")
        assert any(n.text.startswith("Tab. 2") and "vocabulary" in n.text for n in notes)  # Tab. 2 omitted with its reason, in the summary
        assert not driver.find_elements(By.CSS_SELECTOR, "section#tab2")  # and no section of its own
        first = driver.execute_script("return document.body.children[1];")
        assert first.get_attribute("id") == "summary" and "Models (1): synthetic (supervised)" in first.text
    finally:
        driver.quit()


def test_a_long_table_is_folded_with_its_head_visible(tmp_path):
    """In headless Chromium: a 30-row view shows its head and 10 rows; the other 20 unfold on a click."""
    import pandas as pd
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By

    from oodeval.report.render import html_page
    from oodeval.report.views import View

    view = View("long", "Tab. X — long", "thirty rows", pd.DataFrame({"Detector": [f"d{i}" for i in range(30)], "FPR@95": ["1.0"] * 30}))
    page = tmp_path / "p.html"
    page.write_text(html_page("t", "intro", [view], [], [("Models (1): m", [])]))
    opts = webdriver.ChromeOptions()
    opts.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage",
                f"--user-data-dir={tmp_path / 'chrome-profile'}"):  # fmt: skip
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=opts)
    try:
        driver.get(page.resolve().as_uri())
        shown = [r for r in driver.find_elements(By.CSS_SELECTOR, "tr") if r.is_displayed()]
        assert [r.text for r in shown][:2] == ["Detector FPR@95", "d0 1.0"] and len(shown) == 1 + 10
        fold = driver.find_element(By.CSS_SELECTOR, 'details.fold[data-fold="long"] summary')
        assert fold.text == "show the other 20 of 30 rows"
        fold.click()
        shown = [r.text for r in driver.find_elements(By.CSS_SELECTOR, "tr") if r.is_displayed()]
        assert len(shown) == 2 + 30 and shown[-1] == "d29 1.0"  # the unfolded part repeats the head
    finally:
        driver.quit()


def _demo_shaped_scores(sizes, rng) -> dict:
    """The demo's OOD sets at ``sizes`` (near-OOD first, the primary), three detectors each, ID test
    of ``sizes.id_test`` scores; OOD scores shifted so that FPR@95 lies strictly between 0 and 1."""
    n_ood = {"fmnist-heldout": sizes.near_ood, "digits": sizes.digits, "photos": sizes.photos,
             "noise-uniform": sizes.uniform, "noise-gaussian": sizes.gaussian}  # fmt: skip
    id_s = {d: rng.normal(size=sizes.id_test) for d in ("msp", "energy", "knn")}
    return {s: {d: (id_s[d], rng.normal(loc=-1.0 - 0.3 * i, size=m)) for i, d in enumerate(id_s)} for s, m in n_ood.items()}


@pytest.mark.parametrize("quick, expected_n", [(True, 50), (False, 500)])
def test_tabA6_default_n_gives_every_demo_set_its_draws(quick, expected_n):
    """At the report's default n, every row of the demo's Tab. A6 (the quick and the full sizes) has
    draws: mean, bias, std and rho, none of them a dash; the caption says how n was chosen."""
    from oodeval.demo.data import DemoSizes
    from oodeval.report.subsampling import default_subsample_n, subsampling_view

    sizes = DemoSizes.quick() if quick else DemoSizes()
    scores = _demo_shaped_scores(sizes, np.random.default_rng(0))
    n, why = default_subsample_n(scores, "fmnist-heldout")
    assert n == expected_n  # half the smallest other set (the noise sets), below the primary set's size
    a6 = subsampling_view(scores, None, 20, 0, "m", "fmnist-heldout")
    assert f"n={n}" in a6.caption and "noise-uniform, N = " in a6.caption and "capped at 0.5" in a6.caption
    frame = a6.frame.set_index("Dataset")
    assert list(frame.index) == list(scores)
    drawn = frame[["mean", "bias", "std", "rho"]]
    assert not (drawn == "–").any().any(), drawn
    assert (frame["n/N (%)"].astype(float) < 100).all()


def test_tabA6_default_n_is_the_papers_where_the_primary_set_is_the_smallest():
    """Fi-ImageNet-1k's case: the primary set (655) is the smallest, so n is its size and its own row
    has the closed form only, as the paper's Tab. A6."""
    from oodeval.report.subsampling import default_subsample_n

    rng = np.random.default_rng(1)
    scores = {s: {"msp": (rng.normal(size=50), rng.normal(size=m))} for s, m in (("fi", 655), ("ninco", 5879), ("imagenet-o", 2000))}
    assert default_subsample_n(scores, "fi") == (655, "n = the primary set's size (fi, the paper's choice).")
    assert default_subsample_n({"fi": scores["fi"]}, "fi")[0] == 655
    assert default_subsample_n(scores, "absent") == (None, "")
