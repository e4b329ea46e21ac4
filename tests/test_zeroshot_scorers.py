"""Zero-shot scorers against plain re-derivations (naive float64 exp is safe for |logit| <= 100)."""

import numpy as np
import pytest
from sklearn.base import clone

from oodeval.features import FeatureSet
from oodeval.zeroshot import create_scorer, score_zeroshot, scorer_names


def unit(rng, *shape):
    x = rng.normal(size=shape)
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


@pytest.fixture
def emb():
    rng = np.random.default_rng(0)
    return {"img": unit(rng, 40, 16), "id": unit(rng, 7, 16), "neg": unit(rng, 23, 16), "patch": unit(rng, 40, 5, 16)}


def naive_p(img, text, tau=0.01):
    a = np.exp(img @ text.T / tau)
    return a / a.sum(axis=-1, keepdims=True)


def test_names_and_registry():
    assert scorer_names() == ["mcm", "maxlogit", "energy", "gen", "entropy", "margin", "gl_mcm", "neglabel", "eoe", "csp", "adaneg"]
    det = create_scorer("neglabel", n_groups=3)
    assert det.get_params() == {"tau": 0.01, "n_groups": 3, "seed": 0}
    assert clone(det).get_params() == det.get_params()
    with pytest.raises(KeyError, match="unknown zero-shot scorer"):
        create_scorer("nope")


def test_logit_space_scorers_match_plain_formulas(emb):
    img, t = emb["img"], emb["id"]
    logits = img @ t.T / 0.01
    p = naive_p(img, t)
    np.testing.assert_allclose(score_zeroshot("mcm", img, t), p.max(1), rtol=1e-10)
    np.testing.assert_allclose(score_zeroshot("maxlogit", img, t), logits.max(1), rtol=1e-12)
    np.testing.assert_allclose(score_zeroshot("energy", img, t), np.log(np.exp(logits).sum(1)), rtol=1e-10)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    # log p = l - logsumexp(l) with l ~ 100 has ~100 * eps absolute rounding in both computations
    np.testing.assert_allclose(score_zeroshot("entropy", img, t), (p * logp).sum(1), rtol=1e-9, atol=16 * 100 * np.finfo(float).eps)
    srt = np.sort(logits, axis=1)
    np.testing.assert_allclose(score_zeroshot("margin", img, t), srt[:, -1] - srt[:, -2], rtol=1e-10)
    ps = np.sort(p, axis=1)
    np.testing.assert_allclose(score_zeroshot("margin", img, t, space="prob"), ps[:, -1] - ps[:, -2], rtol=1e-10)
    # GEN with 1 - p_c written as the mass of the other classes (1 - p cancels when p ~ 1)
    def gen_ref(p, m, g):
        out = np.zeros(len(p))
        for i, row in enumerate(p):
            for c in np.argsort(-row)[:m]:
                out[i] -= row[c] ** g * np.delete(row, c).sum() ** g
        return out

    np.testing.assert_allclose(score_zeroshot("gen", img, t, top_m=3), gen_ref(p, 3, 0.1), rtol=1e-10)
    # top_m larger than C uses all C classes
    full = gen_ref(p, 7, 0.5)
    np.testing.assert_allclose(score_zeroshot("gen", img, t, gamma=0.5), full, rtol=1e-10)
    for name in scorer_names():
        if name != "gl_mcm":
            out = score_zeroshot(name, img, t)
            assert out.dtype == np.float64 and out.shape == (40,)


def test_gl_mcm_adds_best_patch_softmax(emb):
    fs = FeatureSet(features=emb["img"].astype(np.float32), extras={"patch_features": emb["patch"].astype(np.float32)})
    img, patch, t = fs.features.astype(np.float64), fs.extras["patch_features"].astype(np.float64), emb["id"]
    local = naive_p(patch, t).max(axis=2).max(axis=1)
    expect = naive_p(img, t).max(1) + 0.5 * local
    np.testing.assert_allclose(score_zeroshot("gl_mcm", fs, t, lam=0.5), expect, rtol=1e-6)
    with pytest.raises(ValueError, match="patch_features"):
        score_zeroshot("gl_mcm", FeatureSet(features=emb["img"].astype(np.float32)), t)


