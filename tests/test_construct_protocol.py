"""The three-stage protocol: the verdict rules for every combination, and the SQLite store."""

import itertools
import multiprocessing
import random
import re
import sqlite3
import threading

import pytest

from oodeval.construct.candidates import Candidate
from oodeval.construct.protocol import AuthError, ProtocolError, ProtocolStore, wordnet_senses
from oodeval.construct.rules import Outcome, Verdict, agree, check_verdict, concept, differences, normalise_label, resolve_verdicts

TAYRA = "n02451415"  # WordNet 3.0: tayra, taira, Eira barbara


def ood(who, label="tayra", fine=False, sense=None):
    return Verdict(who, "ood", label, fine, ood_sense=sense)


def idv(who, cls):
    return Verdict(who, "id", id_class=cls)


def amb(who):
    return Verdict(who, "ambiguous")


# ---- Stage 1 + 2: every pair of verdicts ----------------------------------------------------------
STAGE12 = [
    ("ood/ood same label", [ood("a", "tayra", True), ood("b", "tayra", True)], Outcome("final", "ood", 2, "tayra", True, None, ("tayra",))),
    ("ood/ood same label up to case and spacing: the first spelling adopted, both kept",
     [ood("a", "Denison barb", True), ood("b", "  denison   BARB ", True)],
     Outcome("final", "ood", 2, "Denison barb", True, None, ("Denison barb", "  denison   BARB "))),
    ("ood/ood other labels", [ood("a", "axolotl", True), ood("b", "teapot", True)], Outcome("stage3")),
    ("ood/ood same label, other fine-grained flag", [ood("a", "axolotl", True), ood("b", "axolotl", False)], Outcome("stage3")),
    ("ood/ood other labels and flags (axolotl vs teapot)", [ood("a", "axolotl", True), ood("b", "teapot", False)], Outcome("stage3")),
    ("id/id same class", [idv("a", 3), idv("b", 3)], Outcome("final", "id", 2, None, False, 3)),
    ("id/id other classes", [idv("a", 3), idv("b", 4)], Outcome("stage3")),
    ("ambiguous/ambiguous", [amb("a"), amb("b")], Outcome("final", "ambiguous", 2)),
    ("ood/id", [ood("a"), idv("b", 1)], Outcome("stage3")),
    ("id/ood", [idv("a", 1), ood("b")], Outcome("stage3")),
    ("ood/ambiguous", [ood("a"), amb("b")], Outcome("stage3")),
    ("ambiguous/ood", [amb("a"), ood("b")], Outcome("stage3")),
    ("id/ambiguous", [idv("a", 2), amb("b")], Outcome("stage3")),
    ("ambiguous/id", [amb("a"), idv("b", 2)], Outcome("stage3")),
    ("one verdict only", [ood("a")], Outcome("stage1")),
    ("no verdict", [], Outcome("stage1")),
]


@pytest.mark.parametrize("stage1, expected", [c[1:] for c in STAGE12], ids=[c[0] for c in STAGE12])
def test_stage1_and_stage2(stage1, expected):
    assert resolve_verdicts(stage1) == expected


