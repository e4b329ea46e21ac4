"""Cross-check against pytorch-ood 0.4.0 on the same arrays (Spearman rho > 0.999).

pytorch-ood returns outlier scores (higher = OOD), so we compare with their negation. Known
divergences are compared where they do not bind (GEN's probability clamp) or on inputs that
remove them (NNGuide's bank: we hand it our seeded random subset).
"""

import numpy as np
import pytest
import pytorch_ood.detector as pood
import torch
from scipy.stats import spearmanr

from oodeval import detectors


@pytest.fixture(scope="module")
def problem(scored_together):
    return scored_together


def t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float32))


def head(x):
    return x.flatten(1)


def agree(ours, theirs):
    rho = spearmanr(ours, -np.asarray(theirs, dtype=np.float64)).statistic
    assert rho > 0.999, rho


def linear(train):
    lin = torch.nn.Linear(train.weight.shape[1], train.weight.shape[0])
    with torch.no_grad():
        lin.weight.copy_(t(train.weight))
        lin.bias.copy_(t(train.bias))
    return lin


def test_logit_detectors(problem):
    train, x = problem
    f = t(x.logits).double()  # float32 softmax saturates at 1 and ties the ranking
    ours = {n: detectors.create(n).fit(train).score(x) for n in ["msp", "maxlogit", "energy", "kl_matching"]}
    agree(ours["msp"], pood.MaxSoftmax(None).predict_logits(f))
    agree(ours["maxlogit"], pood.MaxLogit(None).predict_logits(f))
    agree(ours["energy"], pood.EnergyBased(None).predict_logits(f))
    # pytorch-ood clamps p to [1e-7, 1 - 1e-7] (the GEN release does not), so compare where the
    # clamp is inactive: logits scaled down until every probability exceeds 1e-7
    soft = x.logits * 0.3
    assert torch.softmax(t(soft).double(), dim=1).min() > 1e-7
    from oodeval.features import FeatureSet

    gen_ours = detectors.create("gen").fit().score(FeatureSet(x.features, logits=soft))
    agree(gen_ours, pood.GEN(None, gamma=0.1, M=100).predict_logits(t(soft).double()))
    klm = pood.KLMatching(None).fit_logits(t(train.logits).double())
    agree(ours["kl_matching"], klm.predict_logits(f))


def test_shaping_detectors(problem):
    train, x = problem
    lin = linear(train)
    maps = t(x.features)[:, :, None, None]
    react = pood.ReAct(None, lambda m: lin(m.flatten(1)), percentile=0.9)
    react.fit_feature_maps(t(train.features)[:, :, None, None], torch.as_tensor(train.labels))
    agree(detectors.create("react").fit(train).score(x), react.predict_feature_maps(maps))
    ash = pood.ASH(None, lambda m: lin(m.flatten(1)), variant="ash-s", percentile=0.9)
    agree(detectors.create("ash_s").fit(train).score(x), ash.predict_feature_maps(maps))
    scale = pood.SCALE(None, lambda m: lin(m.flatten(1)), percentile=0.85)
    agree(detectors.create("scale").fit(train).score(x), scale.predict_feature_maps(maps))
    dice = pood.DICE(None, w=t(train.weight), b=t(train.bias), p=0.7)
    dice.fit_features(t(train.features), torch.as_tensor(train.labels))
    agree(detectors.create("dice").fit(train).score(x), dice.predict_features(t(x.features)))


def test_feature_detectors(problem):
    train, x = problem
    z, y = t(train.features), torch.as_tensor(train.labels)
    maha = pood.Mahalanobis(None).fit_features(z, y)
    agree(detectors.create("mahalanobis").fit(train).score(x), maha.predict_features(t(x.features)))
    vim = pood.ViM(None, d=16, w=t(train.weight), b=t(train.bias)).fit_features(z, y)
    agree(detectors.create("vim").fit(train).score(x), vim.predict_features(t(x.features)))
    knn = pood.KNN(None, k=20)  # 0.4.0 normalises by default, like the paper
    knn.fit_features(z, y)
    agree(detectors.create("knn", k=20).fit(train).score(x), knn.predict_features(t(x.features)).numpy())
    fdbd = pood.fDBD(None, linear(train)).fit_features(z)
    agree(detectors.create("fdbd").fit(train).score(x), fdbd.predict_features(t(x.features)))
    ours = detectors.create("mcm").fit(train)
    mcm = pood.MCM(None, text_embeddings=torch.as_tensor(ours.centroids_), temperature=1.0)
    agree(ours.score(x), mcm.predict_features(t(x.features)))


def test_nnguide_on_our_seeded_bank(problem):
    train, x = problem
    ours = detectors.create("nnguide", k=10, bank_fraction=0.1, seed=0).fit(train)
    bank = ours.bank_index_
    theirs = pood.NNGuide(None, linear(train), k=10)
    theirs.fit_features(t(train.features)[bank], torch.as_tensor(train.labels)[bank])
    with torch.no_grad():
        agree(ours.score(x), theirs.predict_features(t(x.features)))


def test_rmd_agrees_in_0_4_0(problem):
    # older pytorch-ood's trap (docs/detectors.md: a wrongly scaled background scatter) is gone in 0.4.0: class and
    # background covariances are both unnormalised scatters (+1e-6 I), so its scores are ours / N
    train, x = problem
    ours = detectors.create("relative_mahalanobis").fit(train).score(x)
    rmd = pood.RMD(None).fit_features(t(train.features), torch.as_tensor(train.labels))
    theirs = rmd.predict_features(t(x.features)).double().numpy()
    agree(ours, theirs)
    np.testing.assert_allclose(-theirs * len(train), ours, rtol=1e-2, atol=1e-2 * np.abs(ours).max())
