"""Benchmark: oodeval's post-hoc detectors vs pytorch-ood on synthetic ImageNet-scale features.

Full size (``--scale 1``): 1000 classes, D = 1024, 200k ID-train, 50k ID-test, 50k OOD rows.
For every detector that runs on cached features/logits (all but nac, which needs per-layer
states) it prints fit+score seconds, the peak of numpy allocations (tracemalloc; faiss's index
memory is not traced, see the "faiss" note) and the ratio to the dense matrix products the
detector inherently needs (timed on their own with np.matmul in float64, the precision the
detector computes in; logit-only detectors need no product and get no ratio). pytorch-ood 0.4.0's implementation of the same detector runs on the same arrays; where
its predict cost is far beyond ours (per-class loops), it is timed on ``--pood-rows`` rows and
extrapolated linearly (marked ``*``).

    python benchmarks/detectors.py --scale 0.05        # quick check
    python benchmarks/detectors.py                     # full size (needs ~6 GB RAM, long)
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import tracemalloc

import numpy as np

from oodeval import detectors
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.detectors.hybrid import vim_dim
from oodeval.features import FeatureSet

SHARED = ["msp", "maxlogit", "energy", "gen", "kl_matching", "react", "ash_s", "scale", "dice",
          "mahalanobis", "relative_mahalanobis", "knn", "fdbd", "vim", "nnguide", "mcm"]  # fmt: skip


def products(name: str, n_train: int, n_score: int, d: int, c: int, hp: dict) -> list[tuple[int, int, int]]:
    """(m, k, n) shapes of the dense products a detector cannot avoid."""
    head = [(n_score, d, c)]
    table = {
        "kl_matching": [(n_train, c, c), (n_score, c, c)],
        "react": head, "ash_s": head, "scale": head, "dice": head,
        "mahalanobis": [(n_train, d, d), (n_score, d, d), (n_score, d, c)],
        "mahalanobis_pp": [(n_train, d, d), (n_score, d, d), (n_score, d, c)],
        "relative_mahalanobis": [(n_train, d, d), (n_score, d, d), (n_score, d, d), (n_score, d, c)],
        "relative_mahalanobis_pp": [(n_train, d, d), (n_score, d, d), (n_score, d, d), (n_score, d, c)],
        "knn": [(n_score, d, n_train)],
        "nnguide": [(n_score, d, max(hp.get("k", 10), int(np.ceil(0.01 * n_train))))],
        "cosine": head, "mcm": head,
        "fdbd": [(c, d, c), (n_score, d, c)],
        "neco": [(n_train, d, d), (n_score, d, hp.get("n_components_", d))],
        "vim": [(n_train, d, d), (n_train, d, c), (n_train, d, d - vim_dim(d)),
                (n_score, d, c), (n_score, d, d - vim_dim(d))],
    }  # fmt: skip
    return table.get(name, [])


def matmul_seconds(shapes: list[tuple[int, int, int]], cache: dict) -> float:
    total = 0.0
    for m, k, n in shapes:
        if (m, k, n) not in cache:
            rows = min(m, max(1, 4_000_000 // max(k, n)))  # time one chunk, scale to m rows
            a = np.random.default_rng(0).standard_normal((rows, k))
            b = np.random.default_rng(1).standard_normal((k, n))
            t0 = time.perf_counter()
            a @ b
            cache[(m, k, n)] = (time.perf_counter() - t0) * m / rows
        total += cache[(m, k, n)]
    return total


def run_ours(name: str, train: FeatureSet, score_sets: list[FeatureSet], hp: dict) -> tuple[float, float, object]:
    tracemalloc.start()
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    det = detectors.create(name, **hp).fit(train)
    for fs in score_sets:
        det.score(fs)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return seconds, peak / 2**20, det


def run_pood(name: str, train: FeatureSet, score_sets: list[FeatureSet], max_rows: int) -> tuple[float, bool]:
    """Seconds of pytorch-ood's fit + predict on the same arrays (predict extrapolated if capped)."""
    import torch
    import pytorch_ood.detector as pood

    z = torch.from_numpy(np.asarray(train.features))
    f = torch.from_numpy(np.asarray(train.logits))
    y = torch.from_numpy(np.asarray(train.labels))
    w, b = torch.from_numpy(train.weight), torch.from_numpy(train.bias)
    lin = torch.nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    on_maps = lambda m: lin(m.flatten(1))  # noqa: E731
    slow = {"mahalanobis", "relative_mahalanobis", "dice"}
    t0 = time.perf_counter()
    with torch.no_grad():
        if name in ("msp", "maxlogit", "energy", "gen"):
            det = {"msp": pood.MaxSoftmax(None), "maxlogit": pood.MaxLogit(None), "energy": pood.EnergyBased(None),
                   "gen": pood.GEN(None, gamma=0.1, M=100)}[name]  # fmt: skip
            pred = det.predict_logits
            use = "logits"
        elif name == "kl_matching":
            det = pood.KLMatching(None).fit_logits(f)
            pred, use = det.predict_logits, "logits"
        elif name in ("react", "ash_s", "scale"):
            if name == "react":
                det = pood.ReAct(None, on_maps, percentile=0.9)
                det.fit_feature_maps(z[:, :, None, None], y)
            elif name == "ash_s":
                det = pood.ASH(None, on_maps, variant="ash-s", percentile=0.9)
            else:
                det = pood.SCALE(None, on_maps, percentile=0.85)
            pred, use = (lambda x: det.predict_feature_maps(x[:, :, None, None])), "features"
        elif name == "dice":
            det = pood.DICE(None, w=w, b=b, p=0.7)
            det.fit_features(z, y)
            pred, use = det.predict_features, "features"
        elif name in ("mahalanobis", "relative_mahalanobis"):
            det = (pood.Mahalanobis(None) if name == "mahalanobis" else pood.RMD(None)).fit_features(z, y)
            pred, use = det.predict_features, "features"
        elif name == "knn":
            det = pood.KNN(None, k=1000 if len(z) >= 1000 else len(z))
            det.fit_features(z, y)
            pred, use = det.predict_features, "features"
        elif name == "fdbd":
            det = pood.fDBD(None, lin).fit_features(z)
            pred, use = det.predict_features, "features"
        elif name == "vim":
            det = pood.ViM(None, d=vim_dim(z.shape[1]), w=w, b=b).fit_features(z, y)
            pred, use = det.predict_features, "features"
        elif name == "nnguide":
            ours = detectors.create("nnguide").fit(train)
            det = pood.NNGuide(None, lin, k=10)
            det.fit_features(z[ours.bank_index_], y[ours.bank_index_])
            pred, use = det.predict_features, "features"
        elif name == "mcm":
            cents = detectors.create("mcm").fit(train).centroids_
            det = pood.MCM(None, text_embeddings=torch.from_numpy(cents).float(), temperature=1.0)
            pred, use = det.predict_features, "features"
        else:
            raise KeyError(name)
        fit_s = time.perf_counter() - t0
        extrapolated = False
        score_s = 0.0
        batch = 64 if name == "dice" else 4096
        for fs in score_sets:
            arr = np.asarray(fs.logits if use == "logits" else fs.features)
            rows = len(arr)
            if name in slow and rows > max_rows:
                rows, extrapolated = max_rows, True
            t1 = time.perf_counter()
            for s in range(0, rows, batch):
                pred(torch.from_numpy(arr[s : min(rows, s + batch)]))
            score_s += (time.perf_counter() - t1) * len(arr) / rows
    return fit_s + score_s, extrapolated


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full row counts (default 1)")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--detectors", default=None, help="comma-separated subset")
    ap.add_argument("--no-pood", action="store_true", help="skip pytorch-ood")
    ap.add_argument("--pood-rows", type=int, default=2000, help="rows timed for pytorch-ood's slow predicts")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_train, n_test = int(200_000 * args.scale), int(50_000 * args.scale)
    t0 = time.perf_counter()
    train, test, ood = synthetic_problem(args.classes, args.dim, n_train, n_test, n_test, seed=args.seed, nac=False)
    print(f"data: {args.classes} classes, D={args.dim}, train {n_train}, test {n_test}, OOD {n_test} "
          f"(generated in {time.perf_counter() - t0:.1f}s); threads: OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, cpus {os.cpu_count()}")  # fmt: skip
    knn_k = 1000 if n_train >= 100_000 else max(1, n_train // 200)
    hps = {"knn": {"k": knn_k}}
    names = args.detectors.split(",") if args.detectors else [n for n in detectors.names("paper21") if n != "nac"]
    cache: dict = {}
    n_score = 2 * n_test
    detectors.create("msp")  # import every detector module before timing
    print(f"{'detector':<24}{'ours s':>9}{'peak MB':>9}{'matmul s':>10}{'ratio':>7}"
          f"{'pytorch-ood s':>15}{'speed-up':>10}")  # fmt: skip
    tot_ours = tot_pood = meas_ours = meas_pood = 0.0
    for name in names:
        hp = hps.get(name, {})
        secs, peak, det = run_ours(name, train, [test, ood], hp)
        fitted = {"n_components_": det.n_components_} if name == "neco" else {}
        shapes = products(name, n_train, n_score, args.dim, args.classes, {**hp, **fitted})
        if shapes:
            ref = matmul_seconds(shapes, cache)
            line = f"{name:<24}{secs:>9.2f}{peak:>9.0f}{ref:>10.2f}{secs / ref:>7.1f}"
        else:
            line = f"{name:<24}{secs:>9.2f}{peak:>9.0f}{'-':>10}{'-':>7}"
        if name in SHARED and not args.no_pood:
            try:
                ps, extra = run_pood(name, train, [test, ood], args.pood_rows)
            except AssertionError:  # its Mahalanobis needs every class in the train set
                print(line + f"{'n/a':>15}", flush=True)
                continue
            line += f"{ps:>14.2f}{'*' if extra else ' '}{ps / secs:>10.1f}"
            tot_ours += secs
            tot_pood += ps
            if not extra:
                meas_ours += secs
                meas_pood += ps
        print(line + ("" if shapes else "   (no matrix product: O(N C) on the logits)"), flush=True)
    if tot_ours:
        print(f"{'shared total':<24}{tot_ours:>9.2f}{'':>26}{tot_pood:>15.2f}{tot_pood / tot_ours:>10.1f}")
        if meas_ours and meas_ours != tot_ours:
            print(f"{'  without * rows':<24}{meas_ours:>9.2f}{'':>26}{meas_pood:>15.2f}{meas_pood / meas_ours:>10.1f}")
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; "
          "* = pytorch-ood predict timed on --pood-rows rows and extrapolated; "
          "faiss index memory (knn, nnguide) is outside tracemalloc")  # fmt: skip


if __name__ == "__main__":
    main()