@pytest.mark.needs("wordnet")
def test_labels_agree_on_the_chosen_wordnet_sense_only():
    senses = wordnet_senses()
    assert senses is not None  # wordnet-base is installed (the needs marker)
    got = resolve_verdicts([ood("a", "Tayra", True, TAYRA), ood("b", "Eira barbara", True, TAYRA)])
    assert got == Outcome("final", "ood", 2, "Tayra", True, None, ("Tayra", "Eira barbara"), TAYRA)
    assert concept("Tayra", TAYRA) == concept("Eira_barbara", TAYRA) == ("sense", TAYRA)
    assert resolve_verdicts([ood("a", "Tayra", True, TAYRA), ood("b", "Eira barbara", False, TAYRA)]) == Outcome("stage3")
    # free labels (no sense chosen) match only the same label; a sense never matches a free label
    assert resolve_verdicts([ood("a", "tayra"), ood("b", "Eira barbara")]) == Outcome("stage3")
    assert resolve_verdicts([ood("a", "tayra", sense=TAYRA), ood("b", "tayra")]) == Outcome("stage3")
    # the old all-senses synonym rule made these final agreements; each annotator's first noun sense differs
    for a, b in [("hotdog", "dog"), ("seal", "stamp"), ("pitcher", "hurler")]:
        assert resolve_verdicts([ood("a", a), ood("b", b)]) == Outcome("stage3"), (a, b)
    first = {w: _first_sense(w) for w in ("hotdog", "dog", "seal", "stamp")}
    assert resolve_verdicts([ood("a", "hotdog", sense=first["hotdog"]), ood("b", "dog", sense=first["dog"])]) == Outcome("stage3")
    assert resolve_verdicts([ood("a", "seal", sense=first["seal"]), ood("b", "stamp", sense=first["stamp"])]) == Outcome("stage3")
    seal_stamp = "n04159058"  # "a device incised to make an impression": both chose it, so they agree
    assert agree(ood("a", "seal", sense=seal_stamp), ood("b", "stamp", sense=seal_stamp))
    assert normalise_label(" Denison_barb ") == normalise_label("denison-barb") == "denison barb"


def _first_sense(label):
    from oodeval.zeroshot.wordnet import noun_senses

    return noun_senses(label)[0].wnid


BAD_LABELS = [
    ("-", None, "no letter or digit"), ("_", None, "no letter or digit"), ("\u200b", None, "no letter or digit"),
    ("Class B", None, "names ID class 1 ('class b, bee')"), ("bee", None, "names ID class 1"),
    ("tayra", "n02084071", "not a name of WordNet sense n02084071"), ("tayra", "n99999999", "no noun synset n99999999"),
    ("tayra", "02451415", "synset id like n02451415"), ("x" * 201, None, "at most 200 characters"),
    ("dog", "n02084071", "includes ID class 2 ('Canis familiaris')"),
]


@pytest.mark.needs("wordnet")
@pytest.mark.parametrize("label, sense, message", BAD_LABELS, ids=[b[2] for b in BAD_LABELS])
def test_empty_labels_id_class_names_and_foreign_senses_are_refused(label, sense, message):
    names = ["class a", "class b, bee", "Canis familiaris"]
    with pytest.raises(ValueError, match=re.escape(message)):
        check_verdict("ood", label, False, None, 3, sense, names, wordnet_senses())
    check_verdict("ood", "tayra", False, None, 3, TAYRA, names, wordnet_senses())  # a proper one passes
    with pytest.raises(ValueError, match="without WordNet"):
        check_verdict("ood", "tayra", False, None, 3, TAYRA, names, None)


DISPUTE = [ood("a", "tayra"), idv("b", 5)]
MAKERS = {"ood": lambda w: ood(w, "tayra", True), "id": lambda w: idv(w, 5), "ambiguous": amb}


@pytest.mark.parametrize("combo", list(itertools.product(MAKERS, repeat=3)), ids="-".join)
def test_stage3_every_combination(combo):
    stage3 = [MAKERS[v](w) for v, w in zip(combo, "abc")]
    got = resolve_verdicts(DISPUTE, stage3)
    assert got.status == "final" and got.stage == 3
    if len(set(combo)) == 1:
        assert got.verdict == combo[0]
        if combo[0] == "ood":
            assert (got.ood_label, got.fine_grained, got.labels) == ("tayra", True, ("tayra",))
        if combo[0] == "id":
            assert got.id_class == 5
    else:
        assert got == Outcome("final", "ambiguous", 3)


