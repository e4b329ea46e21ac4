"""Kernel PCA where its principal space is the larger part (q > M / 2): the residual is read on
the complement's eigenvectors, ||V'(phi - m)||, and is still the release's -||r - U_q U_q' r||."""

import numpy as np
import pytest

from oodeval import detectors
from oodeval.testing import small_problem

pytest.importorskip("pytorch_ood.detector")  # test_since_paper's module needs it at import
from test_since_paper import _kpca_release, close, same_results  # noqa: E402


@pytest.fixture(scope="module")
def problem():
    return small_problem(seed=4)


@pytest.mark.parametrize("kernel, hp", [("cosine", {"explained_variance": 0.98}),
                                        ("cosine_gaussian", {"n_features": 32, "gamma": 1.0, "explained_variance": 0.95})])  # fmt: skip
def test_kpca_reads_the_residual_on_the_complement_as_the_release(problem, kernel, hp):
    train, test, ood = problem
    det = detectors.create("kpca", kernel=kernel, **hp).fit(train)
    width = det.components_.shape[0]
    assert width / 2 < det.n_components_ < width  # the complement's path, and a residual to read
    assert det.complement_.shape == (width, width - det.n_components_)
    # the two bases together are orthonormal: the full eigenvector matrix
    basis = np.hstack([det.components_, det.complement_])
    np.testing.assert_allclose(basis.T @ basis, np.eye(width), atol=1e-12)  # float64 eigenvectors: ~width ulps
    ours = np.concatenate([det.score(test), det.score(ood)])
    rows = np.concatenate([test.features, ood.features])
    draws = (det.rff_weights_, det.rff_phases_) if kernel == "cosine_gaussian" else (None, None)
    ref = _kpca_release(train.features, rows, hp["explained_variance"], *draws)
    # float64 on both sides, neither cancels ||r||^2 (the release subtracts the projection, ours
    # projects on the complement): a few ulps of ||r|| apart, the residual >= 1e-3 of ||r|| here
    assert close(ours, ref, 1e-9)
    same_results(ours, ref, len(test))
    assert not close(_kpca_release(train.features, rows, hp["explained_variance"], *draws, wrong_centre=True), ref, 1e-6)
