"""Consensus on concepts (WordNet senses), final agreements reopened only by the coordinator, and an
export whose counts follow the consensus rule and whose cells a spreadsheet cannot run."""

import csv
import getpass

import pytest

from oodeval.cli import main
from oodeval.construct.candidates import Candidate
from oodeval.construct.export import export
from oodeval.construct.protocol import ProtocolError, ProtocolStore
from oodeval.construct.rules import Outcome
from oodeval.zeroshot.wordnet import noun_senses
from test_construct_app import call, make_project, start, verdict

pytestmark = pytest.mark.needs("wordnet")

TAYRA = "n02451415"  # WordNet 3.0: tayra, taira, Eira barbara
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def first_sense(label):
    return noun_senses(label)[0].wnid


def test_concepts_decide_consensus_the_concept_count_and_the_export(tmp_path):
    project, store, _ = make_project(tmp_path)
    images = [c.image for c in project.candidates]
    stage1 = [
        (("tayra", TAYRA), ("Eira barbara", TAYRA)),  # one concept in two spellings: agreed at Stage 2
        (("taira", TAYRA), ("Tayra", TAYRA)),  # the same concept again: still one concept
        (("hotdog", None), ("dog", None)),  # the old rule matched them through a sense of "dog"
        (("seal", None), ("stamp", None)),
        (("hotdog", first_sense("hotdog")), ("dog", first_sense("dog"))),  # each word's own first sense
        (('=HYPERLINK("http://evil.example","x")', None), ('=hyperlink("http://evil.example","x")', None)),
        (("+cmd", None), ("+CMD", None)),
        (("@sum", None), ("@sum", None)),
    ]
    for image, pair in zip(images, stage1):
        for who, (label, sense) in zip(("alice", "bob"), pair):
            store.submit(who, image, 1, "ood", label, True, ood_sense=sense)
    outcomes = store.outcomes()
    assert [outcomes[i].status for i in images[:8]] == ["final", "final", "stage3", "stage3", "stage3", "final", "final", "final"]
    assert outcomes[images[0]] == Outcome("final", "ood", 2, "tayra", True, None, ("tayra", "Eira barbara"), TAYRA)
    for image in images[2:5]:  # the joint review: seal / stamp / seal is no consensus either
        for who, label in zip(("alice", "bob", "carol"), ("seal", "stamp", "seal")):
            store.submit(who, image, 3, "ood", label, True)
        assert store.outcome(image) == Outcome("final", "ambiguous", 3)
    for image in images[8:]:
        for who in ("alice", "bob"):
            store.submit(who, image, 1, "ambiguous")
    paths = export(project, store)
    ood = read_csv(paths["ood"])
    assert len(ood) == 5
    by_sense = [r for r in ood if r["ood_sense"] == TAYRA]
    assert [(r["ood_label"], r["other_labels"]) for r in by_sense] == [("tayra", "Eira barbara"), ("taira", "Tayra")]
    total = {r["flag"]: r for r in read_csv(paths["outcome"])}["all"]
    assert (total["ood"], total["ood_concepts"], total["ambiguous"]) == ("5", "4", str(3 + len(images[8:])))
    assert "OOD concepts are counted by the same rule" in paths["outcome_md"].read_text()
    # formula cells are inert: a leading ' (the label as typed follows it)
    assert {r["ood_label"] for r in ood} >= {"'=HYPERLINK(\"http://evil.example\",\"x\")", "'+cmd", "'@sum"}
    for name in ("ood", "returned_id", "ambiguous", "id_eval", "outcome"):
        for row in read_csv(paths[name]):
            for col, cell in row.items():
                if col not in ("path", "label", "original_label", "decided_stage", "fine_grained"):
                    assert not cell.startswith(FORMULA_START), (name, col, cell)


