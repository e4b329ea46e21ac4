"""Benchmark: oodeval's post-hoc detectors vs their float32 dense-compute floor and their peers.

Full size (``--scale 1``): 1000 classes, D = 1024, 200k ID-train, 50k ID-test, 50k OOD rows.
For every registered detector that runs on cached features/logits (all but those in NOT_HERE: nac's
per-layer states, cnc's K + 1 head, the network methods' pass arrays, each measured where it says;
a method that refuses the size up front, e.g. class_gmm's K D x D factors, prints its refusal)
it prints fit+score wall seconds and CPU seconds, the peak of numpy allocations (tracemalloc), and
the ratio to its float32 floor: the dense products the detector cannot avoid (sgemm, timed alone;
a covariance's scatter Z^T Z as BLAS's syrk, the symmetric half that the formula needs, in
float64 where its formula reads the smallest eigenvalues: ViM's residual space)
plus, for softmax readouts, a max, an exp and a row sum over the float32 logits (the max of each
block of rows, which is all a shift that keeps exp finite needs; the sum accumulated in float64, as
oodeval's contract requires of every reduction that becomes a score), the passes over the
features no product makes (the fit's class means or mean feature over ID train, the norms of the
scored rows; a float32 column or row sum each), the selections the formula needs (GEN's top M per
row, ReAct's train percentile, ASH-S's and SCALE's top entries per feature row: one linear-time
partition each), OpenMax's fit passes over the ID-train logits (its class means, then each row's
distance to its own), the softmax passes a fit repeats (temperature scaling's Newton steps over
its validation logits, GMM's E-steps over its K components), as many as the fit ran, and the D x D
float64 eigendecompositions it needs (a pseudo-inverse per
covariance, ViM's and NECO's principal spaces); the passes and the row selections run over the sets'
own arrays on every core. The machine's sgemm GFLOP/s is measured and printed. The peer's
implementation of the same detector runs on the same arrays with the same settings (``PEERS``:
pytorch-ood 0.4.0's detector, or OpenOOD v1.5's postprocessor maths re-run, :func:`run_openood`); where its predict cost
is far beyond ours (per-class loops), it is timed on ``--pood-rows`` rows and extrapolated linearly
(marked ``*``). A run (either library's) that takes under REPEAT_BELOW_S is repeated REPEATS times
(under LIGHT_S, at least LIGHT_REPEATS times and for at least LIGHT_S seconds) and its least
wall and least CPU time kept, each from its own run; each floor is likewise the least of REPEATS
calls (as many as a light run's) after a warm-up (the shared machine's noise only adds time). glibc's mmap threshold is pinned for the run
(:func:`pin_allocator`), so that neither library's timing depends on what the process freed
before. Totals of the shared detectors are printed with and
without kNN, against the issue's full-size targets (300 s and 60 s on 2 cores), and the last
lines name every detector that misses a per-detector target: over FLOOR_TARGET times its floor
(wall or CPU), or slower than pytorch-ood in CPU time.

    python benchmarks/detectors.py --scale 0.1         # quick check
    python benchmarks/detectors.py                     # full size (needs ~6 GB RAM, long)
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import resource
import threading
import time
import tracemalloc

import numpy as np
from _machine import add_kernel_arguments, describe, use_kernel

from oodeval import detectors
from oodeval.detectors._synthetic import synthetic_problem
from oodeval.detectors.hybrid import logit_origin, vim_dim
from oodeval.errors import InputError
from oodeval.features import FeatureSet

#: a detector whose first run takes less than this is run REPEATS times more, the least wall and
#: the least CPU time kept (each from its own run, for both libraries); each floor is the least
#: of each over REPEATS calls after a warm-up
REPEAT_BELOW_S = 10.0
REPEATS = 2
#: a run under LIGHT_S is repeated at least LIGHT_REPEATS times and for at least LIGHT_S seconds:
#: the first few runs of a light detector in a process take up to 3x its steady time (measured: MSP
#: at --scale 0.1, 38, 26, 34, 33, 32, 28, then 15-17 ms of CPU), and pytorch-ood's light runs
#: spread over 17-45 ms, so ten runs kept a lucky or an unlucky one
LIGHT_S = 0.5
LIGHT_REPEATS = 10


#: glibc's mallopt parameters: the size from which malloc maps fresh pages, and the free heap top
#: it keeps (both fixed, which stops glibc moving the threshold with what the process freed)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest
TRIM_THRESHOLD = 64 << 20


def pin_allocator() -> str:
    """Fix glibc's mmap and trim thresholds for the whole run, so that both libraries' per-batch
    temporaries (pytorch-ood's MSP and energy take two 16 MB tensors per 4096-row batch) come
    from a kept heap whatever the process freed before. With glibc's moving threshold the same
    pytorch-ood energy run took 10 or 41 ms of CPU at ``--scale 0.1`` depending on the process's
    history; pinned, it took 10-14 ms in six processes. Returns what was done, for the header."""
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return "allocator as is (no glibc mallopt)"
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return "allocator as is (mallopt refused)"
    return f"glibc mmap threshold pinned at {MMAP_THRESHOLD >> 20} MB"


def repeats(seconds: float) -> int:
    """How many more times to run a detector whose first run took ``seconds``."""
    if seconds >= REPEAT_BELOW_S:
        return 0
    return max(LIGHT_REPEATS, math.ceil(LIGHT_S / max(seconds, 1e-3))) if seconds < LIGHT_S else REPEATS

SHARED = ["msp", "maxlogit", "energy", "gen", "kl_matching", "react", "ash_s", "scale", "dice",
          "mahalanobis", "relative_mahalanobis", "knn", "fdbd", "vim", "nnguide", "mcm"]  # fmt: skip


def products(name: str, n_train: int, n_score: int, d: int, c: int, hp: dict) -> list[tuple[int, int, int]]:
    """(m, k, n) shapes of the dense products a detector cannot avoid."""
    head = [(n_score, d, c)]
    table = {
        "kl_matching": [(n_score, c, c)],
        "react": head, "ash_s": head, "scale": head, "dice": head,
        # the whitened class means nu_c = (mu_c - m) W (C, D, D), the scored rows' whitening and
        # their cross term with nu; the scatter is in scatters()
        "mahalanobis": [(c, d, d), (n_score, d, d), (n_score, d, c)],
        "mahalanobis_pp": [(c, d, d), (n_score, d, d), (n_score, d, c)],
        "relative_mahalanobis": [(c, d, d), (n_score, d, d), (n_score, d, d), (n_score, d, c)],
        "relative_mahalanobis_pp": [(c, d, d), (n_score, d, d), (n_score, d, d), (n_score, d, c)],
        "knn": [(n_score, d, n_train)],
        "nnguide": [(n_score, d, max(hp.get("k", 10), int(np.ceil(0.01 * n_train))))],
        "cosine": head, "mcm": head,
        "fdbd": [(c, d, c), (n_score, d, c)],
        "neco": [(n_score, d, hp.get("n_components_", d))],
        # ViM's origin -pinv(W) b: at least the head's (C, D, C) Gram product (then a C^3 / 3 factorisation)
        "vim": [(c, d, c), (n_train, d, c), (n_train, d, d - vim_dim(d)),
                (n_score, d, c), (n_score, d, d - vim_dim(d))],
        # the peers' methods
        "residual": [(n_score, d, d - vim_dim(d))],
        "ash_b": head, "ash_p": head, "vra": head,
        "relation": [(n_score, d, hp.get("bank", n_train)), (n_score, c, hp.get("bank", n_train))],
        "gmm": gmm_products(n_train, n_score, d, hp),
        # per class: its scatter (in scatters()), then a triangular solve of every scored row (a D x D product's work)
        "class_gmm": [(n_score * c, d, d)],
        # (openmax: its alpha distances are row dots, see passes_over)
    }  # fmt: skip
    table.update(since_paper_products(n_train, n_score, d, c, hp))
    return table.get(name, [])


def scatters(name: str, n_train: int, d: int, c: int, hp: dict) -> list[tuple[int, str]]:
    """(row count, dtype) of the (N, D) scatters Z^T Z (a covariance, D x D and symmetric) a formula forms:
    the Mahalanobis family's class scatter, ViM's and the residual's covariance about the origin,
    NECO's and GMM's PCA covariance (when it reduces), each class's scatter of class_gmm (N rows
    in all); the relative forms' background covariance also needs the between-class scatter of
    the C class means (the within-class one plus that: an identity, the least work for it; the
    floor omitted it before). The formula needs only the symmetric half, which BLAS forms with its own kernel
    (syrk): the floor times that kernel on the same shape (:func:`syrk_seconds`), as it times
    sgemm for every other product. (It counted a full (N, D, D) sgemm before: on this machine's
    OpenBLAS a one-thread float32 syrk takes 0.65x that time, so the floor held work that the
    formula does not need.) float32 for every one: ViM's and the residual's covariance is
    float64 in oodeval, for its residual space's small eigenvalues, but a float32 product of
    centred blocks with a float64 fall-back (as the Mahalanobis family's) would serve it."""
    if name in ("vim", "residual"):
        return [(n_train, "float32")]
    if name in ("relative_mahalanobis", "relative_mahalanobis_pp"):
        return [(n_train, "float32"), (c, "float32")]
    one = ("mahalanobis", "mahalanobis_pp", "neco", "class_gmm")
    if name in one or (name == "gmm" and hp.get("dim_", d) < d):
        return [(n_train, "float32")]
    return []


def syrk_seconds(m: int, d: int, dtype: str = "float32", budget: int = 4_000_000) -> tuple[float, float]:
    """(wall, CPU) of the symmetric product Z^T Z of an (m, d) Z in ``dtype`` (numpy's ``a.T @ a``
    runs BLAS's syrk): timed on one chunk of rows and scaled linearly to m rows; the least wall
    and the least CPU time over one BLAS thread and all of them (OpenBLAS's syrk gains little
    from a second thread: 1.1x a full sgemm's CPU time on two, 0.65x on one), each its own least."""
    from threadpoolctl import threadpool_limits

    rows = min(m, max(256, budget // d))
    a = np.random.default_rng(0).standard_normal((rows, d)).astype(dtype)
    every = _timed(lambda: a.T @ a, None)
    with threadpool_limits(1, user_api="blas"):
        one = _timed(lambda: a.T @ a, None)
    return min(every[0], one[0]) * m / rows, min(every[1], one[1]) * m / rows


def gmm_products(n_train: int, n_score: int, d: int, hp: dict) -> list[tuple[int, int, int]]:
    """GMM's: the covariance for the PCA (when it reduces), the projections of every row, per
    k-means step of the EM's start (scikit-learn's, as many as it ran, ``kmeans_iter_``) the
    (N, K) distances, and per EM step (as many as the fit ran, ``n_iter_``) the whitening and the
    two (N, K) products. (The k-means steps were missing: the release's EM starts from them.)"""
    p, k, steps = hp.get("dim_", d), hp.get("n_components", 50), hp.get("n_iter_", 0)
    shapes = [(n_train + n_score, d, p)] if p < d else []  # the PCA's covariance: in scatters()
    shapes += [(n_train, p, k)] * hp.get("kmeans_iter_", 0)
    return shapes + [(n_train, p, p), (n_train, p, k), (n_train, k, p)] * steps + [(n_score, p, p), (n_score, p, k)]


def sgemm_gflops() -> float:
    """Measured float32 matmul GFLOP/s of this machine (2048^3, best of 3)."""
    a = np.random.default_rng(0).standard_normal((2048, 2048), dtype=np.float32)
    best = np.inf
    for _ in range(3):
        t0 = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t0)
    return 2 * 2048**3 / best / 1e9


#: the sets whose softmax passes take each row's own max (an argmax pass, the cheapest row max
#: numpy has) instead of the block's: MSP's and MCM's numerator is each scored row's largest term;
#: KL matching's templates are indexed by each ID-train row's predicted class (issue 45)
ROW_MAX = {"msp": ["score"], "mcm": ["score"], "kl_matching": ["train"]}


def softmax_passes(name: str) -> list[str]:
    """The sets ("train" and/or "score") whose logits a softmax readout must pass over: a max
    (of the block, or of each row where :data:`ROW_MAX` says), an exp and a row sum."""
    table = {"msp": ["score"], "energy": ["score"], "gen": ["score"], "kl_matching": ["train", "score"],
             "react": ["score"], "ash_s": ["score"], "scale": ["score"], "dice": ["score"], "vim": ["score"],
             "mcm": ["score"], "nnguide": ["score"],
             "entropy": ["score"], "temperature_scaling": ["score"], "openmax": ["score"], "ash_b": ["score"],
             "ash_p": ["score"], "vra": ["score"], "lts": ["score"], "gradnorm": ["score"], "grad_uncertainty": ["score"],
             "relation": ["train", "score"], **SINCE_PAPER_SOFTMAX}  # fmt: skip
    return table.get(name, [])


def reads(name: str) -> list[tuple[str, str]]:
    """(set, reduction): the passes over the features that no product of the detector makes:
    the fit statistics over every ID-train row ("columns": the class means of cosine and MCM,
    the mean feature of fDBD and DICE, kNN's normalised bank, the Mahalanobis family's class
    means) and the norms of the rows ("rows": cosine, MCM, kNN and NNGuide normalise the scored
    rows, fDBD divides by ||z - mean||, the ++ forms normalise ID-train and scored rows alike)."""
    maha = ("mahalanobis", "mahalanobis_pp", "relative_mahalanobis", "relative_mahalanobis_pp")
    pp = ("mahalanobis_pp", "relative_mahalanobis_pp")
    train = [("train", "columns")] if name in ("cosine", "mcm", "fdbd", "dice", "knn", "she", "nci", "relation", *maha) else []
    train += [("train", "rows")] if name in pp else []
    score = [("score", "rows")] if name in ("cosine", "mcm", "fdbd", "knn", "nnguide", "she", "nci", "gradnorm",
                                            "grad_uncertainty", "relation", *pp) else []  # fmt: skip
    # NCI reduces each scored row three times (its dot with w_y, ||z - mu||, ||z||_1); LTS sums
    # relu(z) over each scored row besides its top-k partition
    score += {"nci": [("score", "rows")] * 2, "lts": [("score", "rows")]}.get(name, [])
    return train + score + SINCE_PAPER_READS.get(name, [])


def logit_reads(name: str) -> list[tuple[str, str]]:
    """(set, reduction) as :func:`reads`, over the logits: OpenMax's fit forms each class's mean
    logit vector (a column pass over ID train) and then each row's distance to its own class's
    (a row pass: it needs the means first); KL matching's templates add each ID-train row's
    softmax into its predicted class's sum (a column pass over ID train; issue 45)."""
    return {"openmax": [("train", "columns"), ("train", "rows")], "kl_matching": [("train", "columns")]}.get(name, [])


def fit_search_passes(name: str, train: FeatureSet, n_score: int, fitted: dict) -> list[tuple[np.ndarray, int]]:
    """(array, times): softmax passes (max, exp, row sum) over arrays the formula forms itself,
    each as many times as the fit ran it: temperature scaling's Newton steps on 1/T over its
    validation logits (each step needs the NLL's slope at the new T: every exp of f / T anew);
    GMM's E-steps, a softmax over the K components of every ID-train row per EM step, and one over
    every scored row (the score's log-sum-exp)."""
    if name == "temperature_scaling" and fitted.get("val_rows") is not None:
        return [(np.asarray(train.logits)[fitted["val_rows"]], int(fitted["steps"]))]
    if name == "gmm":
        k, rng = fitted.get("n_components", 50), np.random.default_rng(0)
        return [(rng.standard_normal((len(train), k), dtype=np.float32), int(fitted.get("n_iter_", 0))),
                (rng.standard_normal((n_score, k), dtype=np.float32), 1)]  # fmt: skip
    return []


def argmax_passes(name: str) -> list[str]:
    """The sets whose predicted classes (an argmax of each logit row) a formula reads with no
    softmax: SHE's patterns (train) and the pattern each row is read against, NCI's head row,
    OptFS's head row (train: its theta; scored rows: its readout); ORA's boundaries are those of each
    row's predicted class; GROOD indexes the ID-train rows whose label is their predicted class.
    Issue 45's: fDBD's y = argmax f of each scored row (its boundaries are those of y); cosine's
    max over each scored row's C cosines (a row max, as an argmax pass costs)."""
    return {"she": ["train", "score"], "nci": ["score"], "optfs": ["train", "score"], "ora": ["score"],
            "grood": ["train"], "fdbd": ["score"], "cosine": ["score"]}.get(name, [])


def selections(name: str, d: int, c: int) -> list[tuple[str, str, int]]:
    """(set, array, k): the per-row selections a detector's formula itself needs, a partition of
    each row at position k: GEN sums the M largest p of each row, ASH-S keeps and SCALE sums the
    top 10% / 15% of each feature row."""
    return {"gen": [("score", "logits", c - min(100, c))], "ash_s": [("score", "features", round(0.9 * d))],
            "scale": [("score", "features", round(0.85 * d))], "ash_b": [("score", "features", round(0.65 * d))],
            "ash_p": [("score", "features", round(0.9 * d))], "lts": [("score", "features", round(0.95 * d))],
            "openmax": [("score", "logits", c - 3)]}.get(name, [])  # fmt: skip


def percentiles(name: str, n_train: int, d: int) -> list[tuple[int, int]]:
    """(values, k): ReAct's clip is the 90th percentile of all n_train D train activations, one
    linear-time partition of them."""
    if name == "vra":  # its two clip values, each a partition of every train activation
        return [(n_train * d, int(0.1 * n_train * d)), (n_train * d, int(0.9 * n_train * d))]
    if name == "optfs":  # OptFS's 0.1% and 99.9% quantiles of every ID-train value (issue 42's block)
        return [(n_train * d, int(0.001 * n_train * d)), (n_train * d, int(0.999 * n_train * d))]
    return [(n_train * d, int(0.9 * n_train * d))] if name == "react" else []


def passes_over(name: str) -> list[tuple[str, str, str]]:
    """(set, array, op): the further passes over a set's own arrays that a formula needs beyond
    its products, softmax sum, reads and selections: "dot", a second row reduction over the
    softmax terms once their sum is known (entropy's sum p log p, GradNorm's sum |p - 1/C|),
    accumulated in float64 as every reduction that becomes a score; "scale", an elementwise pass
    writing a new value of each entry (LTS's S f before the exp; OptFS's interval of every
    ID-train and scored value); "sum", a row sum accumulated in float64.
    Issue 45's corrections, each work its formula needs: KL matching's sum p log p (its score is
    -min_k KL = max_k p . log d_k - sum p log p), a dot over the scored softmax terms; fDBD's
    sum_c f_c / ||w_y - w_c|| of each row's C logits (a dot with the predicted class's row);
    ASH-S's and SCALE's s1, the sum of each feature row, and the shaped row they write (ASH-S's
    pruned row, SCALE's row times exp(s1 / s2)) before the head reads it."""
    shaping = [("score", "features", "sum"), ("score", "features", "scale")]
    return {"entropy": [("score", "logits", "dot")], "gradnorm": [("score", "logits", "dot")],
            "lts": [("score", "logits", "scale")],
            # the score reads f / T: a pass writing each scaled logit (was missing)
            "temperature_scaling": [("score", "logits", "scale")],
            # each scored row's distance to each of its alpha top classes' MAVs: a row dot with that
            # row's own MAV, accumulated in float64 (was an (N, C) x (C, alpha) product: no matrix is
            # shared by the rows, so no product can form them); alpha = 3, the default run here
            "openmax": [("score", "logits", "dot")] * 3,
            "optfs": [("train", "features", "scale"), ("score", "features", "scale")],
            "kl_matching": [("score", "logits", "dot")], "fdbd": [("score", "logits", "dot")],
            "ash_s": shaping, "scale": shaping}.get(name, [])  # fmt: skip


def factorisations(name: str) -> int:
    """How many D x D symmetric eigendecompositions (float64, LAPACK) a detector's formula needs:
    the pseudo-inverse of each covariance (Mahalanobis: the tied one; RMD: also the background
    one), ViM's principal space, NECO's PCA."""
    return {"mahalanobis": 1, "mahalanobis_pp": 1, "relative_mahalanobis": 2, "relative_mahalanobis_pp": 2,
            "vim": 1, "neco": 1, "residual": 1, "gmm": 1, **SINCE_PAPER_FACTORISATIONS}.get(name, 0)  # fmt: skip


def _timed(fn, device: str | None) -> tuple[float, float]:
    """(wall, CPU) seconds of fn(): the least of each over REPEATS calls (as many as
    :func:`repeats` gives when the warm-up call took under LIGHT_S) after one warm-up call
    (synchronised on a CUDA device)."""
    sync = (lambda: None) if device is None or not device.startswith("cuda") else __import__("torch").cuda.synchronize
    t0 = time.perf_counter()
    fn()
    sync()
    best = (np.inf, np.inf)
    warm = time.perf_counter() - t0
    for _ in range(repeats(warm) if warm < LIGHT_S else REPEATS):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        sync()
        best = (min(best[0], time.perf_counter() - t0), min(best[1], time.process_time() - c0))
    return best


#: the issue's bound on a detector's time over its float32 floor (wall and CPU)
FLOOR_TARGET = 2.0
#: issue 45's bound on a detector's CPU time over its floor's (CPU time: robust on a shared machine)
CPU_TARGET = 1.5

#: rows per block of the floor's elementwise passes (each block's passes stay in a core's cache)
FLOOR_ROWS = 1024


def _on_all_cores(fn, arrays: list) -> tuple[float, float]:
    """(wall, CPU) seconds of fn over every block of FLOOR_ROWS rows of the host ``arrays``, one
    thread per core taking the next pending block (one task per core: a task per block costs
    0.1-0.2 ms of wake-ups each): the arrays are read from memory, as a detector reads them, with
    every core the detector may use."""
    from concurrent.futures import ThreadPoolExecutor

    blocks = [a[s : s + FLOOR_ROWS] for a in arrays for s in range(0, len(a), FLOOR_ROWS)]
    cores = os.cpu_count() or 1

    def run() -> None:
        pending, lock = iter(blocks), threading.Lock()

        def work(_) -> None:
            while True:
                with lock:
                    block = next(pending, None)
                if block is None:
                    return
                fn(block)

        list(pool.map(work, range(cores)))

    with ThreadPoolExecutor(cores) as pool:
        return _timed(run, None)


_BUFFERS = threading.local()


def _buffer(shape: tuple[int, int]) -> np.ndarray:
    """A kept per-thread float32 output for the floor's exp (a fresh array per block would add
    page faults that no detector pays)."""
    buf = getattr(_BUFFERS, "exp", None)
    if buf is None or buf.size < shape[0] * shape[1]:
        buf = _BUFFERS.exp = np.empty(shape[0] * shape[1], dtype=np.float32)
    return buf[: shape[0] * shape[1]].reshape(shape)


def floor_seconds(name: str, shapes: list[tuple[int, int, int]], train: FeatureSet, score_sets: list[FeatureSet],
                  cache: dict, device: str | None, fitted: dict | None = None) -> tuple[float, float]:  # fmt: skip
    """(wall, CPU) seconds of the float32 floor of ``name``: its products ``shapes`` (sgemm on
    ``device``, None = numpy, each timed on one chunk and scaled linearly to the full size), its
    scatters (:func:`scatters`: BLAS's syrk on the host, timed the same way), and
    on the host arrays themselves the softmax passes (block max, exp, row sum in float64), the per-row
    partitions and the percentile's partition its formula needs, and its D x D float64
    eigendecompositions (on the host CPU). On a torch device the passes and partitions run on
    one chunk there, scaled linearly."""
    wall = cpu = 0.0
    if device is None:
        rand = lambda *shape: np.random.default_rng(0).standard_normal(shape, dtype=np.float32)  # noqa: E731

        def passes(a, row_max: bool = False):
            with np.errstate(over="ignore"):  # raw logits: exp may overflow, at the same speed
                return a.argmax(axis=1) if row_max else a.max(), np.einsum("ij->i", np.exp(a, out=_buffer(a.shape)), dtype=np.float64)
    else:
        import torch

        rand = lambda *shape: torch.randn(*shape, device=device)  # noqa: E731
        passes = lambda a: (a.amax(), a.exp().sum(dim=1, dtype=torch.float64))  # noqa: E731
    budget = 4_000_000 if device is None else 64_000_000

    def add(key, measure) -> None:
        nonlocal wall, cpu
        if key not in cache:
            cache[key] = measure()
        wall, cpu = wall + cache[key][0], cpu + cache[key][1]

    def scaled(make, op, rows: int, m: int):
        a = make(rows)
        w, c = _timed(lambda: op(a), device)
        return w * m / rows, c * m / rows

    def product(m: int, k: int, n: int):
        b = rand(k, n)
        return scaled(lambda r: rand(r, k), lambda a: a @ b, min(m, max(256, budget // max(k, n))), m)

    for m, k, n in shapes:
        add((m, k, n), lambda: product(m, k, n))
    d = train.features.shape[1]
    for m, dtype in scatters(name, len(train), d, train.logits.shape[1], fitted or {}):  # torch has no symmetric kernel: a full product there
        add(("syrk", m, d, dtype, device), lambda: syrk_seconds(m, d, dtype) if device is None else product(m, d, d))
    sets = {"train": [train], "score": score_sets}
    for role in softmax_passes(name):
        if device is None:
            row_max = role in ROW_MAX.get(name, [])
            add(("softmax", role, row_max), lambda: _on_all_cores(lambda a: passes(a, row_max), [np.asarray(fs.logits) for fs in sets[role]]))
        else:
            m, n = sum(len(fs) for fs in sets[role]), sets[role][0].logits.shape[1]
            add(("softmax", role, device), lambda: scaled(lambda r: rand(r, n), passes, min(m, max(256, budget // n)), m))
    for role, axis in reads(name):
        if device is None:
            reduce = (lambda a: a.sum(axis=0)) if axis == "columns" else (lambda a: np.einsum("ij,ij->i", a, a))
            add(("read", role, axis), lambda: _on_all_cores(reduce, [np.asarray(fs.features) for fs in sets[role]]))
        else:
            m, n = sum(len(fs) for fs in sets[role]), train.features.shape[1]
            reduce = (lambda a: a.sum(dim=0)) if axis == "columns" else (lambda a: (a * a).sum(dim=1))
            add(("read", role, axis, device), lambda: scaled(lambda r: rand(r, n), reduce, min(m, max(256, budget // n)), m))
    for role, axis in logit_reads(name):
        if device is None:
            reduce = (lambda a: a.sum(axis=0)) if axis == "columns" else (lambda a: np.einsum("ij,ij->i", a, a))
            add(("logit read", role, axis), lambda: _on_all_cores(reduce, [np.asarray(fs.logits) for fs in sets[role]]))
    for array, times in fit_search_passes(name, train, sum(len(fs) for fs in score_sets), fitted or {}) if device is None else []:
        w, c = _on_all_cores(passes, [array])
        wall, cpu = wall + times * w, cpu + times * c
        if name == "temperature_scaling":  # each Newton step's slope, sum_c e_c f_c: a float64 row dot (was missing)
            w, c = _on_all_cores(lambda a: np.einsum("ij,ij->i", a, a, dtype=np.float64), [array])
            wall, cpu = wall + times * w, cpu + times * c
    for role in argmax_passes(name):  # the predicted class of every row: an argmax over its logits
        if device is None:
            add(("argmax", role), lambda: _on_all_cores(lambda a: a.argmax(1), [np.asarray(fs.logits) for fs in sets[role]]))
        else:
            m, n = sum(len(fs) for fs in sets[role]), train.logits.shape[1]
            add(("argmax", role, device), lambda: scaled(lambda r: rand(r, n), lambda a: a.argmax(1), min(m, max(256, budget // n)), m))
    for role, array, k in selections(name, train.features.shape[1], train.logits.shape[1]):
        if device is None:
            top = lambda a: np.partition(a, k, axis=1)  # noqa: E731
            add(("select", role, array, k), lambda: _on_all_cores(top, [np.asarray(getattr(fs, array)) for fs in sets[role]]))
        else:
            m, n = sum(len(fs) for fs in sets[role]), getattr(sets[role][0], array).shape[1]
            top = lambda a: a.kthvalue(k + 1, dim=1)  # noqa: E731
            add(("select", role, array, k, device), lambda: scaled(lambda r: rand(r, n), top, min(m, max(256, budget // n)), m))
    def eigh(d: int) -> tuple[float, float]:
        # the least wall and the least CPU time over one BLAS thread and all of them (LAPACK's
        # eigh gains little wall time from a second thread and spins on it; the detectors run it
        # on one): the floor is the least the factorisation can take, each measure on its own
        from threadpoolctl import threadpool_limits

        a = np.random.default_rng(0).standard_normal((d, d))
        spd = a @ a.T / d
        every = _timed(lambda: np.linalg.eigh(spd), None)
        with threadpool_limits(1, user_api="blas"):
            one = _timed(lambda: np.linalg.eigh(spd), None)
        return min(every[0], one[0]), min(every[1], one[1])

    for _ in range(factorisations(name)):
        add(("eigh", train.features.shape[1]), lambda: eigh(train.features.shape[1]))
    for n, k in percentiles(name, len(train), train.features.shape[1]):
        width = min(n, budget)
        pos = int(k * width / n)
        flat = lambda a: np.partition(a, pos) if device is None else a.kthvalue(pos + 1)  # noqa: E731
        add(("percentile", n, k), lambda: scaled(lambda r: rand(r), flat, width, n))
    for role, array, op in passes_over(name):  # the further elementwise passes a formula needs (host)
        fn = {"dot": lambda a: np.einsum("ij,ij->i", a, a, dtype=np.float64),
              "sum": lambda a: np.einsum("ij->i", a, dtype=np.float64),
              "scale": lambda a: np.multiply(a, a.dtype.type(1.5), out=_buffer(a.shape))}[op]  # fmt: skip
        add(("pass", role, array, op), lambda: _on_all_cores(fn, [np.asarray(getattr(fs, array)) for fs in sets[role]]))
    for key, (rows, cols, op, m) in generated_passes(name, len(train), sum(len(fs) for fs in score_sets), train.logits.shape[1]).items():
        add(("generated", name, key), lambda: _generated(rows, cols, op, m))
    for size in large_factorisations(name):
        add(("eigh", size), lambda: _one_eigh(size))
    return wall, cpu


def _one_eigh(d: int) -> tuple[float, float]:
    """(wall, CPU) of one float64 eigendecomposition of a d x d SPD matrix on one BLAS thread (a
    large one: timed once, its CPU time far above the machine's noise)."""
    from threadpoolctl import threadpool_limits

    a = np.random.default_rng(0).standard_normal((d, d))
    spd = a @ a.T / d
    with threadpool_limits(1, user_api="blas"):
        c0, t0 = time.process_time(), time.perf_counter()
        np.linalg.eigh(spd)
        return time.perf_counter() - t0, time.process_time() - c0


def _generated(rows: int, cols: int, op, m: int) -> tuple[float, float]:
    """(wall, CPU) of ``op`` over an (m, cols) float32 matrix that a detector forms itself (no set
    holds it), timed on ``rows`` of its rows at a time on every core and scaled to m rows."""
    a = np.random.default_rng(0).standard_normal((min(rows, m), cols), dtype=np.float32)
    w, c = _on_all_cores(op, [a])
    return w * m / len(a), c * m / len(a)


def warm_up(sets: list[FeatureSet]) -> float:
    """Pay the one-time costs before any timing: BLAS/LAPACK and oodeval's thread pools, first
    calls, and each set's head hash and NaN/inf check (each done once per FeatureSet, then
    shared by every detector that reads it, as in a grid). Returns the seconds of the hashes and
    checks, which the header prints."""
    t0 = time.perf_counter()
    for fs in sets:
        fs.signature()
        fs.check_finite(("features", "logits", "head"), "benchmark")
    once = time.perf_counter() - t0
    detectors.create("energy").fit().score(sets[0])

    a = np.random.default_rng(0).standard_normal((512, 512))
    np.linalg.eigh(a @ a.T)
    np.linalg.pinv(a, hermitian=True)
    logit_origin(a[:256], a[:256, 0])
    np.partition(a.astype(np.float32), 100, axis=1)
    return once


def run_ours(name: str, train: FeatureSet, score_sets: list[FeatureSet], hp: dict, trace: bool = True) -> tuple[float, float, float, object]:
    """(wall s, CPU s, peak traced MB or NaN, fitted detector) of fit + scoring every set. The
    first run traces numpy's allocations (tracemalloc) for the peak; one under REPEAT_BELOW_S is
    run :func:`repeats` times more, untraced, keeping the least wall and the least CPU time
    (tracing slows many small allocations by ~15%, and each floor is timed after a warm-up call)."""

    def once() -> tuple[float, float, object]:
        c0, t0 = time.process_time(), time.perf_counter()
        det = detectors.create(name, **hp).fit(train)
        for fs in score_sets:
            det.score(fs)  # scores come back to the host: every device queue is drained
        return time.perf_counter() - t0, time.process_time() - c0, det

    if trace:
        tracemalloc.start()
    seconds, cpu, det = once()
    peak = tracemalloc.get_traced_memory()[1] / 2**20 if trace else float("nan")
    tracemalloc.stop()
    for _ in range(repeats(seconds)):
        again = once()
        seconds, cpu = min(seconds, again[0]), min(cpu, again[1])
    return seconds, cpu, peak, det


def run_pood(name: str, train: FeatureSet, score_sets: list[FeatureSet], max_rows: int, k: int) -> tuple[float, float, bool]:
    """(wall s, CPU s, extrapolated) of pytorch-ood's fit + predict on the same arrays (predict
    extrapolated linearly where capped at ``max_rows``)."""
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
    slow = {"mahalanobis", "relative_mahalanobis", "dice", "openmax", "class_gmm"}
    c0, t0 = time.process_time(), time.perf_counter()
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
            det = pood.KNN(None, k=k)
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
        elif name in SINCE_PAPER_POOD:
            pred, use = since_paper_pood(name, z, y, lin)
        elif name in ("entropy", "temperature_scaling"):
            det = pood.Entropy(None) if name == "entropy" else pood.TemperatureScaling(None).fit_logits(f, y)
            pred, use = det.predict_logits, "logits"
        elif name == "openmax":  # our defaults (OpenOOD's tail 20, alpha 3), all labelled rows as pytorch-ood fits
            det = pood.OpenMax(None, tailsize=20, alpha=3, euclid_weight=1.0)
            det.fit_logits(f.double(), y)
            pred, use = (lambda a: det.predict_logits(a.double())), "logits"
        elif name in ("ash_b", "ash_p"):
            det = pood.ASH(None, on_maps, variant=name.replace("_", "-"), percentile=0.65 if name == "ash_b" else 0.9)
            pred, use = (lambda x: det.predict_feature_maps(x[:, :, None, None])), "features"
        elif name == "vra":  # pytorch-ood clips per dimension; ours at its settings does too
            det = pood.VRA(None, on_maps, lower_percentile=0.1, upper_percentile=0.9)
            det.fit_feature_maps(z[:, :, None, None], y)
            pred, use = (lambda x: det.predict_feature_maps(x[:, :, None, None])), "features"
        elif name == "lts":
            det = pood.LTS(None, lin, p=0.05)
            pred, use = det.predict_features, "features"
        elif name == "she":
            det = pood.SHE(None, lin).fit_features(z, y)
            pred, use = det.predict_features, "features"
        elif name == "nci":
            det = pood.NCI(None, lin, alpha=1e-4).fit_features(z)
            pred, use = det.predict_features, "features"
        elif name == "class_gmm":
            det = pood.GMM(None, reg=1e-6).fit_features(z.double(), y)
            pred, use = (lambda a: det.predict_features(a.double())), "features"
        else:
            raise KeyError(name)
        fit_s, fit_c = time.perf_counter() - t0, time.process_time() - c0
        extrapolated = False
        score_s = score_c = 0.0
        batch = 64 if name == "dice" else 4096
        for fs in score_sets:
            arr = np.asarray(fs.logits if use == "logits" else fs.features)
            rows = len(arr)
            if name in slow and rows > max_rows:
                rows, extrapolated = max_rows, True
            c1, t1 = time.process_time(), time.perf_counter()
            for s in range(0, rows, batch):
                pred(torch.from_numpy(arr[s : min(rows, s + batch)]))
            score_s += (time.perf_counter() - t1) * len(arr) / rows
            score_c += (time.process_time() - c1) * len(arr) / rows
    return fit_s + score_s, fit_c + score_c, extrapolated


def run_openood(name: str, train: FeatureSet, score_sets: list[FeatureSet], max_rows: int | None = None) -> tuple[float, float, bool]:
    """(wall s, CPU s, False) of OpenOOD v1.5's postprocessor maths re-run on the same arrays (its
    package does not install): gmm (scikit-learn's PCA(50) and GaussianMixture(50, tied,
    random_state=0), as ``gmm_postprocessor.py`` with ``gmm.yml``), residual (EmpiricalCovariance,
    then np.linalg.eig of the covariance, as ``residual_postprocessor.py``), relation (float64
    products of every scored row with every ID-train row, by blocks of 4096 bank rows, as
    ``relation_postprocessor.py`` on a GPU; its scoring timed on the first ``max_rows`` rows of
    each set, when given, and extrapolated linearly: its cost is the same per scored row)."""
    from scipy.special import softmax
    from sklearn.covariance import EmpiricalCovariance
    from sklearn.decomposition import PCA
    from sklearn.mixture import GaussianMixture

    c0, t0 = time.process_time(), time.perf_counter()
    z = np.asarray(train.features, dtype=np.float64)
    if name == "gmm":
        axes = PCA(n_components=50).fit(z).components_.T
        gm = GaussianMixture(n_components=50, random_state=0, covariance_type="tied").fit(z @ axes)
        for fs in score_sets:
            gm.score_samples(np.asarray(fs.features, dtype=np.float64) @ axes)
    elif name == "residual":
        w, b = train.weight.astype(np.float64), train.bias.astype(np.float64)
        u = -np.linalg.pinv(w) @ b
        cov = EmpiricalCovariance(assume_centered=True).fit(z - u).covariance_
        vals, vecs = np.linalg.eig(cov)
        ns = np.ascontiguousarray(np.real(vecs.T[np.argsort(-np.real(vals))[vim_dim(z.shape[1]) :]]).T)
        for fs in score_sets:
            np.linalg.norm((np.asarray(fs.features, dtype=np.float64) - u) @ ns, axis=1)
    elif name == "relation":
        def embed(features, logits):
            x = np.asarray(features, dtype=np.float64)
            return x / np.sqrt((x**2).sum(-1) + 1e-10)[:, None], softmax(np.asarray(logits, dtype=np.float64), axis=1)

        bank_z, bank_p = embed(train.features, train.logits)
        fit_s, fit_c = time.perf_counter() - t0, time.process_time() - c0
        score_s = score_c = 0.0
        for fs in score_sets:
            rows = len(fs) if max_rows is None else min(len(fs), max_rows)
            c1, t1 = time.process_time(), time.perf_counter()
            qz, qp = embed(fs.features[:rows], fs.logits[:rows])
            for q in range(0, len(qz), 1024):
                total = np.zeros(len(qz[q : q + 1024]))
                for j in range(0, len(bank_z), 4096):
                    rel = np.clip(qz[q : q + 1024] @ bank_z[j : j + 4096].T, 0, None) * (qp[q : q + 1024] @ bank_p[j : j + 4096].T)
                    total += (rel * (rel > 0.03)).sum(-1)
            score_s += (time.perf_counter() - t1) * len(fs) / rows
            score_c += (time.process_time() - c1) * len(fs) / rows
        return fit_s + score_s, fit_c + score_c, rows < len(score_sets[0])
    else:
        raise KeyError(name)
    return time.perf_counter() - t0, time.process_time() - c0, False


#: which peer's implementation each method's row times: pytorch-ood 0.4's detector, or OpenOOD's
#: maths re-run (:func:`run_openood`); the rest have no peer implementation on cached arrays
PEERS = {**{n: "pytorch-ood" for n in SHARED}, **{n: "pytorch-ood" for n in (
    "entropy", "temperature_scaling", "openmax", "ash_b", "ash_p", "vra", "lts", "she", "nci", "class_gmm")},
    **{n: "openood" for n in ("gmm", "residual", "relation")}}  # fmt: skip

#: the methods with no floor, and why
NO_FLOOR = {"maxlogit": "no floating-point work: max of the logits"}

#: registered methods this benchmark does not time, and where they are measured
NOT_HERE = {"nac": "per-layer states (benchmarks/nac_taps.py)",
            "cnc": "a K + 1 head, which the synthetic problem lacks",
            **{n: "scores a network pass's arrays (benchmarks/network_methods.py)"
               for n in ("odin", "mahalanobis_ensemble", "gram", "rankfeat", "mc_dropout")}}  # fmt: skip


# ---- issue 42: the peers' methods since the paper, measured as the 21 are -----------------------
# Their floors in the terms above (products, softmax passes, reads, percentiles, eigendecompositions)
# and, for webo and pnml, pytorch-ood 0.4.0's class on the same arrays; they are not among SHARED
# (the 21's totals). cfood's floor is its two distance products, its radii's partitions and one
# comparison per (scored row, reference row); kpca's its random-feature and scatter products, the
# cos of every random feature, the 4096 x 4096 eigendecomposition and the scored rows' projection
# on the smaller of its fitted q components and their complement. ora's floor is the head's product
# and one softmax pass over the scored logits: its per-class cosine needs a square root and a
# division for every (scored row, class), timed as the exp of such a pass (corrected: the floor
# omitted them). weiper's floor is its products, the max softmax of its perturbed logits, their
# ID-train range and one elementwise pass per binned value, ID train and scored (corrected: the
# floor omitted the range and the bins, which its densities need). cadref has no peer timing: pytorch-ood
# 0.4.0 lacks it; weiper and ora are in neither peer. grood's floor is its three products (prototype
# distances of ID train and of the scored rows, the scored gradients against the indexed ones) and
# its reads; OpenOOD's grood runs the network and a faiss IVF index (an approximate 1-NN; faiss is
# not installed here), so it has no peer timing.

#: the methods pytorch-ood has, timed against its class
SINCE_PAPER_POOD = ("webo", "pnml")
PEERS.update({n: "pytorch-ood" for n in SINCE_PAPER_POOD})
#: a softmax readout over the scored logits: WEBO's weighted logsumexp, pNML's log p; CADRef's energy
#: of every ID-train row (its mean confidence) and of every scored row; WeiPer's max softmax of each of
#: its 100 perturbed heads over the scored rows (100 passes the size of the scored logits)
SINCE_PAPER_SOFTMAX = {"webo": ["score"], "pnml": ["score"], "cadref": ["train", "score"], "weiper": ["score"] * 100,
                       "grood": ["train", "score"],  # GROOD: softmax_K of its C + 1 prototype distances
                       "ora": ["score"]}  # ORA: a sqrt and a division per (scored row, class), as an exp
#: pNML normalises every ID-train row (its X'X) and every scored row
SINCE_PAPER_READS = {"pnml": [("train", "rows"), ("score", "rows")], "cfood": [("train", "rows"), ("score", "rows")],
                     "optfs": [("train", "columns"), ("score", "rows")], "kpca": [("train", "rows"), ("score", "rows")],
                     # CADRef: its predicted-class means, each scored row's l1 norm and split error;
                     # ORA: the class means, each scored row's ||z - mu||
                     "cadref": [("train", "columns"), ("score", "rows")], "ora": [("train", "columns"), ("score", "rows")],
                     "weiper": [("train", "rows"), ("score", "rows")],
                     # GROOD: the class prototypes (label means), the norms of the indexed and scored gradients
                     "grood": [("train", "columns"), ("train", "rows"), ("score", "rows")]}  # fmt: skip
#: pNML's pseudo-inverse of X'X
SINCE_PAPER_FACTORISATIONS = {"pnml": 1}


def since_paper_products(n_train: int, n_score: int, d: int, c: int, hp: dict) -> dict[str, list[tuple[int, int, int]]]:
    """pNML: X'X over ID train, x V and W x over the scored rows; CFOOD: the reference rows' (10% of
    ID train) distances to each other and to the scored rows; kernel PCA: the 4096 random features
    of ID train and of the scored rows, and their scatter; CADRef: the head over ID train (its
    predicted classes) and the scored rows; ORA: the head's Gram matrix and the head over the
    scored rows; GROOD: the distances of the ID-train and the scored rows to the C + 1 prototypes,
    and of the scored rows' gradients to the indexed ones (``bank``: the fitted count)."""
    ref, m = int(0.1 * n_train), 4096
    return {"pnml": [(n_train, d, d), (n_score, d, d), (n_score, d, c)],
            "cfood": [(ref, d, ref), (n_score, d, ref)],
            # (the last: each scored row's projection on the smaller of U_q and its complement, which
            # the residual needs; was left out)
            "kpca": [(n_train, d, m), (n_train, m, m), (n_score, d, m), (n_score, m, max(1, min(hp.get("q", m), m - hp.get("q", m))))],
            "cadref": [(n_train, d, c), (n_score, d, c)], "ora": [(c, d, c), (n_score, d, c)],
            # WeiPer: its 100 perturbed heads over ID train twice (the value range, then the densities)
            # and over the scored rows
            "weiper": [(n_train, d, 100 * c), (n_train, d, 100 * c), (n_score, d, 100 * c)],
            "grood": [(n_train, d, c + 1), (n_score, d, c + 1), (n_score, d, hp.get("bank", n_train))]}  # fmt: skip


def since_paper_hyperparameters(c: int) -> dict[str, dict]:
    """WEBO with seeded class weights (some <= 0, so the ReLU has work), the same for pytorch-ood."""
    w = np.random.default_rng(42).normal(1.0, 0.6, c)
    return {"webo": {"class_weights": w.tolist()}}


def since_paper_pood(name: str, z, y, lin) -> tuple[object, str]:
    """(predict, input) of pytorch-ood's class for ``name``, fitted on the ID-train tensors."""
    import torch
    import pytorch_ood.detector as pood

    if name == "webo":
        w = torch.tensor(since_paper_hyperparameters(lin.weight.shape[0])["webo"]["class_weights"], dtype=torch.float32)
        return (lambda f: pood.WeightedEBO.score(f, w)), "logits"
    det = pood.PNML(None, lin).fit_features(z, y)
    return det.predict_features, "features"


def generated_passes(name: str, n_train: int, n_score: int, c: int = 1000) -> dict[str, tuple[int, int, object, int]]:
    """{what: (rows per timed block, columns, op, rows in all)}: the passes over matrices a
    since-paper formula forms itself. CFOOD: each reference row's radii, one partition of its
    distances to the other reference rows at every grid position (:func:`cfood_levels`), and
    one comparison of every scored row's distance to each reference row with a radius; kernel
    PCA: the cos of every random feature of ID train and the scored rows (float32); WeiPer: the min
    and max of its 100 heads' ID-train logits and one elementwise pass (a bin coordinate) over
    them and the scored rows' (``c`` classes)."""
    from oodeval.detectors.neighbours import cfood_levels

    ref, m = int(0.1 * n_train), 4096
    if name == "cfood" and ref >= 2:
        pos = cfood_levels(ref)[1] + 1
        return {"radii": (256, ref, lambda a: np.partition(a, pos, axis=1), ref),
                "compare": (256, ref, lambda a: np.count_nonzero(a >= 0, axis=1), n_score)}
    if name == "kpca":
        return {"cos": (1024, m, lambda a: np.cos(a, out=_buffer(a.shape)), n_train + n_score)}
    if name == "weiper":  # its r = 100 heads' logits: their ID-train range, then a bin of each ID-train and scored one
        return {"range": (1024, c, lambda a: (a.min(), a.max()), 100 * n_train),
                "bins": (1024, c, lambda a: np.multiply(a, a.dtype.type(1.5), out=_buffer(a.shape)), 100 * (n_train + n_score))}
    if name == "nnguide":  # its guidance: the mean of the k = 10 largest of each scored row's bank similarities
        bank, k = max(10, int(np.ceil(0.01 * n_train))), 10
        return {"top k": (1024, bank, lambda a: np.partition(a, bank - k, axis=1), n_score)}
    if name == "gen":  # its readout p^g (1 - p)^g of each row's M = 100 top terms, in float64 (so p near 1 keeps 1 - p)
        return {"readout": (1024, 100, lambda a: np.exp(a, dtype=np.float64), n_score)}
    return {}


def large_factorisations(name: str) -> list[int]:
    """Sizes of the symmetric eigendecompositions (float64) a formula needs beyond the D x D ones
    of :func:`factorisations`: kernel PCA's principal space of its 4096 x 4096 scatter."""
    return [4096] if name == "kpca" else []


# ---- end of issue 42's block ---------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the full row counts (default 1)")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--detectors", default=None, help="comma-separated subset")
    ap.add_argument("--compute-dtype", default="float32", choices=("float32", "float64"), help="oodeval's compute_dtype")
    ap.add_argument("--device", default=None, help="torch device for the detectors that take one (default: numpy)")
    ap.add_argument("--train", type=int, default=None, help="ID-train rows (overrides --scale)")
    ap.add_argument("--test", type=int, default=None, help="ID-test and OOD rows each (overrides --scale)")
    ap.add_argument("--no-pood", action="store_true", help="skip pytorch-ood")
    ap.add_argument("--pood-rows", type=int, default=2000, help="rows timed for pytorch-ood's slow predicts")
    ap.add_argument("--seed", type=int, default=0)
    add_kernel_arguments(ap)
    args = ap.parse_args()
    use_kernel(args)
    n_train = args.train or int(200_000 * args.scale)
    n_test = args.test or int(50_000 * args.scale)
    if min(n_train, n_test) < 1:
        ap.error(f"--scale/--train/--test give {n_train} train and {n_test} test rows; each needs at least 1")
    unknown = sorted(set((args.detectors or "").split(",")) - set(detectors.names()) - {""})
    if unknown:
        ap.error(f"unknown detectors {', '.join(unknown)}; known: {', '.join(detectors.names())}")
    if args.device is not None:
        args.no_pood = True  # pytorch-ood runs on the CPU here; the comparison is a CPU one
    allocator = pin_allocator()
    t0 = time.perf_counter()
    train, test, ood = synthetic_problem(args.classes, args.dim, n_train, n_test, n_test, seed=args.seed, nac=False)
    print(f"data: {args.classes} classes, D={args.dim}, train {n_train}, test {n_test}, OOD {n_test} "
          f"(generated in {time.perf_counter() - t0:.1f}s); threads: OMP_NUM_THREADS="
          f"{os.environ.get('OMP_NUM_THREADS', 'unset')}, cpus {os.cpu_count()}; "
          f"{allocator}; oodeval compute_dtype {args.compute_dtype}, device {args.device or 'numpy'}")  # fmt: skip
    print("\n".join(describe(sgemm_gflops())))
    knn_k = 1000 if n_train >= 100_000 else max(1, n_train // 200)
    print(f"knn k = {knn_k} for both libraries")
    # the peers' methods at the settings their peer's timed run uses: VRA per dimension at 10/90
    # (pytorch-ood's clip), OpenMax on every labelled row (pytorch-ood's fit set)
    hps = {"knn": {"k": knn_k}, "vra": {"per_dim": True}, "openmax": {"correct_only": False},
           **since_paper_hyperparameters(args.classes)}
    on_arrays = [n for n in detectors.names() if n not in NOT_HERE]
    names = args.detectors.split(",") if args.detectors else on_arrays
    if not args.detectors:
        print("not timed here: " + "; ".join(f"{n}: {why}" for n, why in NOT_HERE.items()))
    cache: dict = {}
    n_score = 2 * n_test
    detectors.create("msp")  # import every detector module before timing
    once = warm_up([train, test, ood])
    print(f"head hashes and NaN/inf checks of the three sets: {once:.2f} s, once per set (shared by every detector)")
    if args.device is not None:
        import torch

        torch.ones(1, device=args.device).sum().item()  # import and initialise torch before timing
    print(f"{'detector':<24}{'wall s':>8}{'cpu s':>8}{'peak MB':>8}{'floor s':>9}{'/floor':>7}{'cpu/fl':>7}"
          + ("" if args.no_pood else f"{'pood s':>10}{'pood cpu':>9}{'pood/ours':>10}"))  # fmt: skip
    # totals over the shared detectors: [ours wall, ours CPU, pood wall, pood CPU], all / without knn
    tot = {"all": np.zeros(4), "no knn": np.zeros(4)}
    misses: dict[str, list[str]] = {"floor": [], "pood": []}  # the targets, per detector
    for name in names:
        hp = dict(hps.get(name, {}))
        params = detectors.create(name).get_params()
        if "compute_dtype" in params:
            hp["compute_dtype"] = args.compute_dtype
        if args.device is not None:
            if "device" not in params:
                continue  # numpy-only detector: nothing to time on the device
            hp["device"] = args.device
        try:
            secs, cpu, peak, det = run_ours(name, train, [test, ood], hp, trace=args.device is None)
        except InputError as err:  # refused up front at this size (gmm, class_gmm): say why
            print(f"{name:<24}refused: {err}", flush=True)
            continue
        fitted = {"n_components_": det.n_components_} if name == "neco" else {}
        if name == "gmm":
            fitted = {"dim_": det.resolved_params()["dim"], "n_iter_": det.n_iter_, "kmeans_iter_": det.kmeans_iter_,
                      "n_components": det.n_components}  # fmt: skip
        if name == "relation":
            fitted = {"bank": len(det.bank_features_)}
        if name == "grood":
            fitted = {"bank": len(det.bank_)}
        if name == "temperature_scaling":
            fitted = {"val_rows": det.val_rows_, "steps": det.n_iter_}
        if name == "kpca":
            fitted = {"q": det.n_components_}
        shapes = products(name, n_train, n_score, args.dim, args.classes, {**hp, **fitted})
        line = f"{name:<24}{secs:>8.2f}{cpu:>8.2f}{peak:>8.0f}"
        ref, ref_cpu = (0.0, 0.0) if name in NO_FLOOR else floor_seconds(name, shapes, train, [test, ood], cache, args.device, fitted)
        if ref_cpu > 0:
            if max(secs / ref, cpu / ref_cpu) > FLOOR_TARGET or cpu / ref_cpu > CPU_TARGET:
                misses["floor"].append(f"{name} {secs / ref:.2f}/{cpu / ref_cpu:.2f}")
            line += f"{ref:>9.2f}{secs / ref:>7.2f}{cpu / ref_cpu:>7.2f}"
        else:
            line += f"{'-':>9}{'-':>7}{'-':>7}"
        if name in PEERS and not args.no_pood:
            peer = run_pood if PEERS[name] == "pytorch-ood" else (lambda n, tr, sets, rows, _: run_openood(n, tr, sets, rows if n == "relation" else None))
            try:
                ps, pc, extra = peer(name, train, [test, ood], args.pood_rows, knn_k)
                for _ in range(repeats(ps)):
                    again = peer(name, train, [test, ood], args.pood_rows, knn_k)
                    ps, pc = min(ps, again[0]), min(pc, again[1])
            except AssertionError:  # its Mahalanobis needs every class in the train set
                print(line + f"{'n/a':>10}", flush=True)
                continue
            line += f"{ps:>10.2f}{pc:>8.2f}{'*' if extra else ' '}{pc / cpu:>10.2f}" + ("  (OpenOOD's maths)" if PEERS[name] == "openood" else "")
            if pc / cpu < 1:
                misses["pood"].append(f"{name} {pc / cpu:.2f}")
        else:
            ps = pc = 0.0
        if name in SHARED:
            for key in ("all",) if name == "knn" else ("all", "no knn"):
                tot[key] += (secs, cpu, ps, pc)
        print(line + (f"   ({NO_FLOOR[name]})" if name in NO_FLOOR else ""), flush=True)
    print("/floor = wall / float32 floor wall; cpu/fl = CPU time / floor CPU time (robust on a shared machine)")
    for key, target in (("all", 300), ("no knn", 60)):
        w, c, pw, pcpu = tot[key]
        line = f"shared total ({key}): ours {w:.2f} s wall, {c:.2f} s CPU (full-size target <= {target} s wall on 2 cores)"
        if pw:
            line += f"; pytorch-ood {pw:.2f} s wall, {pcpu:.2f} s CPU = {pcpu / c:.1f}x ours in CPU time"
        print(line)
    print("pood/ours = the peer's CPU time / ours: pytorch-ood 0.4's detector, or OpenOOD v1.5's maths re-run where marked")
    print(f"targets (the issues', at --scale 0.1 and 1): /floor <= {FLOOR_TARGET:g} and cpu/fl <= {CPU_TARGET:g}: " + ("met" if not misses["floor"] else "NOT met by " + ", ".join(misses["floor"])))
    if not args.no_pood:
        print("targets (the issue's, at --scale 0.1 and 1): pood/ours >= 1: " + ("met" if not misses["pood"] else "NOT met by " + ", ".join(misses["pood"])))
    print(f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB; "
          "* = pytorch-ood predict timed on --pood-rows rows and extrapolated; shared = the "
          f"{len(SHARED)} detectors both libraries implement")  # fmt: skip


if __name__ == "__main__":
    main()
