"""Goldens that hold on every machine, and the local bitwise guard (docs/conventions.md#reproducibility).

Two levels, as the conventions page states them:

- **Across machines** (SIMD kernels, BLAS builds, thread counts, torch's CPU capability) float32
  sums run in another order, so a golden holds within a tolerance that follows from the arithmetic:
  ``tests/golden/demo-features`` holds the quick demo's stored features (real trained features with
  NAC taps), and ``tests/golden/demo-features.json`` every paper detector's scores and metrics on
  them as recorded on one machine. A score may move by :func:`score_tolerance`; a metric (and each
  bootstrap bound) moves only when an ID/OOD pair of scores changes order, so it may move by what
  the pairs within that score tolerance can change (:func:`metric_tolerance`), and by nothing when
  there are none. ``tests/golden/demo-quick.json`` holds the quick demo's end-to-end metrics
  (training in float64, so the same weights everywhere), checked within the measured spread across
  kernels and thread counts (:data:`DEMO_TOLERANCE`).
- **On one machine** the same command gives the same bytes: ``python tests/golden.py record`` runs
  the quick demo (one BLAS/OpenMP thread) and keeps the sha256 of its results in ``.golden/``
  (never committed); ``python tests/golden.py check`` (``make golden``) runs it again after a change
  and names every cell whose bits moved.

``python tests/golden.py refresh`` rewrites the committed goldens from this machine, after a change
meant to move the numbers (a new default, a fixed detector): review the diff it prints.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
FEATURES = GOLDEN / "demo-features"
FEATURE_GOLDEN = GOLDEN / "demo-features.json"
DEMO_GOLDEN = GOLDEN / "demo-quick.json"
LOCAL = ROOT / ".golden" / "demo-quick.sha256.json"

#: every metric a results row carries, and the bootstrap bounds of those that have them
METRICS = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "aupr_in", "aupr_out", "detection_error")
BOUNDED = ("fpr95", "fpr95_ood_positive", "tnr95", "auroc", "detection_error")
COLUMNS = METRICS + tuple(f"{m}_{end}" for m in BOUNDED for end in ("lo", "hi"))
#: set sizes: exact on every machine
SIZES = ("n_id", "n_ood")
#: bootstrap draws and seed of the fixed-feature golden (the quick demo's)
DRAWS, SEED = 200, 0

#: the quick demo's end-to-end metrics may move this much (absolute, as fractions) on another machine.
#: It trains in float64 from float64 initial draws, so its weights are the same everywhere; extraction
#: and the detectors then move scores by float32 rounding. Measured over ATEN_CPU_CAPABILITY
#: default/avx2, OPENBLAS_CORETYPE Prescott/Haswell and OMP_NUM_THREADS 1/4 on an AVX-512 Xeon
#: (docs/conventions.md#reproducibility): AUROC and AUPR by at most 4e-5, every FPR@95, TNR and
#: detection error (and their bounds) by nothing. A share-type metric moves in steps of one image,
#: so it may move by one image of the smallest OOD set (100 images: 0.01); AUROC and AUPR by 5e-4
#: (12x the spread, a third of what energy's temperature 1 -> 1.1 moves). Set sizes are exact.
DEMO_TOLERANCE = {"share": 0.0101, "rank": 5e-4}


def machine() -> dict:
    """What the recorded numbers ran on: CPU, ISA, BLAS kernels, torch's CPU capability."""
    from threadpoolctl import threadpool_info

    info = {"python": platform.python_version(), "machine": platform.machine(), "numpy": np.__version__}
    try:
        cpu = Path("/proc/cpuinfo").read_text()
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("model name")), "?")
    except OSError:
        info["cpu"] = platform.processor()
    info["blas"] = sorted({f"{p.get('internal_api')} {p.get('version')} {p.get('architecture')}" for p in threadpool_info()
                           if p.get("user_api") == "blas"})
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        pass
    return info


# --- the fixed features -------------------------------------------------------------------------

