"""A scripted session on a generated dataset: candidates -> evidence -> protocol -> exported manifests."""

import csv
import os
from pathlib import Path

import pytest

from oodeval.cli import main
from oodeval.construct.protocol import ProtocolStore
from oodeval.construct.synthetic import make_synthetic_dataset

# scenario k % 6 -> (stage-1 verdicts of alice and bob, stage-3 verdicts of alice, bob, carol, expected outcome)
SCENARIOS = [
    ([("ood", "L", True), ("ood", " l", True)], [], ("ood", "L", True)),          # agreed OOD (same label normalised): alice's spelling
    ([("id", 2), ("id", 2)], [], ("id", 2)),                                      # agreed ID
    ([("ambiguous",), ("ambiguous",)], [], ("ambiguous",)),                         # agreed ambiguous
    ([("ood", "X", True), ("id", 1)], [("ood", "X", True), ("ood", "x", True), ("ood", "X", True)], ("ood", "X", True)),
    ([("id", 0), ("id", 1)], [("id", 0), ("id", 0), ("id", 1)], ("ambiguous",)),  # no full consensus
    ([("ood", "A", False), ("ambiguous",)], [("id", 4), ("id", 4), ("id", 4)], ("id", 4)),
    ([("ood", "P", True), ("ood", "Q", True)], [("ood", "P", True), ("ood", "P", True), ("ood", "Q", True)], ("ambiguous",)),  # labels differ
    ([("ood", "P", True), ("ood", "P", False)], [("ood", "P", False), ("ood", "P", False), ("ood", "P", False)], ("ood", "P", False)),
]


def args_for(v, k):
    if v[0] == "ood":
        return ["ood", "--label", f"{v[1]}{k}"] + (["--fine-grained"] if v[2] else [])
    if v[0] == "id":
        return ["id", "--id-class", str(v[1])]
    return ["ambiguous"]


