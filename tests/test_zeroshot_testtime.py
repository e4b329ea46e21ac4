"""AdaNeg and CSP against re-derivations of the authors' code, and the test-time protocol (issue 43).

The AdaNeg reference below restates YBZh/OpenOOD-VLM openood/postprocessors/ttaprompt_postprocessor.py
(``TTAPromptPostprocessor_noadagap.postprocess``, commit 694592a7): a (K, 1 + L, E) memory of zeros with
the text embedding in row 0, a write index starting at 1, the entropy-sorted replacement, and the
proxies as the (weighted) sum of the memory rows renormalised, computed directly per image.
"""

import random

import numpy as np
import pytest
from scipy import stats as sps
from scipy.special import logsumexp

from oodeval.errors import InputError
from oodeval.zeroshot import create_scorer
from oodeval.zeroshot.adaneg import MemoryBank
from oodeval.zeroshot.csp import SUPERCLASSES, conjugated_labels, lexfile_heads, select_pool
from oodeval.zeroshot.testtime import Protocol, over_orders, score_labelled, score_pair, spread, stream_order


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def grouped(logits, c, groups, seed):
    """NegLabel's grouping as in the release: drop M mod G, permute, split, mean of the ID shares."""
    neg = logits[:, c:]
    m = neg.shape[1]
    keep = m - m % groups
    neg = neg[:, :keep][:, np.random.default_rng(seed).permutation(keep)].reshape(len(logits), groups, -1)
    shares = [np.exp(logsumexp(logits[:, :c], 1) - logsumexp(np.c_[logits[:, :c], neg[:, g]], 1)) for g in range(groups)]
    return np.mean(shares, axis=0)


def adaneg_reference(x, id_text, neg, batch, tau=0.01, groups=5, seed=0, memleng=10, thres=0.5, gap=0.5, beta=5.5,
                     lam=0.1, samada=True):
    text = np.r_[id_text, neg]
    c, (k, e) = len(id_text), text.shape
    feat_memory = np.concatenate([text[:, None, :], np.zeros((k, memleng, e))], axis=1)
    indice = np.ones(k, dtype=int)
    entropy_memory = np.zeros((k, memleng + 1))
    out = []
    for start in range(0, len(x), batch):
        xb = x[start : start + batch]
        out_v = xb @ text.T / tau
        conf_v = grouped(out_v, c, groups, seed)

        def store(rows, cols, offset):
            for i in np.flatnonzero(rows):
                cate = int(np.argmax(out_v[i, cols])) + offset
                p = np.exp(out_v[i, cols] - logsumexp(out_v[i, cols]))
                h = -(p * np.log(p + 1e-8)).sum()
                # below ~1e-8 the release's offset makes h negative and its replacement could pick the
                # text row (entropy 0); oodeval never replaces it, so the data keep h clearly positive
                assert h > 1e-6
                if indice[cate] == memleng:
                    if (h < entropy_memory[cate]).sum() == 0:
                        continue
                    j = np.argsort(entropy_memory[cate], kind="stable")[-1]
                    feat_memory[cate, j], entropy_memory[cate, j] = xb[i], h
                else:
                    feat_memory[cate, indice[cate]], entropy_memory[cate, indice[cate]] = xb[i], h
                    indice[cate] += 1

        store(conf_v > thres + gap * (1 - thres), slice(0, c), 0)
        store(conf_v < thres - gap * thres, slice(c, k), c)
        logits = np.empty_like(out_v)
        for b, xi in enumerate(xb):
            if samada:
                w = np.exp(-beta * (1 - feat_memory @ xi))  # (K, 1 + L)
                proxies = (w[:, :, None] * feat_memory).sum(1)
            else:
                proxies = feat_memory.mean(1)
            logits[b] = unit(proxies) @ xi / tau
        out.append(grouped(logits, c, groups, seed) + lam * conf_v)
    return np.concatenate(out), indice


@pytest.fixture
def stream():
    """Images near ID names or near negatives (confident either way) and some in between."""
    rng = np.random.default_rng(3)
    id_text, neg = unit(rng.normal(size=(4, 12))), unit(rng.normal(size=(11, 12)))
    near_id = unit(id_text[rng.integers(0, 4, 60)] * 3 + rng.normal(size=(60, 12)))
    near_neg = unit(neg[rng.integers(0, 11, 40)] * 3 + rng.normal(size=(40, 12)))
    x = np.r_[near_id, near_neg, unit(rng.normal(size=(20, 12)))]
    return x[rng.permutation(len(x))], id_text, neg