def load_features(folder: Path = FEATURES) -> tuple:
    """(train, nac_fit, test, {ood name: set}) of the golden features."""
    from oodeval.features import FeatureSet

    roles = json.loads((folder / "roles.json").read_text())
    load = lambda name: FeatureSet.load(folder / name, mmap=False)  # noqa: E731
    return load(roles["train"]), load(roles["nac_fit"]), load(roles["test"]), {o: load(o) for o in roles["ood"]}


def default_hyperparameters(train) -> dict:
    """The quick demo's explicit settings: kNN's k at 1 per 1000 bank images (oodeval.demo.run)."""
    from oodeval.demo.run import _knn_k

    return {"knn": {"k": _knn_k(len(train))}}


def score_features(train, nac_fit, test, oods, hyperparameters: dict | None = None, names: list[str] | None = None,
                   ) -> tuple[dict, dict]:
    """Paper detectors (default: all 21) on the golden features through the grid's own seam
    (:func:`oodeval.evaluation.evaluate_detectors`): ({detector|ood: {column: value}}, {detector|set: scores})."""
    from oodeval import detectors
    from oodeval.evaluation import evaluate_detectors

    hp = default_hyperparameters(train)
    for name, values in (hyperparameters or {}).items():
        hp[name] = {**hp.get(name, {}), **values}
    names = names or detectors.names("paper21")
    scores: dict = {}
    rows = evaluate_detectors(train, test, oods, names, {k: v for k, v in hp.items() if k in names}, scores_out=scores,
                              progress=False, tapped=nac_fit, draws=DRAWS, seed=SEED)
    bad = [f"{r['detector']}/{r['ood']}: {r.get('error')}" for r in rows if r["status"] != "ok"]
    if bad:
        raise AssertionError("golden cells failed: " + "; ".join(bad))
    cells = {f"{r['detector']}|{r['ood']}": {c: float(r[c]) for c in COLUMNS} for r in rows}
    flat = {f"{det}|{s}": np.asarray(v, dtype=np.float64) for det, sets in scores.items() for s, v in sets.items()}
    return cells, flat


def float32_error(train, nac_fit, test, oods, scores: dict) -> dict[str, float]:
    """Each score array's measured float32 rounding error, relative to its scale (:func:`_scale`):
    max |s32 - s64| / scale against the same detector run with ``compute_dtype="float64"`` (the
    reference path; 0 for the detectors that compute in float64 only)."""
    from oodeval import detectors

    wide = [n for n in detectors.names("paper21") if "compute_dtype" in detectors.create(n).get_params()]
    _, reference = score_features(train, nac_fit, test, oods, {n: {"compute_dtype": "float64"} for n in wide})
    return {k: float(np.max(np.abs(v - reference[k]) / _scale(reference[k]))) for k, v in scores.items()}


def _scale(scores: np.ndarray) -> np.ndarray:
    """Per element, the magnitude its rounding error is relative to: its own plus the array's median
    magnitude (a score near zero is a difference of terms of the array's size, and carries their error)."""
    return np.abs(scores) + np.median(np.abs(scores))


def reduction_length(train) -> int:
    """The longest reduction behind a paper detector's score: the widest of the features, the
    logits and NAC's taps (products with the head, covariance factors, per-layer states)."""
    widths = [train.features.shape[1], train.logits.shape[1]]
    widths += [v.shape[1] for v in train.extras.values() if v.ndim == 2]
    return max(widths)


def score_tolerance(golden: np.ndarray, relative_error: float, reduction: int) -> np.ndarray:
    """How far each element of a recorded score array may move on another machine.

    The float32 path's error on this machine was measured against the float64 reference
    (:func:`float32_error`, ``relative_error`` = its largest value relative to the scale). Another
    machine sums in another order (other SIMD widths, BLAS kernels, thread splits): its error is of
    the same kind and size, so the two differ by a small multiple of ours (measured: up to 3.5x
    under OpenBLAS's Haswell and Prescott kernels, docs/conventions.md); 16x leaves room for a
    kernel whose blocking is worse, and stays orders of magnitude below what a changed setting
    moves (energy's temperature 1 -> 1.1 moves scores by about 10%). Products in float64
    (the detectors without a float32 path, fits, factorisations) add a floor of ``16 sqrt(L) u64``
    (u64 the float64 unit roundoff, L the reduction length: random-sign rounding errors grow like
    its square root). All relative to :func:`_scale`.
    """
    floor = 16.0 * math.sqrt(reduction) * float(np.finfo(np.float64).eps) / 2
    return max(16.0 * relative_error, floor) * _scale(golden)


