"""WordNet lexicon, NegMining, vocabularies, LLM siblings / EOE against a fake endpoint, sweeps, CLI."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from oodeval.zeroshot.vocabulary import Vocabulary, oracle, union

DEBIAN = Path("/usr/share/wordnet")


@pytest.mark.needs("wordnet")
def test_wordnet_lexicon_counts_from_debian_files():
    from oodeval.zeroshot.wordnet import _heads, head_lemmas, synonyms

    assert len(_heads(str(DEBIAN), "noun")) == 82115 and len(_heads(str(DEBIAN), "adj")) == 18156  # synsets
    lex = head_lemmas()
    assert len(lex) == 79403 == len(set(lex))  # the paper's lexicon size
    assert len(head_lemmas(pos=("noun",))) == 67186 and len(head_lemmas(pos=("adj",))) == 14006
    assert lex[0] == "entity" and all(w == w.lower() and "_" not in w for w in lex)
    assert synonyms("tench", "n01440764") == {"tench", "tinca tinca"}
    assert "projectile" in synonyms("missile")


def _line(offset, pos, lemmas):
    words = " ".join(f"{w} 0" for w in lemmas)
    return f"{offset:08d} 03 {pos} {len(lemmas):02x} {words} 000 | gloss\n"


@pytest.fixture
def wndb(tmp_path):
    """A tiny WNDB folder: licence header lines, underscores, markers, case duplicates."""
    folder = tmp_path / "wn"
    folder.mkdir()
    head = "  1 This software and database is being provided\n  2 licence\n"
    nouns = [["cat", "true_cat"], ["Dog", "domestic_dog"], ["dog", "frump"], ["sea_lion"], ["tabby", "cat"],
             ["car", "auto"], ["rock"], ["cloud"], ["violin", "fiddle"], ["tree"]]  # fmt: skip
    adjs = [["red(a)"], ["upright(p)", "erect"], ["rock"], ["blue"]]
    (folder / "data.noun").write_text(head + "".join(_line(100 + i, "n", s) for i, s in enumerate(nouns)))
    (folder / "data.adj").write_text(head + "".join(_line(200 + i, "a", s) for i, s in enumerate(adjs)))
    return folder


def test_head_lemma_rules_on_a_small_wndb(wndb):
    from oodeval.zeroshot.wordnet import head_lemmas, synonyms

    assert head_lemmas(wndb) == ["cat", "dog", "sea lion", "tabby", "car", "rock", "cloud", "violin", "tree", "red", "upright", "blue"]
    assert synonyms("cat", folder=wndb) == {"cat", "true cat", "tabby"}
    assert synonyms("violin", "n00000108", folder=wndb) == {"violin", "fiddle"}
    with pytest.raises(FileNotFoundError, match="wordnet-base"):
        head_lemmas(wndb / "missing")


def test_negmining_keeps_least_similar_by_percentile_with_label_ties():
    from oodeval.zeroshot.negmining import negmine, percentile_similarity, rank_candidates

    rng = np.random.default_rng(3)
    id_text = rng.normal(size=(20, 8))
    id_text /= np.linalg.norm(id_text, axis=1, keepdims=True)
    cand = rng.normal(size=(50, 8))
    cand /= np.linalg.norm(cand, axis=1, keepdims=True)
    labels = [f"w{i:02d}" for i in range(50)]
    d = percentile_similarity(cand, id_text, 95)
    for j in (0, 17, 49):  # 95th percentile, linear interpolation, by hand
        s = np.sort(cand[j] @ id_text.T)
        pos = 0.95 * 19
        assert d[j] == pytest.approx(s[int(pos)] + (pos - int(pos)) * (s[int(pos) + 1] - s[int(pos)]), rel=1e-12)
    mined = negmine(labels, cand, id_text, m=10)
    assert mined == [labels[i] for i in np.argsort(d, kind="stable")[:10]]
    assert negmine(labels, cand, id_text, m=30)[:10] == mined  # prefixes are consistent
    # exact ties are broken by the label, whatever the input order
    tied = np.vstack([cand[:1]] * 3)
    assert negmine(["b", "c", "a"], tied, id_text, m=3) == ["a", "b", "c"]
    assert rank_candidates(labels, cand, id_text)[1].tolist() == sorted(d.tolist())


def test_vocabulary_roundtrip_hash_union_oracle(tmp_path):
    v = Vocabulary(["a", "b"], "custom", {"why": "test"})
    v.save(tmp_path / "v.json")
    w = Vocabulary.load(tmp_path / "v.json")
    assert w == v and w.content_hash == v.content_hash
    assert Vocabulary(["b", "a"], "custom").content_hash != v.content_hash
    data = json.loads((tmp_path / "v.json").read_text())
    data["labels"].append("c")
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="content hash"):
        Vocabulary.load(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="2 repeated"):
        Vocabulary(["a", "a", "b", "b"], "custom")
    u = union([v, Vocabulary(["c", "a"], "custom")])
    assert u.labels == ["a", "b", "c"] and u.kind == "union"
    assert v.prefix(1).labels == ["a"]
    (tmp_path / "m.csv").write_text("path,ood_label\n1.jpg,tayra\n2.jpg,\n3.jpg,tayra\n4.jpg,Weasel\n5.jpg,okapi\n")
    o = oracle(tmp_path / "m.csv", exclude=["weasel"])
    assert o.labels == ["tayra", "okapi"] and o.provenance["rows"] == 5 and o.provenance["excluded"] == 1
    with pytest.raises(ValueError, match="no column"):
        oracle(tmp_path / "m.csv", column="label")


class FakeLLM(BaseHTTPRequestHandler):
    """OpenAI-compatible /chat/completions: siblings per class, EOE lists; 503 once to test retries."""

    calls: list = []
    fail_next = 0

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append({"body": body, "auth": self.headers.get("Authorization")})
        if type(self).fail_next:
            type(self).fail_next -= 1
            self.send_response(503)
            self.end_headers()
            return
        prompt = body["messages"][-1]["content"]
        if "nearest siblings" in prompt:
            name = prompt.split('"')[1]
            text = f"- {name}\n- {name} junior\n- Fiddle\n- {name} major\n- {name} junior"
        else:
            turn = sum(m["role"] == "user" for m in body["messages"])
            text = "\n".join(f"- Thing {turn}-{i}" for i in range(3)) + "\n- Violin"
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def endpoint():
    FakeLLM.calls = []
    FakeLLM.fail_next = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeLLM)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_llm_siblings_filter_cache_and_replay(endpoint, tmp_path, monkeypatch, wndb):
    from oodeval.llm import ChatClient, LLMError
    from oodeval.zeroshot.llm_vocab import generate_siblings, siblings_vocabulary
    from oodeval.zeroshot.wordnet import synonyms

    monkeypatch.setenv("FAKE_KEY", "sk-secret-123")
    FakeLLM.fail_next = 1
    client = ChatClient(endpoint, "fake-gpt", api_key_env="FAKE_KEY", cache_dir=tmp_path / "llm", backoff=0.01)
    ids = ["violin", "cat"]
    syn = [synonyms(n, folder=wndb) for n in ids]
    per = generate_siblings(client, ids, k=20, generation=0, synonyms=syn, progress=False)
    # the ID name itself, "Fiddle" (a WordNet synonym of violin) and repeats are gone
    assert per == {"violin": ["violin junior", "violin major"], "cat": ["cat junior", "cat major"]}
    assert len(FakeLLM.calls) == 3 and FakeLLM.calls[-1]["auth"] == "Bearer sk-secret-123"
    assert "20" in FakeLLM.calls[-1]["body"]["messages"][0]["content"]
    cached = " ".join(p.read_text() for p in (tmp_path / "llm").glob("*.json"))
    assert len(list((tmp_path / "llm").glob("*.json"))) == 2 and "sk-secret" not in cached
    offline = ChatClient(endpoint, "fake-gpt", cache_dir=tmp_path / "llm", offline=True)
    assert generate_siblings(offline, ids, generation=0, synonyms=syn, progress=False) == per
    # another endpoint serving a model of the same name is not answered from this endpoint's cache
    other = ChatClient("http://127.0.0.1:9/v1", "fake-gpt", cache_dir=tmp_path / "llm", offline=True)
    with pytest.raises(LLMError, match="offline and no cached response"):
        generate_siblings(other, ids, generation=0, synonyms=syn, progress=False)
    generate_siblings(client, ids, generation=1, synonyms=syn, progress=False)
    assert len(FakeLLM.calls) == 5  # another generation is another request
    vocab = siblings_vocabulary(per)
    assert vocab.labels == ["violin junior", "violin major", "cat junior", "cat major"]
    assert siblings_vocabulary(per, k=1).labels == ["violin junior", "cat junior"]
    assert len(siblings_vocabulary(per, k=1, seed=4)) == 2


def test_eoe_prompts_turns_and_filter(endpoint, tmp_path):
    from oodeval.llm import ChatClient
    from oodeval.zeroshot.llm_vocab import generate_eoe

    client = ChatClient(endpoint, "fake-gpt", cache_dir=tmp_path / "llm")
    v = generate_eoe(client, ["violin", "cat"], style="far", n_classes=6, batch=3)
    assert len(FakeLLM.calls) == 2  # 6 classes at 3 per turn
    first = FakeLLM.calls[0]["body"]["messages"]
    assert "violin; cat" in first[0]["content"] and len(FakeLLM.calls[1]["body"]["messages"]) == 3
    assert v.kind == "eoe" and "violin" not in v.labels
    assert v.labels == [f"thing {t}-{i}" for t in (1, 2) for i in range(3)]
    near = generate_eoe(client, ["violin", "cat"], style="near", n_classes=4)
    assert len(FakeLLM.calls) == 4 and near.provenance["style"] == "near"
    with pytest.raises(ValueError, match="unknown EOE prompt style"):
        generate_eoe(client, ["cat"], style="mid")


def test_sweeps_match_direct_evaluation():
    from oodeval.metrics import all_metrics
    from oodeval.zeroshot import score_zeroshot
    from oodeval.zeroshot.sweeps import sweep_prefix, sweep_siblings

    rng = np.random.default_rng(0)

    def unit(*shape):
        x = rng.normal(size=shape)
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    id_img, ood_img, id_text, neg = unit(60, 8), unit(40, 8), unit(5, 8), unit(30, 8)
    curve = sweep_prefix(id_img, ood_img, id_text, neg, [0, 10, 30], n_groups=2)
    assert curve["x"] == [0, 10, 30] and curve["fpr95"][0] == 1.0
    direct = all_metrics(score_zeroshot("neglabel", id_img, id_text, neg[:10], n_groups=2),
                      score_zeroshot("neglabel", ood_img, id_text, neg[:10], n_groups=2))
    assert curve["fpr95"][1] == direct["fpr95"] and curve["auroc"][1] == direct["auroc"]
    table = {f"s{i}": neg[i] for i in range(30)}
    per = {"a": [f"s{i}" for i in range(10)], "b": [f"s{i}" for i in range(10, 30)]}
    sib = sweep_siblings(id_img, ood_img, id_text, per, lambda labels: np.stack([table[x] for x in labels]), [1, 5, 100], seed=2)
    assert sib["vocab_size"] == [2, 10, 30] and sib["param"] == "k"
    assert sib["fpr95"][2] == sweep_prefix(id_img, ood_img, id_text, neg, [30])["fpr95"][0]  # all 30, any order


def test_cli_vocab_wordnet_union_oracle(tmp_path, tiny_clip, wndb, capsys):
    import open_clip

    from oodeval.cli import main

    cfg = tmp_path / f"{tiny_clip}.json"
    cfg.write_text(json.dumps(open_clip.get_model_config(tiny_clip)))
    (tmp_path / "ids.txt").write_text("cat\nviolin\n")
    args = ["vocab", "wordnet", "--model", str(cfg), "--pretrained", "none", "--id-names", str(tmp_path / "ids.txt"),
            "--wordnet", str(wndb), "--cache", str(tmp_path / "cache"), "--M", "4", "--out", str(tmp_path / "wn.json")]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "WordNet lexicon: 12 head lemmas" in out and "wrote 4 NegMined labels" in out and "prompts/s" in out
    wn = Vocabulary.load(tmp_path / "wn.json")
    assert len(wn) == 4 and not {"cat", "violin"} & set(wn.labels)
    assert wn.provenance["lexicon_size"] == 12 and wn.provenance["excluded_id_names"] == 2
    assert main(args[:-4] + ["--M", "all", "--out", str(tmp_path / "all.json")]) == 0
    assert "all 10 labels from cache" in capsys.readouterr().out  # the 10 candidates
    assert Vocabulary.load(tmp_path / "all.json").labels[:4] == wn.labels
    (tmp_path / "m.csv").write_text("path,ood_label\n1.jpg,okapi\n")
    assert main(["vocab", "oracle", str(tmp_path / "m.csv"), "--out", str(tmp_path / "o.json")]) == 0
    assert main(["vocab", "union", str(tmp_path / "wn.json"), str(tmp_path / "o.json"), "--out", str(tmp_path / "u.json")]) == 0
    assert Vocabulary.load(tmp_path / "u.json").labels == wn.labels + ["okapi"]
    # FPR@95 vs the WordNet prefix size, on random unit image embeddings of the tiny model's width
    from oodeval.features import FeatureSet

    rng = np.random.default_rng(0)
    for name, n in (("id", 30), ("ood", 20)):
        x = rng.normal(size=(n, 32)).astype(np.float32)
        FeatureSet(features=x / np.linalg.norm(x, axis=1, keepdims=True)).save(tmp_path / name)
    sweep = args[:8] + ["--cache", str(tmp_path / "cache")]
    sweep[1] = "sweep"
    sweep.insert(2, "wordnet")
    assert main(sweep + ["--vocab", str(tmp_path / "all.json"), "--id-features", str(tmp_path / "id"),
                         "--ood-features", str(tmp_path / "ood"), "--values", "0", "3", "10", "--out", str(tmp_path / "c.json")]) == 0
    curve = json.loads((tmp_path / "c.json").read_text())
    assert curve["x"] == [0, 3, 10] and curve["fpr95"][0] == 1.0 and len(curve["auroc"]) == 3
    # every scorer on the same FeatureSets, scores written atomically
    assert main(["zeroshot"] + sweep[3:] + ["--id-features", str(tmp_path / "id"), "--ood-features", str(tmp_path / "ood"),
                                           "--scorers", "all", "--vocab", str(tmp_path / "wn.json"), "--out", str(tmp_path / "zs")]) == 0
    out = capsys.readouterr().out
    assert "gl_mcm     omitted: no patch_features" in out and "neglabel" in out and "ID names: 2 from" in out
    metrics = json.loads((tmp_path / "zs" / "metrics.json").read_text())
    assert sorted(metrics) == sorted(["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "gl_mcm", "neglabel", "eoe", "csp", "adaneg"])
    assert metrics["gl_mcm"]["omitted"].startswith("omitted: no patch_features") and not (tmp_path / "zs" / "gl_mcm.id.npy").exists()
    assert np.load(tmp_path / "zs" / "eoe.ood.npy").shape == (20,)
    assert metrics["adaneg"]["test_time"] and not metrics["neglabel"]["test_time"]
    # a test-time scorer over five stream orders: the spread printed and recorded with each order's settings
    assert main(["zeroshot"] + sweep[3:] + ["--id-features", str(tmp_path / "id"), "--ood-features", str(tmp_path / "ood"),
                                           "--scorers", "adaneg,neglabel", "--vocab", str(tmp_path / "wn.json"), "--orders", "5",
                                           "--stream-batch", "4", "--out", str(tmp_path / "tt")]) == 0
    out = capsys.readouterr().out
    assert "test-time: mean of 5 orders (batch 4, both sets whole" in out and "FPR@95 min-max" in out and "95% CI of the mean" in out
    assert "static (order-free)" in out.split("neglabel", 1)[1].splitlines()[0]
    rec = json.loads((tmp_path / "tt" / "metrics.json").read_text())["adaneg"]
    assert [(r["order"], r["batch_size"], r["id_share"], r["n_id"], r["n_ood"]) for r in rec["orders"]] == [(k, 4, None, 30, 20) for k in range(5)]
    aurocs = [r["auroc"] for r in rec["orders"]]
    assert rec["spread"]["auroc"]["min"] == min(aurocs) and rec["spread"]["auroc"]["max"] == max(aurocs)
    assert np.load(tmp_path / "tt" / "adaneg.order4.ood.npy").shape == (20,)


def test_cli_vocab_llm_with_fake_endpoint_and_k_sweep(endpoint, tmp_path, capsys, tiny_clip):
    import open_clip

    from oodeval.cli import main
    from oodeval.features import FeatureSet

    (tmp_path / "ids.txt").write_text("violin\ncat\n")
    base = ["vocab", "llm", "--id-names", str(tmp_path / "ids.txt"), "--base-url", endpoint, "--llm-model", "fake",
            "--llm-cache", str(tmp_path / "llm"), "--out", str(tmp_path / "gpt.json")]  # fmt: skip
    assert main(base + ["--generations", "0", "1"]) == 0
    assert "wrote 4 sibling labels from 2 classes" in capsys.readouterr().out
    vocab = Vocabulary.load(tmp_path / "gpt.json")
    assert vocab.kind == "llm-siblings" and vocab.provenance["per_class"]["cat"] == ["cat junior", "cat major"]
    assert len(FakeLLM.calls) == 4
    assert main(base + ["--generations", "0", "1", "--offline"]) == 0  # replays from the cache
    assert len(FakeLLM.calls) == 4
    # FPR@95 vs siblings kept per class
    cfg = tmp_path / f"{tiny_clip}.json"
    cfg.write_text(json.dumps(open_clip.get_model_config(tiny_clip)))
    rng = np.random.default_rng(1)
    for name, n in (("id", 30), ("ood", 20)):
        x = rng.normal(size=(n, 32)).astype(np.float32)
        FeatureSet(features=x / np.linalg.norm(x, axis=1, keepdims=True)).save(tmp_path / name)
    assert main(["vocab", "sweep", "siblings", "--model", str(cfg), "--pretrained", "none", "--id-names", str(tmp_path / "ids.txt"),
                 "--cache", str(tmp_path / "cache"), "--vocab", str(tmp_path / "gpt.json"), "--id-features", str(tmp_path / "id"),
                 "--ood-features", str(tmp_path / "ood"), "--values", "0", "1", "2", "--out", str(tmp_path / "k.json")]) == 0  # fmt: skip
    curve = json.loads((tmp_path / "k.json").read_text())
    assert curve["param"] == "k" and curve["vocab_size"] == [0, 2, 4] and curve["fpr95"][0] == 1.0


def test_cli_vocab_refuses_out_of_range_sizes_and_reads_text_vocabularies(tmp_path, capsys):
    from oodeval.cli import main

    wn = ["vocab", "wordnet", "--model", "ViT-B-32", "--pretrained", "none", "--out", str(tmp_path / "v.json")]
    llm = ["vocab", "llm", "--llm-model", "m", "--llm-cache", str(tmp_path / "c"), "--offline", "--out", str(tmp_path / "v.json")]
    eoe = ["vocab", "eoe", "--llm-model", "m", "--llm-cache", str(tmp_path / "c"), "--offline", "--out", str(tmp_path / "v.json")]
    for argv, says in (
        (wn + ["--M", "-5"], "--M must be a whole number >= 1 or 'all', got '-5'"),
        (wn + ["--M", "0"], "--M must be a whole number >= 1"),
        (wn + ["--M", "lots"], "got 'lots'"),
        # number options are ranged when the command line is parsed (argparse's exit 2)
        (wn + ["--percentile", "150"], "argument --percentile: must be <= 100, got 150"),
        (wn + ["--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
        (llm + ["--k", "0"], "argument --k: must be an integer >= 1, got 0"),
        (llm + ["--generations", "0", "-1"], "argument --generations: must be an integer >= 0, got -1"),
        (eoe + ["--n-classes", "-3"], "argument --n-classes: must be an integer >= 1, got -3"),
    ):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        assert code == 2, argv
        assert says in capsys.readouterr().err, says
    assert not (tmp_path / "v.json").exists() and not (tmp_path / "c").exists()
    # a text vocabulary (one label per line) is read, repeats kept once, and joins a union
    (tmp_path / "neg.txt").write_text("okapi\n\nzebu\nokapi\n  gnu \n")
    Vocabulary(["zebu", "yak"], "custom").save(tmp_path / "b.json")
    assert main(["vocab", "union", str(tmp_path / "neg.txt"), str(tmp_path / "b.json"), "--out", str(tmp_path / "u.json")]) == 0
    assert Vocabulary.load(tmp_path / "u.json").labels == ["okapi", "zebu", "gnu", "yak"]
    text = Vocabulary.load(tmp_path / "neg.txt")
    assert text.kind == "custom" and text.provenance["repeated_labels_dropped"] == 1
    (tmp_path / "bad.json").write_text('["okapi"]')
    assert main(["vocab", "union", str(tmp_path / "bad.json"), "--out", str(tmp_path / "u2.json")]) == 2
    assert "bad.json is not a Vocabulary JSON" in capsys.readouterr().err