# the three Stage-3 OOD verdicts: (label, fine-grained) of a, b, c -> the outcome (None = ambiguous)
LABEL_FLAG = [
    ([("Denison barb", True), ("tayra", True), ("banana", True)], None),          # three labels are no consensus
    ([("tayra", True), ("tayra", True), ("banana", True)], None),                 # one label differs
    ([("tayra", True), ("tayra", True), ("tayra", False)], None),                 # one flag differs
    ([("tayra", False), ("tayra", True), ("tayra", True)], None),
    ([("Tayra", True), ("tayra ", True), ("TAYRA", True)], ("Tayra", True)),      # same label normalised
    ([("tayra", False), ("tayra", False), ("tayra", False)], ("tayra", False)),
    ([("tayra", True, TAYRA), ("Eira barbara", True, TAYRA), ("taira", True, TAYRA)], ("tayra", True)),  # one WordNet sense
    ([("tayra", True, TAYRA), ("Eira barbara", True, TAYRA), ("taira", False, TAYRA)], None),
    ([("tayra", True), ("Eira barbara", True), ("taira", True)], None),  # free labels: three strings
    ([("seal", True), ("stamp", True), ("seal", True)], None),
]


@pytest.mark.parametrize("votes, expected", LABEL_FLAG, ids=[" / ".join(f"{v[0]}{'*' if v[1] else ''}" for v in c[0]) for c in LABEL_FLAG])
def test_stage3_label_and_flag_consensus(votes, expected):
    stage3 = [ood(w, *vote) for w, vote in zip("abc", votes)]
    got = resolve_verdicts(DISPUTE, stage3)
    if expected is None:
        assert got == Outcome("final", "ambiguous", 3)
    else:
        assert (got.status, got.verdict, got.stage, got.ood_label, got.fine_grained) == ("final", "ood", 3, *expected)
        assert got.labels == tuple(dict.fromkeys(vote[0] for vote in votes))


def test_differences_name_every_field():
    assert differences([ood("a", "axolotl", True), ood("b", "teapot", False)]) == ["ood_label", "fine_grained"]
    assert differences([ood("a", "axolotl", True), idv("b", 3)]) == ["verdict"]
    assert differences([idv("a", 2), idv("b", 3), idv("c", 3)]) == ["id_class"]
    assert differences([amb("a"), amb("b")]) == []


def test_stage3_id_needs_the_same_class_and_waits_for_all_three():
    assert resolve_verdicts(DISPUTE, [idv("a", 5), idv("b", 5), idv("c", 6)]) == Outcome("final", "ambiguous", 3)
    assert resolve_verdicts(DISPUTE, [idv("a", 5), idv("b", 5)]) == Outcome("stage3")
    assert resolve_verdicts(DISPUTE, []) == Outcome("stage3")
    with pytest.raises(ValueError, match="three annotators"):
        resolve_verdicts(DISPUTE, [amb("a")] * 4)


# ---- the store ------------------------------------------------------------------------------------
def make_store(tmp_path, n=4, n_classes=10):
    cands = [Candidate(f"img/{i}.png", f"img/{i}.png", i % n_classes, f"c{i % n_classes}", "uncertain" if i % 2 else "no class") for i in range(n)]
    return ProtocolStore.create(tmp_path / "p.sqlite", cands, ("alice", "bob"), "carol", n_classes)


def test_create_tokens_and_wal(tmp_path):
    store, tokens = make_store(tmp_path)
    assert set(tokens) == {"alice", "bob", "carol"} and len(set(tokens.values())) == 3
    assert store.authenticate(tokens["bob"]).name == "bob"
    assert store.authenticate(tokens["carol"]).role == "stage3"
    for bad in ("", None, tokens["bob"] + "x"):
        with pytest.raises(AuthError):
            store.authenticate(bad)
    with sqlite3.connect(store.path) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert tokens["alice"] not in str(con.execute("SELECT * FROM annotators").fetchall())
    with pytest.raises(FileExistsError):
        make_store(tmp_path)
    with pytest.raises(ValueError, match="two Stage-1"):
        ProtocolStore.create(tmp_path / "q.sqlite", store.images(), ("a",), "c", 10)
    with pytest.raises(ValueError, match="n_classes must be a positive integer"):
        ProtocolStore.create(tmp_path / "q.sqlite", store.images(), ("a", "b"), "c", None)