@pytest.mark.parametrize("samada", [True, False])
@pytest.mark.parametrize("exp_span", [600.0, 0.0])  # 0: every tau takes the per-group log-sum-exp path
def test_adaneg_matches_the_release_rederived(stream, samada, exp_span, monkeypatch):
    from oodeval.zeroshot import adaneg

    monkeypatch.setattr(adaneg, "_EXP_SPAN", exp_span)
    x, id_text, neg = stream
    ref, indice = adaneg_reference(x, id_text, neg, batch=8, tau=0.05, memleng=4, groups=3, samada=samada)
    assert (indice == 4).sum() >= 3  # several slots filled up, so replacement was exercised
    got = create_scorer("adaneg", tau=0.05, memory_size=4, n_groups=3, batch_size=8, sample_adaptive=samada).score(x, id_text, neg)
    # same float64 maths in another order (Gram-matrix norms vs explicit proxies): ~1e-13 relative on scores <= 1.1
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    static = grouped(x @ np.r_[id_text, neg].T / 0.05, 4, 3, 0)
    assert np.abs(got - 1.1 * static).max() > 1e-3  # the memory changed the scores


@pytest.mark.parametrize("samada", [True, False])
def test_adaneg_batched_memory_matches_the_release_rederived(stream, samada, monkeypatch):
    """The fast path's arrangement: a batch of 40 gives a label several images per batch (stored in
    rounds, filling and replacing within the batch), and one slot per work chunk of the proxies."""
    from oodeval.zeroshot import adaneg

    monkeypatch.setattr(adaneg, "_CACHE_ELEMENTS", 1)
    x, id_text, neg = stream
    ref, indice = adaneg_reference(x, id_text, neg, batch=40, tau=0.05, memleng=3, groups=3, samada=samada)
    assert (indice == 3).sum() >= 3
    got = create_scorer("adaneg", tau=0.05, memory_size=3, n_groups=3, batch_size=40, sample_adaptive=samada).score(x, id_text, neg)
    # float64 throughout, sums of <= 3 terms of cosines <= 1 in another order: ~1e-15 on cosines, times 1/tau = 20
    # in the exponent, on scores <= 1.1; 1e-9 as in the test above
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-9)
    rounds = adaneg._occurrence(np.array([4, 1, 4, 4, 1, 0]))
    assert rounds.tolist() == [0, 0, 1, 2, 1, 0]


def test_adaneg_blocks_of_a_batch_match_the_release_rederived(stream, monkeypatch):
    """A batch of 40 worked in blocks of 16 images (the last one short), on one BLAS thread and on two
    threads: the release's per-image re-derivation's scores, the same bits whatever the thread count."""
    from threadpoolctl import threadpool_limits

    from oodeval.zeroshot import adaneg

    monkeypatch.setattr(adaneg, "_BLOCK_ROWS", 16)
    x, id_text, neg = stream
    ref, indice = adaneg_reference(x, id_text, neg, batch=40, tau=0.05, memleng=3, groups=3)
    assert (indice == 3).sum() >= 3
    got = {}
    for threads in (1, 2):
        with threadpool_limits(threads, user_api="blas"):
            det = create_scorer("adaneg", tau=0.05, memory_size=3, n_groups=3, batch_size=40)
            got[threads] = det.score(x, id_text, neg)
    # as in the tests above: float64 throughout, in another order than the release's
    np.testing.assert_allclose(got[1], ref, rtol=0, atol=1e-9)
    np.testing.assert_array_equal(got[2], got[1])  # same code per block, BLAS on one thread in both


def test_adaneg_defaults_are_the_imagenet_script():
    assert create_scorer("adaneg").get_params() == {
        "tau": 0.01, "n_groups": 5, "seed": 0, "memory_size": 10, "thres": 0.5, "gap": 0.5, "beta": 5.5, "lam": 0.1,
        "sample_adaptive": True, "batch_size": 256, "id_share": None}  # fmt: skip


