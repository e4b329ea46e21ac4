"""Per-image evidence: VLM top-k (D), confusions (E), MLLM answer (A), reverse search links (B)."""

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from PIL import Image

from oodeval.cli import main
from oodeval.construct.candidates import load_project, write_project
from oodeval.construct.evidence import (
    build_evidence,
    describe_image,
    load_embeddings,
    load_evidence,
    load_text_embeddings,
    parse_mllm_answer,
    reverse_search_links,
    vlm_topk,
)
from oodeval.construct.synthetic import make_synthetic_dataset
from oodeval.features.featureset import FeatureSet
from oodeval.llm import ChatClient


def test_vlm_topk_orders_by_cosine():
    text = np.eye(4)
    image = np.array([[0.1, 0.9, 0.4, 0.0], [0.0, 0.0, 0.0, 5.0], [3.0, 1.0, 2.0, 0.5]])
    idx, cos = vlm_topk(image, text, k=3)
    assert idx.tolist() == [[1, 2, 0], [3, 0, 1], [0, 2, 1]]  # the last two of row 1 tie at 0: lower index first
    norm = np.linalg.norm(image, axis=1)
    np.testing.assert_allclose(cos[0], np.array([0.9, 0.4, 0.1]) / norm[0])
    np.testing.assert_allclose(cos[1], [1.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="must be \\(N, E\\) and \\(C, E\\)"):
        vlm_topk(image, np.eye(3))


def test_reverse_search_links_encode_the_url():
    links = reverse_search_links("https://host/a b.jpg?x=1&y=2")
    assert [x["service"] for x in links] == ["Google Lens", "Bing", "Yandex", "TinEye"]
    assert links[3]["url"] == "https://tineye.com/search?url=https%3A%2F%2Fhost%2Fa%20b.jpg%3Fx%3D1%26y%3D2"
    own = reverse_search_links("https://h/x.png", {"Mine": "https://search.example/?img={url}"})
    assert own == [{"service": "Mine", "url": "https://search.example/?img=https%3A%2F%2Fh%2Fx.png"}]
    with pytest.raises(ValueError, match="must be an http\\(s\\) URL containing \\{url\\}"):
        reverse_search_links("https://h/x.png", {"Bad": "javascript:alert({url})"})


NAMES = ["electric ray", "barracouta", "French horn"]


@pytest.mark.parametrize(
    "reply, label, in_list, id_class",
    [
        ('{"in_list": true, "label": "French Horn", "description": "a brass horn"}', "French Horn", True, 2),
        ('Sure:\n```json\n{"in_list": false, "label": "Denison barb", "description": "a fish"}\n```', "Denison barb", False, None),
        ('{"in_list": true, "label": "Denison barb"}', "Denison barb", False, None),  # a claim the names contradict
        ("barracouta", "barracouta", True, 1),
    ],
)
def test_parse_mllm_answer(reply, label, in_list, id_class):
    got = parse_mllm_answer(reply, NAMES)
    assert (got["label"], got["in_list"], got["id_class"], got["raw"]) == (label, in_list, id_class, reply)


@pytest.fixture
def fake_llm():
    """An OpenAI-compatible endpoint that records requests and answers with an open-world label."""
    seen = []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_POST(self):
            seen.append((self.path, json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            body = json.dumps({"choices": [{"message": {"content": '{"in_list": false, "label": "Denison barb", "description": "fish"}'}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    server.shutdown()
    server.server_close()


def test_describe_image_sends_the_image_as_a_data_url_and_caches(tmp_path, fake_llm):
    url, seen = fake_llm
    image = tmp_path / "x.png"
    Image.new("RGB", (4, 3), (200, 10, 10)).save(image)
    client = ChatClient(url, "mllm-test", cache_dir=tmp_path / "cache", max_retries=0)
    got = describe_image(client, image, NAMES)
    assert (got["label"], got["in_list"], got["model"]) == ("Denison barb", False, "mllm-test")
    path, payload = seen[0]
    assert path == "/v1/chat/completions" and payload["model"] == "mllm-test"
    text, img = payload["messages"][0]["content"]
    assert text["type"] == "text"
    assert "electric ray; barracouta; French horn" in text["text"] and "not in the list" in text["text"]
    assert img["type"] == "image_url"
    assert img["image_url"]["url"] == "data:image/png;base64," + base64.b64encode(image.read_bytes()).decode()
    assert describe_image(client, image, NAMES) == got and len(seen) == 1  # second answer from the cache


@pytest.fixture
def project(tmp_path):
    d = make_synthetic_dataset(tmp_path / "data", n_classes=5, per_class=6, seed=3)
    return d, write_project(tmp_path / "work", d.manifest, d.reannotation, d.classes)


def test_build_evidence_pieces_and_resume(project, fake_llm, tmp_path):
    d, p = project
    img, txt = np.load(d.image_embeddings), np.load(d.text_embeddings)
    done = build_evidence(p, img, txt, top_k=3, confusions_k=2, image_url_template="https://h/{path}", progress=False)
    n = len(p.candidates)
    assert done["written"] == done["vlm_topk"] == done["reverse_search"] == n and done["mllm"] == 0
    row = p.manifest.index()[p.candidates[0].image]
    ev = load_evidence(p.evidence_dir, p.candidates[0].image)
    sims = img[row] @ txt.T / np.linalg.norm(img[row]) / np.linalg.norm(txt, axis=1)
    assert [e["label"] for e in ev["vlm_topk"]] == np.argsort(-sims)[:3].tolist()
    assert ev["original"] == {"label": p.candidates[0].original_label, "name": p.candidates[0].original_name}
    assert ev["image_url"] == f"https://h/{p.candidates[0].path}"
    # a rerun with nothing new writes nothing; adding the MLLM completes the files without losing (D)
    assert build_evidence(p, progress=False)["written"] == 0
    client = ChatClient(fake_llm[0], "m", cache_dir=tmp_path / "cache", max_retries=0)
    done = build_evidence(p, client=client, progress=False)
    assert done["written"] == done["mllm"] == done["vlm_topk"] == n
    assert load_evidence(p.evidence_dir, p.candidates[0].image)["mllm"]["label"] == "Denison barb"
    with pytest.raises(ValueError, match=f"have 7 rows but the ID manifest has {len(p.manifest)}"):
        build_evidence(p, img[:7], txt, progress=False)
    with pytest.raises(ValueError, match="needs both image embeddings and class text embeddings"):
        build_evidence(p, img, None, progress=False)


def test_evidence_cli_reads_featureset_folders(project, capsys):
    d, p = project
    fs = FeatureSet(features=np.load(d.image_embeddings))
    fs.save(d.folder / "fs")
    assert np.array_equal(load_embeddings(d.folder / "fs"), np.load(d.image_embeddings))
    assert main(["construct", "evidence", str(p.folder), "--image-embeddings", str(d.folder / "fs"),
                 "--text-embeddings", str(d.text_embeddings), "--top-k", "2"]) == 0
    out = capsys.readouterr().out
    n = len(p.candidates)
    counts = {line.split(")")[0].strip(): line.split()[-3:] for line in out.splitlines() if line.strip().startswith("(")}
    assert counts["(D"] == [str(n), "/", str(n)] and counts["(A"] == ["0", "/", str(n)] and counts["(B"] == ["0", "/", str(n)]
    ev = load_evidence(load_project(p.folder).evidence_dir, p.candidates[-1].image)
    assert len(ev["vlm_topk"]) == 2 and "reverse_search" not in ev and "mllm" not in ev
    assert main(["construct", "evidence", str(p.folder), "--image-url-template", "https://h/{path}",
                 "--search-template", "Mine=https://s.example/?u={url}"]) == 0
    ev = load_evidence(p.evidence_dir, p.candidates[-1].image)
    assert [x["service"] for x in ev["reverse_search"]] == ["Mine"] and len(ev["vlm_topk"]) == 2
    assert main(["construct", "evidence", str(p.folder), "--search-template", "no-equals-sign"]) == 2
    assert main(["construct", "evidence", str(p.folder), "--text-embeddings", str(d.folder / "nope.npy"),
                 "--image-embeddings", str(d.image_embeddings)]) == 2
    assert "do not exist" in capsys.readouterr().err


@pytest.mark.parametrize("option, template, shown", [
    ("--image-url-template", "https://h/{id}", "found {id}"),
    ("--image-url-template", "https://h/{0}/{path}", "found {0}"),
    ("--image-url-template", "https://h/{}", "found {}"),
    ("--image-url-template", "https://h/{path", "not a valid template"),
    ("--search-template", "Mine=https://s.example/?u={url}&k={0}", "found {0}"),
    ("--search-template", "Mine=https://s.example/?u={id}", "found {id}"),
])
def test_url_templates_with_other_fields_are_a_clear_error(project, capsys, option, template, shown):
    d, p = project
    before = sorted(p.evidence_dir.glob("*")) if p.evidence_dir.exists() else []
    assert main(["construct", "evidence", str(p.folder), option, template]) == 2
    err = capsys.readouterr().err
    assert err.startswith("oodeval construct: error:") and shown in err and "Traceback" not in err
    assert (sorted(p.evidence_dir.glob("*")) if p.evidence_dir.exists() else []) == before


def test_text_embeddings_keyed_by_label(tmp_path):
    from oodeval.zeroshot.text_cache import TextEmbeddingCache

    rng = np.random.default_rng(0)
    emb = rng.normal(size=(4, 8)).astype(np.float32)
    cache = TextEmbeddingCache(tmp_path / "cache", {"model": "tiny"})
    cache.add(["French horn", "barracouta"], emb[:2])
    cache.add(["electric ray", "wool"], emb[2:])
    got = load_text_embeddings(cache.folder, NAMES)
    np.testing.assert_array_equal(got, emb[[2, 1, 0]])
    np.savez(tmp_path / "t.npz", labels=np.array(["barracouta", "electric ray"]), embeddings=emb[:2])
    with pytest.raises(ValueError, match="lack 1 of the 3 class names, e.g. \\['French horn'\\]"):
        load_text_embeddings(tmp_path / "t.npz", NAMES)
    with pytest.raises(ValueError, match="give the class names"):
        load_text_embeddings(tmp_path / "t.npz", None)
    np.save(tmp_path / "t.npy", emb)
    np.testing.assert_array_equal(load_text_embeddings(tmp_path / "t.npy", None), emb)