def test_store_files_are_private_and_tokens_can_be_reissued(tmp_path):
    store, tokens = make_store(tmp_path)
    con = sqlite3.connect(store.path)  # while a connection is open, the WAL and shared-memory files exist
    con.execute("SELECT count(*) FROM verdicts").fetchone()
    store.submit("alice", "img/0.png", 1, "ambiguous")
    modes = {f.name: f.stat().st_mode & 0o777 for f in [store.path, *store.path.parent.glob("p.sqlite-*")]}
    con.close()
    assert modes == {"p.sqlite": 0o600, "p.sqlite-shm": 0o600, "p.sqlite-wal": 0o600}
    new = store.reissue("bob")
    assert new != tokens["bob"] and store.authenticate(new).name == "bob"
    with pytest.raises(AuthError, match="unknown access token"):
        store.authenticate(tokens["bob"])
    assert store.authenticate(tokens["alice"]).name == "alice"
    with pytest.raises(AuthError, match="unknown annotator 'mallory'"):
        store.reissue("mallory")


@pytest.mark.needs("wordnet")
def test_full_flow_with_dispute_and_revision(tmp_path):
    store, _ = make_store(tmp_path)
    img = "img/1.png"
    store.submit("alice", img, 1, "id", id_class=3)
    store.submit("alice", img, 1, "ood", "tayra", True)  # revised before bob answered: the latest counts
    assert store.outcome(img).status == "stage1"
    assert store.view("bob", img)["my_stage1"] is None  # bob sees nothing of alice
    assert "stage1" not in store.view("bob", img)
    store.submit("bob", img, 1, "id", id_class=1)
    assert store.outcome(img) == Outcome("stage3")
    with pytest.raises(ProtocolError, match="closed"):
        store.submit("alice", img, 1, "id", id_class=1)
    view = store.view("carol", img)
    assert [(v["annotator"], v["verdict"]) for v in view["stage1"]] == [("alice", "ood"), ("bob", "id")]
    store.submit("alice", img, 3, "ood", "tayra", True, ood_sense=TAYRA)
    store.submit("bob", img, 3, "id", id_class=1)
    store.submit("bob", img, 3, "ood", "Eira barbara", True, ood_sense=TAYRA)  # bob changes his mind in the joint review
    assert store.outcome(img).status == "stage3"
    store.submit("carol", img, 3, "ood", "tayra", True, ood_sense=TAYRA)
    assert store.outcome(img) == Outcome("final", "ood", 3, "tayra", True, None, ("tayra", "Eira barbara"), TAYRA)
    with pytest.raises(ProtocolError, match="already decided"):
        store.submit("carol", img, 3, "ambiguous")
    assert len(store.rows(img)) == 7  # the audit trail keeps every row
    p = {r["annotator"]: r for r in store.progress()}
    assert (p["alice"]["stage1_done"], p["alice"]["stage1_total"], p["carol"]["stage3_done"], p["carol"]["stage3_total"]) == (1, 4, 1, 1)
    assert store.queue("carol", 1) == [] and store.queue("carol", 3) == [{"image": img, "done": True, "status": "final"}]
    assert [q["done"] for q in store.queue("alice", 1)] == [False, True, False, False]


def test_agreement_hides_the_other_verdict(tmp_path):
    store, _ = make_store(tmp_path)
    store.submit("alice", "img/0.png", 1, "ambiguous")
    store.submit("bob", "img/0.png", 1, "ambiguous")
    assert store.outcome("img/0.png") == Outcome("final", "ambiguous", 2)
    view = store.view("bob", "img/0.png")
    assert view["my_stage1"]["annotator"] == "bob" and "stage1" not in view and not view["in_stage3"]
    with pytest.raises(ProtocolError, match="takes no Stage-3"):
        store.submit("carol", "img/0.png", 3, "ambiguous")
    with pytest.raises(ProtocolError, match="still in Stage 1"):
        store.submit("carol", "img/2.png", 3, "ambiguous")


