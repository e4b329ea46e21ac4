"""Issue 45's shortcuts in the millisecond detectors: each equals the direct computation it replaces.

- ``Compute.rowmax`` / ``rowmin`` read the value at the argmax / argmin (numpy's row max is not
  vectorised): the same values as ``max`` / ``min`` along rows, ties and infinities included.
- GEN reads p^g (1 - p)^g as exp(g (log p + log(1 - p))), with the log-sum-exp's shift taken from
  its top-M partition: equal to the power form, also where p = 1 exactly (a margin beyond exp's
  range, so 1 - p = 0 and the term is 0, as 0^g: log(0) = -inf, exp(-inf) = 0).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp

from oodeval.detectors import create
from oodeval.detectors._backend import Compute
from oodeval.features import FeatureSet


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rowmax_rowmin_equal_the_row_reductions(dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 37)).astype(dtype)
    a[3, [2, 9]] = a[3].max() + 1  # a tied maximum
    a[4, :] = 1.5  # a constant row
    a[5, 7], a[6, 1] = np.inf, -np.inf
    comp = Compute(dtype)
    # the same stored values are selected, so equality is exact
    np.testing.assert_array_equal(comp.rowmax(a), a.max(axis=1))
    np.testing.assert_array_equal(comp.rowmin(a), a.min(axis=1))


def _gen_reference(f: np.ndarray, m: int, g: float = 0.1) -> np.ndarray:
    """-sum of p^g (1 - p)^g over the m largest p in the power form the log form replaced:
    exp(g log p) (-expm1(log p))^g, log p = f - logsumexp(f) in float64."""
    f = np.asarray(f, dtype=np.float64)
    log_p = np.sort(f - logsumexp(f, axis=1, keepdims=True), axis=1)[:, ::-1][:, :m]
    return -np.sum(np.exp(g * log_p) * (-np.expm1(log_p)) ** g, axis=1)


@pytest.mark.parametrize("compute_dtype", ["float32", "float64"])
def test_gen_log_form_equals_the_power_form(compute_dtype):
    rng = np.random.default_rng(1)
    c, m = 50, 10
    f = (rng.standard_normal((64, c)) * 3).astype(np.float32)
    f[0, 0] = 2000.0  # p = 1 exactly: the top term is 0^g = 0 (the others exp(-200)-sized, not 0)
    f[1, :] = 0.0  # uniform: p = 1/C everywhere
    f[2, :2] = 40.0  # two tied top classes, the rest far below
    x = FeatureSet(features=np.zeros((64, 4), np.float32), logits=f)
    got = create("gen", top_m=m, compute_dtype=compute_dtype).fit().score(x)
    ref = _gen_reference(f, m)
    assert ref[0] < 0 and got[0] < 0  # the other nine terms are tiny but not zero in either form
    # float64: a handful of roundings in exp/log/expm1 on either side (rtol 1e-12, far above 1e-15);
    # float32: the exps are float32 (a few eps32 relative per term), so rtol 1e-5
    rtol = 1e-12 if compute_dtype == "float64" else 1e-5
    np.testing.assert_allclose(got, ref, rtol=rtol)
