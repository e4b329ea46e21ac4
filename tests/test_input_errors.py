"""Every input problem is one line naming the file (exit 2); labels are parsed, not sorted (issue 26).

Each test feeds one damaged or unusual input and asserts the one-line message names the file;
the old behaviour (a crash, a message without the file, or silently other numbers) fails it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oodeval.cli import main
from oodeval.data import Manifest
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.features import FeatureSet
from oodeval.zeroshot.vocabulary import Vocabulary


def one_line_error(capsys, argv, *needles: str) -> str:
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "unexpected" not in err, err
    for n in needles:
        assert n in err, err
    return err


# ------------------------------------------------------------------ labels are parsed, not sorted


def _csv(tmp_path: Path, text: str, name: str = "m.csv", encoding: str = "utf-8") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode(encoding))
    return path


def test_integer_labels_stay_their_integer(tmp_path: Path) -> None:
    m = Manifest.from_csv(_csv(tmp_path, "path,label\na.png,10\nb.png,2\nc.png,-1\nd.png,\n"))
    assert m.labels.tolist() == [10, 2, -1, -1] and m.class_names is None  # "10" < "2" as strings: not renumbered
    names = Manifest.from_csv(_csv(tmp_path, "path,label\na.png,dog\nb.png,cat\nc.png,-1\n"))
    assert names.labels.tolist() == [1, 0, -1] and names.class_names == ["cat", "dog"]


@pytest.mark.parametrize(("cells", "needle"), [
    (["1", "2.0", "3"], "label '2.0' is not an integer (lines 3)"),
    (["1e30", "0", "1"], "label '1e30' is not an integer (lines 2)"),
    (["1", "cat", "dog"], "labels mix class names (e.g. 'cat', line 3) with integers (e.g. '1', lines 2)"),
    (["99999999999999999999", "0", "1"], "does not fit a 64-bit integer (line 2)"),
])  # fmt: skip
def test_float_mixed_and_huge_labels_are_refused_with_their_lines(tmp_path: Path, cells, needle) -> None:
    path = _csv(tmp_path, "path,label\n" + "".join(f"{i}.png,{c}\n" for i, c in enumerate(cells)))
    with pytest.raises(ValueError, match="manifest " + str(path).replace("\\", "\\\\")) as info:
        Manifest.from_csv(path)
    assert needle in str(info.value)


def test_a_class_list_reads_labels_as_names(tmp_path: Path) -> None:
    path = _csv(tmp_path, "path,label\na.png,2.0\nb.png,cat\nc.png,1\n")
    m = Manifest.from_csv(path, class_names=["cat", "x", "2.0"])
    assert m.labels.tolist() == [2, 0, 1]
    with pytest.raises(ValueError, match=r"label 'dog' is neither an integer nor one of the 3 class names \(lines 2\)"):
        Manifest.from_csv(_csv(tmp_path, "path,label\na.png,dog\n"), class_names=["cat", "x", "2.0"])


# ------------------------------------------------------------------ manifests: valid and broken


def test_a_utf8_bom_manifest_is_read(tmp_path: Path) -> None:
    m = Manifest.from_csv(_csv(tmp_path, "path,label\na.png,1\n", encoding="utf-8-sig"))
    assert m.paths == ["a.png"] and m.labels.tolist() == [1]


def test_ragged_rows_and_non_utf8_manifests_name_the_file(tmp_path: Path) -> None:
    ragged = _csv(tmp_path, "path,label\na.png,1\nb,c.png,0\nd.png\n", "ragged.csv")
    with pytest.raises(ValueError, match=r"ragged.csv: 2 row\(s\) have more or fewer cells than the 2 header columns \(lines 3, 4\)"):
        Manifest.from_csv(ragged)
    latin = _csv(tmp_path, "path,label\ncaf\u00e9.png,1\n", "latin.csv", encoding="latin-1")
    with pytest.raises(ValueError, match=r"latin.csv is not UTF-8 text"):
        Manifest.from_csv(latin)


def test_manifest_round_trip_through_its_marker_line(tmp_path: Path) -> None:
    m = Manifest(["a.png", "b.png", "c.png", "d.png"], np.array([3, 0, 2, 1]), class_names=["a", "b", "c", "d"])
    path = m.to_csv(tmp_path / "m.csv")
    assert path.read_text().startswith("# oodeval-output: ")
    back = Manifest.from_csv(path)
    assert back.labels.tolist() == [3, 0, 2, 1] and back.class_names == ["a", "b", "c", "d"]


# ------------------------------------------------------------------ score files and metrics


def test_metrics_refuses_empty_npy_and_complex_scores(tmp_path: Path, capsys) -> None:
    good = tmp_path / "id.npy"
    np.save(good, np.linspace(0, 1, 20))
    empty = tmp_path / "empty.npy"
    empty.write_bytes(b"")
    one_line_error(capsys, ["metrics", good, empty], f"score file {empty}")
    cplx = tmp_path / "c.npy"
    np.save(cplx, np.linspace(0, 1, 20) + 1j)
    one_line_error(capsys, ["metrics", good, cplx], f"score file {cplx}")
    from oodeval.metrics import all_metrics

    with pytest.raises(ValueError, match="complex"):
        all_metrics(np.linspace(0, 1, 20), np.linspace(0, 1, 20) + 0.5j)


# ------------------------------------------------------------------ FeatureSets and vocabularies


@pytest.fixture
def sets(tmp_path: Path) -> Path:
    train, test, ood = synthetic_problem(n_classes=3, dim=8, n_train=60, n_test=30, n_ood=30, seed=0)
    for name, fs in {"train": train, "test": test, "ood": ood}.items():
        fs.save(tmp_path / name)
    return tmp_path


def _score(sets: Path) -> list:
    return ["score", "--train", sets / "train", "--test", sets / "test", "--ood", f"o={sets / 'ood'}", "--detectors", "msp", "--no-progress"]


def test_broken_featureset_files_are_named(sets: Path, capsys) -> None:
    feats = sets / "ood" / "features.npy"
    good = feats.read_bytes()
    feats.write_bytes(good[: len(good) // 2])  # truncated: "mmap length is greater than file size"
    one_line_error(capsys, _score(sets), str(feats), "extract it again")
    np.save(feats, np.array([{"a": 1}] * 30, dtype=object), allow_pickle=True)
    one_line_error(capsys, _score(sets), str(feats), "pickled data")
    feats.write_bytes(good)
    meta = sets / "ood" / "meta.json"
    meta.write_text(meta.read_text()[:-20])
    one_line_error(capsys, _score(sets), str(meta), "not valid JSON")


def test_vocabulary_problems_name_the_file(tmp_path: Path, capsys) -> None:
    v = tmp_path / "v.json"
    Vocabulary(["cat", "dog"], "custom").save(v)
    data = json.loads(v.read_text())
    data["labels"] = ["cat", "wolf"]
    v.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"vocabulary file {v}: content hash"):
        Vocabulary.load(v)
    txt = tmp_path / "v.txt"
    txt.write_bytes("caf\u00e9\n".encode("latin-1"))
    one_line_error(capsys, ["vocab", "union", txt, "--out", tmp_path / "u.json"], f"vocabulary file {txt} is not UTF-8")


# ------------------------------------------------------------------ run and report


def _experiment(tmp_path: Path, sets: Path, results: Path, extra: str = "") -> Path:
    exp = tmp_path / "exp.toml"
    exp.write_text(
        f'seeds = [0]\nbootstrap_draws = 20\nresults = "{results}"\n{extra}'
        '[datasets]\nid_train = "train"\nid_test = "test"\nood = ["far"]\n'
        f'[[models]]\nname = "synthetic"\nfeatures = {{ id_train = "{sets / "train"}", id_test = "{sets / "test"}", far = "{sets / "ood"}" }}\n'
        '[[detectors]]\nname = "msp"\n[[detectors]]\nname = "energy"\n'
    )
    return exp


def test_run_on_its_damaged_table_and_a_csv_results_path(sets: Path, capsys) -> None:
    results = sets / "r.parquet"
    exp = _experiment(sets, sets, results)
    assert main(["run", str(exp), "--no-progress"]) == 0
    results.write_bytes(results.read_bytes()[:-30])
    one_line_error(capsys, ["run", exp, "--no-progress"], str(results), "damaged")
    one_line_error(capsys, ["run", _experiment(sets, sets, sets / "r.csv"), "--no-progress"], "r.csv", "must end in .parquet")
    assert main(["run", str(sets / "exp.toml"), "--check"]) == 2 and "must end in .parquet" in capsys.readouterr().err
    assert not (sets / "r.csv").exists()


def test_report_refuses_missing_or_truncated_scores_and_impossible_values(sets: Path, capsys) -> None:
    from oodeval.results import load_results, save_results

    results = sets / "r.parquet"
    assert main(["run", str(_experiment(sets, sets, results)), "--no-progress"]) == 0
    df = load_results(results)
    scores = sets / df.iloc[0]["scores_ood"]
    kept = scores.read_bytes()
    scores.write_bytes(kept[:-16])
    one_line_error(capsys, ["report", results, "--out", sets / "rep", "--draws", "10"], str(scores), "truncated")
    scores.unlink()
    one_line_error(capsys, ["report", results, "--out", sets / "rep", "--draws", "10"], str(scores), "missing")
    scores.write_bytes(kept)
    save_results(df.assign(auroc=np.where(df["detector"] == "msp", 7.0, df["auroc"])), results)
    one_line_error(capsys, ["report", results, "--out", sets / "rep", "--draws", "10"], str(results), "auroc lie outside [0, 1]")


def test_report_during_a_first_run_reads_the_parts(sets: Path, capsys) -> None:
    from oodeval.report import write_report
    from oodeval.results import compact_results, load_results, parts_dir, write_part

    results = sets / "r.parquet"
    assert main(["run", str(_experiment(sets, sets, results)), "--no-progress"]) == 0
    df = load_results(results)
    first = sets / "first" / "r.parquet"  # as a first run leaves it before compaction: parts only
    first.parent.mkdir()
    (sets / "first" / "r.scores").symlink_to(sets / "r.scores")
    write_part(df, first)
    assert not first.exists() and any(parts_dir(first).iterdir())
    paths = write_report(first, sets / "rep", draws=10)
    assert paths["html"].is_file() and compact_results(first)


def test_run_check_accepts_an_experiment_that_run_completes(tmp_path: Path) -> None:
    """A zero-shot model bringing its vocabulary's text embeddings needs no vocabulary file: `run`
    completes it, so `run --check` must accept it."""
    from oodeval.experiment import load_config, run_experiment
    from oodeval.experiment.check import check_experiment

    rng = np.random.default_rng(0)
    text = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    img = lambda n, rows: (text[rows[rng.integers(0, len(rows), n)]] + 0.5 * rng.normal(size=(n, 8))).astype(np.float32)  # noqa: E731
    np.save(tmp_path / "id_text.npy", text[:3])
    np.save(tmp_path / "neg.npy", text[3:7])
    feats = {"id_test": str(FeatureSet(features=img(40, np.arange(3)), labels=rng.integers(0, 3, 40)).save(tmp_path / "id")),
             "novel": str(FeatureSet(features=img(30, np.arange(3, 7))).save(tmp_path / "ood")),
             "text:id": str(tmp_path / "id_text.npy"), "text:neg": str(tmp_path / "neg.npy")}  # fmt: skip
    cfg = load_config({"seeds": [0], "bootstrap_draws": 20, "results": str(tmp_path / "r.parquet"),
                       "datasets": {"id_test": "val", "ood": ["novel"]},
                       "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": feats}],
                       "zeroshot": [{"name": "neglabel", "vocabulary": "neg.txt", "hyperparameters": {"n_groups": 1}}]},
                      base_dir=tmp_path)  # fmt: skip
    assert not (tmp_path / "neg.txt").exists()
    summary = run_experiment(cfg, progress=False)
    assert summary.ok and summary.computed == 1
    assert check_experiment(cfg) == []


def test_protocol_store_on_a_full_disk_says_so(tmp_path: Path, monkeypatch) -> None:
    import sqlite3

    from oodeval.construct import protocol

    store = tmp_path / "p.sqlite"
    store.write_bytes(b"")

    def full(*a, **k):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(protocol.sqlite3, "connect", full)
    with pytest.raises(ValueError, match=f"protocol store {store} cannot be opened \\(database or disk is full\\); free disk space"):
        protocol.ProtocolStore(store)


def test_experiment_files_non_utf8_named_and_bom_accepted(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_bytes("seeds = [0]\n# caf\u00e9\n".encode("latin-1"))
    one_line_error(capsys, ["run", bad, "--check"], f"experiment file {bad} is not UTF-8 text")
    bom = tmp_path / "bom.toml"
    bom.write_bytes("\ufeffseeds = [0]\n".encode())
    one_line_error(capsys, ["run", bom, "--check"], "missing required key 'datasets'")  # parsed past the BOM


def test_readers_of_manifests_skip_the_marker_line(tmp_path: Path) -> None:
    from oodeval.construct.tables import read_manifest
    from oodeval.zeroshot.vocabulary import oracle

    m = Manifest(["a.png", "b.png"], np.array([1, 0]), ood_label=["zebra", ""], class_names=["cat", "dog"])
    m.to_csv(tmp_path / "m.csv")
    assert oracle(tmp_path / "m.csv").labels == ["zebra"]
    ids = read_manifest(tmp_path / "m.csv")
    assert ids.paths == ["a.png", "b.png"] and ids.labels == [1, 0]