def metric_tolerance(x: np.ndarray, y: np.ndarray, dx: np.ndarray, dy: np.ndarray, multiplicity: int) -> dict:
    """How far each metric of (ID scores ``x``, OOD scores ``y``) can move when every score moves by
    at most its tolerance (``dx``, ``dy``).

    Every metric here is a function of the interleaving of ID and OOD scores alone (with ties), so
    it moves only through the ID/OOD pairs whose intervals touch (``|x_i - y_j| <= dx_i + dy_j``):
    AUROC by at most 1/(n m) per such pair; an FPR@95 (either convention) and the detection error
    by at most the share of ID and OOD scores in such pairs; average precision (whose steps also
    follow ties among ID scores) by the same shares plus 2/n per pair of ID scores within tolerance.
    A bootstrap bound is a quantile of draws resampling the OOD set with the ID set fixed; a
    resample repeats an OOD score at most ``multiplicity`` times, which scales its bound. Without
    such pairs nothing can move beyond float64 rounding (1e-12 here).
    """
    n, m = x.size, y.size
    order = np.argsort(y)
    ys, dys = y[order], dy[order]
    reach = dx.max() + dys.max()
    lo = np.searchsorted(ys, x - reach, side="left")
    hi = np.searchsorted(ys, x + reach, side="right")
    pairs, id_touched, ood_touched = 0, 0, np.zeros(m, dtype=bool)
    for i in np.flatnonzero(hi > lo):
        near = np.abs(ys[lo[i]:hi[i]] - x[i]) <= dx[i] + dys[lo[i]:hi[i]]
        if near.any():
            pairs += int(near.sum())
            id_touched += 1
            ood_touched[lo[i]:hi[i]] |= near
    id_ties = int(np.sum(np.diff(np.sort(x)) <= 2 * dx.max()))
    share = id_touched / n + ood_touched.sum() / m
    point = {"auroc": pairs / (n * m), "fpr": share, "aupr": share + 2 * id_ties / n}
    tol = {}
    for column in COLUMNS:
        metric = column.removesuffix("_lo").removesuffix("_hi")
        kind = "auroc" if metric == "auroc" else "aupr" if metric.startswith("aupr") else "fpr"
        tol[column] = point[kind] * (multiplicity if column != metric else 1) + 1e-12
    return tol


def max_multiplicity(m: int) -> int:
    """The most times one OOD index repeats in a bootstrap resample of the golden's (seeded) draws."""
    idx = np.random.default_rng(SEED).integers(0, m, size=(DRAWS, m))
    return int(max(np.bincount(row, minlength=m).max() for row in idx))


def load_feature_golden() -> tuple[dict, dict, dict]:
    """(cells, scores, relative float32 errors) recorded in ``tests/golden/demo-features.*``."""
    data = json.loads(FEATURE_GOLDEN.read_text())
    with np.load(FEATURE_GOLDEN.with_suffix(".npz")) as z:
        scores = {k: z[k] for k in z.files}
    return data["cells"], scores, data["float32_error"]