BAD = [
    (dict(annotator="alice", image="nope.png", stage=1, verdict="ambiguous"), ProtocolError, "unknown image id 'nope.png'"),
    (dict(annotator="mallory", image="img/0.png", stage=1, verdict="ambiguous"), AuthError, "unknown annotator"),
    (dict(annotator="carol", image="img/0.png", stage=1, verdict="ambiguous"), ProtocolError, "Stage-3 annotator"),
    (dict(annotator="alice", image="img/0.png", stage=2, verdict="ambiguous"), ProtocolError, "stage must be 1 or 3"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="maybe"), ProtocolError, "verdict must be one of"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="ood"), ProtocolError, "needs a proposed OOD label"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="ood", ood_label="  "), ProtocolError, "needs a proposed OOD label"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="id"), ProtocolError, "needs an integer ID class"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="id", id_class=10), ProtocolError, "outside 0..9"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="id", id_class="3"), ProtocolError, "integer ID class"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="ambiguous", fine_grained=True), ProtocolError, "takes no OOD label"),
    (dict(annotator="alice", image="img/0.png", stage=1, verdict="ambiguous", id_class=2), ProtocolError, "takes no ID class"),
]


@pytest.mark.parametrize("kwargs, exc, message", BAD, ids=[b[2] for b in BAD])
def test_bad_submissions_change_nothing(tmp_path, kwargs, exc, message):
    store, _ = make_store(tmp_path)
    store.submit("bob", "img/0.png", 1, "ambiguous")
    before = store.rows()
    with pytest.raises(exc, match=message):
        store.submit(**kwargs)
    assert store.rows() == before


def test_rows_are_append_only(tmp_path):
    store, _ = make_store(tmp_path)
    store.submit("alice", "img/0.png", 1, "ambiguous")
    row = store.rows()[0]
    con = sqlite3.connect(store.path)
    replace = ("INSERT OR REPLACE INTO verdicts(id, image, annotator, stage, verdict, fine_grained, submission, created)"
               " VALUES (?, 'img/0.png', 'alice', 1, 'ood', 0, ?, 'now')")
    for sql, args in [("UPDATE verdicts SET verdict = 'ood'", ()), ("DELETE FROM verdicts", ()),
                      (replace, (row.id, "fresh-submission")), (replace, (None, row.submission))]:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            con.execute(sql, args)
    con.close()
    assert store.rows() == [row]


def test_replays_are_no_ops_and_old_revisions_cannot_overwrite(tmp_path):
    store, _ = make_store(tmp_path)
    img = "img/0.png"
    first = store.submit("alice", img, 1, "ood", "tayra", True, submission="sub-0001", base=None)
    assert store.submit("alice", img, 1, "ood", "tayra", True, submission="sub-0001", base=None) == first  # replay
    assert len(store.rows()) == 1
    with pytest.raises(ProtocolError, match="already used for another verdict"):
        store.submit("alice", img, 1, "ambiguous", submission="sub-0001", base=None)
    second = store.submit("alice", img, 1, "ambiguous", submission="sub-0002", base=first)
    with pytest.raises(ProtocolError, match="changed since this page loaded"):  # a request made before `second`
        store.submit("alice", img, 1, "ood", "tayra", True, submission="sub-0003", base=first)
    with pytest.raises(ProtocolError, match="changed since"):  # a second tab that never saw `first`
        store.submit("alice", img, 1, "id", id_class=1, submission="sub-0004", base=None)
    assert [r.id for r in store.rows()] == [first, second] and store.view("alice", img)["my_stage1"]["verdict"] == "ambiguous"


def test_undo_while_the_stage_is_open(tmp_path):
    store, _ = make_store(tmp_path)
    img = "img/0.png"
    with pytest.raises(ProtocolError, match="no Stage-1 verdict on 'img/0.png' to undo"):
        store.submit("alice", img, 1, "withdrawn")
    store.submit("alice", img, 1, "ambiguous")
    store.submit("alice", img, 1, "withdrawn")  # undone while bob's verdict is not in
    assert store.view("alice", img)["my_stage1"] is None
    store.submit("alice", img, 1, "ambiguous")
    store.submit("bob", img, 1, "id", id_class=2)  # a dispute: Stage 3
    with pytest.raises(ProtocolError, match="in Stage 3: its Stage-1 verdicts can no longer be undone"):
        store.submit("bob", img, 1, "withdrawn")
    store.submit("carol", img, 3, "ambiguous")
    store.submit("carol", img, 3, "withdrawn")
    assert store.view("carol", img)["stage3"] == []
    for who in ("alice", "bob", "carol"):
        store.submit(who, img, 3, "id", id_class=2)
    assert store.outcome(img) == Outcome("final", "id", 3, None, False, 2)
    with pytest.raises(ProtocolError, match="already decided"):
        store.submit("carol", img, 3, "withdrawn")
    with pytest.raises(ProtocolError, match="takes no OOD label"):
        store.submit("alice", "img/1.png", 1, "withdrawn", id_class=3)


