"""Where a detector's CPU time goes, fit and score apart: `benchmarks/detectors.py`'s data and
detectors, each of the named parts of their code timed in CPU seconds (the least of ``--repeats``
fits and scorings; time.process_time, so other processes on a shared machine do not enter it).

    python benchmarks/profile_detectors.py --scale 0.1 --detectors mahalanobis,vim
    python benchmarks/profile_detectors.py --scale 0.1 --threads 1   # the work itself, one core

A part is a function of oodeval's detector code (listed in PARTS), wrapped for the run by a
timer that adds its CPU time to the part's total (a part called inside another counts in both);
"other" is the phase's time outside every part. The machine is described as in detectors.py.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import importlib
import time

import numpy as np

#: (module, attribute path) of the parts timed
PARTS = [
    ("oodeval.detectors._common", "class_means"), ("oodeval.detectors._common", "scatter"),
    ("oodeval.detectors._common", "whitening"), ("oodeval.detectors._common", "mean_rows"),
    ("oodeval.detectors.mahalanobis", "_centred_class_means"), ("oodeval.detectors._common", "scatter_rounding"),
    ("oodeval.detectors.hybrid", "logit_origin"), ("oodeval.detectors.hybrid", "ViM._parts"),
    ("oodeval.detectors.base", "Detector.check_params"), ("oodeval.features.featureset", "FeatureSet.check_finite"),
    ("oodeval.features.featureset", "FeatureSet.signature"), ("oodeval.features.featureset", "FeatureSet.check_agrees"),
    ("oodeval.detectors.base", "as_scores"), ("oodeval.detectors._backend", "_NumpyCompute.map_rows"),
    ("numpy.linalg", "eigh"),
]  # fmt: skip

TOTALS: collections.Counter = collections.Counter()


def _wrap(module: str, path: str) -> None:
    owner = importlib.import_module(module)
    *outer, name = path.split(".")
    for part in outer:
        owner = getattr(owner, part)
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        c0 = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            TOTALS[path] += time.process_time() - c0

    setattr(owner, name, timed)
    for mod in ("oodeval.detectors._common", "oodeval.detectors.hybrid", "oodeval.detectors.mahalanobis",
                "oodeval.detectors.feature", "oodeval.detectors.base"):  # fmt: skip
        m = importlib.import_module(mod)
        if not outer and getattr(m, name, None) is fn:
            setattr(m, name, timed)
    if module == "numpy.linalg":
        np.linalg.eigh = timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--detectors", default="vim,mahalanobis,mahalanobis_pp,relative_mahalanobis,"
                    "relative_mahalanobis_pp,cosine,energy,maxlogit")  # fmt: skip
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="BLAS and oodeval threads (threadpoolctl; default all)")
    args = ap.parse_args()
    from _machine import describe
    from threadpoolctl import threadpool_limits

    from oodeval import detectors
    from oodeval.detectors._synthetic import synthetic_problem

    for line in describe():
        print(line)
    for module, path in PARTS:
        _wrap(module, path)
    n_train, n_test = int(200_000 * args.scale), int(50_000 * args.scale)
    train, test, ood = synthetic_problem(1000, 1024, n_train, n_test, n_test, seed=0, nac=False)
    for fs in (train, test, ood):  # once per FeatureSet, as in detectors.py
        fs.signature()
        fs.check_finite(("features", "logits", "head"), "profile")
    limit = threadpool_limits(args.threads) if args.threads else contextlib.nullcontext()
    with limit:
        detectors.create("energy").fit().score(test)
        print(f"train {n_train}, test {n_test} + OOD {n_test}; threads {args.threads or 'all'}; CPU seconds, least of {args.repeats}")
        for name in args.detectors.split(","):
            best: dict[str, dict[str, float]] = {}
            for _ in range(args.repeats):
                for phase in ("fit", "score"):
                    TOTALS.clear()
                    c0 = time.process_time()
                    if phase == "fit":
                        det = detectors.create(name).fit(train)
                    else:
                        det.score(test)
                        det.score(ood)
                    total = time.process_time() - c0
                    parts = {"total": total, **{k: v for k, v in TOTALS.items() if v > 0}}
                    if phase not in best or total < best[phase]["total"]:
                        best[phase] = parts
            for phase, parts in best.items():
                text = ", ".join(f"{k} {v:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]))
                print(f"{name} {phase}: {text}", flush=True)


if __name__ == "__main__":
    main()