def test_memory_bank_is_bounded_and_keeps_the_lowest_entropies():
    rng = np.random.default_rng(0)
    text = unit(rng.normal(size=(3, 6)))
    bank = MemoryBank(text, capacity=3)
    hs = [0.9, 0.5, 0.7, 0.2, 0.95, 0.1]
    xs = unit(rng.normal(size=(6, 6)))
    for x, h in zip(xs, hs):
        bank.add(1, x, h)
    assert bank.count.tolist() == [0, 3, 0] and bank.used == 3  # pool never grows past K * capacity
    assert sorted(bank.entropy[1]) == [0.1, 0.2, 0.5]
    stored = bank.images(1)
    np.testing.assert_array_equal(stored[np.argsort(bank.entropy[1])], xs[[5, 3, 1]])  # the images of the 3 lowest
    np.testing.assert_allclose(bank.gram[1], stored @ stored.T, atol=1e-12)  # Gram kept in step with replacements
    np.testing.assert_allclose(bank.gram_text[1], stored @ text[1], atol=1e-12)


def test_scores_do_not_depend_on_the_labels(stream):
    """Shuffling which rows are ID after scoring: the same stream, the same per-image scores."""
    x, id_text, neg = stream
    det = create_scorer("adaneg", batch_size=16)
    is_id = np.arange(len(x)) < 50
    a = score_labelled(det, x, is_id, id_text, neg, Protocol(order=2))
    shuffled = np.random.default_rng(9).permutation(is_id)
    b = score_labelled(det, x, shuffled, id_text, neg, Protocol(order=2))
    np.testing.assert_array_equal(a, b)
    # and the scorer only ever saw embeddings: a label-free stream scored directly gives the same numbers
    order = stream_order(is_id, Protocol(order=2))
    np.testing.assert_array_equal(a[order], det.score(x[order], id_text, neg))


def test_state_is_rebuilt_per_evaluation(stream):
    x, id_text, neg = stream
    id_set, ood1, ood2 = x[:50], x[50:90], x[90:]
    det = create_scorer("adaneg", batch_size=8)
    score_pair(det, id_set, ood1, id_text, neg)
    after = score_pair(det, id_set, ood2, id_text, neg)
    fresh = score_pair(create_scorer("adaneg", batch_size=8), id_set, ood2, id_text, neg)
    np.testing.assert_array_equal(after[0], fresh[0])
    np.testing.assert_array_equal(after[1], fresh[1])
    # carrying the memory over would change them: OOD set 1 streamed first, then the same stream
    order = stream_order(np.r_[np.ones(50, bool), np.zeros(30, bool)], Protocol())
    pool = np.r_[id_set, ood2]
    carried = det.score(np.r_[ood1, pool[order]], id_text, neg)[len(ood1) :]
    assert not np.allclose(carried, det.score(pool[order], id_text, neg))


def test_order_mix_and_spread(stream):
    x, id_text, neg = stream
    det = create_scorer("adaneg", batch_size=8)
    runs = over_orders(det, x[:60], x[60:], id_text, neg, orders=5)
    assert [r["order"] for r in runs] == [0, 1, 2, 3, 4] and all(r["batch_size"] == 8 for r in runs)
    aurocs = [r["auroc"] for r in runs]
    assert len(set(aurocs)) > 1  # the order matters for a test-time scorer
    s = spread(aurocs)
    half = sps.t.ppf(0.975, 4) * np.std(aurocs, ddof=1) / np.sqrt(5)
    assert s["min"] == min(aurocs) and s["max"] == max(aurocs) and s["n"] == 5
    np.testing.assert_allclose([s["ci_low"], s["ci_high"]], [np.mean(aurocs) - half, np.mean(aurocs) + half], rtol=1e-12)
    static = [r["auroc"] for r in over_orders(create_scorer("neglabel"), x[:60], x[60:], id_text, neg, orders=3)]
    assert len(set(static)) == 1  # a static scorer gives one number whatever the order
    s_id, s_ood, info = score_pair(det, x[:60], x[60:], id_text, neg, Protocol(order=1, id_share=0.8))
    assert (info["n_id"], info["n_ood"]) == (60, 15) and len(s_id) == 60 and len(s_ood) == 15
    s_id, s_ood, info = score_pair(det, x[:60], x[60:], id_text, neg, Protocol(order=1, id_share=0.25))
    assert (info["n_id"], info["n_ood"]) == (20, 60)
    with pytest.raises(InputError, match="id_share"):
        Protocol(id_share=1.0)


