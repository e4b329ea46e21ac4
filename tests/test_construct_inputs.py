"""Inputs of benchmark construction: manifest, class names, reannotation table, candidate pool."""

from collections import Counter

import pytest

from oodeval.cli import main
from oodeval.construct.candidates import flag_counts, load_project, write_project
from oodeval.construct.tables import confusion_counts, read_class_names, read_manifest, read_reannotation

MANIFEST = "path,label,url\n" + "".join(f"img/{i}.png,{i % 3},https://x.org/{i}.png\n" for i in range(9))
CLASSES = "ray\nbarb\ntuba\n"
#  img0..8 have labels 0,1,2,0,1,2,0,1,2
REANNOTATION = """path,original_label,reannotated,flag
img/0.png,0,,uncertain
img/1.png,1,,no class
img/2.png,2,0;1,
img/3.png,0,1,
img/4.png,1,barb|tuba,
img/5.png,2,,uncertain
img/6.png,0,1;2,
img/7.png,1,1,
"""


@pytest.fixture
def inputs(tmp_path):
    (tmp_path / "m.csv").write_text(MANIFEST)
    (tmp_path / "c.txt").write_text(CLASSES)
    (tmp_path / "r.csv").write_text(REANNOTATION)
    return tmp_path


def test_candidates_and_flag_counts(inputs, capsys):
    project = write_project(inputs / "work", inputs / "m.csv", inputs / "r.csv", inputs / "c.txt")
    assert [c.image for c in project.candidates] == ["img/0.png", "img/1.png", "img/5.png"]
    assert [c.original_name for c in project.candidates] == ["ray", "barb", "tuba"]
    assert flag_counts(project.candidates) == {"uncertain": 2, "no class": 1}
    again = load_project(inputs / "work")
    assert again.candidates == project.candidates and again.manifest.extra[3]["url"] == "https://x.org/3.png"
    assert main(["construct", "candidates", str(inputs / "w2"), "--manifest", str(inputs / "m.csv"),
                 "--reannotation", str(inputs / "r.csv"), "--classes", str(inputs / "c.txt")]) == 0
    out = capsys.readouterr().out
    assert "3 candidate images" in out
    assert [line.split()[:3] for line in out.splitlines()[1:3]] == [["uncertain", "2", "(66.7%)"], ["no", "class", "1"]]


def test_confusion_counts(inputs):
    man = read_manifest(inputs / "m.csv")
    rows = read_reannotation(inputs / "r.csv", man, read_class_names(inputs / "c.txt"))
    # original 0: img3 -> {1}, img6 -> {1, 2}; original 1: img4 -> {1, 2} (1 is itself); original 2: img2 -> {0, 1}
    assert confusion_counts(rows) == {0: Counter({1: 2, 2: 1}), 1: Counter({2: 1}), 2: Counter({0: 1, 1: 1})}


def test_class_names_csv_and_gaps(tmp_path):
    (tmp_path / "n.csv").write_text("label,name\n1,barb\n0,ray\n")
    assert read_class_names(tmp_path / "n.csv") == ["ray", "barb"]
    (tmp_path / "g.csv").write_text("label,name\n0,ray\n2,tuba\n")
    with pytest.raises(ValueError, match="without gaps"):
        read_class_names(tmp_path / "g.csv")
    (tmp_path / "e.txt").write_text("ray\n\nbarb\n")
    with pytest.raises(ValueError, match="one non-empty name per line"):
        read_class_names(tmp_path / "e.txt")


BAD_REANNOTATION = [
    ("image,flag\nimg/0.png,uncertain\n", "lacks column\\(s\\) reannotated"),
    ("path,reannotated,flag\nimg/99.png,,uncertain\n", "image 'img/99.png' is not in the ID manifest"),
    ("path,reannotated,flag\n" + "".join(f"nope/{i}.png,,x\n" for i in range(5)), "5 image\\(s\\) in total are not in the ID manifest"),
    ("path,reannotated,flag\nimg/0.png,,x\nimg/0.png,1,\n", "row 3 repeats image 'img/0.png' of row 2"),
    ("path,reannotated,flag\nimg/0.png,7,\n", "reannotated label '7' is not a known class"),
    ("path,reannotated,flag\nimg/0.png,eel,\n", "reannotated label 'eel' is not a known class"),
    ("path,original_label,reannotated,flag\nimg/0.png,2,,x\n", "original_label '2' differs from the manifest label 0"),
    ("path,reannotated,flag\nimg/0.png,,x,extra\n", "more fields than the 3 header columns"),
    ("path,reannotated,flag\n", "no rows"),
    ("", "is empty"),
    ("path,reannotated,flag\nimg/0.png,1,\n", "assigns every one of its 1 images to a class"),
]


@pytest.mark.parametrize("text, message", BAD_REANNOTATION, ids=[b[1][:30] for b in BAD_REANNOTATION])
def test_malformed_reannotation_is_refused_and_writes_nothing(inputs, text, message, capsys):
    (inputs / "bad.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        write_project(inputs / "work", inputs / "m.csv", inputs / "bad.csv", inputs / "c.txt")
    assert not (inputs / "work").exists()
    rc = main(["construct", "candidates", str(inputs / "work"), "--manifest", str(inputs / "m.csv"),
               "--reannotation", str(inputs / "bad.csv"), "--classes", str(inputs / "c.txt")])
    assert rc == 2 and "oodeval construct: error:" in capsys.readouterr().err
    assert not (inputs / "work").exists()


BAD_MANIFEST = [
    ("file,label\na.png,0\n", "lacks column\\(s\\) path"),
    ("path,label\na.png,x\n", "row 2 label 'x' is not a class index"),
    ("path,label\na.png,-1\n", "row 2 label '-1' is not a class index"),
    ("path,label\na.png,0\na.png,1\n", "row 3 repeats path 'a.png' of row 2"),
    ("path,label\n,0\n", "row 2 has an empty path"),
]


@pytest.mark.parametrize("text, message", BAD_MANIFEST, ids=[b[1][:30] for b in BAD_MANIFEST])
def test_malformed_manifest(tmp_path, text, message):
    (tmp_path / "m.csv").write_text(text)
    with pytest.raises(ValueError, match=message):
        read_manifest(tmp_path / "m.csv")


def test_manifest_labels_beyond_class_names(inputs):
    (inputs / "two.txt").write_text("ray\nbarb\n")
    with pytest.raises(ValueError, match="3 manifest label\\(s\\) \\(e.g. 2\\) exceed the 2 class names"):
        write_project(inputs / "work", inputs / "m.csv", inputs / "r.csv", inputs / "two.txt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_project(inputs / "work", inputs / "missing.csv", inputs / "r.csv")