def test_outcomes_are_updated_incrementally(tmp_path, monkeypatch):
    store, _ = make_store(tmp_path, n=6)
    for i in range(6):
        store.submit("alice", f"img/{i}.png", 1, "ambiguous")
    assert store.summary()["stage1"] == 6
    calls = []
    real = ProtocolStore._outcome
    monkeypatch.setattr(ProtocolStore, "_outcome", lambda self, rows: calls.append(rows[0].image) or real(self, rows))
    store.submit("bob", "img/4.png", 1, "ambiguous")
    assert calls == ["img/4.png"]  # the submission's own check, one image
    calls.clear()
    store.outcomes(), store.progress(), store.queue("alice", 1)
    assert calls == ["img/4.png"]  # folded in once, not recomputed per call or per image
    other = ProtocolStore(store.path)  # another process's view sees the same state
    assert other.outcomes() == store.outcomes() and other.summary()["ambiguous"] == 1


def _hammer(path, who, seed, images):
    """Submit one Stage-1 verdict per image in a seeded order; return (accepted row ids, refusals)."""
    store = ProtocolStore(path)
    order = list(images)
    random.Random(seed).shuffle(order)
    accepted, refused = [], 0
    for img in order:
        try:
            accepted.append(store.submit(who, img, 1, "ood", "tayra"))
        except ProtocolError as exc:
            assert "closed" in str(exc)
            refused += 1
    return accepted, refused


def _check_race_free(store, accepted, attempts):
    rows = store.rows()
    assert sorted(r.id for r in rows) == sorted(accepted)  # every accepted row is stored, nothing else
    assert len(accepted) < attempts  # some were refused: the stage really closed under contention
    for img in (c.image for c in store.images()):
        mine = [r for r in rows if r.image == img]
        seen = set()
        for k, r in enumerate(mine):  # no row may follow the moment both annotators are in
            seen.add(r.annotator)
            if seen == {"alice", "bob"}:
                assert k == len(mine) - 1, f"{img}: row accepted after Stage 1 closed"
        assert seen == {"alice", "bob"} and store.outcome(img).verdict == "ood"


def test_concurrent_threads_lose_nothing(tmp_path):
    store, _ = make_store(tmp_path, n=25)
    images = [c.image for c in store.images()]
    results = [None] * 8
    def work(i):
        results[i] = _hammer(store.path, "alice" if i % 2 else "bob", i, images)
    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    accepted = [r for res in results for r in res[0]]
    assert len(accepted) + sum(res[1] for res in results) == 8 * 25
    _check_race_free(store, accepted, 8 * 25)


def test_concurrent_processes_lose_nothing(tmp_path):
    store, _ = make_store(tmp_path, n=20)
    images = [c.image for c in store.images()]
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(4) as pool:
        results = pool.starmap(_hammer, [(store.path, "alice" if i % 2 else "bob", i, images) for i in range(4)])
    accepted = [r for res in results for r in res[0]]
    _check_race_free(store, accepted, 4 * 20)


def test_opening_something_else_is_refused(tmp_path):
    (tmp_path / "x.sqlite").write_text("not a database")
    with pytest.raises(ValueError, match="is not an oodeval protocol store"):
        ProtocolStore(tmp_path / "x.sqlite")
    with pytest.raises(FileNotFoundError, match="construct init"):
        ProtocolStore(tmp_path / "missing.sqlite")
