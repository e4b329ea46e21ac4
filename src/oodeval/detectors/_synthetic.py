"""Synthetic class-Gaussian FeatureSets for tests, benchmarks and demos (no detector here).

ID features mimic post-ReLU penultimate features: z = relu(mu_y + sigma eps), where each class
mean is a small base level plus a few strong class-specific dimensions; the head is aligned
with the class means (W = normalised mu, b small). Far-OOD features have no class structure
and low activation: z = relu(0.3 + 0.7 eps). Logits are W z + b; the NAC state of the
``pre_logits`` layer is computed exactly for this linear head: z * W^T (softmax(f) - 1/C).
"""

from __future__ import annotations

import numpy as np
from scipy.special import softmax

from ..errors import InputError
from ..features import FeatureSet

__all__ = ["synthetic_problem"]


def synthetic_problem(
    n_classes: int = 10,
    dim: int = 64,
    n_train: int = 2000,
    n_test: int = 500,
    n_ood: int = 500,
    seed: int = 0,
    strong: int = 4,
    sigma: float = 1.0,
    nac: bool = True,
    chunk: int = 65536,
) -> tuple[FeatureSet, FeatureSet, FeatureSet]:
    """(ID train, ID test, far OOD) FeatureSets with features, labels, logits, head (float32).

    Same seed, same bytes. Rows are generated in chunks of ``chunk`` so ImageNet-sized
    problems need only the output arrays.
    """
    rng = np.random.default_rng(seed)
    mu = np.full((n_classes, dim), 0.5)
    for c in range(n_classes):
        mu[c, rng.choice(dim, size=min(strong, dim), replace=False)] = 4.0
    weight = (mu / np.linalg.norm(mu, axis=1, keepdims=True) * 4.0).astype(np.float32)
    bias = (0.1 * rng.standard_normal(n_classes)).astype(np.float32)

    def make(n: int, ood: bool) -> FeatureSet:
        z = np.empty((n, dim), dtype=np.float32)
        f = np.empty((n, n_classes), dtype=np.float32)
        st = np.empty((n, dim), dtype=np.float32) if nac else None
        y = np.full(n, -1, dtype=np.int64) if ood else rng.integers(0, n_classes, size=n)
        for s in range(0, n, chunk):
            e = slice(s, min(n, s + chunk))
            noise = rng.standard_normal((e.stop - s, dim))
            zc = np.maximum(0.3 + 0.7 * noise if ood else mu[y[e]] + sigma * noise, 0.0)
            z[e] = zc
            fc = zc @ weight.T.astype(np.float64) + bias
            f[e] = fc
            if nac:
                st[e] = zc * ((softmax(fc, axis=1) - 1.0 / n_classes) @ weight.astype(np.float64))
        extras = {"nac/pre_logits": st} if nac else {}
        return FeatureSet(z, labels=y, logits=f, weight=weight, bias=bias, extras=extras,
                          meta={"dataset": "synthetic-ood" if ood else "synthetic-id", "seed": seed})

    return make(n_train, False), make(n_test, False), make(n_ood, True)


#: the problems of :func:`conditioned_problem`
CONDITIONED = ("offset", "tail", "rank_deficient", "head")


def conditioned_problem(
    kind: str,
    n_classes: int = 40,
    dim: int = 256,
    n_train: int = 3000,
    n_test: int = 2000,
    n_ood: int = 2000,
    seed: int = 0,
    condition: float = 1e8,
) -> tuple[FeatureSet, FeatureSet, FeatureSet]:
    """(ID train, ID test, near OOD) FeatureSets conditioned like real penultimate features.

    Gaussian classes z = o + mu_y + Sigma^1/2 eps around a shared offset o; near OOD are held-out
    classes drawn like the ID ones (fine-grained OOD). ``kind``:

    - ``"offset"``: LayerNorm-like: |o| ~ 84 concentrated in a few low-variance dimensions
      ("massive activations"), so z' S^-1 z / D is ~1e3-1e4 (the cancelled-term ratio of an
      expanded quadratic form) while the class structure is of unit size;
    - ``"tail"``: covariance eigenvalues geometric from 1 down to 1 / ``condition`` (1e8) in
      a random basis, class means spread like the covariance, plus a moderate offset;
    - ``"rank_deficient"``: fewer training rows than dimensions (3 per class), so the tied
      covariance has rank n_train - C;
    - ``"head"``: a near rank-deficient head (singular values from 1 down to 1e-4) with a bias,
      so ViM's logit origin -pinv(W) b lies far from the features.

    The head is W = class-mean directions (``head``: with its spectrum spread), b = -W o, logits
    W z + b; everything float32, same seed same bytes.
    """
    if kind not in CONDITIONED:
        raise InputError(f"conditioned problem must be one of {CONDITIONED}, got {kind!r}")
    rng = np.random.default_rng(seed)
    d = dim
    basis = np.linalg.qr(rng.standard_normal((d, d)))[0]
    if kind == "tail":
        sd = np.sqrt(np.geomspace(1.0, 1.0 / condition, d))
    else:
        sd = np.sqrt(1.0 / np.arange(1, d + 1))  # a long but mild tail, as real features have
    if kind == "offset":  # the 8 heavy dimensions get the 8 smallest variances, in the standard basis
        heavy = rng.choice(d, size=8, replace=False)
        basis = np.eye(d)[:, np.concatenate([np.setdiff1d(np.arange(d), heavy), heavy])]
        offset = 0.1 * rng.standard_normal(d)
        offset[heavy] = rng.choice([-1.0, 1.0], 8) * 30.0  # |o| ~ 84
    else:
        offset = 3.0 + 0.5 * rng.standard_normal(d)
    scale = basis * sd  # Sigma^1/2 = basis diag(sd)
    n_all = 2 * n_classes
    means = rng.standard_normal((n_all, d)) @ scale.T * 0.5  # ID and held-out classes alike
    w = means[:n_classes] - means[:n_classes].mean(axis=0)
    w /= np.linalg.norm(w, axis=1, keepdims=True)
    if kind == "head":
        u, _, vt = np.linalg.svd(w, full_matrices=False)
        w = (u * np.geomspace(1.0, 1e-4, len(vt))) @ vt * 4.0
    weight = w.astype(np.float32)
    bias = (-(w @ offset) + 0.1 * rng.standard_normal(n_classes)).astype(np.float32)
    if kind == "head":
        bias = (0.5 * rng.standard_normal(n_classes)).astype(np.float32)
    if kind == "rank_deficient":
        n_train = 3 * n_classes

    def make(n: int, classes: np.ndarray, labelled: bool, name: str) -> FeatureSet:
        y = rng.choice(classes, size=n)
        if labelled:  # every ID class in the training set
            y[: len(classes)] = classes
        z = offset + means[y] + rng.standard_normal((n, d)) @ scale.T
        f = z @ w.T + bias
        return FeatureSet(z.astype(np.float32), labels=y if labelled else np.full(n, -1), logits=f.astype(np.float32),
                          weight=weight, bias=bias, meta={"dataset": f"conditioned-{kind}-{name}", "seed": seed})

    ids, held_out = np.arange(n_classes), np.arange(n_classes, n_all)
    return make(n_train, ids, True, "train"), make(n_test, ids, True, "test"), make(n_ood, held_out, False, "ood")