def test_csp_conjugated_labels_follow_the_release_draws():
    adjectives = ["lively", "unheard", "hand-held", "oxidized"]
    random.seed(0)  # the release: random.seed(seed), then one random.choice(csp_templates) per adjective
    expect = [random.choice([f"{{}} {s}" for s in SUPERCLASSES]).format(a) for a in adjectives]
    assert conjugated_labels(adjectives, seed=0) == expect


def test_csp_selection_matches_the_release_rule():
    rng = np.random.default_rng(1)
    id_text = unit(rng.normal(size=(30, 8)))
    nouns, conj = [f"n{i}" for i in range(40)], [f"c{i}" for i in range(20)]
    n_emb, c_emb = unit(rng.normal(size=(40, 8))), unit(rng.normal(size=(20, 8)))
    n_emb[3] = id_text[0]  # an ID name among the nouns: max cos > 0.95 sends it last
    labels, n_nouns = select_pool(nouns, n_emb, conj, c_emb, id_text, fraction=0.25)

    def release(emb, names):
        sims = emb @ id_text.T
        sim = np.quantile(sims, 0.95, axis=1)  # torch.quantile, linear interpolation
        sim[sims.max(1) > 0.95] = 1.0
        return [names[i] for i in np.argsort(sim)[: int(len(names) * 0.25)]]

    assert n_nouns == 10 and labels == release(n_emb, nouns) + release(c_emb, conj)
    assert "n3" not in labels


def test_csp_lexicon_reads_lexicographer_files(tmp_path):
    line = "{off} {lex:02d} {pos} 01 {word} 0 000 | gloss\n"
    (tmp_path / "data.adj").write_text("  licence\n" + "".join(line.format(off=f"{i:08d}", lex=lex, pos="a", word=w)
                                       for i, (lex, w) in enumerate([(0, "Lively"), (1, "solar"), (44, "hand-held"), (0, "lively")])))
    assert lexfile_heads(["adj.all", "adj.ppl"], tmp_path) == ["lively", "hand-held"]
    with pytest.raises(InputError, match="unknown WordNet lexicographer"):
        lexfile_heads(["adj.none"], tmp_path)


def test_csp_score_is_neglabel_grouping_with_100_groups(stream):
    x, id_text, neg = stream
    got = create_scorer("csp").score(x, id_text, neg)
    np.testing.assert_allclose(got, grouped(x @ np.r_[id_text, neg].T / 0.01, 4, 11, 0), rtol=1e-12)
    assert create_scorer("csp").get_params() == {"tau": 0.01, "n_groups": 100, "seed": 0}


def test_cli_vocab_csp_builds_both_parts(tmp_path, tiny_clip, capsys):
    import json

    import open_clip

    from oodeval.cli import main
    from oodeval.zeroshot import Vocabulary

    wn = tmp_path / "wn"
    wn.mkdir()
    row = "{i:08d} {lex:02d} {pos} 01 {w} 0 000 | gloss\n"
    nouns = [(3, "rock"), (6, "violin"), (18, "teacher"), (6, "car"), (17, "cloud"), (3, "tree"), (21, "liter"), (6, "kite")]
    adjs = [(0, "red"), (1, "solar"), (44, "hand-held"), (0, "blue"), (0, "lively"), (0, "quiet")]
    (wn / "data.noun").write_text("  licence\n" + "".join(row.format(i=i, lex=lex, pos="n", w=w) for i, (lex, w) in enumerate(nouns)))
    (wn / "data.adj").write_text("  licence\n" + "".join(row.format(i=i, lex=lex, pos="a", w=w) for i, (lex, w) in enumerate(adjs)))
    cfg = tmp_path / f"{tiny_clip}.json"
    cfg.write_text(json.dumps(open_clip.get_model_config(tiny_clip)))
    (tmp_path / "ids.txt").write_text("cat\nviolin\n")
    assert main(["vocab", "csp", "--model", str(cfg), "--pretrained", "none", "--id-names", str(tmp_path / "ids.txt"),
                 "--wordnet", str(wn), "--cache", str(tmp_path / "cache"), "--fraction", "0.5", "--out", str(tmp_path / "csp.json")]) == 0
    assert "wrote the CSP pool: 3 nouns + 2 conjugated labels" in capsys.readouterr().out  # int(6 * 0.5), int(5 * 0.5)
    vocab = Vocabulary.load(tmp_path / "csp.json")
    assert vocab.kind == "csp" and len(vocab) == 5
    nouns_kept, conj_kept = vocab.labels[:3], vocab.labels[3:]
    assert set(nouns_kept) <= {"rock", "violin", "car", "cloud", "tree", "kite"}  # noun.person / noun.quantity left out
    assert all(label.split()[-1] in SUPERCLASSES and label.split()[0] in {"red", "hand-held", "blue", "lively", "quiet"}
               for label in conj_kept)  # adj.pert ("solar") left out


