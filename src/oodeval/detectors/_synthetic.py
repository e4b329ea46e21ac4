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