def test_labels_that_are_empty_or_name_an_id_class_are_refused_with_the_reason(tmp_path):
    cands = [Candidate(f"img/{i}.png", f"img/{i}.png", 0, "tench, Tinca tinca", "uncertain") for i in range(2)]
    store, _ = ProtocolStore.create(tmp_path / "p.sqlite", cands, ("alice", "bob"), "carol", 3,
                                    class_names=["tench, Tinca tinca", "goldfish", "great white shark"])
    for label, sense, message in [("-", None, "no letter or digit"), ("_", None, "no letter or digit"),
                                  ("\u200b", None, "no letter or digit"), ("Tinca_tinca", None, "names ID class 0"),
                                  ("Goldfish", None, "names ID class 1"), ("tayra", "n02084071", "not a name of WordNet sense")]:
        with pytest.raises(ProtocolError, match=message):
            store.submit("alice", "img/0.png", 1, "ood", label, ood_sense=sense)
    assert store.rows() == []
    with pytest.raises(ValueError, match="2 class names for 3 ID classes"):
        ProtocolStore.create(tmp_path / "q.sqlite", cands, ("alice", "bob"), "carol", 3, class_names=["a", "b"])


def test_an_agreement_is_final_until_the_coordinator_reopens_it(tmp_path, capsys):
    project, store, tokens = make_project(tmp_path)
    images = [c.image for c in project.candidates]
    for image in images:
        for who in ("alice", "bob"):
            store.submit(who, image, 1, "ambiguous")
    first = images[0]
    with pytest.raises(ProtocolError, match="agreement is final"):
        store.submit("bob", first, 1, "withdrawn")
    server, base = start(project)
    try:  # the page's undo is the same refusal
        mine = call(base, f"/api/item?image={first}", tokens["bob"])[1]["my_last_row"]["1"]
        status, err = call(base, "/api/verdict", tokens["bob"], {**verdict(first, verdict="withdrawn"), "base": mine})
        assert status == 400 and "only the coordinator can reopen it" in err["error"]
    finally:
        server.shutdown()
        server.server_close()
    assert store.outcome(first) == Outcome("final", "ambiguous", 2)
    work = str(project.folder)
    assert main(["construct", "export", work]) == 0
    capsys.readouterr()
    assert main(["construct", "reopen", work, first, "--reason", "bob mis-keyed"]) == 2  # stdin is no terminal: no silent yes
    assert "needs confirmation" in capsys.readouterr().err and store.outcome(first).status == "final"
    assert main(["construct", "reopen", work, first, "--reason", " ", "--yes"]) == 2
    assert "needs a reason" in capsys.readouterr().err
    assert main(["construct", "reopen", work, first, "--reason", "bob mis-keyed", "--yes"]) == 0
    out = capsys.readouterr()
    assert f"reopened {first} (was ambiguous (decided at Stage 2))" in out.out
    assert f"the export in {project.folder / 'export'}" in out.err and "is now stale" in out.err
    assert store.outcome(first) == Outcome("stage1") and store.view("bob", first)["my_stage1"] is None
    log = store.reopenings()
    assert [(r["image"], r["reason"], r["by"], r["stale_export"]) for r in log] == [(first, "bob mis-keyed", getpass.getuser(),
                                                                                     str(project.folder / "export"))]
    assert len(store.rows(first)) == 2  # the audit trail keeps the reopened rows
    assert main(["construct", "status", work]) == 0
    assert "is stale: 1 image(s) it included were reopened since" in capsys.readouterr().out
    assert main(["construct", "reopen", work, first, "--reason", "again", "--yes"]) == 2
    assert "not decided" in capsys.readouterr().err
    store.submit("alice", first, 1, "id", id_class=1)  # judged afresh: a new agreement
    store.submit("bob", first, 1, "id", id_class=1)
    assert store.outcome(first) == Outcome("final", "id", 2, None, False, 1)
    assert store.stale_export() is not None
    assert main(["construct", "export", work]) == 0
    capsys.readouterr()
    assert store.stale_export() is None
    assert [r["path"].endswith(first.rsplit("/", 1)[-1]) for r in read_csv(project.folder / "export" / "returned_id.csv")] == [True]