def test_neglabel_one_group_is_eq3_and_grouping_matches_release(emb):
    img, t, neg = emb["img"], emb["id"], emb["neg"]
    a_id = np.exp(img @ t.T / 0.01).sum(1)
    a_neg = np.exp(img @ neg.T / 0.01)
    np.testing.assert_allclose(score_zeroshot("neglabel", img, t, neg, n_groups=1), a_id / (a_id + a_neg.sum(1)), rtol=1e-10)
    # full softmax over ID + negatives, ID mass
    p = naive_p(img, np.vstack([t, neg]))
    np.testing.assert_allclose(score_zeroshot("neglabel", img, t, neg, n_groups=1), p[:, :7].sum(1), rtol=1e-10)
    # 23 negatives in 5 groups: last 3 dropped, seeded permutation, 5 groups of 4, mean of Eq. 3
    perm = np.random.default_rng(7).permutation(20)
    groups = a_neg[:, :20][:, perm].reshape(40, 5, 4).sum(2)
    expect = (a_id[:, None] / (a_id[:, None] + groups)).mean(1)
    got = score_zeroshot("neglabel", img, t, neg, n_groups=5, seed=7)
    np.testing.assert_allclose(got, expect, rtol=1e-10)
    assert got.tobytes() == score_zeroshot("neglabel", img, t, neg, n_groups=5, seed=7).tobytes()
    assert not np.allclose(got, score_zeroshot("neglabel", img, t, neg, n_groups=5, seed=8))
    # more groups than negatives: every negative its own group
    few = neg[:3]
    expect = (a_id[:, None] / (a_id[:, None] + a_neg[:, :3])).mean(1)
    np.testing.assert_allclose(score_zeroshot("neglabel", img, t, few), expect, rtol=1e-10)


def test_neglabel_invariants(emb):
    img, t, neg = emb["img"], emb["id"], emb["neg"]
    assert np.array_equal(score_zeroshot("neglabel", img, t, None), np.ones(40))
    assert np.array_equal(score_zeroshot("neglabel", img, t, neg[:0]), np.ones(40))
    # adding a negative never raises the score: exact in real arithmetic; in float64 the log-sums are
    # ~1/tau = 100, so they carry ~100 * eps absolute rounding, i.e. ~1e-14 relative in the score
    prev = np.ones(40)
    rounding = 16 * (1 / 0.01) * np.finfo(np.float64).eps
    for m in range(1, len(neg) + 1):
        cur = score_zeroshot("neglabel", img, t, neg[:m], n_groups=1)
        assert np.all(cur <= prev * (1 + rounding)) and np.all(cur > 0)
        prev = cur
    # a negative equal to an image's embedding lowers that image's score strongly
    hit = score_zeroshot("neglabel", img[:1], t, np.vstack([neg, img[:1]]), n_groups=1)
    assert hit[0] < 0.5 * score_zeroshot("neglabel", img[:1], t, neg, n_groups=1)[0]