def run_cli(capsys, *argv, token=None, monkeypatch=None):
    if token is not None:
        monkeypatch.setenv("OODEVAL_TOKEN", token)
    rc = main(["construct", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_scripted_session(tmp_path, capsys, monkeypatch):
    d = make_synthetic_dataset(tmp_path / "data", n_classes=6, per_class=10, unassigned=0.4, seed=1)
    work = tmp_path / "work"
    rean = read_csv(d.reannotation)
    pool = [r for r in rean if r["reannotated"] == ""]
    flags = {r["path"]: r["flag"] for r in pool}

    rc, out, _ = run_cli(capsys, "candidates", work, "--manifest", d.manifest, "--reannotation", d.reannotation, "--classes", d.classes)
    assert rc == 0 and f"{len(pool)} candidate images" in out
    for flag in set(flags.values()):
        assert any(line.split()[-2] == str(sum(f == flag for f in flags.values())) for line in out.splitlines() if line.strip().startswith(flag))

    rc, out, _ = run_cli(capsys, "evidence", work, "--image-embeddings", d.image_embeddings, "--text-embeddings", d.text_embeddings)
    assert rc == 0 and f"{len(pool)} files written" in out

    rc, out, _ = run_cli(capsys, "init", work, "--stage1", "alice", "bob", "--stage3", "carol")
    assert rc == 0
    tokens = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("  ")}
    assert set(tokens) == {"alice", "bob", "carol"}
    rc, _, err = run_cli(capsys, "init", work, "--stage1", "alice", "bob", "--stage3", "carol")
    assert rc == 2 and "never overwritten" in err

    store = ProtocolStore(work / "protocol.sqlite")
    # bad input through the CLI: clear error, nothing stored
    for token, image, message in [
        ("nope", "x", "unknown access token"),
        (tokens["alice"], "not/an/image.png", "unknown image id"),
        (tokens["carol"], pool[0]["path"], "Stage-3 annotator"),
        ("", pool[0]["path"], "no access token: set OODEVAL_TOKEN or pass --token-file"),
    ]:
        rc, _, err = run_cli(capsys, "verdict", work, image, "ambiguous", token=token, monkeypatch=monkeypatch)
        assert rc == 2 and message in err
    assert store.rows() == []

    expected = {}
    for k, row in enumerate(pool):
        s1, s3, outcome = SCENARIOS[k % len(SCENARIOS)]
        for who, v in zip(("alice", "bob"), s1):
            assert run_cli(capsys, "verdict", work, row["path"], *args_for(v, k), token=tokens[who], monkeypatch=monkeypatch)[0] == 0
        for who, v in zip(("alice", "bob", "carol"), s3):
            assert run_cli(capsys, "verdict", work, "--stage", 3, row["path"], *args_for(v, k), token=tokens[who], monkeypatch=monkeypatch)[0] == 0
        expected[row["path"]] = outcome if outcome[0] != "ood" else ("ood", f"{outcome[1]}{k}", outcome[2])
        if k == 3:  # half-way: export refuses while images are pending
            rc, _, err = run_cli(capsys, "export", work)
            assert rc == 2 and "still pending" in err and not (work / "export").exists()

    rc, out, _ = run_cli(capsys, "status", work)
    assert rc == 0 and "stage1 0, stage3 0" in out
    rc, out, _ = run_cli(capsys, "export", work)
    assert rc == 0

    exp = work / "export"
    ood_rows = {os.path.normpath(exp / r["path"]): r for r in read_csv(exp / "ood.csv")}
    back_rows = {os.path.normpath(exp / r["path"]): r for r in read_csv(exp / "returned_id.csv")}
    amb_rows = {os.path.normpath(exp / r["path"]): r for r in read_csv(exp / "ambiguous.csv")}
    full = {p: os.path.normpath(d.folder / p) for p in expected}
    assert {full[p] for p, e in expected.items() if e[0] == "ood"} == set(ood_rows)
    assert {full[p] for p, e in expected.items() if e[0] == "id"} == set(back_rows)
    assert {full[p] for p, e in expected.items() if e[0] == "ambiguous"} == set(amb_rows)
    for p, e in expected.items():
        if e[0] == "ood":
            r = ood_rows[full[p]]
            assert (r["label"], r["ood_label"], r["fine_grained"], r["flag"]) == ("-1", e[1], str(int(e[2])), flags[p])
        if e[0] == "id":
            assert back_rows[full[p]]["label"] == str(e[1])

    # the OOD manifest and the ID evaluation set are ordinary oodeval manifests
    from oodeval.data.manifest import Manifest

    m = Manifest.from_csv(exp / "ood.csv")
    assert (m.labels == -1).all() and len(m) == len(ood_rows)
    assert all(Path(m.resolve_path(i)).is_file() for i in range(len(m)))
    assert sorted(m.ood_label) == sorted(e[1] for e in expected.values() if e[0] == "ood")
    ide = Manifest.from_csv(exp / "id_eval.csv")
    n_images = 6 * 10
    assert len(ide) == n_images - len(ood_rows) - len(amb_rows)
    id_labels = {os.path.normpath(ide.resolve_path(i)): int(ide.labels[i]) for i in range(len(ide))}
    assert all(id_labels[full[p]] == e[1] for p, e in expected.items() if e[0] == "id")

    # outcome table: counts and shares per flag and overall, fine-grained share of OOD
    table = {r["flag"]: r for r in read_csv(exp / "outcome.csv")}
    groups = {f: [p for p in expected if flags[p] == f] for f in set(flags.values())}
    groups["all"] = list(expected)
    for flag, paths in groups.items():
        outs = [expected[p] for p in paths]
        n_ood = sum(o[0] == "ood" for o in outs)
        n_fine = sum(o[0] == "ood" and o[2] for o in outs)
        r = table[flag]
        assert int(r["candidates"]) == len(paths)
        assert int(r["ood"]) == n_ood and int(r["id"]) == sum(o[0] == "id" for o in outs)
        assert int(r["ambiguous"]) == sum(o[0] == "ambiguous" for o in outs) and int(r["pending"]) == 0
        assert float(r["ood_share"]) == pytest.approx(n_ood / len(paths), abs=1e-6)
        assert int(r["fine_grained"]) == n_fine
        assert float(r["fine_grained_share"]) == pytest.approx(n_fine / n_ood if n_ood else 0.0, abs=1e-6)
        assert int(r["ood_concepts"]) == len({o[1] for o in outs if o[0] == "ood"})
    assert "| all |" in (exp / "outcome.md").read_text() and "Consensus rule:" in (exp / "outcome.md").read_text()