def test_grid_runs_adaneg_per_order_and_records_the_stream(tmp_path):
    import json

    from oodeval.experiment import load_config, run_experiment
    from oodeval.features import FeatureSet
    from oodeval.metrics import all_metrics
    from oodeval.results import load_results

    rng = np.random.default_rng(1)
    basis = np.linalg.qr(rng.normal(size=(8, 8)))[0]
    id_text, neg_text = basis[:3], basis[3:7]
    id_img = unit(id_text[rng.integers(0, 3, 60)] + 0.6 * rng.normal(size=(60, 8)))
    ood_img = unit(neg_text[rng.integers(0, 4, 40)] + 0.6 * rng.normal(size=(40, 8)))
    feats = {"id_test": str(FeatureSet(features=id_img.astype(np.float32)).save(tmp_path / "id")),
             "novel": str(FeatureSet(features=ood_img.astype(np.float32)).save(tmp_path / "ood"))}
    np.save(tmp_path / "id_text.npy", id_text)
    np.save(tmp_path / "wordnet.npy", neg_text)
    (tmp_path / "wordnet.txt").write_text("a\nb\nc\nd\n")
    feats.update({"text:id": str(tmp_path / "id_text.npy"), "text:wordnet": str(tmp_path / "wordnet.npy")})
    cfg = {"seeds": [0, 1, 2], "bootstrap_draws": 20, "results": str(tmp_path / "results.parquet"),
           "datasets": {"id_test": "val", "ood": ["novel"]},
           "models": [{"name": "open_clip:ViT-B-32", "label": "clip", "kind": "zero-shot", "features": feats}],
           "zeroshot": [{"name": "adaneg", "vocabulary": "wordnet.txt", "hyperparameters": {"batch_size": 8}},
                        {"name": "csp", "vocabulary": "wordnet.txt"}],
           "sweeps": [{"name": "wn_size", "vocabulary": "wordnet.txt", "sizes": [2, 4], "scorer": "adaneg",
                       "hyperparameters": {"batch_size": 8}}]}  # fmt: skip
    summary = run_experiment(load_config(cfg, base_dir=tmp_path), progress=False)
    df = load_results(summary.results)
    assert (df["status"] == "ok").all(), df["error"].dropna().tolist()
    ada = df[df["detector"] == "adaneg"].sort_values("seed")
    assert df[df["detector"] == "csp"]["stream"].isna().all()
    streams = [json.loads(s) for s in ada["stream"]]
    assert [(s["order"], s["batch_size"], s["id_share"]) for s in streams] == [(0, 8, None), (1, 8, None), (2, 8, None)]
    x_id, x_ood = (unit(np.asarray(FeatureSet.load(feats[k]).features, np.float64)) for k in ("id_test", "novel"))
    import pandas as pd

    from oodeval.report import build_views, sweeps_path

    sw = pd.read_parquet(sweeps_path(summary.results))
    assert list(sw["size"]) == [2, 4]  # the whole vocabulary, stream order 0 = the grid's seed-0 cell
    assert sw["fpr95"].iloc[-1] == pytest.approx(ada[ada["seed"] == 0]["fpr95"].iloc[0], abs=1e-12)

    tab2 = next(v for v in build_views(df, summary.results)[0] if v.key == "tab2")
    assert "Test-time scorers (adaneg) saw the test set adaptively" in tab2.caption
    for seed, auroc in zip(ada["seed"], ada["auroc"]):
        s_id, s_ood, _ = score_pair(create_scorer("adaneg", batch_size=8), x_id, x_ood, id_text, neg_text, Protocol(order=int(seed)))
        assert auroc == pytest.approx(all_metrics(s_id, s_ood)["auroc"], abs=1e-12)