def feature_deviation(cells: dict, scores: dict, golden_cells: dict, golden_scores: dict, errors: dict,
                      reduction: int) -> list[str]:
    """Every score array and metric of ``cells``/``scores`` outside its tolerance against the golden
    (the keys present in ``cells``/``scores``; a key the golden lacks is a deviation)."""
    problems = []
    tolerance = {}
    for key, got in scores.items():
        want = golden_scores.get(key)
        if want is None or got.shape != want.shape:
            problems.append(f"{key}: shape {got.shape}, golden {None if want is None else want.shape}")
            continue
        tolerance[key] = score_tolerance(want, errors[key], reduction)
        over = np.abs(got - want) > tolerance[key]
        if over.any():
            i = int(np.argmax(np.abs(got - want) - tolerance[key]))
            problems.append(f"{key}: {int(over.sum())} of {got.size} scores outside tolerance, e.g. [{i}] {got[i]!r} "
                            f"vs golden {want[i]!r} (tolerance {tolerance[key][i]:.3g})")
    for key, got in cells.items():
        det, ood = key.split("|", 1)
        ood_key, id_key = f"{det}|{ood}", f"{det}|id"
        if key not in golden_cells:
            problems.append(f"{key}: not in the golden")
            continue
        if ood_key not in tolerance or id_key not in tolerance:
            continue  # its scores deviate: reported above
        x, y = golden_scores[id_key], golden_scores[ood_key]
        tol = metric_tolerance(x, y, tolerance[id_key], tolerance[ood_key], max_multiplicity(y.size))
        for column, want in golden_cells[key].items():
            if not abs(got[column] - want) <= tol[column]:
                problems.append(f"{key} {column}: {got[column]!r}, golden {want!r} (tolerance {tol[column]:.3g})")
    return problems


# --- the quick demo end to end -------------------------------------------------------------------

def run_quick_demo(out: Path, stream=None):
    """The quick demo into ``out`` with one BLAS/OpenMP thread (its bytes then depend on this machine only)."""
    from threadpoolctl import threadpool_limits

    from oodeval.demo.run import run_demo

    with threadpool_limits(limits=1):
        return run_demo(out, quick=True, progress=False, stream=stream or io.StringIO())


def demo_cells(results) -> dict:
    """{detector|dataset: {column: value}} of a demo results table, with its set sizes."""
    from oodeval.results import load_results

    table = load_results(results)
    return {f"{r['detector']}|{r['dataset']}": {c: float(r[c]) for c in COLUMNS + SIZES} for _, r in table.iterrows()}


def demo_rescored(out: Path, hyperparameters: dict) -> dict:
    """:func:`demo_cells` of the detectors in ``hyperparameters`` rescored with those settings on
    the quick demo's stored features under ``out`` (as a changed default would score them)."""
    from oodeval.demo.run import OOD_LABELS
    from oodeval.demo.data import SET_NAMES
    from oodeval.features import FeatureSet
    from oodeval.evaluation import evaluate_detectors

    entries = {json.loads((p / "meta.json").read_text())["dataset"]: p for p in (out / "store").glob("*/*")
               if (p / "meta.json").is_file() and ".nac-fit-" not in p.name}
    load = lambda name: FeatureSet.load(entries[name], mmap=False)  # noqa: E731
    rows = evaluate_detectors(load(SET_NAMES["id_train"]), load(SET_NAMES["id_test"]),
                              {label: load(name) for name, label in OOD_LABELS.items()}, list(hyperparameters),
                              hyperparameters, progress=False, draws=DRAWS, seed=SEED)
    return {f"{r['detector']}|{r['ood']}": {c: float(r[c]) for c in COLUMNS + SIZES} for r in rows}


def cell_digests(results) -> dict[str, str]:
    """sha256 per cell of its metrics, bounds and score arrays (the local bitwise guard)."""
    from oodeval.results import load_cell_scores, load_results

    table = load_results(results).sort_values(["model", "detector", "dataset", "split"])
    out = {}
    for _, row in table.iterrows():
        h = hashlib.sha256(f"{row['status']}".encode())
        for column in COLUMNS:
            h.update(np.float64(row[column]).tobytes())
        if row["status"] == "ok":
            for scores in load_cell_scores(row, results):
                h.update(np.ascontiguousarray(scores).tobytes())
        out[f"{row['model']}|{row['detector']}|{row['dataset']}|{row['split']}"] = h.hexdigest()
    return out


def demo_deviation(cells: dict, golden: dict) -> list[str]:
    """Every cell and metric outside :data:`DEMO_TOLERANCE`, and every cell added or lost."""
    problems = [f"cell {k} missing" for k in golden if k not in cells]
    problems += [f"cell {k} not in the golden" for k in cells if k not in golden]
    for key in sorted(set(cells) & set(golden)):
        for column, want in golden[key].items():
            kind = "exact" if column in SIZES else "rank" if column.startswith(("auroc", "aupr")) else "share"
            got, tol = cells[key][column], DEMO_TOLERANCE.get(kind, 0.0)
            if not abs(got - want) <= tol:
                problems.append(f"{key} {column}: {got:.6f}, golden {want:.6f} (tolerance {tol})")
    return problems