def test_eoe_release_score(emb):
    img, t, neg = emb["img"], emb["id"], emb["neg"]
    p = naive_p(img, np.vstack([t, neg]))
    expect = p[:, :7].max(1) - 0.25 * p[:, 7:].max(1)
    np.testing.assert_allclose(score_zeroshot("eoe", img, t, neg), expect, rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(score_zeroshot("eoe", img, t, None), score_zeroshot("mcm", img, t), rtol=1e-12)


def test_large_logits_stay_finite(emb):
    img, t, neg = emb["img"], emb["id"], emb["neg"]
    for name in ("mcm", "energy", "entropy", "gen", "neglabel", "eoe"):
        out = score_zeroshot(name, img, t, neg if name in ("neglabel", "eoe") else None, tau=1e-4)
        assert np.all(np.isfinite(out)), name
    # with tau=1e-4 the softmax is one-hot for almost every image: MCM ~ 1
    assert np.median(score_zeroshot("mcm", img, t, tau=1e-4)) > 0.999


def test_bad_inputs_are_named(emb):
    with pytest.raises(ValueError, match="not l2-normalised"):
        score_zeroshot("mcm", emb["img"] * 2, emb["id"])
    with pytest.raises(ValueError, match="dim"):
        score_zeroshot("mcm", emb["img"], emb["id"][:, :8] / np.linalg.norm(emb["id"][:, :8], axis=1, keepdims=True))
    with pytest.raises(ValueError, match="ID names only"):
        score_zeroshot("mcm", emb["img"], emb["id"], emb["neg"])
    bad = emb["img"].copy()
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        score_zeroshot("maxlogit", bad, emb["id"])


def test_scoring_in_image_chunks_gives_the_same_scores(emb):
    fs = FeatureSet(features=emb["img"].astype(np.float32), extras={"patch_features": emb["patch"].astype(np.float32)})
    for name in ("neglabel", "gl_mcm", "eoe"):
        det = create_scorer(name)
        neg = emb["neg"] if det.uses_negatives else None
        whole = det.score(fs, emb["id"], neg)
        det.chunk_rows = 7  # 40 rows in 6 chunks
        np.testing.assert_allclose(det.score(fs, emb["id"], neg), whole, rtol=1e-12, err_msg=name)


def test_scoring_streams_a_memory_mapped_store_in_chunks(tmp_path, monkeypatch):
    """Peak numpy memory while scoring a memory-mapped FeatureSet is a chunk plus the text, not the array."""
    import tracemalloc

    import oodeval._arrays as common

    from oodeval.features.stream import iter_chunks

    rng = np.random.default_rng(5)
    n, p, e, c = 3000, 16, 16, 10
    feats = rng.normal(size=(n, e)).astype(np.float32)
    patches = (3 * rng.normal(size=(n, p, e))).astype(np.float32)  # not unit: the grid path normalises per chunk
    FeatureSet(features=feats, extras={"patch_features": patches}).save(tmp_path / "fs")
    fs = FeatureSet.load(tmp_path / "fs")
    assert isinstance(fs.extras["patch_features"], np.memmap)
    parts = list(iter_chunks({"p": fs.extras["patch_features"]}, 700))
    assert [s.stop for s, _ in parts] == [700, 1400, 2100, 2800, 3000]
    assert all(type(a["p"]) is np.ndarray for _, a in parts)  # plain reads, not views of the map
    np.testing.assert_array_equal(np.concatenate([a["p"] for _, a in parts]), patches)

    text = rng.normal(size=(c, e))
    context = {"id_text": text / np.linalg.norm(text, axis=1, keepdims=True)}
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    expect = score_zeroshot("gl_mcm", FeatureSet(features=unit(feats.astype(np.float64)),
                                                 extras={"patch_features": unit(patches.astype(np.float64))}), context["id_text"])
    create_scorer("gl_mcm").score(FeatureSet(features=unit(feats[:2].astype(np.float64)), extras={"patch_features": unit(patches[:2].astype(np.float64))}),
                           context["id_text"])  # warm-up: lazy imports do not count
    monkeypatch.setattr(common, "CHUNK_ELEMENTS", 20_000)  # ~45 of the 3000 rows per chunk (width 17 x 26)
    tracemalloc.start()
    got = create_scorer("gl_mcm").score(fs, context["id_text"], normalize=True)  # what the grid's zeroshot_scores calls
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    np.testing.assert_allclose(got, expect, rtol=1e-12)
    whole = patches.size * 8  # the float64 copy the former path made (twice)
    assert peak < whole / 10, (peak, whole)
