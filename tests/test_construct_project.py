"""A project pins its inputs; the CLI reads tokens from the environment or a file, never argv."""

import json

import pytest

from oodeval.cli import main
from oodeval.construct.candidates import load_project, write_project
from oodeval.construct.protocol import open_store
from oodeval.construct.synthetic import make_synthetic_dataset


def cli(capsys, *argv):
    rc = main(["construct", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture
def initialised(tmp_path, capsys):
    """A project made without --classes (6 classes in the manifest), evidence built, store created."""
    d = make_synthetic_dataset(tmp_path / "data", n_classes=6, per_class=6, unassigned=0.4, seed=2)
    work = tmp_path / "work"
    assert cli(capsys, "candidates", work, "--manifest", d.manifest, "--reannotation", d.reannotation)[0] == 0
    assert cli(capsys, "evidence", work, "--image-embeddings", d.image_embeddings, "--text-embeddings", d.text_embeddings)[0] == 0
    rc, out, _ = cli(capsys, "init", work, "--stage1", "alice", "bob", "--stage3", "carol")
    assert rc == 0
    tokens = {line.split()[0]: line.split()[-1] for line in out.splitlines() if line.startswith("  ")}
    return d, work, tokens


def test_project_json_pins_inputs_pool_and_evidence(initialised):
    d, work, _ = initialised
    meta = json.loads((work / "project.json").read_text())
    assert set(meta["sha256"]) == {"manifest", "reannotation", "class_names", "pool"} and meta["sha256"]["class_names"] is None
    assert all(len(meta["sha256"][k]) == 64 for k in ("manifest", "reannotation", "pool"))
    assert set(meta["pinned"]) == {"pool", "evidence"} and meta["pinned"]["pool"] == meta["sha256"]["pool"]


def test_rerunning_candidates_or_evidence_after_init_is_refused(initialised, capsys):
    d, work, _ = initialised
    before = {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()}
    rc, _, err = cli(capsys, "candidates", work, "--manifest", d.manifest, "--reannotation", d.reannotation)
    assert rc == 2 and "is initialised" in err and "new work folder" in err
    rc, _, err = cli(capsys, "evidence", work, "--image-embeddings", d.image_embeddings, "--text-embeddings", d.text_embeddings, "--force")
    assert rc == 2 and "is initialised" in err
    assert {p.name: p.read_bytes() for p in work.iterdir() if p.is_file()} == before


def test_changed_inputs_pool_or_evidence_are_detected(initialised, capsys):
    d, work, _ = initialised
    pool = (work / "candidates.csv").read_text()
    (work / "candidates.csv").write_text(pool.rsplit("\n", 2)[0] + "\n")  # one candidate fewer
    with pytest.raises(ValueError, match="candidates.csv was changed after"):
        load_project(work)
    rc, _, err = cli(capsys, "export", work, "--allow-pending")
    assert rc == 2 and "changed after" in err and not (work / "export").exists()
    (work / "candidates.csv").write_text(pool)
    evidence = sorted((work / "evidence").glob("*.json"))[0]
    evidence.write_text(evidence.read_text().replace('"flag"', '"flag" ', 1))
    with pytest.raises(ValueError, match="evidence in .* changed after `construct init`"):
        open_store(load_project(work), check_evidence=True)
    open_store(load_project(work))  # the verdicts themselves stay readable (status)
    d.manifest.write_text(d.manifest.read_text() + "\n")
    with pytest.raises(ValueError, match="manifest .* changed since `construct candidates`"):
        load_project(work)


def test_a_store_made_for_another_pool_is_refused(tmp_path, initialised):
    d, work, _ = initialised
    other = write_project(tmp_path / "other", d.manifest, d.reannotation)
    (other.folder / "protocol.sqlite").write_bytes((work / "protocol.sqlite").read_bytes())
    other.candidates.pop()  # as if candidates.csv described another pool
    with pytest.raises(ValueError, match="made for another candidate pool"):
        open_store(other)


def test_id_classes_are_checked_without_class_names(initialised, capsys, monkeypatch):
    d, work, tokens = initialised
    image = load_project(work).candidates[0].image
    monkeypatch.setenv("OODEVAL_TOKEN", tokens["alice"])
    rc, _, err = cli(capsys, "verdict", work, image, "id", "--id-class", 999)
    assert rc == 2 and "ID class 999 is outside 0..5" in err
    assert cli(capsys, "verdict", work, image, "id", "--id-class", 5)[0] == 0


def test_tokens_come_from_env_or_file_and_can_be_reissued(initialised, capsys, monkeypatch, tmp_path):
    d, work, tokens = initialised
    image = load_project(work).candidates[0].image
    monkeypatch.delenv("OODEVAL_TOKEN", raising=False)
    try:  # there is no --token option (nor an abbreviation of --token-file) to show the token in `ps`
        rc = main(["construct", "verdict", str(work), "--token", tokens["bob"], image, "ambiguous"])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2 and "error:" in capsys.readouterr().err and open_store(load_project(work)).rows() == []
    (tmp_path / "bob.token").write_text(tokens["bob"] + "\n")
    rc, out, _ = cli(capsys, "verdict", work, "--token-file", tmp_path / "bob.token", image, "ambiguous")
    assert rc == 0 and "bob stage 1 ambiguous" in out
    rc, _, err = cli(capsys, "verdict", work, "--token-file", tmp_path / "missing.token", image, "ambiguous")
    assert rc == 2 and "cannot read --token-file" in err
    rc, out, _ = cli(capsys, "token", "reissue", work, "bob")
    assert rc == 0 and "the old one no longer works" in out
    new = out.splitlines()[-1].split()[-1]
    rc, _, err = cli(capsys, "verdict", work, "--token-file", tmp_path / "bob.token", image, "ambiguous")
    assert rc == 2 and "unknown access token" in err
    monkeypatch.setenv("OODEVAL_TOKEN", new)
    assert cli(capsys, "verdict", work, image, "ambiguous")[0] == 0
    rc, _, err = cli(capsys, "token", "reissue", work, "mallory")
    assert rc == 2 and "unknown annotator 'mallory'" in err