# --- commands ------------------------------------------------------------------------------------

def _export_features(store: Path, folder: Path) -> None:
    from oodeval.demo.data import OOD_SETS, SET_NAMES
    from oodeval.features import FeatureSet

    entries = {json.loads((p / "meta.json").read_text())["dataset"]: p for p in store.glob("*/*") if (p / "meta.json").is_file()}
    fit = [p for p in store.glob("*/*") if ".nac-fit-" in p.name]
    if len(fit) != 1:
        raise SystemExit(f"expected one NAC fit set in {store}, found {len(fit)}")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    roles = {"train": SET_NAMES["id_train"], "nac_fit": "nac-fit", "test": SET_NAMES["id_test"], "ood": list(OOD_SETS)}
    for name, path in [(roles["train"], entries[SET_NAMES["id_train"]]), ("nac-fit", fit[0]),
                       (roles["test"], entries[SET_NAMES["id_test"]])] + [(o, entries[o]) for o in OOD_SETS]:
        fs = FeatureSet.load(path, mmap=False)
        fs.extras.pop("manifest_index", None)
        fs.meta = {k: v for k, v in fs.meta.items() if k not in ("content_hash", "shapes", "dtypes", "n")}
        fs.save(folder / name)
    (folder / "roles.json").write_text(json.dumps(roles, indent=2) + "\n")


def refresh() -> None:
    """Rewrite the committed goldens on this machine: features, their scores and metrics, the demo's metrics."""
    with tempfile.TemporaryDirectory() as tmp:
        result = run_quick_demo(Path(tmp) / "demo")
        _export_features(Path(tmp) / "demo" / "store", FEATURES)
        demo = demo_cells(result.results)
    train, nac_fit, test, oods = load_features()
    cells, scores = score_features(train, nac_fit, test, oods)
    errors = float32_error(train, nac_fit, test, oods, scores)
    np.savez_compressed(FEATURE_GOLDEN.with_suffix(".npz"), **scores)
    for path, data in ((FEATURE_GOLDEN, {"cells": cells, "float32_error": errors}), (DEMO_GOLDEN, {"cells": demo})):
        path.write_text(json.dumps({"recorded_on": machine(), **data}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {FEATURES}, {FEATURE_GOLDEN}(+.npz), {DEMO_GOLDEN}; review `git diff --stat tests/golden`")


def record_or_check(record: bool) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        digests = cell_digests(run_quick_demo(Path(tmp) / "demo").results)
    if record or not LOCAL.is_file():
        LOCAL.parent.mkdir(exist_ok=True)
        LOCAL.write_text(json.dumps({"machine": machine(), "cells": digests}, indent=1) + "\n")
        print(f"recorded the quick demo's {len(digests)} cell digests in {LOCAL} (this machine only; never committed)")
        return 0
    saved = json.loads(LOCAL.read_text())
    if saved["machine"] != machine():
        print(f"warning: {LOCAL} was recorded on {saved['machine']}, this is {machine()}: bits may differ "
              "without a change; `make golden-record` on this machine first", file=sys.stderr)
    moved = sorted(k for k in set(saved["cells"]) | set(digests) if saved["cells"].get(k) != digests.get(k))
    if moved:
        print(f"{len(moved)} of {len(digests)} cells moved since the recorded digest:\n  " + "\n  ".join(moved))
        return 1
    print(f"all {len(digests)} cells bit-identical to the recorded digest")
    return 0


def main(argv: list[str]) -> int:
    commands = {"record": lambda: record_or_check(True), "check": lambda: record_or_check(False), "refresh": refresh}
    if len(argv) != 1 or argv[0] not in commands:
        print(f"usage: python tests/golden.py {{{'|'.join(commands)}}}\n\n{__doc__}", file=sys.stderr)
        return 2
    return commands[argv[0]]() or 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
